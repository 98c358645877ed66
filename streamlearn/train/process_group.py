"""Ray Train's torch process group, set up by a Train controller that never imports torch.

Ray Train's controller unpickles the trainer's backend config at every group start, and
`ray.train.torch.TorchConfig` lives in a module that imports torch: ~2 CPU-s and as long of
a group's start on two cores, in a process that never touches a tensor (its process mapped
libtorch; it does not with this config). `TorchGroup` sets up the same process group with
Ray's own functions, called on the workers, which import torch anyway. Only what we use:
gloo or NCCL, rendezvous through the environment; no TPU. Ray is pinned to 2.60 (pyproject).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray
from ray.train.backend import Backend, BackendConfig


@dataclass
class TorchGroup(BackendConfig):
    backend: str = "gloo"  # "nccl" on GPUs
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _Backend

    @property
    def train_func_context(self):
        return _WorkerDevice

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework  # internal; Ray is pinned to 2.60

        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class _Backend(Backend):
    share_cuda_visible_devices = True  # as Ray's torch backend: NCCL sees every GPU of the node

    def on_start(self, worker_group, backend_config: TorchGroup):
        from ray.train._internal.utils import get_address_and_port

        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_rendezvous_env, address=address, port=port)
        ray.get([worker_group.execute_single_async(rank, _init_process_group, backend=backend_config.backend,
                                                   world_rank=rank, world_size=len(worker_group),
                                                   init_method="env://", timeout_s=backend_config.timeout_s)
                 for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config: TorchGroup):
        from ray._private.ray_constants import env_integer
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        try:  # Ray's own shutdown timeout, its environment variable honoured as Ray's backend does
            ray.get(worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1),
                    timeout=env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                        DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S))
        except GetTimeoutError:
            pass  # a worker stuck in a collective: the group's processes are killed next anyway


# Run on the workers: each imports Ray's torch backend there, where torch is loaded already.

def _rendezvous_env(address: str, port: int) -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars  # LOCAL_RANK and the rest

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    _set_torch_distributed_env_vars()


def _init_process_group(**kwargs) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(**kwargs)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy_process_group)


class _WorkerDevice:
    """Around the training function on a worker: Ray's own (a GPU worker's default CUDA device)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        TorchConfigContextManager().__enter__()

    def __exit__(self, *exc):
        return False
