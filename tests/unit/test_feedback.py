"""Fake-negative weighting and calibration (streamlearn/train/feedback.py): a stream where every
fraud is learned first as legitimate and again as fraud must still teach the true probability."""

from __future__ import annotations

import numpy as np
import torch

from streamlearn.ingest.decode import feature_width
from streamlearn.phases import Phases
from streamlearn.pipeline import load_pipeline
from streamlearn.train.drift import Watch
from streamlearn.train.feedback import fake_negative_calibrated, fake_negative_weights
from streamlearn.train.learner import Learner, Shuffled


def test_the_weighted_loss_on_the_biased_stream_is_the_true_loss_in_expectation():
    p = torch.tensor([0.01, 0.2, 0.5, 0.9])  # the true fraud probability, and the model's
    loss_fraud, loss_legit = torch.tensor(1.7), torch.tensor(0.3)  # any two losses
    # Each fraud is a row of 0 and a row of 1: the stream's share of 1-rows is p / (1 + p).
    biased_fraud, biased_legit = p / (1 + p), 1 / (1 + p)
    weighted = (biased_fraud * fake_negative_weights(p, torch.ones(4)) * loss_fraud
                + biased_legit * fake_negative_weights(p, torch.zeros(4)) * loss_legit)
    assert torch.allclose(weighted, p * loss_fraud + (1 - p) * loss_legit)


def test_learning_a_biased_stream_recovers_the_true_rate_with_either_correction():
    """One logit learns a stream of events that are fraud with probability 0.2, each fraud seen twice
    (first as legitimate): plain log loss learns 0.2 / 1.2; FNW learns 0.2; FNC turns the first into 0.2."""
    torch.manual_seed(0)
    fraud = (torch.rand(20_000) < 0.2).float()
    rows = torch.cat([torch.zeros(len(fraud)), torch.ones(int(fraud.sum()))])  # arrivals, then reports

    def learn(weighted: bool) -> float:
        logit = torch.zeros(1, requires_grad=True)
        optimizer = torch.optim.Adam([logit], lr=0.05)
        for _ in range(400):
            y = rows[torch.randint(len(rows), (512,))]
            output = logit.expand(len(y))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(output, y, reduction="none")
            if weighted:
                loss = loss * fake_negative_weights(torch.sigmoid(output), y)
            optimizer.zero_grad()
            loss.mean().backward()
            optimizer.step()
        return float(torch.sigmoid(logit.detach()))

    true, plain = 0.2, learn(weighted=False)
    assert abs(plain - true / (1 + true)) < 0.02
    assert abs(learn(weighted=True) - true) < 0.02
    assert abs(float(fake_negative_calibrated(torch.tensor(plain))) - true) < 0.03


def test_calibration_clamps_scores_beyond_what_the_biased_stream_allows():
    assert fake_negative_calibrated(torch.tensor([0.0, 0.5, 0.9])).tolist() == [0.0, 1.0, 1.0]



def test_the_trainer_learns_the_fake_negative_weighted_loss():
    """The training loop's step (train/learner.py) moves the model as the weighted loss written out
    plainly does: the weights on the loss, the score they take without gradient."""
    pipeline = load_pipeline("fraud_chargebacks")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, feature_width(pipeline), generator=gen)
    y = (torch.rand(64, generator=gen) < 0.3).float()
    trained, plain, fresh = (_model(pipeline) for _ in range(3))
    trainer = Learner(trained, torch.optim.SGD(trained.parameters(), lr=0.5), pipeline, torch.device("cpu"),
                      Watch(1000), Phases(0))
    assert trainer.fake_negatives
    trainer.steps(Shuffled(x, y, np.zeros(64, np.uint32), [64], [64], 1))
    output = plain(x)
    (pipeline.loss(output, y) * fake_negative_weights(torch.sigmoid(output), y)).mean().backward()
    torch.optim.SGD(plain.parameters(), lr=0.5).step()
    for a, b, before in zip(trained.parameters(), plain.parameters(), fresh.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
        assert not torch.equal(a, before)


def _model(pipeline):
    torch.manual_seed(5)
    return pipeline.build_model()
