"""Which processes a resize's warm pool asks the raylets to start (autoscale/warmpool.py)."""

from streamlearn.autoscale.warmpool import CONTROLLER_FAMILY, Prestart, plan

ENVS = {"controller": '{"env_vars": {}}', "worker": '{"env_vars":{}}'}


def test_the_controllers_family_once_on_its_node_and_a_worker_per_free_room():
    out = plan(ENVS, "head", {"head": 0.0, "a": 1.0, "b": 0.0, "c": 1.0}, workers=2, cpus_per_worker=1.0, sent={})
    assert out[0] == Prestart("head", "controller", CONTROLLER_FAMILY)
    assert sorted((p.node_id, p.count) for p in out[1:]) == [("a", 1), ("c", 1)]
    assert all(p.role == "worker" for p in out[1:])


def test_never_more_workers_than_the_new_group_has_nor_twice_on_a_node():
    out = plan(ENVS, "head", {"a": 4.0}, workers=3, cpus_per_worker=0.5, sent={("head", "controller"): 3})
    assert out == [Prestart("a", "worker", 3)]  # 8 rooms of half a CPU, 3 workers wanted
    sent = {("head", "controller"): 3, ("a", "worker"): 1}
    out = plan(ENVS, "head", {"a": 1.0, "b": 1.0}, workers=2, cpus_per_worker=1.0, sent=sent)
    assert out == [Prestart("b", "worker", 1)]  # a has its one already; one left to place
    assert plan(ENVS, "head", {"b": 1.0}, workers=2, cpus_per_worker=1.0,
                sent={**sent, ("b", "worker"): 1}) == []


def test_nothing_before_the_first_group_told_its_envs():
    assert plan({}, "head", {"a": 2.0}, workers=2, cpus_per_worker=1.0, sent={}) == []
    only_workers = plan({"worker": "{}"}, None, {"a": 2.0}, workers=2, cpus_per_worker=1.0, sent={})
    assert only_workers == [Prestart("a", "worker", 2)]


def test_a_node_whose_room_is_taken_gets_none():
    assert plan(ENVS, "head", {"a": 0.4}, workers=1, cpus_per_worker=0.5, sent={("head", "controller"): 3}) == []
