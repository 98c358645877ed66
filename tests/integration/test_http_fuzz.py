"""Property-based fuzzing of /score over real HTTP, generated from the service's own OpenAPI schema.

Hypothesis builds events from the request-body schema the app publishes (types, enums, bounds,
lengths), then breaks them: wrong types, NaN and infinities, integers far past 64 bits, unicode
(lone surrogates included), deep nesting, missing and unknown fields, lists of mixed items, raw
bytes, and bodies past the size limit. The scorer serves a real checkpoint twice over: under
uvicorn in this process, and deployed on Ray Serve behind its default HAProxy ingress, as users
reach it. Properties: never a 5xx, every 4xx names the problem, every answer comes within
the client's timeout, and the service is healthy and scores correctly afterwards.
"""

from __future__ import annotations

import json
import math
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlearn.kafka.broker import free_port
from streamlearn.serve import deploy, shutdown
from streamlearn.serve.app import local_app
from streamlearn.serve.config import ServeConfig

from .models import EVENT, write_checkpoint

pytestmark = pytest.mark.integration

REQUEST_TIMEOUT_S = 10.0  # far above any honest answer (< 50 ms here): hitting it means a hang
MAX_BATCH = 50
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module", params=["uvicorn", "serve"])
def server(request, tmp_path_factory):
    """The scorer behind real HTTP, twice: under uvicorn in this process, and deployed on the
    session's Ray the way users get it (Serve, its HAProxy ingress in front of the replica)."""
    cfg = ServeConfig(checkpoint_dir=str(tmp_path_factory.mktemp("fuzz")), pipeline="fraud", poll_interval_s=0.5,
                      max_batch=MAX_BATCH, port=free_port(), min_replicas=1, max_replicas=1, auth_token=None)
    write_checkpoint(cfg.run_dir, 1)
    serve = uvicorn_server if request.param == "uvicorn" else serve_deployment
    with serve(cfg, request) as url, httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        wait_until_serving(client)
        yield client


def wait_until_serving(client: httpx.Client, timeout_s: float = 30.0) -> None:
    """Until the checkpoint is swapped in: the scorer approves it at once and swaps it a moment
    later, and until then /score answers 503 "no model yet", rightly (a fresh-clone run once
    fuzzed uvicorn's first request 4 ms before its swap)."""
    deadline = time.monotonic() + timeout_s
    while (health := client.get("/healthz").json()).get("version") != 1:
        assert time.monotonic() < deadline, f"no model served within {timeout_s:.0f} s: {health}"
        time.sleep(0.1)


@contextmanager
def uvicorn_server(cfg: ServeConfig, _request):
    uv = uvicorn.Server(uvicorn.Config(local_app(cfg), host="127.0.0.1", port=cfg.port, log_level="warning",
                                       access_log=False))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{cfg.port}"
    finally:
        uv.should_exit = True
        thread.join(timeout=10)


@contextmanager
def serve_deployment(cfg: ServeConfig, request):
    request.getfixturevalue("ray_cluster")
    url = deploy(cfg)
    try:
        yield url
    finally:
        shutdown()


def event_schema(client: httpx.Client) -> dict:
    """The event schema as published in /openapi.json, resolved from the /score request body."""
    score = client.get("/openapi.json").json()["paths"]["/score"]["post"]
    body = score["requestBody"]["content"]["application/json"]["schema"]
    single, batch = body["oneOf"]
    assert batch["items"] == single and batch["maxItems"] == MAX_BATCH
    return single


def valid_value(prop: dict) -> st.SearchStrategy:
    kind = prop["type"]
    if "enum" in prop:
        return st.sampled_from(prop["enum"])
    if kind == "string":
        return st.text(max_size=prop.get("maxLength", 64))
    if kind == "boolean":
        return st.booleans()
    lo, hi = prop.get("minimum"), prop.get("maximum")
    if kind == "integer":
        return st.integers(min_value=None if lo is None else math.ceil(lo), max_value=None if hi is None else int(hi))
    return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False)


HUGE = st.one_of(  # numbers at and past what a float or a 64-bit integer holds
    st.sampled_from([2**63, -(2**63) - 1, 10**20, 10**400, -(10**400), 1e308, -1e308, 5e-324, -0.0]),
    st.integers(min_value=300, max_value=4000).map(lambda digits: 10**digits * (-1) ** digits),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), HUGE, st.floats(allow_nan=True, allow_infinity=True),
    st.text(), st.text(alphabet=st.characters(codec="utf-8")).map(lambda s: s * 50),
    st.sampled_from(["\ud800", "\udfff", "\x00", "\u202e", "e\u0301", "\U0001f4b3" * 100, "NaN", "1e400"]),
)
NESTED = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                            max_size=4), max_leaves=20)
DEEP = st.integers(min_value=2, max_value=3000).map(lambda n: json.loads("[" * min(n, 900) + "]" * min(n, 900)))
HOSTILE = st.one_of(HUGE, SCALARS, NESTED, DEEP)


@st.composite
def broken_event(draw, schema: dict) -> dict:
    props = schema["properties"]
    event = {name: draw(valid_value(p)) for name, p in props.items()}
    names = sorted(props)
    # Validation stops at the first bad field, so most events break exactly one: every check gets reached.
    broken = draw(st.one_of(st.sampled_from(names).map(lambda n: [n]),
                            st.lists(st.sampled_from(names), max_size=4, unique=True)))
    for name in broken:
        event[name] = draw(HOSTILE)
    for name in draw(st.lists(st.sampled_from(names), max_size=2, unique=True)):
        event.pop(name, None)
    event.update(draw(st.dictionaries(st.text(max_size=20), NESTED, max_size=3)))  # unknown fields
    return event


def body_strategy(schema: dict) -> st.SearchStrategy:
    event = st.one_of(broken_event(schema), st.fixed_dictionaries({n: valid_value(p)
                                                                   for n, p in schema["properties"].items()}))
    return st.one_of(
        event,
        st.lists(st.one_of(event, NESTED), min_size=0, max_size=MAX_BATCH + 5),  # mixed items, empty, too many
        NESTED,
    )


def check_answer(response: httpx.Response, sent_events: int | None = None) -> None:
    assert response.status_code < 500, f"{response.status_code}: {response.text[:300]}"
    body = response.json()
    if response.status_code == 200:
        assert sent_events is None or len(body["scores"]) == sent_events
        assert all(0.0 <= s <= 1.0 for s in body["scores"]) and body["version"] == 1
    else:
        assert response.status_code in (400, 413, 422), response.status_code
        assert isinstance(body["detail"], str) and len(body["detail"]) > 10, body


def post(client: httpx.Client, content: bytes) -> httpx.Response:
    return client.post("/score", content=content, headers={"content-type": "application/json"})


def test_fuzz_json_bodies_from_the_openapi_schema(server):
    client = server
    schema = event_schema(client)

    @FUZZ
    @given(body_strategy(schema))
    def run(body):
        text = json.dumps(body, allow_nan=True)  # NaN and Infinity as bare literals, as sloppy clients send
        response = post(client, text.encode("utf-8", "surrogatepass"))
        events = len(body) if isinstance(body, list) else 1
        check_answer(response, events)
        if isinstance(body, list) and not body:
            assert response.status_code == 422
        if isinstance(body, list) and len(body) > MAX_BATCH:
            assert response.status_code == 413 and str(MAX_BATCH) in response.json()["detail"]
        if response.status_code == 422 and response.json().get("field"):
            assert response.json()["field"] in response.json()["detail"]

    run()


def test_fuzz_one_field_at_a_time(server):
    client = server
    props = event_schema(client)["properties"]

    @FUZZ
    @given(st.sampled_from(sorted(props)), HOSTILE)
    def run(name, value):
        response = post(client, json.dumps({**EVENT, name: value}, allow_nan=True).encode("utf-8", "surrogatepass"))
        check_answer(response, 1)
        if response.status_code == 422:  # the one broken field is the one named
            assert response.json()["field"] == name, response.json()

    run()


def test_fuzz_raw_bytes_and_broken_json(server):
    client = server
    valid = json.dumps(EVENT).encode()

    @FUZZ
    @given(st.one_of(
        st.binary(max_size=2000),
        st.integers(min_value=0, max_value=len(valid)).map(lambda n: valid[:n]),  # truncated
        st.tuples(st.integers(0, len(valid) - 1), st.binary(min_size=1, max_size=8)).map(
            lambda t: valid[:t[0]] + t[1] + valid[t[0] + 1:]),  # bytes flipped in place
        st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
        st.integers(min_value=1, max_value=200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.sampled_from([b"", b" ", b"null", b"NaN", b"[]", b"{}", b"\xef\xbb\xbf{}", b"1" * 5000,
                         b'{"amount": 1' + b"0" * 4400 + b"}"]),
    ))
    def run(content):
        check_answer(post(client, content))

    run()


def test_oversized_and_odd_requests(server):
    client = server
    limit = MAX_BATCH * (4096 + 2) + 2
    huge = b"[" + b",".join([json.dumps(EVENT).encode()] * 20_000) + b"]"  # ~5 MB, far past the limit
    for response in (post(client, huge), post(client, b" " * (limit + 1))):
        assert response.status_code == 413 and "limit" in response.json()["detail"]

    def chunks():  # no Content-Length: the limit must hold for a streamed body too
        for _ in range(300):
            yield b" " * 10_000

    streamed = client.post("/score", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert client.post("/score", data={"form": "field"}).status_code == 400  # not JSON at all
    assert client.get("/score").status_code == 405
    assert client.post("/score", json=[EVENT] * MAX_BATCH).status_code == 200


def test_healthy_and_correct_after_fuzzing(server):
    client = server
    # Runs last in the module: everything above must have left the service as it was.
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok", "ready": True, "version": 1}
    one = client.post("/score", json=EVENT)
    assert one.status_code == 200
    again = client.post("/score", json=[EVENT, EVENT])
    assert again.json()["scores"] == [one.json()["scores"][0]] * 2  # same model, same answer
