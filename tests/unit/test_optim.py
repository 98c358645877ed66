"""train/optim.py: a worker's optimizer learns bitwise as `optimizer.step()` does, and never
imports torch._dynamo (1.2-2 s of a core in every training worker that starts)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from streamlearn.config import REPO_ROOT
from streamlearn.train.optim import keep_dynamo_out, plain_step

# A fresh interpreter: this one may have imported torch._dynamo already.
A_WORKERS_OPTIMIZER = """
import sys
import torch
from streamlearn.train.optim import keep_dynamo_out, plain_step
from streamlearn.pipeline import load_pipeline
keep_dynamo_out()
pipeline = load_pipeline("fraud")
model = pipeline.build_model()
optimizer = pipeline.make_optimizer(model.parameters())
step = plain_step(optimizer)
x = torch.randn(64, next(model.parameters()).shape[1])
for _ in range(3):
    optimizer.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    step()
optimizer.load_state_dict(optimizer.state_dict())
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""


def test_a_workers_optimizer_builds_steps_saves_and_restores_without_torch_dynamo():
    done = subprocess.run([sys.executable, "-c", A_WORKERS_OPTIMIZER], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]


def _learn(make_optimizer, plain: bool, steps: int = 40) -> list[torch.Tensor]:
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = make_optimizer(model.parameters())
    step = plain_step(optimizer) if plain else optimizer.step
    data = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x, y = torch.randn(32, 12, generator=data), torch.rand(32, 1, generator=data)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make_optimizer", [
    lambda params: torch.optim.Adam(params, lr=0.01, fused=True),  # the pipelines' default
    lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
], ids=["fused-adam", "adamw", "sgd-momentum"])
def test_the_plain_step_learns_the_weights_of_optimizer_step_bitwise(make_optimizer):
    keep_dynamo_out()
    plain, wrapped = _learn(make_optimizer, plain=True), _learn(make_optimizer, plain=False)
    assert all(torch.equal(a, b) for a, b in zip(plain, wrapped, strict=True))


def test_an_optimizer_with_hooks_or_differentiable_keeps_its_own_step():
    params = [torch.zeros(2, requires_grad=True)]
    hooked = torch.optim.SGD(params, lr=0.1)
    calls = []
    hooked.register_step_pre_hook(lambda *_: calls.append("pre"))
    step = plain_step(hooked)
    params[0].grad = torch.ones(2)
    step()
    assert calls == ["pre"]
    differentiable = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1, differentiable=True)
    assert plain_step(differentiable) == differentiable.step
