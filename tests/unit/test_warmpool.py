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


def test_a_group_s_standby_comes_once_it_has_learned_a_while_and_again_before_it_expires(monkeypatch):
    """The failure standby (autoscale/warmpool.py): nothing in a group's first STANDBY_AFTER_S, then
    one process per live Train worker on its node, kept STANDBY_KEEP_S and started anew before
    that; a group's start (a restart after a failure too) arms it again."""
    from streamlearn.autoscale import warmpool

    asked = []
    monkeypatch.setattr(warmpool, "_raylets", lambda: {"a": "10.0.0.1:1", "b": "10.0.0.2:1"})
    monkeypatch.setattr(warmpool, "_train_worker_nodes", lambda: {"a": 2, "b": 1, "gone": 1})
    monkeypatch.setattr(warmpool, "_prestart", lambda raylet, env, count, keep: asked.append((raylet, count, keep)))
    pool = warmpool.WarmPool(0.5, "fraud")
    pool.learn("worker", ENVS["worker"])
    pool.standby(100.0)
    assert asked == [], "no group started yet"
    pool.group_started(100.0)
    pool.standby(100.0 + warmpool.STANDBY_AFTER_S - 1)
    assert asked == []
    pool.standby(100.0 + warmpool.STANDBY_AFTER_S)
    assert sorted(asked) == [("10.0.0.1:1", 2, warmpool.STANDBY_KEEP_S), ("10.0.0.2:1", 1, warmpool.STANDBY_KEEP_S)]
    pool.standby(100.0 + warmpool.STANDBY_AFTER_S + 60)
    assert len(asked) == 2, "one standby per group while it lasts"
    pool.standby(100.0 + warmpool.STANDBY_AFTER_S + warmpool.STANDBY_KEEP_S - 59)
    assert len(asked) == 4, "anew before the first expires"
    pool.group_started(5000.0)  # a restart took them
    pool.standby(5000.0 + warmpool.STANDBY_AFTER_S)
    assert len(asked) == 6
