import numpy as np

from streamlearn.prequential import SlidingWindow, roc_auc, summarize


def test_auc_matches_definition():
    rng = np.random.default_rng(0)
    scores, labels = rng.random(300), (rng.random(300) < 0.3).astype(float)
    pos, neg = scores[labels == 1], scores[labels == 0]
    expected = np.mean(pos[:, None] > neg[None, :]) + 0.5 * np.mean(pos[:, None] == neg[None, :])
    assert abs(roc_auc(scores, labels) - expected) < 1e-12


def test_constant_model_has_auc_half_and_one_class_none():
    assert roc_auc(np.full(10, 0.3), np.array([0, 1] * 5, dtype=float)) == 0.5
    assert roc_auc(np.ones(4), np.zeros(4)) is None


def test_window_keeps_only_the_most_recent_events():
    w = SlidingWindow(5)
    for i in range(4):
        w.add(np.full(3, float(i)), np.zeros(3))
    scores, _ = w.arrays()
    assert scores.tolist() == [2.0, 2.0, 3.0, 3.0, 3.0]


def test_regression_metrics():
    m = summarize("regression", np.array([1.0, 2.0]), np.array([1.0, 4.0]))
    assert m["mae"] == 1.0 and abs(m["rmse"] - np.sqrt(2.0)) < 1e-12
