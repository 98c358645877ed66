"""Continuous DDP training on Ray Train."""
