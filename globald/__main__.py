import sys

from globald.cli import main

sys.exit(main())
