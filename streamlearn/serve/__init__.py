"""Real-time scoring: Ray Serve replicas that hot-swap each new checkpoint that passes its checks.

    from streamlearn.serve import ServeConfig, deploy, shutdown, pin_version, unpin

Only the config is imported with the package: the model store imports torch (3 s of a core)
and `deploy`/`shutdown`/`build_app`/`local_app` Ray Serve and FastAPI, each on first use, so the
CLI, which reads `ServeConfig` for every command, and its `pin`/`unpin` stay instant.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from streamlearn.serve.config import ServeConfig

__all__ = ["ServeConfig", "ModelStore", "ServingModel", "pin_version", "read_pin", "unpin",
           "deploy", "shutdown", "build_app", "local_app"]

_LAZY = {"deploy": "streamlearn.serve.app", "shutdown": "streamlearn.serve.app",
         "build_app": "streamlearn.serve.app", "local_app": "streamlearn.serve.app",
         "ModelStore": "streamlearn.serve.model_store", "ServingModel": "streamlearn.serve.model_store",
         "pin_version": "streamlearn.rundir.ledger", "read_pin": "streamlearn.rundir.ledger",
         "unpin": "streamlearn.rundir.ledger"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'streamlearn.serve' has no attribute {name!r}")
