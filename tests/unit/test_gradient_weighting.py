"""Lockstep DDP with uneven slices: two gloo ranks holding 300 and 100 events take one step each,
and the update equals the one a single process takes on the mean loss over all 400 events.

The loop sums each rank's per-event losses and scales by world / global count, so DDP's mean over
ranks is the mean over the global batch however unevenly a window split (an empty rank too).
Real torch.distributed (gloo, two processes), no Ray and no Kafka."""

import os
from unittest import mock

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipelines.fraud import Fraud
from streamlearn.phases import Phases
from streamlearn.train.drift import Watch
from streamlearn.train.learner import Learner, Shuffled

SIZES = (300, 100)


def _data():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(sum(SIZES), Fraud.n_features, generator=gen)
    y = (torch.rand(sum(SIZES), generator=gen) < 0.3).float()
    return x, y


def _model():
    torch.manual_seed(11)
    return Fraud().build_model()


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    x, y = _data()
    lo = sum(SIZES[:rank])
    x, y = x[lo:lo + SIZES[rank]], y[lo:lo + SIZES[rank]]
    model = torch.nn.parallel.DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    learner = Learner(model, optimizer, Fraud(), torch.device("cpu"), Watch(1000), Phases(rank))
    learner.steps(Shuffled(x, y, np.zeros(len(y), dtype=np.uint32), [len(y)], [sum(SIZES)], 2))
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    _leave()


def _leave() -> None:
    """Both ranks leave together, and without the interpreter's teardown: CI saw rank 1 abort
    twice ("terminate called without an active exception", SIGABRT), the second time with the
    barrier already in. That message is a C++ thread destroyed while still joinable, which points
    at teardown (C++ static destructors beside gloo's threads at exit), not at the work, whose
    errors would be Python exceptions. The result is on disk by now; exit as the work ends."""
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_uneven_slices_give_the_mean_gradient_over_the_global_batch(tmp_path):
    out = str(tmp_path / "after.pt")
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)

    x, y = _data()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    Fraud().loss(model(x), y).mean().backward()
    optimizer.step()
    after = torch.load(out)
    for name, value in model.state_dict().items():
        assert torch.allclose(after[name], value, atol=1e-6), name


def _batch(rank: int):
    from streamlearn.ingest.decode import Batch
    from streamlearn.ingest.windows import Window
    x, y = _data()
    lo = sum(SIZES[:rank])
    window = Window(seq=1, ranges={rank: (lo, lo + SIZES[rank])})
    return Batch(window, x[lo:lo + SIZES[rank]].numpy(), y[lo:lo + SIZES[rank]].numpy(),
                 np.zeros(SIZES[rank], dtype=np.uint32), bad=[])


def _alone(rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """One rank's slice learned in its own steps, as `--sync window` takes them before the average."""
    model = _model()
    optimizer = Fraud().make_optimizer(model.parameters())
    learner = Learner(model, optimizer, Fraud(), torch.device("cpu"), Watch(1000), Phases(rank), per_window=True)
    with mock.patch("streamlearn.train.learner.average"):  # the same steps as in the group, no average
        learner.learn(_batch(rank), list(SIZES), 64, 0, rank)
    return model, optimizer


def _window_rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    model = _model()
    optimizer = Fraud().make_optimizer(model.parameters())
    learner = Learner(model, optimizer, Fraud(), torch.device("cpu"), Watch(1000), Phases(rank), per_window=True)
    learner.learn(_batch(rank), list(SIZES), 64, 0, rank)
    torch.save((model.state_dict(), optimizer.state_dict()), f"{out}.{rank}")
    _leave()


def test_per_window_sync_ends_each_window_with_the_event_weighted_mean_on_every_rank(tmp_path):
    """`--sync window`: each rank steps on its own slice (ceil(300/64) = 5 steps each, the short
    rank's last ones empty), then weights and Adam's moments are averaged 3:1, as the events were
    split. Both ranks end with the same bits (a checkpoint of rank 0 is the group's), equal to the
    mean of what each rank learns alone."""
    out = str(tmp_path / "after")
    mp.spawn(_window_rank, args=(f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)
    (m0, o0), (m1, o1) = (torch.load(f"{out}.{r}") for r in (0, 1))
    for name in m0:
        assert torch.equal(m0[name], m1[name]), name
    for p, state in o0["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], o1["state"][p][key]), (p, key)

    alone = [_alone(r) for r in (0, 1)]
    share = [n / sum(SIZES) for n in SIZES]
    for name, value in m0.items():
        expected = sum(w * a[0].state_dict()[name] for w, a in zip(share, alone, strict=True))
        assert torch.allclose(value, expected, atol=1e-6), name
    for p, state in o0["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            expected = sum(w * a[1].state_dict()["state"][p][key] for w, a in zip(share, alone, strict=True))
            assert torch.allclose(state[key], expected, atol=1e-7), (p, key)
    assert not torch.allclose(m0["net.0.weight"], alone[0][0].state_dict()["net.0.weight"]), "no average"
