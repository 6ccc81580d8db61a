"""The daemon process: its lifecycle (daemon), the state directory and its lock (statedir), the status document and
file (status, statusfile).
"""
