"""The Serve application builder's args: converted as `serve run` and config files pass them,
refused with a message that says where the setting goes instead. No Ray cluster: binding a
deployment needs none."""

from __future__ import annotations

import os
import re

import pytest
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary  # pinned Ray 2.60

from streamlearn.errors import ConfigError, PipelineError
from streamlearn.serve.app import app_builder
from streamlearn.serve.config import ServeConfig


def test_command_line_strings_become_the_fields_types():
    cfg = ServeConfig.from_args({"pipeline": "fraud", "checkpoint_dir": "~/ckpt", "max_replicas": "3",
                                 "poll_interval_s": "0.25", "quality_tolerance": "0", "run_name": "r1"})
    assert (cfg.max_replicas, cfg.poll_interval_s, cfg.quality_tolerance) == (3, 0.25, 0.0)
    assert cfg.checkpoint_dir == os.path.expanduser("~/ckpt") and cfg.run_name == "r1"


def test_yaml_scalars_are_accepted_when_they_fit():
    cfg = ServeConfig.from_args({"max_replicas": 3.0, "num_cpus": 1, "run_name": 2024})
    assert (cfg.max_replicas, cfg.num_cpus, cfg.run_name) == (3, 1.0, "2024")


@pytest.mark.parametrize("args, message", [
    ({"max_replicas": "2.5"}, "'max_replicas' must be an integer, got '2.5'"),
    ({"max_replicas": 2.5}, "'max_replicas' must be an integer"),
    ({"poll_interval_s": "fast"}, "'poll_interval_s' must be a number"),
    ({"max_batch": True}, "'max_batch' must be an integer"),
    ({"checkpoint_dir": None}, "'checkpoint_dir' must be a string"),
    ({"poll_interval_s": "5"}, "poll_interval_s must be in (0, 1.0]"),  # ServeConfig's own check
])
def test_wrong_values_fail_naming_the_argument(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        ServeConfig.from_args(args)


def test_an_unknown_argument_fails_listing_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        ServeConfig.from_args({"pipeline": "fraud", "replicas": "2"})
    assert "unknown serve argument 'replicas'" in str(err.value)
    assert "valid arguments: checkpoint_dir, pipeline," in str(err.value) and "max_replicas" in str(err.value)


@pytest.mark.parametrize("key, where", [("port", "http_options.port"), ("host", "http_options.host"),
                                        ("route_prefix", "--route-prefix"), ("app_name", "--name"),
                                        ("auth_token", "STREAMLEARN_SERVE_TOKEN")])
def test_where_it_listens_and_the_token_are_refused_with_their_place(key, where):
    with pytest.raises(ConfigError, match=f"'{key}' is not taken here") as err:
        ServeConfig.from_args({key: "some-long-value"})
    assert where in str(err.value)


def test_serve_calls_the_builder_and_gets_the_scorer_with_deploys_options(tmp_path):
    application = call_user_app_builder_with_args_if_necessary(
        app_builder, {"pipeline": "fraud", "checkpoint_dir": str(tmp_path), "max_replicas": "3", "num_cpus": "0.5"})
    deployment = application._bound_deployment  # pinned Ray 2.60
    config = deployment._deployment_config
    assert deployment.name == "Scorer" and deployment.init_args[0].checkpoint_dir == str(tmp_path)
    assert (config.autoscaling_config.min_replicas, config.autoscaling_config.max_replicas) == (1, 3)
    assert config.max_ongoing_requests == ServeConfig().max_ongoing_requests
    assert deployment.ray_actor_options["num_cpus"] == 0.5
    assert config.logging_config["enable_access_log"] is False


def test_a_pipeline_that_does_not_exist_fails_in_the_builder():
    with pytest.raises(PipelineError, match="pipeline .no-such-pipeline. not found"):
        app_builder({"pipeline": "no-such-pipeline"})


def test_a_proxy_slower_than_rays_fixed_60_s_does_not_fail_the_deploy(monkeypatch):
    """Ray 2.60's serve.start raises after 60 s while its proxies go on starting; deploy joins the
    controller with a second call (no Ray here: what is tested is the call sequence). Any other
    error, or a second timeout, is the caller's."""
    from streamlearn.serve import app

    calls = []

    def start(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise TimeoutError("HTTP proxies not available after 60s.")

    monkeypatch.setattr(app.serve, "start", start)
    cfg = ServeConfig(port=8123)
    app._start_serve(cfg)
    assert calls == [{"http_options": {"host": cfg.host, "port": 8123}}] * 2

    def never(**kwargs):
        raise TimeoutError("HTTP proxies not available after 60s.")

    monkeypatch.setattr(app.serve, "start", never)
    with pytest.raises(TimeoutError):
        app._start_serve(cfg)
