"""Kafka access for the daemon: the consumer, metadata queries and the retry policy for transient faults."""
