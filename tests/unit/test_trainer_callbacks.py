"""The trainer a group runs: Ray Train's callbacks, less the one that starts a process we never use."""

from __future__ import annotations

from ray.train.v2._internal.callbacks import BackendSetupCallback, DatasetsCallback

from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.train.trainer import build_trainer


def test_a_group_starts_no_dataset_manager_yet_keeps_ray_train_s_other_callbacks(tmp_path):
    # DatasetsCallback starts a DatasetManager actor (a process: ~3 CPU s of a start on two
    # cores) for the Datasets handed to Ray Train, and streamlearn hands it none.
    cfg = TrainConfig(topic="t", checkpoint_dir=str(tmp_path))
    trainer = build_trainer(cfg, KafkaSettings(bootstrap="127.0.0.1:9"))
    kinds = [type(cb) for cb in trainer._create_default_callbacks()]
    assert DatasetsCallback not in kinds
    assert BackendSetupCallback in kinds, kinds  # the gloo / NCCL group is still Ray Train's
