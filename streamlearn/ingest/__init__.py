"""Ingest: plan offset windows, read them from Kafka, decode and dead-letter."""
