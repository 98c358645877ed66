"""A worker that dies without a word still leaves a row: Ray Train's controller writes it
(streamlearn/train/failures.py). Fed the exceptions Ray Train 2.60 hands its callbacks;
tests/integration/test_aimed_faults.py checks the row a real SIGKILL leaves."""

from __future__ import annotations

import json

from ray.exceptions import ActorDiedError
from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

from streamlearn.errors import IngestError
from streamlearn.ingest.join_files import sha256
from streamlearn.runfiles import read_jsonl
from streamlearn.train.failures import DeathRecord


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
