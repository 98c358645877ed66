"""The group-start benchmark charges a pooled Ray worker's boot to what it became, not to the raylet
its command line names, and a pooled worker that ran nothing to nobody's role."""

from __future__ import annotations

from load.bench.group_start import IDLE, WORKERS, Processes

BOOT = "/venv/bin/python /venv/lib/ray/_private/workers/default_worker.py --raylet-name=/tmp/ray/sockets/raylet"


def processes(titles: dict[int, list[str]], born: float = 1.0) -> Processes:
    procs = Processes.__new__(Processes)  # no sampler thread: the titles are given
    procs.titles = {pid: [(0.1 * i, t) for i, t in enumerate(ts)] for pid, ts in titles.items()}
    procs.born = {pid: born for pid in titles}
    return procs


def test_a_pooled_worker_is_charged_to_the_actor_it_became():
    procs = processes({1: [BOOT, "ray::IDLE", "ray::RayTrainWorker.init_train_context", "ray::RayTrainWorker"],
                       2: [BOOT, "ray::IDLE", "ray::TrainController.__init__"],
                       3: [BOOT, "ray::IDLE", "ray::DatasetManager.__init__"],
                       4: [BOOT, "ray::IDLE"]})
    assert procs.role(1) == WORKERS
    assert procs.role(2) == "Ray Train controller"
    assert procs.role(3) == "Ray Train's helper actors"
    assert procs.role(4) == IDLE


def test_the_raylet_and_the_broker_keep_their_own_roles():
    procs = processes({5: ["/venv/lib/ray/core/src/ray/raylet/raylet --store_socket_name=x"],
                       6: ["java -Xmx512m kafka.Kafka server.properties"], 7: ["/usr/bin/something"]}, born=-5.0)
    assert procs.role(5) == "raylet, GCS and Ray's services"
    assert procs.role(6) == "Kafka broker"
    assert procs.role(7) == "other"
