"""Every CLI default comes from the config class that owns it (one place for every default): a
default changed in TrainConfig, ScalingPolicy, ServeConfig, EvaluatorConfig, ClusterSpec, Monitor or
EmbeddedKafka is the CLI's too."""

from __future__ import annotations

import dataclasses

import typer

from streamlearn.autoscale.policy import ScalingPolicy
from streamlearn.cli import app
from streamlearn.cluster import ClusterSpec
from streamlearn.config import TrainConfig
from streamlearn.kafka.broker import EmbeddedKafka
from streamlearn.monitor import Monitor
from streamlearn.observe.config import EvaluatorConfig
from streamlearn.serve.config import ServeConfig

# CLI option -> the config field it fills, where the names differ.
RENAMED = {"until_idle": "until_idle_s", "up_cooldown": "up_cooldown_s", "down_cooldown": "down_cooldown_s",
           "target_drain": "target_drain_s", "warm_wait": "warm_wait_s", "every": "every_s",
           "lookback": "lookback_s", "idle_timeout": "idle_timeout_s"}
OWNERS = {("train",): (TrainConfig, ScalingPolicy), ("load",): (TrainConfig,), ("demo",): (TrainConfig,),
          ("serve", "up"): (ServeConfig,), ("serve", "rollback"): (TrainConfig,), ("serve", "unpin"): (TrainConfig,),
          ("report",): (TrainConfig,), ("evaluate",): (EvaluatorConfig, TrainConfig), ("status",): (TrainConfig,),
          ("kafka", "up"): (EmbeddedKafka,), ("kafka", "down"): (EmbeddedKafka,), ("monitor", "up"): (Monitor,),
          ("cluster", "up"): (ClusterSpec,)}


def _command(*path: str):
    command = typer.main.get_command(app)
    for word in path:
        command = command.commands[word]
    return command


def _defaults(cls) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_each_cli_default_is_its_config_classes_default():
    checked = 0
    for path, owners in OWNERS.items():
        for param in _command(*path).params:
            field = RENAMED.get(param.name, param.name)
            owner = next((cls for cls in owners if field in _defaults(cls)), None)
            if owner is None or param.default is None:
                continue  # a CLI-only option (--once, --quiet), or "not given": the config decides
            assert param.default == _defaults(owner)[field], (
                f"streamlearn {' '.join(path)} --{param.name.replace('_', '-')} defaults to {param.default!r}, "
                f"{owner.__name__}.{field} to {_defaults(owner)[field]!r}: take it from the config class")
            checked += 1
    assert checked >= 30  # the test reaches the options it is about
