"""Ray worker processes started ahead of a resize, in the runtime envs its actors will ask for.

A new group's start was mostly processes starting and importing (DECISIONS §17): Ray Train's
controller and its helpers on the driver's node, a worker per bundle. Ray gives an idle process
to a new actor when both were started in the same runtime env (train/preload.py), so when a
resize is wanted the scale controller asks the raylets to start them now: the controller's
family on its node while the autoscaler adds room, and a worker on each node with a free
worker's room, where the new group's placement group will go. The workers import torch and the
loop while they wait. A process nobody takes is stopped by its raylet after KEEP_ALIVE_S.

The envs are learned from the running processes (`learn`), never built here: the raylet compares
the serialized string, byte for byte. A worker's is what Ray's core worker rewrote after merging
it with the controller's (sorted keys, no spaces), the controller's what Ray's Python API wrote
(spaces), each holding the variables Ray Train propagates from the driver; a process started in
a string built from the same dict with other spacing or key order was never taken (measured).

The same processes stand by for a failure (`standby`): once a group has learned for
STANDBY_AFTER_S (its own start's CPU spent), a whole group's worker processes are started beside
it, on the nodes its workers run on, and kept STANDBY_KEEP_S; when a worker dies, Ray Train's
restart of the group takes them instead of starting and importing new ones (issue 47's recovery
figure, docs/bench/faults.json). Each group start, a restart included, arms it again.

Through the raylet's PrestartWorkers RPC (Ray 2.60 has no Python API for it): internal, pinned
with Ray, and never on the path of a resize or a restart: a failed request is logged and Ray
starts the processes itself, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamlearn.logs import log

# Ray Train 2.60 starts these in the controller's env for every group: the TrainController, its
# SynchronizationActor and PlacementGroupCleaner (we turn off the DatasetManager and the
# preemption watcher: train/trainer.py).
CONTROLLER_FAMILY = 3
KEEP_ALIVE_S = 180  # longer than a resize's wait for room (--warm-wait, 60 s by default) and its start
# A group's standby: after its first seconds, whose CPU its start needs (on 2 cores a standby's
# imports beside a starting group slow both); kept half an hour, then started anew, ~0.4 GB a process.
STANDBY_AFTER_S, STANDBY_KEEP_S = 20.0, 1800


@dataclass(frozen=True)
class Prestart:
    node_id: str
    role: str  # "controller" or "worker": whose runtime env
    count: int


def plan(envs: dict[str, str], controller_node: str | None, free_cpus: dict[str, float], workers: int,
         cpus_per_worker: float, sent: dict[tuple[str, str], int]) -> list[Prestart]:
    """What to start now for a resize to `workers`, given what this resize started already
    (`sent`, by node and role): the controller's family once on its node, and a worker for
    each worker's room free on a node, `workers` at most in all."""
    out = []
    if "controller" in envs and controller_node and (controller_node, "controller") not in sent:
        out.append(Prestart(controller_node, "controller", CONTROLLER_FAMILY))
    if "worker" in envs:
        left = workers - sum(n for (_, role), n in sent.items() if role == "worker")
        for node, free in sorted(free_cpus.items(), key=lambda kv: -kv[1]):
            take = min(int(free / cpus_per_worker + 1e-9) - sent.get((node, "worker"), 0), left)
            if take > 0:
                out.append(Prestart(node, "worker", take))
                left -= take
    return out


class WarmPool:
    """Lives in the scale controller (autoscale/controller.py), which calls `prepare` while a
    resize is wanted and `reset` when it is over."""

    def __init__(self, cpus_per_worker: float, pipeline: str):
        self.cpus_per_worker, self.pipeline = cpus_per_worker, pipeline
        self.envs: dict[str, str] = {}
        self.controller_node: str | None = None
        self.sent: dict[tuple[str, str], int] = {}  # this resize's requests: processes by (node, role)
        self.standby_at: float | None = None  # when the running group's standby is due

    def learn(self, role: str, env: str, node_id: str | None = None) -> None:
        self.envs[role] = env
        if role == "controller":
            self.controller_node = node_id

    def prepare(self, workers: int) -> None:
        if not self.envs:
            return  # the first group has not told us its envs yet
        try:
            todo = plan(self.envs, self.controller_node, _free_cpus(), workers, self.cpus_per_worker, self.sent)
            nodes = _raylets() if todo else {}
            for p in todo:
                if p.node_id not in nodes:
                    continue  # gone since we looked
                _prestart(nodes[p.node_id], self.envs[p.role], p.count)
                self.sent[(p.node_id, p.role)] = self.sent.get((p.node_id, p.role), 0) + p.count
                log("warm_pool_prestart", pipeline=self.pipeline, node=p.node_id[:12], role=p.role, count=p.count)
        except Exception as e:  # an optimization: the resize goes on with processes Ray starts itself
            log("warm_pool_failed", level="warning", pipeline=self.pipeline, error=str(e)[:200])

    def reset(self) -> None:
        self.sent = {}

    def group_started(self, now: float) -> None:
        """A group (a resize's, or Ray Train's restart after a failure) is starting: its standby
        after STANDBY_AFTER_S (the last one's processes went to this group, or are for a size it
        no longer has)."""
        self.standby_at = now + STANDBY_AFTER_S

    def standby(self, now: float) -> None:
        """While the running group learns: its standby when due (see the module's docstring)."""
        if self.standby_at is None or now < self.standby_at or "worker" not in self.envs:
            return
        self.standby_at = now + STANDBY_KEEP_S - 60  # anew before these expire
        try:
            nodes = _raylets()
            for node, count in _train_worker_nodes().items():
                if node in nodes:
                    _prestart(nodes[node], self.envs["worker"], count, STANDBY_KEEP_S)
                    log("warm_pool_standby", pipeline=self.pipeline, node=node[:12], count=count)
        except Exception as e:  # an optimization: a restart goes on with processes Ray starts itself
            log("warm_pool_failed", level="warning", pipeline=self.pipeline, error=str(e)[:200])


def _free_cpus() -> dict[str, float]:
    import ray._private.state  # internal; Ray is pinned to 2.60

    return {node: res.get("CPU", 0.0) for node, res in ray._private.state.available_resources_per_node().items()}


def _raylets() -> dict[str, str]:
    """Each live node's raylet address, by node id."""
    import ray

    return {n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}" for n in ray.nodes() if n["Alive"]}


def _train_worker_nodes() -> dict[str, int]:
    """Ray Train's live workers by node: where a restarted group's workers will want processes."""
    import ray._private.state  # internal; Ray is pinned to 2.60

    nodes: dict[str, int] = {}
    for actor in ray._private.state.actors().values():
        if actor.get("ActorClassName") == "RayTrainWorker" and actor.get("State") == "ALIVE":
            node = actor["Address"]["NodeID"]
            nodes[node] = nodes.get(node, 0) + 1
    return nodes


def _prestart(raylet: str, serialized_env: str, count: int, keep_alive_s: int = KEEP_ALIVE_S) -> None:
    from ray._private.grpc_utils import init_grpc_channel  # sends the cluster's auth token when it has one
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

    channel = init_grpc_channel(raylet)
    try:
        request = node_manager_pb2.PrestartWorkersRequest(language=common_pb2.PYTHON, num_workers=count,
                                                          keep_alive_duration_secs=keep_alive_s)
        request.runtime_env_info.serialized_runtime_env = serialized_env
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(request, timeout=5)
    finally:
        channel.close()
