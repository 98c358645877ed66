"""Structured logs: one JSON object per line on stderr, quiet unless asked.

Fields every line carries: ts, level, event, and whatever context the caller binds
(pipeline, rank, version). Secrets never reach here: settings print as SecretStr.
"""

from __future__ import annotations

import json
import os
import sys
import time

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_threshold = _LEVELS.get(os.environ.get("STREAMLEARN_LOG_LEVEL", "info").lower(), 20)


def log(event: str, level: str = "info", **fields) -> None:
    if _LEVELS[level] < _threshold:
        return
    line = {"ts": round(time.time(), 3), "level": level, "event": event, **fields}
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)
