"""Pipelines shipped with streamlearn; each module exports PIPELINE."""
