"""Two Serve replicas, a real trainer writing checkpoints, keep-alive clients: one version for all.

Before issue 14 each replica gated checkpoints against its own model, so replicas that started
at different moments served different versions and a caller routed between them saw v4, v7,
v4. Now one decision per version is recorded beside the checkpoints and every replica switches
at the moment it announces (streamlearn/serve/gate.py). Checked here the strongest way a caller
can observe it: whenever an answer arrived before another request was sent, from any client,
the later answer's version is not lower.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from ray import serve

from streamlearn import faults
from streamlearn.config import TrainConfig
from streamlearn.kafka.broker import free_port
from streamlearn.rundir import checkpoint
from streamlearn.serve.app import deploy, shutdown
from streamlearn.serve.config import ServeConfig
from streamlearn.train.trainer import run_dir, train

from .test_faults import Producing, replicas, running_replicas
from .test_serve import EVENT, wait_for
from .test_training import assert_exactly_once

pytestmark = pytest.mark.integration

CLIENTS = 4
SWAPS = 6  # the issue asks for 5 or more


class Client(threading.Thread):
    """One keep-alive connection sending request after request: (sent, received, status, version,
    the replica that answered)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.results = url, threading.Event(), []

    def run(self):
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    r = client.post("/score", json=EVENT)
                    body = r.json() if r.status_code == 200 else {}
                    status = 200 if r.status_code == 200 else f"{r.status_code} {r.text[:200]}"  # what it said
                    self.results.append((sent, time.monotonic(), status, body.get("version"), body.get("replica")))
                except httpx.HTTPError as e:
                    self.results.append((sent, time.monotonic(), repr(e), None, None))


def backwards(results: list[tuple]) -> list[tuple]:
    """Pairs (earlier answer, later request) where the later request, sent after the earlier answer
    arrived, was answered with a lower version: what a caller (or two callers comparing notes) sees."""
    by_sent = sorted(results)
    found, newest_answered, pending = [], None, sorted(results, key=lambda r: r[1])
    i = 0
    for r in by_sent:
        while i < len(pending) and pending[i][1] < r[0]:  # answers received before r was sent
            if newest_answered is None or pending[i][3] > newest_answered[3]:
                newest_answered = pending[i]
            i += 1
        if newest_answered is not None and r[3] < newest_answered[3]:
            found.append((newest_answered, r))
    return found


def test_two_replicas_serve_one_version_at_a_time_through_swaps_and_a_replica_killed_mid_swap(
        kafka, kafka_settings, ray_cluster, topic, tmp_path, monkeypatch):
    """Two replicas serve SWAPS swaps and more with no request failed; then one dies with the next
    approved version loaded, before the announced moment (at its wait for the (SWAPS + 4)-th): the other
    switches at the moment alone, and the replica Serve starts in its place must serve what the
    other serves by then, not an older approval, and follow the later swaps. No answer, before or
    after the death, goes back to an older version. (One Serve app and trainer for both: each
    costs a Train group and two replicas' start.)"""
    # SWAPS + 4, not + 3: on a slow fresh-clone run (12-04, every test 20-30 % slower) the clients
    # began at version 2 and the last version before the death lived under the 0.5 s the check
    # leaves out, so they saw 5 swaps of the 6 asked for before it.
    spec = f"serve_mid_swap#{SWAPS + 4}"
    monkeypatch.setenv(faults.ENV, spec)  # deploy hands it to the replicas' environment
    mark = lambda cfg: faults.mark_of(run_dir(cfg), spec)  # noqa: E731
    results, cfg, alive = _serve_through_swaps(kafka, kafka_settings, topic, tmp_path, ray_cluster,
                                                  killed=lambda cfg: mark(cfg).exists() and mark(cfg).read_text())
    killed_at = _monotonic(mark(cfg).stat().st_mtime)
    failed = [r for r in results if r[2] != 200]
    print(f"replica killed mid-swap at {killed_at:.1f}; {len(failed)} failed: {failed[:4]}")
    # Before the death: every request answered, through SWAPS swaps at least, by both replicas.
    before = [r for r in results if r[1] < killed_at - 0.5]
    assert len({r[3] for r in before}) >= SWAPS + 1, sorted({r[3] for r in before})
    by_replica = {r[4]: {v for *_, v, rep in before if rep == r[4]} for r in before if r[4]}
    assert len(by_replica) == 2 and all(len(v) >= 2 for v in by_replica.values()), by_replica
    # Only requests around the death may fail, at most one per client (each has one in flight),
    # all within moments of it. HAProxy resends what the dead replica left unanswered (retry-on
    # empty-response, streamlearn/serve/ingress.py); a request sent within 40 ms of the death that it
    # cannot resend gets its kept-alive connection closed without an answer ~0.3 s later, for the client
    # to retry (3 of 11 runs, 12-04; docs/OPERATIONS.md, "Client contract"). 2 s leaves room for a loaded machine.
    assert len(failed) <= CLIENTS, failed[:8]
    assert all(sent <= killed_at + 2.0 and received >= killed_at - 0.5 for sent, received, *_ in failed), failed
    _assert_one_version_at_a_time(results, cfg)
    killed_pid = int(mark(cfg).read_text().split()[-1])
    assert len(alive) == 2 and killed_pid not in alive, f"replica {killed_pid} was not replaced: {alive}"
    # Callers reached the killed replica before its death, and its replacement after it.
    answered_by = {int(r[4].rsplit(":", 1)[1]) for r in results if r[4]}
    assert killed_pid in answered_by and set(alive) <= answered_by, (killed_pid, alive, answered_by)
    assert_exactly_once(kafka_settings, cfg)  # the trainer beside it: counts, fingerprint, dead letters once


def _monotonic(wall: float) -> float:
    """A wall-clock time (a file's mtime) on the clients' monotonic clock."""
    return time.monotonic() - (time.time() - wall)


def _serve_through_swaps(kafka, kafka_settings, topic, tmp_path, ray_cluster, killed
                         ) -> tuple[list[tuple], TrainConfig, list[int]]:
    """A trainer checkpointing every second under 1.5k events/s, 2 replicas, CLIENTS keep-alive
    clients from the first served model until SWAPS + 2 checkpoints and `killed` (the fault's
    mark, "<point> pid <pid>", once it fired), then until Serve replaced that replica and 2 more
    swaps came with both serving. Returns every (sent, received, status, version), the config and
    the pids of the replicas alive and running at the end."""
    cfg = TrainConfig(topic=topic, workers=1, cpus_per_worker=0.5, checkpoint_dir=str(tmp_path / "ckpt"),
                      run_name=f"fraud-{topic}", checkpoint_every_s=1.0, checkpoint_every_steps=10_000,
                      window_events=1000, until_idle_s=4.0, batch_size=128, keep_checkpoints=1000)
    serve_cfg = ServeConfig(checkpoint_dir=cfg.checkpoint_dir, run_name=cfg.run_name, pipeline="fraud",
                            port=free_port(), min_replicas=2, max_replicas=2, quality_tolerance=0.05,
                            poll_interval_s=0.25, auth_token=None)
    url = deploy(serve_cfg)
    clients = [Client(url) for _ in range(CLIENTS)]
    # Load until the swaps were seen, not for a fixed time: a Train group that took 30 s to start
    # (a loaded machine) caught up with a fixed 35 s of load in one window and wrote 2 checkpoints.
    produced = Producing(kafka.bootstrap, topic, rate=1500)
    trained: dict = {}
    trainer = threading.Thread(target=lambda: trained.update(train(cfg, kafka_settings)), daemon=True)
    count = lambda: len(checkpoint.list_checkpoints(run_dir(cfg)))  # noqa: E731
    try:
        states = serve.status().applications[serve_cfg.app_name].deployments["Scorer"].replica_states
        assert states.get("RUNNING") == 2, states
        produced.start()
        trainer.start()
        with httpx.Client(base_url=url, timeout=10) as probe:  # the first model: no caller before it
            assert wait_for(lambda: probe.post("/score", json=EVENT).status_code == 200, 180, interval=0.5)
        for client in clients:
            client.start()
        assert wait_for(lambda: count() >= SWAPS + 2, 240, interval=0.5)
        assert wait_for(lambda: killed(cfg), 180, interval=0.5), "the aimed fault never fired"
        pid = int(killed(cfg).split()[-1])
        # Serve notices the death and starts a replacement, which loads before it takes traffic.
        assert wait_for(lambda: len(alive := _running(ray_cluster, serve_cfg)) == 2 and pid not in alive, 180,
                        interval=0.5), f"Serve did not replace replica {pid}"
        target = count() + 2  # and swaps with the replacement serving beside the other
        assert wait_for(lambda: count() >= target, 240, interval=0.5)
        produced.finish()
        trainer.join(300)
        assert trained.get("events_learned", 0) > 0, trained
        time.sleep(2.0)  # the last checkpoint's moment comes and goes under load
        alive = _running(ray_cluster, serve_cfg)
    finally:
        if produced.is_alive():
            produced.finish()
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(15)
        shutdown()
    results = [r for c in clients for r in c.results]
    for client in clients:  # each caller's own answers never go back
        own = [r[3] for r in client.results if r[3] is not None]
        assert own == sorted(own)
    return results, cfg, alive


def _running(ray_cluster, serve_cfg: ServeConfig) -> list[int]:
    """The pids of the scorer's live replicas, if Serve counts all of them as running (else [])."""
    pids = replicas(ray_cluster, serve_cfg.app_name)
    return pids if running_replicas(serve_cfg.app_name) == len(pids) else []


def _assert_one_version_at_a_time(results: list[tuple], cfg: TrainConfig) -> None:
    answered = [r for r in results if r[3] is not None]
    versions = sorted({r[3] for r in answered})
    print(f"{len(results)} requests from {CLIENTS} clients; versions served: {versions}")
    assert len(versions) >= SWAPS + 1, f"only {len(versions) - 1} swaps seen by the clients: {versions}"
    crossed = backwards(answered)
    assert not crossed, f"{len(crossed)} answers went back after a newer one had been given, e.g. {crossed[:3]}"

    # Every version a caller saw was approved, once, in the lineage's record.
    ledger = run_dir(cfg) / "decisions"
    for version in versions:
        decision = json.loads((ledger / f"v{version:09d}.json").read_text())
        assert decision["approved"] is True and decision["version"] == version
