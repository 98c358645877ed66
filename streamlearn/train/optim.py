"""torch.optim without torch._dynamo: a training worker that never compiles never imports it.

torch 2.15's optimizers import torch._dynamo on first use: `add_param_group` (run by every
optimizer's constructor), `zero_grad`, `state_dict` and `load_state_dict` are wrapped by
`torch._disable_dynamo`, which imports it to build the disabled function on its first call, and
`step()`'s wrapper imports it to call `graph_break()`, a no-op outside a compile. That import
is 900 modules, 1.2-2 s of a core in every training worker that starts (a group's start, a
restart after a fault, a resize), about a third of what the worker imports (measured,
docs/DECISIONS.md §17). streamlearn never compiles a model, so:

- `keep_dynamo_out()` fills `torch._disable_dynamo`'s own cache (the attribute it looks for
  before importing) with the plain functions: what the wrapper does under no compile.
- `plain_step(optimizer)` is `optimizer.step()` as its wrappers run it outside a compile (grad
  off, no hooks), without them. An optimizer with hooks, or built `differentiable`, keeps its
  own `step`.

A torch whose wrappers change shape only brings the import back (tests/unit/test_optim.py
checks both the import and that the weights are bitwise those of `optimizer.step()`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch.optim import Optimizer
from torch.optim import optimizer as optimizer_module

_DISABLED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
_CACHE = "__dynamo_disable"  # the attribute torch._compile._disable_dynamo caches its result in


def keep_dynamo_out() -> None:
    """Before the first optimizer is built. Idempotent; a no-op once torch._dynamo is in."""
    for name in _DISABLED:
        fn = getattr(getattr(Optimizer, name), "__wrapped__", None)
        if fn is not None and getattr(fn, _CACHE, None) is None:
            setattr(fn, _CACHE, fn)


def plain_step(optimizer: Optimizer) -> Callable[[], None]:
    """A function that takes one step of `optimizer` as `optimizer.step()` does outside a compile."""
    raw = inspect.unwrap(type(optimizer).step)
    hooked = (optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
              or optimizer_module._global_optimizer_pre_hooks or optimizer_module._global_optimizer_post_hooks)
    if raw is type(optimizer).step or hooked or optimizer.defaults.get("differentiable"):
        return optimizer.step

    def step() -> None:
        with torch.no_grad():  # what step()'s wrapper sets for an optimizer that is not differentiable
            raw(optimizer)

    return step
