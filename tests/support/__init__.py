"""Test-support code that starts real parts (a Spark Connect server, a Spark standalone cluster); not shipped."""
