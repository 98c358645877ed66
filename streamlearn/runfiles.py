"""Reading a run directory's JSON-lines files while training may still be appending to them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict]:
    """Every complete JSON object line; a half-written last line (or any garbled one) is skipped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("t"), int | float):
            rows.append(row)
    return sorted(rows, key=lambda r: r["t"])


def json_safe(obj: Any) -> Any:
    """Valid JSON of what may hold NaN or infinities (an AUC of a one-class window): they become
    null, tuples lists, keys strings. For GET /model and the benchmarks' files."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def append_jsonl(path: Path, row: dict) -> None:
    """One row at the end of a JSON-lines file, in one write (readers skip a half-written line)."""
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")


def read_last_jsonl(path: Path, tail_bytes: int = 65536) -> dict | None:
    """The newest complete row of a JSON-lines file (reading only its end), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            return row
    return None


@dataclass
class RunFiles:
    """history.jsonl (one row per checkpoint), scaling.jsonl (one per controller sample), resizes.jsonl,
    served.jsonl (one per evaluator row)."""

    run_dir: Path
    history: list[dict] = field(default_factory=list)
    scaling: list[dict] = field(default_factory=list)
    resizes: list[dict] = field(default_factory=list)
    served: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunFiles:
        run_dir = Path(run_dir)
        return cls(run_dir, *(read_jsonl(run_dir / f"{name}.jsonl")
                              for name in ("history", "scaling", "resizes", "served")))

    @property
    def tables(self) -> tuple[list[dict], ...]:
        return self.history, self.scaling, self.resizes, self.served

    @property
    def empty(self) -> bool:
        return not any(self.tables)

    @property
    def start(self) -> float:
        return min(rows[0]["t"] for rows in self.tables if rows)
