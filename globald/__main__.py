import sys

from globald.cli.main import main

sys.exit(main())
