"""A served lineage without training: checkpoints written the way the trainer writes them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from pipelines.banking import LABEL
from streamlearn.pipeline import JoinedLabels, load_pipeline
from streamlearn.rundir import checkpoint

FRAUD = load_pipeline("fraud")
EVENT = {"event_id": "e-1", "event_time": 1_700_000_000_000, "customer_id": "c-42", "amount": 125.5,
         "currency": "EUR", "merchant_category": "electronics", "merchant_country": "NL", "channel": "ecom",
         "card_present": False, "customer_age": 37, "account_tenure_days": 800, "is_fraud": False}


def write_checkpoint(run_dir: Path, version: int, *, tamper: bool = False) -> Path:
    torch.manual_seed(version)
    meta = {"version": version, "offsets": {"0": 100 * version}, "counters": {"learned": 100 * version},
            "metrics": {"online": {"auc": 0.8, "logloss": 0.3, "window": 1000}, "train_loss": 0.3},
            "pipeline": FRAUD.describe(), "written_at": time.time(), "topic": "transactions"}
    # Written beside the run dir, tampered there, and renamed in: a scorer polling every 0.2 s once
    # loaded a tampered checkpoint in the moment between its valid write and the tampering, and
    # served it (a fresh-clone run, 12-04).
    staging = checkpoint.write(run_dir.parent / f".staging-{run_dir.name}-{version}", FRAUD.build_model().state_dict(),
                               None, meta)
    if tamper:  # a valid torch file with other weights: only the checksum can tell
        other = {k: v + 1.0 for k, v in FRAUD.build_model().state_dict().items()}
        torch.save({"model": other, "optimizer": None}, staging / "model.pt")
    path = run_dir / f"checkpoint_{version:09d}"
    run_dir.mkdir(parents=True, exist_ok=True)
    os.rename(staging, path)
    return path


class ShortChargebacks(load_pipeline("fraud_chargebacks").__class__):
    """Chargebacks by the window method (the join with `unlabelled_as`) and a 2-s chargeback
    window, what a test can wait out: fraud_chargebacks learned by delayed feedback until then."""

    name = "fraud-chargebacks-2s"
    labels = JoinedLabels(LABEL, ttl_s=2.0, unlabelled_as=0.0)


class MetricsFraud(load_pipeline("fraud").__class__):
    """The fraud pipeline under a name of its own: metrics are tagged by pipeline name, and Ray
    keeps exporting the counters of every earlier fraud run in the session, so a test that
    counts must own its series."""

    name = "fraud-metrics"


class _OneAtATime(torch.nn.Module):
    """A model whose forward holds a lock every process on the machine shares, for a fixed time:
    however many workers there are, the machine learns what one does (a shared bottleneck, as a
    feature store or a licensed scorer would be)."""

    LOCK = Path("/tmp/streamlearn-test-one-at-a-time.lock")
    HOLD_S = 0.008

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        import fcntl

        with self.LOCK.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            time.sleep(self.HOLD_S)
            return self.inner(x)


class SharedBottleneck(load_pipeline("fraud").__class__):
    """Fraud through a bottleneck a second worker cannot widen: batch 16 at 8 ms a step, at most
    2k events/s for the whole machine (~1k measured on a slow 2-core host: the step's own work)."""

    name = "fraud-shared-bottleneck"

    def build_model(self):
        return _OneAtATime(super().build_model())


class _Slow(torch.nn.Module):
    """A model whose training forward sleeps a fixed time in its own process: a worker learns at
    most batch / STEP_S events a second and a second worker, with its own, adds as much again on
    any machine (a model heavier than this host's cores, without taking them)."""

    STEP_S = 0.025

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if self.training:  # scoring (the matured signals, the gate's evidence) is not slowed
            time.sleep(self.STEP_S)
        return self.inner(x)


class SlowChargebacks(load_pipeline("fraud_chargebacks").__class__):
    """fraud_chargebacks at ~10k events/s a worker (batch 256), so that a burst asks for a second
    worker and a resize comes while reports are held back from learning."""

    name = "fraud-chargebacks-slow"

    def build_model(self):
        return _Slow(super().build_model())
