"""The command line: the `globald` entry point and its subcommands (main), the read commands (read, readview),
migration and the Kafka Streams import (migrate, kstreams), and the dev/demo helpers (dev).
"""
