"""The restoration engine, split as in Kafka Streams: the thread (loop and states), the state manager (restore
plans and their end, wipes, commits) and the update task (records into write batches, through the one ``fold``).

Code outside the engine uses only its events (``events``), its read interface (``view``) and the thread; the daemon
alone builds the state manager. import-linter holds these boundaries (pyproject.toml).
"""
