"""What a training worker loads before Ray hands it an actor, and the runtime envs a resize's
warm pool (streamlearn/autoscale/warmpool.py) must start processes in to be taken.

Ray gives an idle worker process to a new actor only if the process was started in the same
runtime env (the serialized env's hash). A group's start is mostly processes starting and
importing (DECISIONS §17): processes started ahead, in the envs the next group will ask for,
with torch and the loop imported while they wait, take that off the resize's path.

Kept light: Ray Train's controller imports this module when it unpickles the run config.
"""

from __future__ import annotations

import ray
import ray.train

from streamlearn.logs import log

# Ray 2.60 runs the function this variable names (module.function) in a worker process after
# it connects and before it takes work: what `runtime_env={"worker_process_setup_hook": ...}`
# becomes for a job. Set for the training workers' env alone: Ray converts the public field only
# at `ray.init`, not in an actor's runtime env (checked). Internal; Ray is pinned < 2.61.
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
WORKER_RUNTIME_ENV = {"env_vars": {SETUP_HOOK_ENV: f"{__name__}.preload"}}


def preload() -> None:
    """Import what every training worker imports first: ~3 s of a core on a quiet machine, more
    on a loaded one. In a process the warm pool started, this runs while it waits idle."""
    try:
        import ray.train.torch  # noqa: F401

        import streamlearn.train.loop  # noqa: F401
        from streamlearn.train.optim import keep_dynamo_out

        keep_dynamo_out()  # the loop's optimizer then does not import torch._dynamo (train/optim.py)
    except Exception as e:  # the loop imports them again and fails there, with its own message
        log("preload_failed", level="warning", error=str(e)[:200])


class EnvReport(ray.train.UserCallback):
    """Runs in Ray Train's controller: tells the scale controller the runtime env the controller
    process runs in (its helper actors inherit it) and its node, at the group's first report.
    A rank tells it the workers' env (train/coordinator.py)."""

    def __init__(self, scale_controller):
        self.scale_controller, self.sent = scale_controller, False

    def after_report(self, run_context, metrics, checkpoint) -> None:
        if self.sent or self.scale_controller is None:
            return
        self.sent = True
        try:
            ctx = ray.get_runtime_context()
            self.scale_controller.learn_env.remote("controller", ctx.get_runtime_env_string(), ctx.get_node_id())
        except Exception as e:  # the pool is an optimization: never fail Ray Train's controller for it
            log("env_report_failed", level="warning", error=str(e)[:200])
