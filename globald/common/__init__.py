"""Shared vocabulary: errors and what the operator should do, exit codes, table states, logging and secret redaction,
swallowed-failure accounting. Everything else may import it, and it imports nothing else of globald's.
"""
