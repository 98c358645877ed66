"""Where a run's scale controller lives on Ray, and how a client finds it.

Light on purpose (no torch, no Kafka, Ray only when a lookup runs): `streamlearn status` and
`streamlearn drain` find the actor through this as the trainer names it, without importing the
controller's own module.
"""

from __future__ import annotations

from streamlearn.errors import ConfigError

NAMESPACE = "streamlearn"


def actor_name(run_name: str) -> str:
    return f"scaler-{run_name}"


def find_controller(run_name: str):
    """Run `run_name`'s controller on the Ray cluster this process joined; ConfigError, saying
    what to check, when no such run trains there."""
    import ray

    name = actor_name(run_name)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise ConfigError(f"no actor {name!r} in Ray namespace {NAMESPACE!r}: is `streamlearn train` (run name "
                          f"{run_name!r}) running on this cluster? Pass --run-name otherwise") from None
