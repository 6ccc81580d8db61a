"""The daemon process: its lifecycle (daemon) and its signals (signals). The status document and file it publishes
are ``globald.status.document`` and ``globald.status.statusfile``, the state directory and its lock
``globald.store.statedir``, so that the packages below the daemon, and the offline commands, read them without
importing the daemon.
"""
