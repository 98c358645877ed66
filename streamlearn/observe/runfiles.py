"""Reading a run directory's JSON-lines files while training may still be appending to them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass
class RunFiles:
    """history.jsonl (one row per checkpoint), scaling.jsonl (one per controller sample), resizes.jsonl."""

    run_dir: Path
    history: list[dict] = field(default_factory=list)
    scaling: list[dict] = field(default_factory=list)
    resizes: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: str | Path) -> RunFiles:
        run_dir = Path(run_dir)
        return cls(run_dir, read_jsonl(run_dir / "history.jsonl"), read_jsonl(run_dir / "scaling.jsonl"),
                   read_jsonl(run_dir / "resizes.jsonl"))

    @property
    def empty(self) -> bool:
        return not (self.history or self.scaling or self.resizes)

    @property
    def start(self) -> float:
        return min(rows[0]["t"] for rows in (self.history, self.scaling, self.resizes) if rows)
