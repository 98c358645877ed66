"""Start a private local Ray head in this process, the way tests, benchmarks and the demo need it."""

from __future__ import annotations

from typing import Any


def start_local_ray(**kwargs: Any):
    """`ray.init(address="local")` (never join a cluster someone else left running), then record
    this head as the machine's current cluster, as `ray start` does. Ray's job supervisor finds
    the cluster a submitted job's driver connects to through that record; without it, a stale
    record from an earlier cluster sends the job's driver to a dead address."""
    import ray
    from ray._private.utils import write_ray_address  # what `ray start --head` calls; pinned Ray 2.60

    ctx = ray.init(address="local", **kwargs)
    write_ray_address(ctx.address_info["gcs_address"])
    return ctx
