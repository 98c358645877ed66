"""The per-window collective: rank 0's plan and every rank's batch size, in one all_reduce.

Real torch.distributed (gloo, three processes), no Ray and no Kafka: every rank must get rank
0's window exactly (with labels, flags and all) and every rank's size by rank, a plan too big
for the box must still arrive (sent apart), and None (no plan due) must come through as None."""

import json

import torch.distributed as dist
import torch.multiprocessing as mp

from streamlearn.collectives import PLAN_BYTES, exchange
from streamlearn.ingest.windows import Window

WORLD = 3


def _windows() -> list:
    small = Window(7, {p: (1000 + p, 9192 + p) for p in range(4)}, checkpoint=True,
                   labels={p: (50 + p, 70 + p) for p in range(4)})
    big = Window(8, {p: (10**12 + p, 10**12 + 8192 + p) for p in range(PLAN_BYTES // 8)}, stop=True)
    return [small, big, None]


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    got = []
    for i, window in enumerate(_windows()):
        size = 100 * (rank + 1) + i
        plan, sizes = exchange(window if rank == 0 else None, size, rank)
        got.append({"plan": repr(plan), "sizes": sizes})
    with open(f"{out}.{rank}", "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


def test_every_rank_gets_rank0s_plan_and_every_size(tmp_path):
    out = str(tmp_path / "got")
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", out), nprocs=WORLD, join=True)
    expected = [{"plan": repr(w), "sizes": [100 * (r + 1) + i for r in range(WORLD)]}
                for i, w in enumerate(_windows())]
    for rank in range(WORLD):
        with open(f"{out}.{rank}") as f:
            assert json.load(f) == expected, rank


def test_one_rank_needs_no_collective():
    window = _windows()[0]
    assert exchange(window, 42, 0) == (window, [42])
