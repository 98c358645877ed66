"""The timeline's allreduce spans: a DDP communication hook that times buckets and changes nothing else."""

from __future__ import annotations

import copy
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from streamlearn.kafka.broker import free_port
from streamlearn.phases import Phases, trace_allreduce


def test_allreduce_hook_records_each_bucket_and_keeps_ddp_gradients(tmp_path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        base = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
        plain, traced = DistributedDataParallel(copy.deepcopy(base)), DistributedDataParallel(copy.deepcopy(base))
        assert not trace_allreduce(plain, Phases(0))  # no timeline: DDP keeps its own reduction
        phases = Phases(0, str(tmp_path / "tl"))
        assert trace_allreduce(traced, phases)
        x = torch.randn(32, 8)
        for model in (plain, traced):
            model(x).pow(2).mean().backward()
        for a, b in zip(plain.parameters(), traced.parameters(), strict=True):
            assert torch.allclose(a.grad, b.grad)
        phases.close()
    finally:
        dist.destroy_process_group()
    spans = [e for e in json.loads((tmp_path / "tl.rank0.json").read_text()) if e["name"] == "allreduce"]
    assert spans and all(e["tid"] == "allreduce" and e["dur"] >= 0 for e in spans)
    n_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    assert sum(e["args"]["bytes"] for e in spans) == n_bytes  # every gradient went through the hook
