"""A finished run's scale controller outlives train() by one report interval, off the caller's path."""

from __future__ import annotations

import time

import ray

from streamlearn.train import trainer


def test_a_finished_runs_controller_goes_after_the_interval_and_the_caller_need_not_wait(monkeypatch):
    killed = []
    monkeypatch.setattr(ray, "kill", lambda actor: killed.append((actor, time.monotonic())))
    started = time.monotonic()
    trainer._retire("controller", 0.3)
    assert killed == [] and time.monotonic() - started < 0.1  # the caller goes on at once
    trainer.wait_for_metrics()  # what the CLI calls before its process (and its actors) go
    assert [actor for actor, _ in killed] == ["controller"] and killed[0][1] - started >= 0.3
    assert trainer._retiring == []


def test_a_kill_that_fails_after_ray_went_is_not_raised(monkeypatch):
    def gone(actor):
        raise RuntimeError("Ray has not been started yet")

    monkeypatch.setattr(ray, "kill", gone)
    trainer._retire("controller", 0.0)
    trainer.wait_for_metrics()  # returns: nothing to kill is not an error
