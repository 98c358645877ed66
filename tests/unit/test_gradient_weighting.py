"""Lockstep DDP with uneven slices: two gloo ranks holding 300 and 100 events take one step each,
and the update equals the one a single process takes on the mean loss over all 400 events.

The loop sums each rank's per-event losses and scales by world / global count, so DDP's mean over
ranks is the mean over the global batch however unevenly a window split (an empty rank too).
Real torch.distributed (gloo, two processes), no Ray and no Kafka."""

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
    # Both ranks leave together: a rank that tears gloo down while its peer is still in a
    # collective's tail can abort the peer's transport thread ("terminate called without an
    # active exception", SIGABRT, seen once in CI).
    dist.barrier()
    dist.destroy_process_group()


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
