"""The load generator: simulated banking events, rate profiles, delayed labels, malformed messages
and scoring callers, for Kafka (`streamlearn load`, `make demo`)."""
