"""`--sync window`: a group's ranks step on their own slices of a window and become one model again
at its end, in one allreduce of the weights and the optimizer's moments, each rank weighted by the
events it learned. DDP's alternative costs an allreduce a step (~1.3 ms on gloo here against a
~0.5 ms step of the fraud MLP: DECISIONS, "How workers stay one model").

After the average every rank holds the same bits (the reduction's result is what each receives),
so rank 0's checkpoint is the group's model, a restore puts every rank where the group was, and a
replayed window is learned as the first time (the same world size gives the same weights)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What makes two ranks' learners the same one: the weights, floating buffers and each
    parameter's optimizer moments (Adam's exp_avg and exp_avg_sq). Adam's step count is left out:
    every rank takes the same number of steps a window, so it is already equal."""
    tensors = _weights(model)
    for p in model.parameters():
        for name, value in sorted(optimizer.state.get(p, {}).items()):
            if name != "step" and torch.is_tensor(value) and value.is_floating_point():
                tensors.append(value)
    return tensors


def average(model: torch.nn.Module, optimizer: torch.optim.Optimizer, weight: float) -> None:
    """Replace every rank's state with the weighted mean over the ranks, `weight` being this rank's
    share of the window's events (the shares sum to 1: no division after the sum, so the result
    is the same on every rank, bit for bit)."""
    tensors = state_tensors(model, optimizer)
    flat = torch.cat([t.reshape(-1) for t in tensors]) * weight
    dist.all_reduce(flat)
    _scatter(flat, tensors)


def same_start(model: torch.nn.Module) -> None:
    """Every rank starts from rank 0's weights, as DDP's wrapper would have made them: a pipeline's
    model need not be built deterministically from the seed."""
    tensors = _weights(model)
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.broadcast(flat, src=0)
    _scatter(flat, tensors)


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.data for p in model.parameters()] + [b for b in model.buffers() if b.is_floating_point()]


def _scatter(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
