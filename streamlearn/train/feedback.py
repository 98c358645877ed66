"""Delayed feedback: learn every event at once as the silent answer, and again when its report comes.

A bank hears of a fraud weeks after the payment (a chargeback) and of a legitimate payment never.
Learning each event at once with the silent label (0) and again with 1 when its report comes
(Ktena et al., RecSys 2019) needs no waiting state, but the stream the model learns is biased:
each fraud is seen twice, once as a fake negative, so it learns b(fraud | x) = p / (1 + p) rather
than p. Two corrections, both from that paper:

- FNW (fake negative weighted): weight each row's log loss so its expectation under the biased
  stream equals the loss under the true one; the model then estimates p itself.
- FNC (fake negative calibration): learn b plainly and convert its scores, p = b / (1 - b).

The weights use the model's own prediction as p, taken without gradient (the paper's choice).
"""

from __future__ import annotations

import torch


def fake_negative_weights(probability: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """FNW's per-row weights for targets of 0 or 1: 1 + p for a report (1), (1 - p)(1 + p) for a
    silent row (0), as 1 + p(y - (1 - y)p). `probability` is the model's (a sigmoid's, in [0, 1]).
    Four tensor ops a step where `where` over both branches took eight: each op gives up the GIL
    and takes it back, and in a worker (beside its checkpoint writer's thread) the eight cost ~75 us
    a step where a quiet process shows ~30 (the forward phase, load/bench/feedback_delay.py)."""
    p = probability.detach()
    return torch.addcmul(target, 1.0 - target, p, value=-1.0).mul_(p).add_(1.0)


def fake_negative_calibrated(biased: torch.Tensor) -> torch.Tensor:
    """FNC: the true fraud probability from a model that learned the biased stream, p = b / (1 - b)
    (b is at most 1/2 when every fraud is reported: clamped for the scores beyond it)."""
    b = biased.clamp(0.0, 0.5)
    return b / (1.0 - b)
