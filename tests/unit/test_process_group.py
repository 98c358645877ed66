"""Ray Train's controller gets what a group's trainer hands it without importing torch: every
callback it unpickles at a group start, our backend config in them (train/process_group.py)."""

from __future__ import annotations

import subprocess
import sys

from streamlearn.config import KafkaSettings, TrainConfig
from streamlearn.train.trainer import build_trainer

LOAD = """
import pickle, sys
callbacks = pickle.load(sys.stdin.buffer)
assert callbacks, "nothing unpickled"
print("torch" in sys.modules, sorted(type(c).__name__ for c in callbacks))
"""


def test_the_controller_s_callbacks_load_without_torch(tmp_path):
    import ray.cloudpickle

    cfg = TrainConfig(topic="t", checkpoint_dir=str(tmp_path), workers=2, cpus_per_worker=0.5)
    trainer = build_trainer(cfg, KafkaSettings(bootstrap="127.0.0.1:9"))
    # What DataParallelTrainer.fit hands the controller actor: its default callbacks and ours.
    callbacks = trainer._create_default_callbacks() + list(trainer.run_config.callbacks)
    loaded = subprocess.run([sys.executable, "-c", LOAD], input=ray.cloudpickle.dumps(callbacks),
                            capture_output=True, check=True)
    torch_imported, names = loaded.stdout.decode().split(" ", 1)
    assert "BackendSetupCallback" in names and "DeathRecord" in names
    assert torch_imported == "False", f"unpickling {names} imported torch"
