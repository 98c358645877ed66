"""Where a run's scale controller lives on Ray, and how a client finds and asks it.

Light on purpose (no torch, no Kafka, Ray only when a lookup runs): `streamlearn status` and
`streamlearn drain` find the actor through this as the trainer names it, without importing the
controller's own module (~0.4 s more than Ray's).
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


def request_drain(run_name: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Ask run `run_name` (on the Ray cluster this process joined) to learn what its topic holds
    now and end: the exactly-once end of a run whose producers have finished, without waiting
    out an idle stop. Returns the end offsets it drains to; ConfigError when no such run trains."""
    import ray

    return ray.get(find_controller(run_name).drain.remote(), timeout=timeout_s)
