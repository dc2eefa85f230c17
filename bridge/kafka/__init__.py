"""Thin adapters over confluent-kafka: the consumer, the durable producer, the topic plan."""
