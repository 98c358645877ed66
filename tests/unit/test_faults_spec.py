"""The fault spec: a typo fails at start, several specs arm several points, a fired one stays fired."""

from __future__ import annotations

import pytest

from streamlearn import faults
from streamlearn.errors import ConfigError


def test_several_specs_arm_several_points_for_their_ranks_only(tmp_path):
    spec = "handover_stop_published@rank0,handover_go@rank1#2"
    assert [(f["point"], f["rank"], f["nth"]) for f in faults.parse(spec)] == [
        ("handover_stop_published", 0, 1), ("handover_go", 1, 2)]
    faults.arm(spec, 1, tmp_path)
    assert [f["point"] for f in faults._armed] == ["handover_go"]
    faults.arm(spec, 0, tmp_path)
    assert [f["point"] for f in faults._armed] == ["handover_stop_published"]
    faults.arm("", 0, tmp_path)
    assert faults._armed == []


def test_a_fired_spec_is_not_armed_again_in_the_lineage(tmp_path):
    faults.mark_of(tmp_path, "step@rank1#90").parent.mkdir()
    faults.mark_of(tmp_path, "step@rank1#90").write_text("step")
    faults.arm("step@rank1#90,handover_go", 1, tmp_path)
    assert [f["spec"] for f in faults._armed] == ["handover_go"]
    faults.arm("", 1, tmp_path)


@pytest.mark.parametrize("spec", ["nowhere", "step@rank", "step,handover_gone", "step#x"])
def test_a_spec_naming_no_point_fails_with_the_points_listed(spec, monkeypatch):
    monkeypatch.setenv(faults.ENV, spec)
    with pytest.raises(ConfigError, match="handover_go"):
        faults.spec_from_env()
