"""The contract every pipeline must keep; runs over every module in pipelines/ that exports PIPELINE."""

import pkgutil

import numpy as np
import pytest
import torch

import pipelines
from streamlearn.errors import BadEvent, PipelineError
from streamlearn.loadgen.generator import BankingSimulator
from streamlearn.pipeline import Pipeline, load_pipeline
from streamlearn.rundir import checkpoint as ckpt

NAMES = [m.name for m in pkgutil.iter_modules(pipelines.__path__)
         if hasattr(__import__(f"pipelines.{m.name}", fromlist=["PIPELINE"]), "PIPELINE")]


def events(n=512, seed=1):
    return BankingSimulator(seed=seed).events(n)


def train_steps(p: Pipeline, seed: int, steps: int = 5) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = p.build_model()
    opt = p.make_optimizer(model.parameters())
    batch = events()
    x, y = torch.from_numpy(p.features(batch)), torch.from_numpy(p.targets(batch))
    for _ in range(steps):
        opt.zero_grad()
        p.loss(model(x), y).mean().backward()
        opt.step()
    return model


def test_both_tasks_are_shipped():
    assert {load_pipeline(n).task for n in NAMES} == {"classification", "regression"}


@pytest.mark.parametrize("name", NAMES)
def test_features_and_targets_shape_dtype(name):
    p = load_pipeline(name)
    x, y = p.features(events(64)), p.targets(events(64))
    assert x.dtype == np.float32 and y.dtype == np.float32
    assert x.shape[0] == y.shape[0] == 64 and np.isfinite(x).all() and np.isfinite(y).all()
    assert p.features([]).shape == (0, x.shape[1])
    assert p.build_model()(torch.from_numpy(x)).shape == (64,)


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_gives_identical_predictions(name, tmp_path):
    p = load_pipeline(name)
    model = train_steps(p, seed=3)
    ckpt.write(tmp_path, model.state_dict(), None, {"version": 1})
    state, _, meta = ckpt.load(tmp_path)
    restored = p.build_model()
    restored.load_state_dict(state)
    x = torch.from_numpy(p.features(events(100, seed=9)))
    with torch.no_grad():
        assert torch.equal(model(x), restored(x))
    assert meta == {"version": 1}


@pytest.mark.parametrize("name", NAMES)
def test_seeded_training_is_reproducible(name):
    p = load_pipeline(name)
    a, b, c = train_steps(p, seed=7), train_steps(p, seed=7), train_steps(p, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), c.state_dict().values(), strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_missing_fields_are_rejected_and_extra_fields_ignored(name):
    p = load_pipeline(name)
    event = events(1)[0]
    with pytest.raises(BadEvent, match="missing_field"):
        p.schema.validate({k: v for k, v in event.items() if k != p.schema.fields[0].name})
    # Fields the schema does not name are ignored (is_fraud, for a pipeline whose label comes later).
    assert p.schema.validate({**event, "unexpected": 1}) == {f.name: event[f.name] for f in p.schema.fields}


def test_a_pipeline_with_joined_labels_learns_their_field():
    p = load_pipeline("fraud_delayed")
    assert p.labels is not None and "is_fraud" not in {f.name for f in p.schema.fields}
    raw = [b'{"event_id":"1-%d","label":%s,"label_time":5}' % (i, b"true" if i % 3 else b"false") for i in range(6)]
    labels, kept, bad = p.labels.schema.decode_columns(raw)
    assert kept == list(range(6)) and not bad
    assert p.label_targets(labels).tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    with pytest.raises(BadEvent, match="oversized"):
        p.labels.schema.decode(b'{"event_id":"' + b"x" * 200 + b'","label":true}')


def test_unknown_pipeline_says_how_to_fix():
    with pytest.raises(PipelineError, match="module:attribute"):
        load_pipeline("no_such_pipeline")
    with pytest.raises(PipelineError, match="not a streamlearn.pipeline.Pipeline"):
        load_pipeline("pipelines.banking:TRANSACTION")


@pytest.mark.parametrize("source, said", [
    ("def broken(:\n", r"importing brokenpipe_syntax failed with SyntaxError: .*line 1\)"),
    ("import no_such_dependency_xyz\n", r"brokenpipe_dep imports 'no_such_dependency_xyz', which is not installed"),
    ("raise RuntimeError('the feature store is down')\n",
     r"importing brokenpipe_raises failed with RuntimeError: the feature store is down"),
])
def test_a_pipeline_module_that_fails_to_import_says_why_not_not_found(tmp_path, monkeypatch, source, said):
    """Issue 47: a module that raises on import was reported as "pipeline not found" (a missing
    dependency) or as a traceback (a SyntaxError)."""
    name = {"def": "brokenpipe_syntax", "import": "brokenpipe_dep", "raise": "brokenpipe_raises"}[source.split()[0]]
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PipelineError, match=said) as raised:
        load_pipeline(f"{name}:PIPELINE")
    assert "not found" not in str(raised.value)
