"""Structured logs: one JSON object per line on stderr, quiet unless asked.

Every line carries ts, level, event, the fields the process bound with `bind` (training:
pipeline, rank, version; serving: pipeline, version), then the caller's. Only lifecycle
events log at info (start, checkpoint, swap, stop): nothing per event or per batch.
STREAMLEARN_LOG_LEVEL=debug|info|warning|error picks the threshold (default info).
Secrets never reach here: settings print as SecretStr, and a field whose name says it
holds one is masked anyway.
"""

from __future__ import annotations

import json
import os
import sys
import time

LEVEL_ENV = "STREAMLEARN_LOG_LEVEL"
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_SECRET_WORDS = ("password", "secret", "token", "credential", "sasl_plain")
_context: dict = {}


def _threshold() -> int:
    asked = os.environ.get(LEVEL_ENV, "info").strip().lower()
    if asked in _LEVELS:
        return _LEVELS[asked]
    print(json.dumps({"ts": round(time.time(), 3), "level": "warning", "event": "bad_log_level", "value": asked,
                      "fix": f"set {LEVEL_ENV} to one of {', '.join(_LEVELS)}; using info"}), file=sys.stderr)
    return _LEVELS["info"]


_threshold_value = _threshold()


def bind(**fields) -> None:
    """Fields every later line from this process carries (a worker is one process per rank);
    a field bound to None is dropped."""
    for key, value in fields.items():
        if value is None:
            _context.pop(key, None)
        else:
            _context[key] = value


def log(event: str, level: str = "info", **fields) -> None:
    if _LEVELS[level] < _threshold_value:
        return
    line = {"ts": round(time.time(), 3), "level": level, "event": event, **_context, **fields}
    for key in line:
        if any(word in key.lower() for word in _SECRET_WORDS):
            line[key] = "**********"
    print(json.dumps(line, default=str), file=sys.stderr, flush=True)
