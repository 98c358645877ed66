"""The fault spec: a typo fails at start, several specs arm several points, a fired one stays fired."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streamlearn import faults
from streamlearn.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def _pass_point(run_dir, fired_elsewhere: bool) -> int:
    code = (f"from pathlib import Path\nfrom streamlearn import faults\nrun = Path({str(run_dir)!r})\n"
            "faults.arm('serve_mid_swap#2', None, run)\n"
            + ("faults.mark_of(run, 'serve_mid_swap#2').parent.mkdir(parents=True)\n"
               "faults.mark_of(run, 'serve_mid_swap#2').write_text('another replica')\n" if fired_elsewhere else "")
            + "faults.point('serve_mid_swap')\nfaults.point('step')\nfaults.point('serve_mid_swap')\n"
              "faults.point('serve_mid_swap')\n")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, timeout=60).returncode


def test_the_nth_pass_kills_the_process_and_only_one_process_fires_a_spec(tmp_path):
    assert _pass_point(tmp_path / "a", fired_elsewhere=False) == -signal.SIGKILL
    assert faults.mark_of(tmp_path / "a", "serve_mid_swap#2").read_text().startswith("serve_mid_swap pid ")
    # Armed in two replicas: the one that comes second finds the mark and lives on.
    assert _pass_point(tmp_path / "b", fired_elsewhere=True) == 0


def test_a_drop_point_drops_its_nth_pass_once_and_leaves_its_mark(tmp_path):
    faults.arm("ray_data_slice_lost@rank1#3", 1, tmp_path)
    assert [faults.drops("ray_data_slice_lost") for _ in range(6)] == [False, False, True, False, False, False]
    assert faults.mark_of(tmp_path, "ray_data_slice_lost@rank1#3").exists()
    faults.arm("ray_data_slice_lost@rank1#3", 1, tmp_path)  # the restarted group: fired in this lineage
    assert not any(faults.drops("ray_data_slice_lost") for _ in range(6))
    faults.arm("", 1, tmp_path)


def test_a_delay_point_holds_back_from_its_nth_pass_on_in_the_process_that_fired_it(tmp_path):
    faults.arm("ray_data_rank_behind@rank0#2", 0, tmp_path)
    assert [faults.delays("ray_data_rank_behind") for _ in range(5)] == [False, True, True, True, True]
    faults.arm("ray_data_rank_behind@rank0#2", 0, tmp_path)  # the restarted group: fired in this lineage
    assert not any(faults.delays("ray_data_rank_behind") for _ in range(5))
    faults.arm("ray_data_rank_behind@rank0#2", 1, tmp_path / "other")  # aimed at rank 0, not this one
    assert not any(faults.delays("ray_data_rank_behind") for _ in range(5))
    faults.arm("", 0, tmp_path)
