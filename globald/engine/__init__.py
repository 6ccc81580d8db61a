"""The restoration engine, split as in Kafka Streams: the thread (loop and states), the state manager (restore
plans, wipes, commits) and the update task (records into write batches)."""
