"""The scoring HTTP API, and the Ray Serve deployment that runs it with autoscaling.

`build_app(store, cfg)` is a plain FastAPI app, so the same code runs under Ray Serve
(`deploy`) and under bare uvicorn (`local_app`, for benchmarks). The body of /score is
parsed by hand rather than by a pydantic model: the pipeline's schema already says which
field is wrong in words the dead-letter topic uses, and a hand parse turns every bad
input into a 4xx with that message instead of a generic validation dump or a 500.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import numpy as np
import torch
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from ray import serve

from streamlearn import faults, metrics
from streamlearn.errors import BadEvent, ConfigError, ServeError
from streamlearn.logs import log
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint
from streamlearn.runfiles import json_safe
from streamlearn.schema import reason_code
from streamlearn.serve.answers import AnswerLog, id_field
from streamlearn.serve.config import ServeConfig
from streamlearn.serve.gate import replica_id
from streamlearn.serve.latency import ScoringStats
from streamlearn.serve.model_store import ModelStore

_QUOTED_FIELD = re.compile(r"'([^']+)'")


class ScoreResponse(BaseModel):
    scores: list[float]
    version: int
    trained_through: dict[str, int]
    pipeline: str
    replica: str  # host:pid of the replica that answered (as GET /model says): which one a caller reached


class ErrorResponse(BaseModel):
    detail: str
    field: str | None = None
    index: int | None = None
    reason: str | None = None


class ClientError(Exception):
    """A request the client must change; becomes a JSON 4xx (or 503) with `detail`."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extra = status, detail, headers, extra


def _bad_event(err: BadEvent, index: int | None) -> ClientError:
    # Schema reasons read "<code>: '<field>' ..."; the field is the first quoted name.
    match = _QUOTED_FIELD.search(err.reason.split(":", 1)[-1])
    where = f"event {index}: " if index is not None else ""
    return ClientError(422, where + err.reason, field=match.group(1) if match else None, index=index,
                       reason=reason_code(err.reason))


def build_app(store: ModelStore, cfg: ServeConfig,
              lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
              answers: AnswerLog | None = None) -> FastAPI:
    pipeline, schema = store.pipeline, store.pipeline.schema
    app = FastAPI(title=f"streamlearn scoring: {pipeline.name}", version=str(pipeline.version), lifespan=lifespan,
                  description=f"Scores {schema.name} events with the newest {pipeline.task} model "
                              f"that passed its integrity check and quality gate.")
    _answer_errors(app)
    scoring = Scoring(store, cfg, answers)
    guarded = _guard(cfg)
    errors = {code: {"model": ErrorResponse} for code in (400, 401, 413, 422, 503)}
    event_schema = schema.json_schema() | {"title": f"{schema.name} event"}
    body_doc = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "oneOf": [event_schema, {"type": "array", "items": event_schema, "minItems": 1,
                                 "maxItems": cfg.max_batch}]}}}}}

    @app.post("/score", response_model=ScoreResponse, responses=errors, openapi_extra=body_doc,
              dependencies=guarded)
    async def score(request: Request) -> Response:
        """Score one event, or a list of up to max_batch events."""
        return await scoring.answer(request)

    @app.get("/model", responses=errors, dependencies=guarded)
    async def model_info() -> dict[str, Any]:
        """The serving version, its offsets and online metrics, the pin, and the last rejection."""
        return json_safe({**store.status(), "scoring": scoring.stats.summary()})

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness: open without a token. `ready` says whether a model is loaded."""
        served = store.serving()
        return {"status": "ok", "ready": served is not None, "version": served.version if served else None}

    return app


def _answer_errors(app: FastAPI) -> None:
    """Every failure answers JSON with a `detail`: bad input its 4xx, a bug a 500 without internals."""

    @app.exception_handler(ClientError)
    async def _client_error(_request: Request, exc: ClientError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail, **exc.extra}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors())
        return JSONResponse({"detail": problems or "invalid request"}, status_code=422)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: log it in full, answer without internals.
        log("serve_internal_error", level="error", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the replica log"},
                            status_code=500)


def _guard(cfg: ServeConfig) -> list:
    """The bearer-token check as a route dependency, or none without a token (no per-request cost)."""
    if not cfg.auth_token:
        return []
    bearer = HTTPBearer(auto_error=False)  # also documents the security scheme in OpenAPI
    expected = cfg.auth_token.get_secret_value().encode()

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        given = credentials.credentials.encode() if credentials else b""
        if not hmac.compare_digest(given, expected):  # constant time: no guessing by timing
            raise ClientError(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                              headers={"WWW-Authenticate": "Bearer"})

    return [Depends(authorized)]


class Scoring:
    """POST /score: read and validate the events, score them with the model served now, log the
    answers for the evaluator, and count each request's status and latency."""

    def __init__(self, store: ModelStore, cfg: ServeConfig, answers: AnswerLog | None):
        self.store, self.pipeline, self.answers, self.max_batch = store, store.pipeline, answers, cfg.max_batch
        self.answer_id = id_field(self.pipeline) if answers is not None else ""
        # Bigger bodies are refused before being read: max_batch events of the largest size.
        self.max_body = cfg.max_batch * (self.pipeline.schema.max_bytes + 2) + 2
        self.stats = ScoringStats()  # this replica's recent latencies, shown by GET /model
        self.replica = replica_id()

    async def answer(self, request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await self._score(request)
        except ClientError as e:
            self._scored(e.status, started)
            raise
        except Exception:
            self._scored(500, started)
            raise
        self._scored(200, started)
        return response

    def _scored(self, status: int, started: float) -> None:
        # After the response is computed; a deque append and two metric calls, no lock.
        seconds = time.perf_counter() - started
        self.stats.add(status, seconds)
        metrics.record_request(self.pipeline.name, status, seconds)

    async def _score(self, request: Request) -> Response:
        # async and inline: scoring a typical request takes well under a millisecond, less than
        # the hop to a thread pool that a sync endpoint would cost.
        pipeline, schema = self.pipeline, self.pipeline.schema
        events = _parse_events(await _read_body(request, self.max_body), self.max_batch)
        valid = []
        for i, event in enumerate(events):
            try:
                valid.append(schema.validate(event))
            except BadEvent as err:
                raise _bad_event(err, None if isinstance(events, _Single) else i) from None
        served = self.store.serving()  # read once: this request uses this model and reports its version
        if served is None:
            raise ClientError(503, f"no model yet: no checkpoint under {self.store.run_dir} has passed its checks; "
                                   "the trainer writes the first one after its first steps",
                              headers={"Retry-After": "2"})
        features = pipeline.features(valid)
        if not np.isfinite(features).all():
            bad = int(np.flatnonzero(~np.isfinite(features).all(axis=1))[0])
            raise ClientError(422, f"event {bad}: its values give non-finite features", index=bad,
                              reason="not_finite")
        with torch.inference_mode():
            scores = pipeline.score(served.model(torch.from_numpy(features))).tolist()
        if self.answers is not None:  # a non-blocking hand-off to librdkafka's queue (serve/answers.py)
            self.answers.publish([str(event[self.answer_id]) for event in valid], served.version, scores)
        body = {"scores": scores, "version": served.version, "trained_through": served.trained_through,
                "pipeline": pipeline.name, "replica": self.replica}
        return Response(json.dumps(body), media_type="application/json")  # skips FastAPI's slow encoder


class _Single(list):
    """A body that was one event, not a list: its errors carry no index."""


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ClientError(413, f"body of {declared} bytes is over the limit of {limit}: send fewer events per "
                               "request")
    body = await request.body()
    if len(body) > limit:
        raise ClientError(413, f"body of {len(body)} bytes is over the limit of {limit}")
    if not body.strip():
        raise ClientError(400, "empty body: send one event as a JSON object, or a JSON list of events")
    return body


def _parse_events(body: bytes, max_batch: int) -> list:
    try:
        payload = json.loads(body)
    except UnicodeDecodeError:
        raise ClientError(400, "body is not UTF-8 text; send JSON") from None
    except RecursionError:  # json's C parser recurses per nesting level; no event nests this deep
        raise ClientError(400, "body nests JSON too deeply; an event is a flat object", reason="not_json") from None
    except ValueError as e:
        raise ClientError(400, f"body is not JSON: {getattr(e, 'msg', e)} at position {getattr(e, 'pos', '?')}",
                          reason="not_json") from None
    if _SURROGATE_ESCAPE.search(body) and (found := _lone_surrogate(payload)):
        # Python's parser takes "\ud800" alone; the trainer's (orjson, msgspec) refuse it, and so
        # did the answer log's encoder, inside the handler: a 500. Refused here like a broken body.
        raise ClientError(400, f"body is not JSON: {found[0]} holds a lone surrogate (\\u{ord(found[1]):04x}), "
                               f"not valid Unicode", reason="not_json")
    if isinstance(payload, dict):
        return _Single([payload])
    if not isinstance(payload, list):
        raise ClientError(422, f"body must be an event object or a list of events, got {type(payload).__name__}",
                          reason="not_object")
    if not payload:
        raise ClientError(422, "empty list: send at least one event", reason="empty")
    if len(payload) > max_batch:
        raise ClientError(413, f"{len(payload)} events in one request, limit {max_batch}: split the batch",
                          reason="too_many")
    return payload


# A \uD800-\uDFFF escape: the only way a lone surrogate gets into the parsed body. Searched first,
# so the walk below runs for the rare body that has one (an emoji's pair is one code point).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _lone_surrogate(obj: Any, where: str = "") -> tuple[str, str] | None:
    """(where in the parsed body, the character) of the first lone surrogate, or None."""
    if isinstance(obj, str):
        bad = next((c for c in obj if "\ud800" <= c <= "\udfff"), None)
        return None if bad is None else (where or "a string", bad)
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        inner = f"{where}field {key!r}" if isinstance(key, str) else f"event {key}: "
        if found := (isinstance(key, str) and _lone_surrogate(key, f"{where}a field name")) or \
                _lone_surrogate(value, inner):
            return found
    return None


# ---- Ray Serve ------------------------------------------------------------------------

@serve.deployment(ray_actor_options={"num_cpus": 0.25})
@serve.ingress()  # late-bound: the app is built per replica from its config (schema, token)
class Scorer:
    def __init__(self, cfg: ServeConfig):
        torch.set_num_threads(cfg.torch_threads)  # replicas share cores; threads would fight
        self.cfg = cfg
        faults.arm(faults.spec_from_env(), None, cfg.run_dir)  # only where a test aimed one (STREAMLEARN_FAULT)
        self.store = ModelStore.from_config(cfg)
        self.answers = answer_log(cfg, self.store.pipeline.name)
        # Load before taking traffic, so a replica added under load never answers 503.
        self.store.poll_once()
        self.store.await_first_moment()
        self.store.start()

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_app(self.store, self.cfg, answers=self.answers)

    def check_health(self) -> None:
        if not self.store.alive:  # Serve replaces a replica whose poller died: it would never swap again
            raise RuntimeError("checkpoint poller thread stopped")

    def __del__(self):
        self.store.stop(timeout=1.0)
        if self.answers is not None:
            self.answers.close(timeout_s=1.0)


def answer_log(cfg: ServeConfig, pipeline: str) -> AnswerLog | None:
    """Where the config asks for it, the publisher of this process's answers."""
    if not cfg.scores_topic:
        return None
    from streamlearn.config import KafkaSettings  # env STREAMLEARN_KAFKA_* for SASL/TLS, as elsewhere

    return AnswerLog(KafkaSettings(bootstrap=cfg.scores_bootstrap).confluent(), cfg.scores_topic, pipeline)


def deploy(cfg: ServeConfig) -> str:
    """Start Serve's proxy on cfg.host:cfg.port (if not yet running) and (re)deploy this
    application; returns its base URL once a replica is up. Ray must be initialized, or
    Serve starts a local Ray of its own in this process."""
    application = scorer_app(cfg)  # before Serve starts: a wrong pipeline fails here, with its message
    _start_serve(cfg)
    running = _proxy_address()
    if running is not None and running != (cfg.host, cfg.port):
        # Serve keeps its first proxy settings; deploying anyway would hand back a wrong URL.
        raise ConfigError(f"Ray Serve already listens on {running[0]}:{running[1]}; deploy with that host/port "
                          "(--host/--port), or shut Serve down first (`serve.shutdown()`)")
    serve.run(application, name=cfg.app_name, route_prefix=cfg.route_prefix)
    _until_answering(cfg.url)
    log("serve_deployed", app=cfg.app_name, url=cfg.url, run_dir=str(cfg.run_dir))
    return cfg.url


def _start_serve(cfg: ServeConfig) -> None:
    """serve.start, patient with a slow machine: Ray 2.60 gives its proxies a fixed 60 s to
    start and then raises, though they go on starting (CI saw a busy 2-core host take longer).
    Serve's controller is up by then, so the second call joins it; whether the proxies ever
    came up, `_until_answering` finds out."""
    http_options = {"host": cfg.host, "port": cfg.port}
    try:
        serve.start(http_options=http_options)
    except TimeoutError as e:
        log("serve_proxies_slow", level="warning", error=str(e), url=cfg.url)
        serve.start(http_options=http_options)


def _until_answering(url: str, timeout_s: float = 120.0) -> None:
    """serve.run returns once the replicas run; with the HAProxy ingress the route reaches
    HAProxy a moment later (a config reload), and a caller told "deployed" before that got an
    answer that was not the scorer's. Deployed means the scorer answers at its URL."""
    import httpx  # the serve extra's client; here only, the replicas never need it

    deadline, problem = time.monotonic() + timeout_s, "no answer yet"
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/healthz", timeout=5.0)
            if answer.status_code == 200 and answer.json().get("status") == "ok":
                return
            problem = f"HTTP {answer.status_code}: {answer.text[:200]}"
        except (httpx.HTTPError, ValueError) as e:
            problem = repr(e)
        time.sleep(0.2)
    raise ServeError(f"the scorer was deployed but {url}/healthz did not answer within {timeout_s:.0f}s "
                      f"({problem}); see the Serve logs in the Ray dashboard")


def app_builder(args: dict[str, Any]) -> serve.Application:
    """The scorer for `serve run` and Serve config files, Ray Serve's application-builder way:

        serve run streamlearn.serve.app:app_builder pipeline=fraud checkpoint_dir=/x
        serve run deploy/serve/fraud.yaml   (import_path: streamlearn.serve.app:app_builder, args: {...})

    `args` are ServeConfig's fields (strings from the command line are converted). They say what
    runs, not where it listens: Serve's proxy takes its host and port from the config file's
    `http_options` (under `serve run module:builder`, Serve's defaults: port 8000, on every
    interface with the HAProxy ingress), and the route and name from the application entry
    (`--route-prefix`/`--name`). So `host`, `port`,
    `route_prefix` and `app_name`, which `deploy` uses, are refused here rather than silently
    ignored, as is `auth_token`: Serve stores args in plain text, so the token comes from
    STREAMLEARN_SERVE_TOKEN in the cluster's environment."""
    return scorer_app(ServeConfig.from_args(args))


def scorer_app(cfg: ServeConfig) -> serve.Application:
    """The Scorer bound to `cfg`, with the deployment options both `deploy` and `app_builder` use."""
    pipeline = load_pipeline(cfg.pipeline)  # fail here, with its message, not in a replica Serve keeps restarting
    if cfg.scores_topic:
        id_field(pipeline)  # answers need an id to meet their labels
    if checkpoint.newest(cfg.run_dir) is None:
        log("serve_no_checkpoint_yet", level="warning", run_dir=str(cfg.run_dir),
            hint="/score answers 503 until the trainer writes a checkpoint")
    fault = faults.spec_from_env()  # an aimed fault travels to the replicas, as to the Train workers
    return Scorer.options(
        autoscaling_config=cfg.autoscaling(),
        max_ongoing_requests=cfg.max_ongoing_requests,
        ray_actor_options={"num_cpus": cfg.num_cpus,
                           **({"runtime_env": {"env_vars": {faults.ENV: fault}}} if fault else {})},
        # A per-request access-log line roughly doubled p99 on 2 cores (load/bench/scoring.py);
        # swaps, rejections and errors still log (WARNING and our own structured lines).
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    ).bind(cfg)


def _proxy_address() -> tuple[str, int] | None:
    try:  # private in Ray 2.60: if it moves, skip the check rather than fail the deploy
        from ray.serve.context import _get_global_client

        http = _get_global_client().http_config
        return http.host, http.port
    except Exception:
        return None


def shutdown(cfg: ServeConfig | None = None) -> None:
    """Remove one application (cfg given), or stop Serve entirely with all its applications."""
    if cfg is not None:
        serve.delete(cfg.app_name)
    else:
        serve.shutdown()


def local_app(cfg: ServeConfig) -> FastAPI:
    """The same API without Ray, for `uvicorn` (benchmarks, debugging)."""
    torch.set_num_threads(cfg.torch_threads)
    store = ModelStore.from_config(cfg)
    store.poll_once()
    answers = answer_log(cfg, store.pipeline.name)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        store.start()
        try:
            yield
        finally:
            store.stop()
            if answers is not None:
                answers.close()

    return build_app(store, cfg, lifespan=lifespan, answers=answers)
