"""Settings of the scoring service: where checkpoints appear, how strictly they are gated,
how the deployment scales, and who may call it.

A frozen dataclass (like TrainConfig) so that one validated value travels unchanged to
every Ray Serve replica; a wrong value fails on the driver with a message that says how
to fix it, not later inside a replica that Serve keeps restarting.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import SecretStr

from streamlearn.errors import ConfigError

TOKEN_ENV = "STREAMLEARN_SERVE_TOKEN"
# Noticing a new checkpoint within 2 s needs polls well inside that; slower polls would
# break the freshness promise of the scoring API.
MAX_POLL_INTERVAL_S = 1.0
# Where an application listens, and the token, are not the builder's to set under `serve run`
# or a RayService: each has its place there, named in the refusal.
NOT_BUILDER_ARGS = {
    "host": "Serve's proxy listens where the Serve config's http_options.host says",
    "port": "Serve's proxy listens where the Serve config's http_options.port says",
    "route_prefix": "set the application's route_prefix in the Serve config (or `serve run --route-prefix`)",
    "app_name": "set the application's name in the Serve config (or `serve run --name`)",
    "auth_token": f"args are stored and shown in plain text: set {TOKEN_ENV} in the cluster's environment",
}


@dataclass(frozen=True)
class ServeConfig:
    """One scoring application: a pipeline's model lineage behind HTTP."""

    checkpoint_dir: str = str(Path.home() / "streamlearn-checkpoints")
    pipeline: str = "fraud"
    run_name: str = ""  # default: derived from the pipeline name, as TrainConfig does
    poll_interval_s: float = 0.5
    # Every replica switches to an approved version at the same announced moment, this long
    # after the decision: enough for each to poll (poll_interval_s) and load it first.
    swap_delay_s: float = 1.0
    # The quality gate (serve/paired.py): a candidate is held only when, on the same events, it is
    # worse than the served version by more than quality_tolerance (absolute, on the headline metric:
    # auc or mae) with confidence 1 - quality_alpha. DECISIONS.md, "The quality gate", measured both.
    quality_tolerance: float = 0.02
    quality_alpha: float = 0.02
    # A served version whose answers to callers (the evaluator's served.jsonl) score an AUC below this
    # is replaced by any candidate that passes the other gates, and StreamlearnServedQualityBelowFloor fires.
    served_auc_floor: float = 0.7
    # Serving further behind the newest checkpoint than either bound says why in `streamlearn status`
    # and fires StreamlearnServingStale (deploy/prometheus/alerts.yml).
    max_behind_versions: int = 10
    max_behind_s: float = 300.0
    max_abs_weight: float = 1e4  # a parameter beyond this is a diverged model, not a trained one
    max_batch: int = 1000  # events per request; more is a 413
    auth_token: SecretStr | None = None  # default: env STREAMLEARN_SERVE_TOKEN; unset = no auth
    min_replicas: int = 1
    max_replicas: int = 2
    target_ongoing_requests: float = 4.0
    max_ongoing_requests: int = 16
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 60.0
    num_cpus: float = 0.25  # per replica: scoring is short and many replicas share a core
    torch_threads: int = 1  # intra-op threads per replica; replicas, not threads, give parallelism
    host: str = "127.0.0.1"
    port: int = 8000
    route_prefix: str = "/"
    app_name: str = ""  # default: "score-<run_name>", so several lineages can be served side by side
    timeline: str = ""  # opt-in: each replica traces its swaps to PATH.scorer-<pid>.json
    # Opt-in: each replica publishes every answer (event id, version, score, time) to this topic at
    # this Kafka, for the evaluator's served quality (`streamlearn evaluate`; usually <topic>.scores).
    scores_topic: str = ""
    scores_bootstrap: str = ""

    def __post_init__(self):
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        need(bool(self.checkpoint_dir), "checkpoint_dir must be set (--checkpoint-dir), the trainer's output directory")
        need(bool(self.pipeline), "pipeline must be set (--pipeline fraud, or package.module:attribute)")
        need(0 < self.poll_interval_s <= MAX_POLL_INTERVAL_S,
             f"poll_interval_s must be in (0, {MAX_POLL_INTERVAL_S}] so a new checkpoint serves within 2 s, "
             f"got {self.poll_interval_s}")
        need(self.swap_delay_s == 0 or self.swap_delay_s >= 2 * self.poll_interval_s,
             f"swap_delay_s must be at least twice poll_interval_s ({self.poll_interval_s}) so every replica sees "
             f"and loads a new version before its moment, or 0 to swap at once (replicas may then disagree for "
             f"a poll interval), got {self.swap_delay_s}")
        need(self.quality_tolerance >= 0,
             f"quality_tolerance must be >= 0 (0 = hold a candidate shown worse by any margin), "
             f"got {self.quality_tolerance}")
        need(0 < self.quality_alpha < 0.5,
             f"quality_alpha must be in (0, 0.5): the chance of holding a candidate that is no worse than "
             f"quality_tolerance (e.g. 0.02), got {self.quality_alpha}")
        need(0 <= self.served_auc_floor <= 1, f"served_auc_floor must be in [0, 1] (0 turns it off), "
                                              f"got {self.served_auc_floor}")
        need(self.max_behind_versions >= 1 and self.max_behind_s > 0,
             f"max_behind_versions must be >= 1 and max_behind_s > 0, got {self.max_behind_versions} and "
             f"{self.max_behind_s}")
        need(self.max_abs_weight > 0, f"max_abs_weight must be > 0, got {self.max_abs_weight}")
        need(self.max_batch >= 1, f"max_batch must be >= 1, got {self.max_batch}")
        need(self.min_replicas >= 1,
             "min_replicas must be >= 1: with none, the first request waits for a replica to start and load a model")
        need(self.max_replicas >= self.min_replicas,
             f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        need(self.target_ongoing_requests > 0, "target_ongoing_requests must be > 0 (e.g. 4)")
        need(self.max_ongoing_requests >= self.target_ongoing_requests,
             "max_ongoing_requests must be >= target_ongoing_requests, or the autoscaler never sees the load "
             "it is asked to react to")
        need(self.upscale_delay_s >= 0 and self.downscale_delay_s >= 0, "upscale/downscale delays must be >= 0")
        need(self.num_cpus > 0, "num_cpus must be > 0 (fractions like 0.25 let replicas share a core)")
        need(self.torch_threads >= 1, f"torch_threads must be >= 1, got {self.torch_threads}")
        need(0 < self.port <= 65535, f"port must be in 1..65535 (Serve's proxy needs a fixed port), got {self.port}")
        need(self.route_prefix.startswith("/"), f"route_prefix must start with '/', got {self.route_prefix!r}")
        need(bool(self.scores_topic) == bool(self.scores_bootstrap),
             "scores_topic and scores_bootstrap go together: the topic answers are published to and the Kafka "
             f"it is on (got topic {self.scores_topic!r}, bootstrap {self.scores_bootstrap!r})")

        if not self.run_name:
            object.__setattr__(self, "run_name", self.pipeline.replace(":", "-").replace(".", "-"))
        need(re.fullmatch(r"[A-Za-z0-9_.-]+", self.run_name) is not None and self.run_name not in (".", ".."),
             f"run_name must be a plain directory name (letters, digits, _ . -), got {self.run_name!r}")
        if not self.app_name:
            object.__setattr__(self, "app_name", f"score-{self.run_name}")

        token = self.auth_token
        if token is None:
            token = os.environ.get(TOKEN_ENV) or None
        if isinstance(token, str):  # a plain string is accepted and wrapped, so it never prints
            token = SecretStr(token)
        if token is not None:
            need(len(token.get_secret_value()) >= 8,
                 f"auth_token must have at least 8 characters (set it, or {TOKEN_ENV}, to a long random string)")
        object.__setattr__(self, "auth_token", token)

    @property
    def run_dir(self) -> Path:
        return Path(self.checkpoint_dir) / self.run_name

    @property
    def url(self) -> str:
        """Where the application answers once deployed (the proxy's address plus the route prefix)."""
        return f"http://{self.host}:{self.port}{self.route_prefix.rstrip('/')}"

    def autoscaling(self) -> dict:
        return {
            "min_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
        }

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> ServeConfig:
        """A config from an application builder's args: `key=value` strings from `serve run`'s
        command line, or YAML scalars from a Serve config file's `args`."""
        valid = [f.name for f in dataclasses.fields(cls) if f.name not in NOT_BUILDER_ARGS]
        for key in args:
            if key in NOT_BUILDER_ARGS:
                raise ConfigError(f"serve argument {key!r} is not taken here: {NOT_BUILDER_ARGS[key]}")
            if key not in valid:
                raise ConfigError(f"unknown serve argument {key!r}; valid arguments: {', '.join(valid)}")
        types = get_type_hints(cls)
        values = {key: _typed(key, value, types[key]) for key, value in args.items()}
        if "checkpoint_dir" in values:  # "~" as on the trainer's command line, on the node that builds
            values["checkpoint_dir"] = os.path.expanduser(values["checkpoint_dir"])
        return cls(**values)


def _typed(key: str, value: Any, kind: type) -> Any:
    """`value` as the field's type: the command line gives strings, YAML gives scalars."""
    wanted = {str: "a string", int: "an integer", float: "a number"}[kind]  # every builder arg's type
    typed = None
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            typed = kind(value)
        except ValueError:
            pass
    if typed is None or (kind is int and typed != value and not isinstance(value, str)):  # 2.5 is no int
        raise ConfigError(f"serve argument {key!r} must be {wanted}, got {value!r}")
    return typed
