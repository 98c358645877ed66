"""Load generation: simulated banking events, rate profiles and malformed messages for Kafka."""
