"""Real fraud models for the quality gate's tests: one learned on the generator's labels, one on
the same events with the labels shuffled (a truly worse model), and fresh events to judge them
on, as the trainer writes them into a checkpoint (train/evidence.py)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from streamlearn.loadgen.generator import BankingSimulator
from streamlearn.pipeline import load_pipeline

FRAUD = load_pipeline("fraud")


@functools.cache
def events(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    sim = BankingSimulator(seed, drift_at=None)
    batch = sim.events(n)
    return FRAUD.features(batch), FRAUD.targets(batch)


@functools.cache
def _state(shuffled: bool) -> dict[str, torch.Tensor]:
    features, targets = events(7, 40_000)
    if shuffled:
        targets = np.random.default_rng(3).permutation(targets)
    torch.manual_seed(0)
    model = FRAUD.build_model()
    optimizer = FRAUD.make_optimizer(model.parameters())
    x, y = torch.from_numpy(features), torch.from_numpy(targets)
    for _epoch in range(2):
        for start in range(0, len(x), 256):
            loss = FRAUD.loss(model(x[start:start + 256]), y[start:start + 256]).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def state(quality: str) -> dict[str, torch.Tensor]:
    """`good`: learned on the true labels (AUC ~0.9 on fresh events); `bad`: on shuffled ones (~0.5)."""
    return {k: v.clone() for k, v in _state(quality == "bad").items()}


def scores(model_state: dict[str, torch.Tensor], features: np.ndarray) -> np.ndarray:
    model = FRAUD.build_model()
    model.load_state_dict(model_state)
    with torch.inference_mode():
        return FRAUD.score(model(torch.from_numpy(features))).numpy()


def evidence(model_state: dict[str, torch.Tensor], seed: int, n: int = 4096) -> dict[str, np.ndarray]:
    """Fresh events (`seed`) scored by `model_state`, as a checkpoint's evidence.npz holds them."""
    features, targets = events(1000 + seed, n)
    return {"features": features, "scores": scores(model_state, features).astype(np.float32), "targets": targets}
