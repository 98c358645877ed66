"""A worker that dies without a word still leaves a row: Ray Train's controller writes it
(streamlearn/train/failures.py); a group that cannot start ends the run, saying why. Fed the
exceptions Ray Train 2.60 hands its callbacks; tests/integration/test_aimed_faults.py checks the row
a real SIGKILL leaves, tests/integration/test_training.py a real start that fails."""

from __future__ import annotations

import json

from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import (
    WorkerGroupStartupFailedError,
    WorkerGroupStartupTimeoutError,
    WorkerHealthCheckFailedError,
)
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

from streamlearn.errors import IngestError, WorkerStartError
from streamlearn.ingest.join_files import sha256
from streamlearn.runfiles import read_jsonl
from streamlearn.train.failures import STARTS_FAILED_IN_A_ROW, BoundedStarts, DeathRecord, never_started, root_cause


def test_a_dead_worker_gets_a_row_and_a_raised_exception_does_not(tmp_path):
    checkpoint = tmp_path / "checkpoint_000000007"  # the newest complete one: the restart resumes from it
    checkpoint.mkdir()
    (checkpoint / "meta.json").write_text(json.dumps({"version": 7}))
    (checkpoint / "SHA256SUMS").write_text(f"{sha256(checkpoint / 'meta.json')}  meta.json\n")
    died = WorkerHealthCheckFailedError("poll_status failed on rank 1", failure=ActorDiedError())
    assert str(died).startswith("poll_status")  # Ray's own order: the worker's description first
    DeathRecord(tmp_path, gen=2).after_exception(None, {0: RuntimeError("gloo: connection closed by peer"), 1: died})
    rows = read_jsonl(tmp_path / "failures.jsonl")
    assert [(r["rank"], r["gen"], r["version"], r["error"]) for r in rows] == [
        (1, 2, 7, "WorkerHealthCheckFailedError")]  # the rank a broken collective failed under: no cause
    assert rows[0]["message"].startswith("The actor died")  # Ray's reason first: status shows the start
    assert "poll_status failed on rank 1" in rows[0]["message"]
    # A diagnosed failure was written by its worker already: nothing twice.
    DeathRecord(tmp_path, gen=2).after_exception(None, {0: IngestError("Ray Data lost its slices")})
    assert len(read_jsonl(tmp_path / "failures.jsonl")) == 1


def test_a_row_that_cannot_be_written_never_fails_the_controller(tmp_path):
    died = WorkerHealthCheckFailedError("poll_status failed", failure=ActorDiedError())
    DeathRecord(tmp_path / "no such run", gen=0).after_exception(None, {0: died})  # no directory: logged, not raised
    assert not (tmp_path / "no such run").exists()


# What Ray Train 2.60 hands the driver when a worker's setup hook cannot import streamlearn (a
# test session's workers without the clone on their path, 2026-12-04): text, the traceback inside.
START_FAILED = ("One of the worker actors failed to initialize due to error:\nTraceback (most recent call last):\n"
                "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                "Failed to execute the setup hook method, streamlearn.train.preload.preload\n"
                "Traceback (most recent call last):\n  File \"importlib/__init__.py\", line 126, in import_module\n"
                "ModuleNotFoundError: No module named 'streamlearn.train'\n"
                "The actor never ran - it was cancelled before it started running.")


def _start_failed():
    return ControllerError(WorkerGroupStartupFailedError(START_FAILED))


def test_groups_that_die_as_they_start_end_the_run_after_a_few_in_a_row():
    policy = BoundedStarts(FailureConfig(max_failures=5))  # Ray's controller_failure_limit: -1, no end
    decisions = [policy.make_decision(_start_failed()) for _ in range(STARTS_FAILED_IN_A_ROW)]
    assert decisions == [FailureDecision.RETRY] * (STARTS_FAILED_IN_A_ROW - 1) + [FailureDecision.RAISE]


def test_a_group_that_started_in_between_begins_the_count_again_and_waits_for_resources_never_end_it():
    policy = BoundedStarts(FailureConfig(max_failures=-1))
    for _ in range(4):  # a failed start, then a group that ran and lost a worker: never three in a row
        assert policy.make_decision(_start_failed()) == FailureDecision.RETRY
        died = WorkerGroupError("rank 1 died", {1: WorkerHealthCheckFailedError("poll", failure=ActorDiedError())})
        assert policy.make_decision(died) == FailureDecision.RETRY
    # Waiting for an autoscaler's nodes is no failed start: Ray's unbounded retries stay.
    for _ in range(10):
        assert policy.make_decision(ControllerError(WorkerGroupStartupTimeoutError(num_workers=2))) == \
            FailureDecision.RETRY


def test_the_user_is_told_why_the_workers_never_started_and_how_to_fix_it():
    why = never_started(_start_failed())
    assert isinstance(why, WorkerStartError)
    assert "ModuleNotFoundError: No module named 'streamlearn.train'" in str(why)
    assert "PYTHONPATH" in str(why) and "worker-*.err" in str(why)
    assert never_started(WorkerGroupError("rank 0 raised", {})) is None  # any other failure is raised as it was
    assert root_cause(RuntimeError("no exception line here\nsecond")) == "no exception line here"
