"""A lineage's run directory: checkpoint files, and the decisions and pin that serving records beside them."""
