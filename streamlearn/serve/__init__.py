"""Real-time scoring: Ray Serve replicas that hot-swap each new checkpoint that passes its checks.

    from streamlearn.serve import ServeConfig, deploy, shutdown, pin_version, unpin

`deploy`/`shutdown`/`build_app`/`local_app` import Ray Serve and FastAPI on first use, so the
CLI's `pin`/`unpin` stay instant.
"""

from __future__ import annotations

from typing import Any

from streamlearn.serve.config import ServeConfig
from streamlearn.serve.model_store import ModelStore, ServingModel, pin_version, read_pin, unpin

__all__ = ["ServeConfig", "ModelStore", "ServingModel", "pin_version", "read_pin", "unpin",
           "deploy", "shutdown", "build_app", "local_app"]

_FROM_APP = {"deploy", "shutdown", "build_app", "local_app"}


def __getattr__(name: str) -> Any:
    if name in _FROM_APP:
        from streamlearn.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'streamlearn.serve' has no attribute {name!r}")
