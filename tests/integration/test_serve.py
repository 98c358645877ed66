"""Ray Serve scoring end to end: hot swap under load, gate, integrity, pin, bad input, auth, scaling.

Deploying is the slow part on 2 cores, so there are only two applications for the whole
module: the main one, and a token-protected one on /secure with its own empty lineage that
covers auth, the 503 before the first checkpoint, and autoscaling.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import torch
from confluent_kafka import Producer
from ray import serve

from streamlearn.errors import ConfigError
from streamlearn.kafka.admin import ensure_topics
from streamlearn.kafka.broker import free_port
from streamlearn.observe.evaluator import Evaluator, EvaluatorConfig
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint
from streamlearn.serve.answers import SCORES_SUFFIX
from streamlearn.serve.app import deploy, shutdown
from streamlearn.serve.config import ServeConfig
from streamlearn.serve.model_store import pin_version, unpin
from tests import trained

pytestmark = pytest.mark.integration

# Replicas report their load every 10 s by default, which would make the autoscaling test
# wait that long before Serve even sees the load. Read by Serve's actors, so it must be
# set before the session's Ray starts: module import (collection) comes before any fixture.
os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", "1")

FRAUD = load_pipeline("fraud")
EVENT = {"event_id": "e-1", "event_time": 1_700_000_000_000, "customer_id": "c-42", "amount": 125.5,
         "currency": "EUR", "merchant_category": "electronics", "merchant_country": "NL", "channel": "ecom",
         "card_present": False, "customer_age": 37, "account_tenure_days": 800, "is_fraud": False}
TOKEN = "integration-test-token"


def write_checkpoint(run_dir: Path, version: int, *, auc: float = 0.8, scale: float = 1.0,
                     corrupt: bool = False, quality: str | None = None) -> Path:
    """Written beside the run dir and renamed in, so a replica never sees it half-made (and a
    corrupt one is corrupt from the first moment it is visible). `quality` ("good", "bad"): a
    really trained model with the evidence the trainer writes (tests/trained.py)."""
    torch.manual_seed(version)
    state = FRAUD.build_model().state_dict() if quality is None else trained.state(quality)
    state = {k: v * scale for k, v in state.items()}
    evidence = trained.evidence(state, seed=version) if quality is not None else None
    meta = {"version": version, "offsets": {"0": 1000 * version, "1": 900 * version}, "counters": {},
            "metrics": {"online": {"auc": auc, "logloss": 0.3, "window": 5000}, "train_loss": 0.3},
            "pipeline": FRAUD.describe(), "written_at": time.time(), "topic": "transactions"}
    staging = checkpoint.write(run_dir.parent / f".staging-{run_dir.name}-{version}", state, None, meta,
                               evidence=evidence)
    if corrupt:
        data = bytearray((staging / "model.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (staging / "model.pt").write_bytes(bytes(data))
    final = run_dir / f"checkpoint_{version:09d}"
    run_dir.mkdir(parents=True, exist_ok=True)
    os.rename(staging, final)
    return final


def next_version(cfg: ServeConfig) -> int:
    """The version after the newest on disk: the tests of this module share one lineage and
    may run in any order, so none assumes which versions the others wrote."""
    return max((v for v, _ in checkpoint.list_checkpoints(cfg.run_dir)), default=0) + 1


def write_good(cfg: ServeConfig, paths: dict[int, Path]) -> int:
    """The next version, a little better than every one before it, so the quality gate approves it."""
    version = next_version(cfg)
    paths[version] = write_checkpoint(cfg.run_dir, version, auc=0.80 + version / 100)
    return version


def expected_score(path: Path) -> float:
    state, _, _ = checkpoint.load(path)
    model = FRAUD.build_model()
    model.load_state_dict(state)
    with torch.inference_mode():
        return float(FRAUD.score(model(torch.from_numpy(FRAUD.features([FRAUD.schema.validate(EVENT)]))))[0])


def wait_for(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


@pytest.fixture(scope="module")
def events_topic(kafka_settings) -> str:
    """The topic whose events (and inline labels) the served-quality test scores; the module's
    scorer publishes every answer to `<it>.scores`."""
    name = f"sq-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_settings, {name: 2, name + SCORES_SUFFIX: 1})
    return name


@pytest.fixture(scope="module")
def service(ray_cluster, tmp_path_factory, kafka_settings, events_topic):
    checkpoint_dir = tmp_path_factory.mktemp("serve")
    cfg = ServeConfig(checkpoint_dir=str(checkpoint_dir), pipeline="fraud", port=free_port(), poll_interval_s=0.25,
                      max_batch=100, min_replicas=1, max_replicas=1, auth_token=None,
                      scores_topic=events_topic + SCORES_SUFFIX, scores_bootstrap=kafka_settings.bootstrap)
    paths = {1: write_checkpoint(cfg.run_dir, 1, auc=0.80)}
    started = time.monotonic()
    url = deploy(cfg)
    print(f"deploy took {time.monotonic() - started:.1f}s")
    client = httpx.Client(base_url=url, timeout=10)
    try:
        yield cfg, client, paths
    finally:
        client.close()
        shutdown()


def model_info(client: httpx.Client) -> dict:
    response = client.get("/model")
    assert response.status_code == 200, response.text
    return response.json()


class Load(threading.Thread):
    """A client sending one request after another; records what each answer said."""

    def __init__(self, url: str, token: str | None = None):
        super().__init__(daemon=True)
        self.url, self.stop, self.results = url, threading.Event(), []
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def run(self):
        with httpx.Client(base_url=self.url, timeout=10, headers=self.headers) as client:
            while not self.stop.is_set():
                try:
                    r = client.post("/score", json=EVENT)
                    body = r.json() if r.status_code == 200 else {}
                    self.results.append((time.monotonic(), r.status_code, body.get("version"),
                                         (body.get("scores") or [None])[0]))
                except httpx.HTTPError as e:
                    self.results.append((time.monotonic(), repr(e), None, None))


def test_swap_under_load(service):
    cfg, client, paths = service
    first = client.post("/score", json=EVENT).json()
    serving = first["version"]
    assert serving == model_info(client)["version"] and first["pipeline"] == "fraud"
    assert first["trained_through"] == {"0": 1000 * serving, "1": 900 * serving}

    loads = [Load(cfg.url) for _ in range(2)]
    for load in loads:
        load.start()
    appeared = {}
    try:
        assert wait_for(lambda: all(load.results for load in loads), 10)
        for _ in range(3):
            version = write_good(cfg, paths)
            written = time.monotonic()
            seen = wait_for(lambda v=version: [t for load in loads for t, _, got, _ in load.results if got == v], 5)
            assert seen, f"version {version} never served"
            appeared[version] = min(seen) - written
            time.sleep(0.3)  # some traffic on this version before the next swap
    finally:
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(10)

    results = [r for load in loads for r in load.results]
    failed = [r for r in results if r[1] != 200]
    print(f"{len(results)} requests during 3 swaps; new version visible after {appeared}")
    assert not failed, f"{len(failed)} of {len(results)} requests failed, e.g. {failed[:3]}"
    for load in loads:  # each client's requests are sequential: its versions must never go back
        versions = [v for _, _, v, _ in load.results]
        assert versions == sorted(versions)
    assert all(delay <= 2.0 for delay in appeared.values()), appeared
    # each answer's score comes from the model of the version it reports: the swap is atomic
    expected = {v: expected_score(p) for v, p in paths.items()}
    for _, _, version, score in results:
        assert score == pytest.approx(expected[version], abs=1e-5)


def test_gate_rejects_degraded_checkpoints(service):
    cfg, client, paths = service
    before = model_info(client)
    serving, blown = before["version"], next_version(cfg)
    write_checkpoint(cfg.run_dir, blown, auc=0.99, scale=1e6)  # great meta, blown-up weights
    info = wait_for(lambda: (i := model_info(client))["last_rejection"] and i["last_rejection"]["version"] == blown
                    and i, 3)
    assert info, "weights x1e6 were not rejected"
    assert info["last_rejection"]["kind"] == "weights" and info["version"] == serving

    good = next_version(cfg)  # a trained model: on its evidence it beats the random one served
    paths[good] = write_checkpoint(cfg.run_dir, good, quality="good")
    assert wait_for(lambda: client.post("/score", json=EVENT).json()["version"] == good, 3)
    worse = next_version(cfg)  # learned shuffled labels: worse than the served one on the same events
    write_checkpoint(cfg.run_dir, worse, auc=0.99, quality="bad")
    info = wait_for(lambda: (i := model_info(client))["last_rejection"] and i["last_rejection"]["version"] == worse
                    and i, 3)
    assert info, "a much worse checkpoint was not rejected"
    assert info["last_rejection"]["kind"] == "quality" and "on the same 4096 events" in info["last_rejection"]["reason"]
    assert info["behind"]["versions"] == 1 and info["behind"]["why"].startswith(f"holding v{good}: v{worse} refused")
    counted = before["rejections"]
    assert info["rejections"] == {**counted, "weights": counted.get("weights", 0) + 1,
                                  "quality": counted.get("quality", 0) + 1}
    assert client.post("/score", json=EVENT).json()["version"] == good


def test_corrupt_checkpoint_is_rejected_and_later_ones_still_swap(service):
    cfg, client, paths = service
    serving, corrupt = model_info(client)["version"], next_version(cfg)
    write_checkpoint(cfg.run_dir, corrupt, corrupt=True)
    info = wait_for(lambda: (i := model_info(client))["last_rejection"] and i["last_rejection"]["version"] == corrupt
                    and i, 3)
    assert info and info["last_rejection"]["kind"] == "integrity" and "checksum" in info["last_rejection"]["reason"]
    assert client.post("/score", json=EVENT).json()["version"] == serving

    later = write_good(cfg, paths)
    assert wait_for(lambda: client.post("/score", json=EVENT).json()["version"] == later, 2.5)


def test_pin_rolls_back_and_unpin_returns(service):
    cfg, client, paths = service
    serving = model_info(client)["version"]
    if serving == min(paths):  # run alone: give it a version to roll back from
        serving = write_good(cfg, paths)
        assert wait_for(lambda: client.post("/score", json=EVENT).json()["version"] == serving, 2.5)
    pinned = min(paths)
    pin_version(cfg.checkpoint_dir, cfg.run_name, pinned)
    try:
        assert wait_for(lambda: client.post("/score", json=EVENT).json()["version"] == pinned, 2.5)
        info = model_info(client)
        assert info["pinned"] == pinned and info["serving_pinned"] is True
    finally:
        unpin(cfg.checkpoint_dir, cfg.run_name)
    assert wait_for(lambda: client.post("/score", json=EVENT).json()["version"] == serving, 2.5)
    assert model_info(client)["pinned"] is None


def _bad(**changes):
    return {k: v for k, v in (EVENT | changes).items() if v is not ...}


@pytest.mark.parametrize("body, status, names", [
    (_bad(amount="12.5"), 422, "amount"),
    (_bad(amount={"$gt": 0}), 422, "amount"),
    (_bad(customer_age=7), 422, "customer_age"),
    (_bad(currency="XYZ"), 422, "currency"),
    (_bad(customer_id=...), 422, "customer_id"),  # missing
    ([EVENT, EVENT, _bad(card_present="yes")], 422, "card_present"),
    (42, 422, "object"),
    ([], 422, "empty"),
    ([EVENT] * 101, 413, "limit 100"),
    (b"{not json", 400, "not JSON"),
    (b"", 400, "empty body"),
    (b"\xff\xfe\x00", 400, "UTF-8"),
    (b"[" + b" " * 500_000 + b"]", 413, "over the limit"),
])
def test_bad_requests_get_4xx_naming_the_problem(service, body, status, names):
    _, client, _ = service
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = client.post("/score", content=content, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert names in detail
    if isinstance(body, list) and status == 422 and body:
        assert response.json()["index"] == 2 and detail.startswith("event 2:")
        assert response.json()["field"] == "card_present"


def test_healthy_after_bad_input_and_documented(service):
    _, client, _ = service
    assert client.get("/score").status_code == 405
    assert client.get("/healthz").json() == {"status": "ok", "ready": True, "version": model_info(client)["version"]}
    response = client.post("/score", json=[EVENT, EVENT])
    assert response.status_code == 200 and len(response.json()["scores"]) == 2
    spec = client.get("/openapi.json").json()
    body = spec["paths"]["/score"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "amount" in body["oneOf"][0]["properties"] and body["oneOf"][1]["maxItems"] == 100


@pytest.fixture(scope="module")
def secure(service):
    """A second application on /secure: a token, its own (empty) lineage, and autoscaling that
    reacts to a handful of concurrent requests. One deployment covers auth, 503 and scaling."""
    cfg, _, _ = service
    secure = ServeConfig(checkpoint_dir=cfg.checkpoint_dir, pipeline="fraud", run_name="secure", port=cfg.port,
                         route_prefix="/secure", auth_token=TOKEN, poll_interval_s=0.25, min_replicas=1,
                         max_replicas=2, target_ongoing_requests=1, max_ongoing_requests=2, upscale_delay_s=0)
    url = deploy(secure)
    try:
        with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}) as client, \
                httpx.Client(base_url=url, timeout=10) as anonymous:
            # What an empty lineage answers, taken before any test writes to it (the tests on
            # this deployment may run in any order): test_auth_and_no_model_yet judges them.
            before = {"score": client.post("/score", json=EVENT), "healthz": anonymous.get("/healthz")}
            yield secure, client, before
    finally:
        shutdown(secure)


def test_answers_are_published_and_judged_per_version_against_their_labels(service, kafka_settings, events_topic,
                                                                            tmp_path):
    """Issue 16's served quality end to end: every answer the scorer gave reaches <topic>.scores,
    and the evaluator, reading it and the events' inline labels from the real broker, reports per
    version the AUC of exactly those answers (checked against a pairwise count of our own) and
    counts a client's retried request once."""
    cfg, client, paths = service
    rng = np.random.default_rng(16)
    n = 400
    labels = rng.random(n) < 0.3
    events = [{**EVENT, "event_id": f"sq-{i}", "amount": float(rng.uniform(1, 5000)),
               "customer_age": int(rng.integers(18, 90)), "account_tenure_days": int(rng.integers(0, 4000)),
               "card_present": bool(rng.random() < 0.5), "is_fraud": bool(labels[i])} for i in range(n)]
    producer = Producer(kafka_settings.confluent())
    for e in events:
        producer.produce(events_topic, orjson.dumps(e), e["customer_id"].encode())
    assert producer.flush(30) == 0

    given: dict[str, tuple[int, float]] = {}  # event id -> (version, score) as the caller was told
    for start in range(0, n, 50):
        if start == n // 2:  # a newer version answers the second half
            version = write_good(cfg, paths)
            assert wait_for(lambda v=version: model_info(client)["version"] == v, 10)
        batch = events[start:start + 50]
        body = client.post("/score", json=batch).json()
        given.update((e["event_id"], (body["version"], s)) for e, s in zip(batch, body["scores"], strict=True))
    retried = client.post("/score", json=events[:50])  # a client's retry: judged once, with its first answer
    assert retried.status_code == 200

    evaluator = Evaluator(FRAUD, kafka_settings, EvaluatorConfig(topic=events_topic, run_dir=tmp_path))
    deadline = time.monotonic() + 60
    while evaluator.quality.joined_total < n and time.monotonic() < deadline:
        evaluator.poll(0.5)
    row = evaluator.row()
    assert row["joined"] == n, row
    assert row["pending"]["answers"] >= 50 and not row["skipped"]  # the retry's answers wait alone
    truth = {e["event_id"]: float(e["is_fraud"]) for e in events}
    versions = sorted({v for v, _ in given.values()})
    assert len(versions) == 2, versions
    for version in versions:
        mine = [(score, truth[i]) for i, (v, score) in given.items() if v == version]
        got = row["versions"][str(version)]
        assert got["joined"] == got["window"] == len(mine)
        assert got["auc"] == pytest.approx(_pairwise_auc(mine), abs=1e-6)
    assert row["overall"]["window"] == n
    assert row["overall"]["auc"] == pytest.approx(_pairwise_auc([(s, truth[i]) for i, (_, s) in given.items()]),
                                                  abs=1e-6)


def _pairwise_auc(pairs: list[tuple[float, float]]) -> float:
    """P(score of a positive > score of a negative), ties half: the definition, counted pair by pair."""
    pos = [s for s, y in pairs if y > 0.5]
    neg = [s for s, y in pairs if y <= 0.5]
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def test_deploy_refuses_a_second_port(service):
    cfg, _, _ = service
    with pytest.raises(ConfigError, match=f"already listens on 127.0.0.1:{cfg.port}"):
        deploy(replace(cfg, port=cfg.port + 1, app_name="elsewhere"))


def test_auth_and_no_model_yet(secure):
    cfg, client, before = secure
    with httpx.Client(base_url=cfg.url, timeout=10) as anonymous:
        assert anonymous.post("/score", json=EVENT).status_code == 401
        wrong = anonymous.post("/score", json=EVENT, headers={"Authorization": "Bearer nope-nope-nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert anonymous.get("/model").status_code == 401
    assert before["healthz"].json()["ready"] is False  # open without a token, and honest
    # Authorized, but the lineage had no checkpoint yet.
    assert before["score"].status_code == 503 and "no model yet" in before["score"].json()["detail"]
    if not checkpoint.list_checkpoints(cfg.run_dir):  # the autoscaling test may have written it already
        write_checkpoint(cfg.run_dir, 1)
    assert wait_for(lambda: client.post("/score", json=EVENT).status_code == 200, 2.5)
    assert client.post("/score", json=EVENT).json()["version"] == 1


def test_autoscales_under_load_without_failures(secure):
    cfg, client, _ = secure
    if not checkpoint.list_checkpoints(cfg.run_dir):  # when run alone
        write_checkpoint(cfg.run_dir, 1)
        assert wait_for(lambda: client.post("/score", json=EVENT).status_code == 200, 2.5)

    def running() -> int:
        return serve.status().applications[cfg.app_name].deployments["Scorer"].replica_states.get("RUNNING", 0)

    assert running() == 1
    loads = [Load(cfg.url, TOKEN) for _ in range(4)]
    started = time.monotonic()
    try:
        for load in loads:
            load.start()
        assert wait_for(lambda: running() == 2, 45, interval=0.5), "Serve never added a second replica"
        print(f"second replica running after {time.monotonic() - started:.1f}s")
        time.sleep(1)  # traffic on both replicas, the new one included
    finally:
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(10)
    results = [r for load in loads for r in load.results]
    failed = [r for r in results if r[1] != 200]
    assert results and not failed, f"{len(failed)} of {len(results)} failed while scaling, e.g. {failed[:3]}"
    assert {version for _, _, version, _ in results} == {1}  # the new replica loaded before taking traffic


def test_a_lone_surrogate_is_a_400_not_a_500_with_answers_published(service):
    """Issue 47: with the answer log on (this module's scorer publishes to <topic>.scores), an id
    holding a lone surrogate passed validation and broke the answer's encoding in the handler."""
    cfg, client, _paths = service
    assert cfg.scores_topic
    for body in ({**EVENT, "event_id": "\ud800"}, [EVENT, {**EVENT, "event_id": "tx-\udfff"}]):
        response = client.post("/score", content=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
        assert response.status_code == 400, response.text
        assert "lone surrogate" in response.json()["detail"] and "'event_id'" in response.json()["detail"]
    assert client.post("/score", json={**EVENT, "event_id": "tx-\U0001f600"}).status_code == 200  # a pair is fine
