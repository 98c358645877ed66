"""Seeing a run: the status screen (`streamlearn status`) and PNG run reports (`streamlearn report`)."""
