"""The trainer a group runs: Ray Train's callbacks, less the one that starts a process we never use,
its placement-group cleaner asking less often, and the settings its controller reads."""

from __future__ import annotations

from ray.train.v2._internal.callbacks import BackendSetupCallback, DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.train.trainer import CLEANER_CHECK_S, RAY_TRAIN_ENV, build_trainer, ray_train_env


def test_a_group_starts_no_dataset_manager_yet_keeps_ray_train_s_other_callbacks(tmp_path):
    # DatasetsCallback starts a DatasetManager actor (a process: ~3 CPU s of a start on two
    # cores) for the Datasets handed to Ray Train, and streamlearn hands it none.
    cfg = TrainConfig(topic="t", checkpoint_dir=str(tmp_path))
    trainer = build_trainer(cfg, KafkaSettings(bootstrap="127.0.0.1:9"))
    callbacks = trainer._create_default_callbacks()
    kinds = [type(cb) for cb in callbacks]
    assert DatasetsCallback not in kinds
    assert BackendSetupCallback in kinds, kinds  # the gloo / NCCL group is still Ray Train's
    # A controller that dies without stopping still has its placement group removed, 10 s later
    # at most, by exactly one cleaner (Ray Train's own, asking less often than its 1 s).
    cleaners = [cb for cb in callbacks if isinstance(cb, PlacementGroupCleanerCallback)]
    assert len(cleaners) == 1 and type(cleaners[0]) is not PlacementGroupCleanerCallback, kinds
    assert cleaners[0]._check_interval_s == CLEANER_CHECK_S


def test_train_s_controller_settings_are_ours_unless_the_user_set_them(monkeypatch):
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE

    # Only settings Ray hands on from the driver to Train's controller: another would do nothing.
    assert set(RAY_TRAIN_ENV) <= ENV_VARS_TO_PROPAGATE
    for name in RAY_TRAIN_ENV:  # set, then removed: monkeypatch puts back what was there before
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "3")
    assert ray_train_env() == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "3"}
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    assert ray_train_env()["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.25"
