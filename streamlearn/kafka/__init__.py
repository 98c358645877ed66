"""Kafka: the embedded broker, topic admin, consumer lag."""
