"""A worker that dies leaves a row in failures.jsonl too, written by Ray Train's controller.

A failure a worker diagnoses (a StreamlearnError) is written to `<run dir>/failures.jsonl` by
that worker before it raises (train/loop.py). A worker process that dies (SIGKILL, the OOM
killer, a lost node) writes nothing: Ray Train's controller sees a failed or hung health check
and restarts the group, and `streamlearn status` showed no failure at all. This callback runs
in that controller and writes the row the dead worker could not.

Only Ray Train's own errors (health checks) get a row here: an exception raised in a worker is
either diagnosed (its row is written already) or a bug whose traceback Ray Train logs, and the
ranks that fail only because another rank died (a collective broken under them) must not read
as causes. The row's version is the newest complete checkpoint's, the one the restart resumes
from. Imported by the controller when it unpickles the run config at every group start, so
what a row needs beyond Ray is imported only when one is written.
"""

from __future__ import annotations

import time
from pathlib import Path

import ray.train
from ray.train.v2._internal.exceptions import RayTrainError  # internal; Ray is pinned to 2.60

from streamlearn.logs import log
from streamlearn.runfiles import append_jsonl


class DeathRecord(ray.train.UserCallback):
    def __init__(self, run_dir: str | Path, gen: int):
        self.run_dir, self.gen = Path(run_dir), gen

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        deaths = {rank: e for rank, e in worker_exceptions.items() if isinstance(e, RayTrainError)}
        if not deaths:
            return
        try:
            from streamlearn.rundir import checkpoint as ckpt

            newest = ckpt.newest(self.run_dir)
            version = ckpt.read_meta(newest)["version"] if newest else 0
            for rank, error in sorted(deaths.items()):
                append_jsonl(self.run_dir / "failures.jsonl",
                             {"t": time.time(), "rank": rank, "gen": self.gen, "version": version,
                              "error": type(error).__name__, "message": _cause_first(error)[:2000]})
        except Exception as e:  # a record must never fail Ray Train's controller
            log("failure_row_not_written", level="warning", error=str(e)[:200])


def _cause_first(error: Exception) -> str:
    """Ray's reason ("The actor died unexpectedly ... its worker process has died") before the
    worker's description: `streamlearn status` shows a row's first 300 characters."""
    text, cause = str(error), str(getattr(error, "health_check_failure", "") or "")
    return f"{cause}\n{text.replace(cause, '').strip()}" if cause else text
