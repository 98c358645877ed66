"""The collectives a training group's ranks speak beside DDP's allreduce: rank 0's object to every
rank, and the per-window plan and slice sizes in one all_reduce. Used by the worker loop and by
the Ray Data stream, so below both."""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

# Room for a pickled plan in the per-window collective (`exchange`): a 4-partition window with
# labels is ~250 bytes, 64 partitions ~1.9 KB; a bigger plan goes in a broadcast of its own.
PLAN_BYTES = 4096


def broadcast(obj, rank: int):
    """Send rank 0's object to every rank (a no-op with one worker)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def exchange(plan, size: int, rank: int) -> tuple[Any, list[int]]:
    """Rank 0's `plan` to every rank and every rank's `size` to every rank, in one all_reduce:
    each rank fills only its own slots (zeros elsewhere), so the sum is the plan and the sizes.
    A window used to take three collectives for this (the plan's length, the plan, the sizes):
    6.7-12.4 ms a window with two ranks on this machine, against issue 12's 5 ms."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return plan, [size]
    world = dist.get_world_size()
    box = torch.zeros(1 + world + PLAN_BYTES // 8, dtype=torch.int64)
    box[1 + rank] = size
    room = box[1 + world:].view(torch.uint8)  # the plan's bytes, in the same tensor
    if rank == 0:
        data = pickle.dumps(plan)
        if len(data) <= PLAN_BYTES:
            box[0] = len(data)
            room[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            box[0] = -1
    dist.all_reduce(box)
    sizes, length = box[1:1 + world].tolist(), int(box[0])
    if length < 0:  # too big for the box: sent apart
        return broadcast(plan, rank), sizes
    return pickle.loads(room[:length].numpy().tobytes()), sizes  # noqa: S301 - from rank 0 of this group
