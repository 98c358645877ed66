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

A group whose workers die as they start is retried by Ray Train without end; `BoundedStarts`
ends the run after a few such starts in a row, and `never_started` names the cause.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import ray.train
from ray.train.v2._internal.exceptions import (  # internal; Ray is pinned to 2.60
    RayTrainError,
    WorkerGroupStartupFailedError,
)
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2.api.exceptions import ControllerError

from streamlearn.errors import WorkerStartError
from streamlearn.logs import log
from streamlearn.runfiles import append_jsonl

# Ray Train 2.60 retries a group whose workers fail as they start with no limit: its
# controller_failure_limit is -1 by default and also counts waits for resources, which must
# stay unbounded while an autoscaler adds nodes. A worker that cannot import streamlearn fails
# the same way every time: a test session whose workers lacked the clone on their path started
# 339 processes in 6 minutes (190 tries) and said nothing. Three failed starts with no group
# started between them is no passing fault (a node lost mid-start is gone at the next try).
STARTS_FAILED_IN_A_ROW = 3


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


class BoundedStarts(DefaultFailurePolicy):
    """Ray Train's own failure policy, less its endless retries of a group that cannot start."""

    def __init__(self, failure_config):
        super().__init__(failure_config)
        self.starts_failed = 0

    def make_decision(self, training_failed_error) -> FailureDecision:
        if not isinstance(training_failed_error, ControllerError):
            self.starts_failed = 0  # a group started since (a worker failure comes from a running group)
        elif _start_failed(training_failed_error):
            self.starts_failed += 1
            if self.starts_failed >= STARTS_FAILED_IN_A_ROW:
                log("workers_never_started", level="error", tries=self.starts_failed,
                    cause=root_cause(training_failed_error))
                return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


def never_started(error: BaseException) -> WorkerStartError | None:
    """What to tell the user when a run ended because its workers could not start, else None."""
    if not _start_failed(error):
        return None
    return WorkerStartError(
        f"Ray Train's workers died as they started, {STARTS_FAILED_IN_A_ROW} groups in a row: "
        f"{root_cause(error)}. Each worker process imports streamlearn on its node: on a cluster, "
        f"install it on every node; from a clone, keep the clone on PYTHONPATH (make sets it). "
        f"The workers' own logs: <ray session dir>/logs/worker-*.err (/tmp/ray/session_latest on the head).")


# "ModuleNotFoundError: No module named 'x'": a traceback's last line, Ray's own wrappers aside.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .+$", re.MULTILINE)


def _start_failed(error: BaseException) -> bool:
    """Ray Train's error for a group whose workers died as they started (not a wait for resources)."""
    return isinstance(error, ControllerError) and isinstance(error.controller_failure, WorkerGroupStartupFailedError)


def root_cause(error: BaseException) -> str:
    """The innermost exception line in the text Ray Train gives for a failed start (its
    workers' tracebacks are text by then), else the text's first line."""
    text = str(error).strip()
    lines = [m.group(0) for m in _EXCEPTION_LINE.finditer(text) if not m.group(0).startswith("ray.")]
    if lines:
        return lines[-1][:500]
    return text.splitlines()[0][:500] if text else repr(error)
