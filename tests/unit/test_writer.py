"""The background checkpoint writer keeps the synchronous contract: in order, offsets committed
only once the checkpoint holding them is durable, state frozen at the window boundary, failures
raised in the training thread; and a restore loads exactly the weights that were written."""

import threading

import pytest
import torch

from pipelines.fraud import Fraud
from streamlearn.config import TrainConfig
from streamlearn.errors import CheckpointError
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.train.loop import _restore
from streamlearn.train.writer import CheckpointWriter, Reporter


def test_checkpoints_publish_in_order_and_commit_only_what_is_on_disk(tmp_path):
    commits = []

    def commit(offsets):
        newest = ckpt.newest(tmp_path)  # the checkpoint holding these offsets must already be durable
        assert newest is not None and ckpt.read_meta(newest)["offsets"] == {str(p): o for p, o in offsets.items()}
        commits.append(offsets)

    done = []
    writer = CheckpointWriter(tmp_path, keep=3, commit=commit)
    for version in range(1, 7):
        offsets = {0: version * 10}
        writer.submit(version, {"w": torch.full((2,), float(version))}, None,
                      {"version": version, "offsets": offsets}, offsets, then=lambda v=version: done.append(v))
    writer.drain()
    writer.close()
    assert done == [1, 2, 3, 4, 5, 6]
    assert commits == [{0: v * 10} for v in range(1, 7)]
    assert [v for v, _ in ckpt.list_checkpoints(tmp_path)] == [4, 5, 6]  # pruned to `keep`


def test_the_state_is_frozen_when_submitted_not_when_written(tmp_path):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    writer = CheckpointWriter(tmp_path, keep=2, commit=lambda offsets: None)
    busy = threading.Event()
    writer._pool.submit(busy.wait)  # the writer is still on an earlier checkpoint
    writer.submit(1, model.state_dict(), optimizer.state_dict(), {"version": 1}, {}, then=lambda: None)
    with torch.no_grad():  # the next window's steps, before the writer gets to this checkpoint
        for p in model.parameters():
            p.add_(1.0)
    busy.set()
    writer.drain()
    written, _opt, _meta = ckpt.load(ckpt.newest(tmp_path))
    for name, value in expected.items():
        assert torch.equal(written[name], value)


def test_a_failed_write_is_raised_at_the_next_checkpoint_or_the_drain(tmp_path):
    writer = CheckpointWriter(tmp_path, keep=2, commit=lambda offsets: None)
    writer.submit(1, {"w": torch.ones(1)}, None, {"version": 1}, {}, then=lambda: None)
    writer.submit(1, {"w": torch.ones(1)}, None, {"version": 1}, {}, then=lambda: None)  # the same version twice
    with pytest.raises(CheckpointError, match="versions only move forward"):
        writer.drain()
    writer.close()


def test_a_restore_loads_exactly_the_weights_and_optimizer_state_that_were_checkpointed(tmp_path):
    pipeline = Fraud()
    torch.manual_seed(3)
    model = pipeline.build_model()
    optimizer = pipeline.make_optimizer(model.parameters())
    for _ in range(3):
        optimizer.zero_grad()
        pipeline.loss(model(torch.randn(16, pipeline.n_features)), torch.rand(16).round()).mean().backward()
        optimizer.step()
    cfg = TrainConfig(checkpoint_dir=str(tmp_path), run_name="r")
    ckpt.publish(tmp_path / "r", 7, model.state_dict(), optimizer.state_dict(), {"version": 7})

    state, opt_state, meta, _arrays, _path = _restore(cfg, rank=0)
    fresh = pipeline.build_model()  # a different init: everything must come from the checkpoint
    fresh.load_state_dict(state)
    fresh_opt = pipeline.make_optimizer(fresh.parameters())
    fresh_opt.load_state_dict(opt_state)
    assert meta["version"] == 7
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for key, value in optimizer.state_dict()["state"][0].items():
        assert torch.equal(value, fresh_opt.state_dict()["state"][0][key]), key


def test_the_meta_is_frozen_too(tmp_path):
    """The lineage's offsets dict lives on and moves with the next windows: the checkpoint must keep
    the offsets of the boundary it was taken at."""
    writer = CheckpointWriter(tmp_path, keep=2, commit=lambda offsets: None)
    busy = threading.Event()
    writer._pool.submit(busy.wait)
    offsets = {0: 100}
    writer.submit(1, {"w": torch.ones(1)}, None, {"version": 1, "offsets": offsets}, offsets, then=lambda: None)
    offsets[0] = 200  # the next window is learned before the writer gets to this checkpoint
    busy.set()
    writer.drain()
    assert ckpt.read_meta(ckpt.newest(tmp_path))["offsets"] == {"0": 100}


def test_ray_gets_a_group_s_first_every_kth_and_last_checkpoint_metrics():
    """Each `ray.train.report` is a barrier across ranks: a group reports one checkpoint in `every`,
    and never leaves Ray's view without its first or its last."""
    reported = []
    reporter = Reporter(lambda metrics: reported.append(metrics["version"]), every=5)
    for version in range(1, 13):
        reporter.submit({"version": version})
    reporter.close()
    assert reported == [1, 5, 10, 12]

    failing = []
    reporter = Reporter(lambda metrics: failing.append(metrics["version"]), every=5)
    for version in range(1, 4):
        reporter.submit({"version": version})
    reporter.close(wait=False)  # a failing worker must not wait on the other ranks' barrier
    reporter._thread.join(5)
    assert failing == [1]
