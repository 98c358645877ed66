"""docs/BENCHMARKS.md's tables are what their JSONs render: every docs/bench/*.json has its block, in
the section its benchmark rewrites, every block has its JSON, and no block was edited by hand
(`python -m load.bench.tables` rewrites them; `write_section` puts one at the head of a re-run's section)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from load.bench import tables

JSONS = sorted(p.stem for p in tables.BENCH_DIR.glob("*.json"))
TEXT = tables.BENCHMARKS_MD.read_text()
BLOCKS = tables.blocks(TEXT)
FIX = "run `python -m load.bench.tables` (a benchmark's re-run writes its own)"


def test_there_are_benchmark_jsons():
    assert JSONS, tables.BENCH_DIR


@pytest.mark.parametrize("name", JSONS)
def test_a_renderer_handles_each_json(name):
    assert tables.renderer(name) is not None, f"docs/bench/{name}.json: add a renderer to RENDERERS"
    block = tables.render(name)  # no KeyError, no TypeError on what the benchmark wrote
    assert block.startswith(tables.start_marker(name) + "\n| ")
    assert block.endswith(f"\n<!-- /table: {name} -->")
    assert "|---" in block and "measured" in block.lower()
    assert block == tables.render(name), "rendering is deterministic"


@pytest.mark.parametrize("name", JSONS)
def test_every_json_has_one_table_block(name):
    assert [m["name"] for m in BLOCKS].count(name) == 1, f"docs/bench/{name}.json: no table block (or two); {FIX}"


def test_every_table_block_names_a_json_that_exists():
    orphans = [m["name"] for m in BLOCKS if not (tables.BENCH_DIR / f"{m['name']}.json").exists()]
    assert not orphans, f"table blocks naming no docs/bench JSON: {orphans}"


def test_every_table_block_is_what_its_json_renders():
    stale = [m["name"] for m in BLOCKS
             if (tables.BENCH_DIR / f"{m['name']}.json").exists() and m[0] != tables.render(m["name"])]
    assert not stale, f"table blocks that differ from their JSON: {stale}; {FIX}"


def test_no_table_marker_is_left_unmatched():
    starts = re.findall(r"<!-- table: \S+ \(generated", TEXT)
    assert len(starts) == len(BLOCKS) == TEXT.count("<!-- /table: "), "a table marker without its pair"


def test_each_block_sits_in_the_section_its_benchmark_rewrites():
    sections = {json_name: section for section, json_name in tables.SECTION_JSON.items()}
    for m in BLOCKS:
        section = sections.get(m["name"], m["name"])
        start, end = TEXT.find(f"<!-- bench:{section} -->"), TEXT.find(f"<!-- /bench:{section} -->")
        assert 0 <= start < m.start() < m.end() < end, f"table {m['name']} is not inside section {section}"


def test_the_command_checks_and_rewrites(tmp_path):
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(TEXT)
    assert tables.main(["--check", "--path", str(page)]) == 0
    name = BLOCKS[0]["name"]
    edited = TEXT.replace(BLOCKS[0][0], BLOCKS[0][0].replace("|---", "| hand-edited |\n|---", 1))
    page.write_text(edited)
    assert tables.main(["--check", "--path", str(page)]) == 1
    assert page.read_text() == edited, "--check changes nothing"
    assert tables.main(["--path", str(page)]) == 0
    assert page.read_text() == TEXT, f"rewriting restores table {name}"


def test_delayed_feedback_renders_what_its_benchmark_writes():
    """load/bench/delayed_feedback.py's summarize(), before its first JSON exists."""
    medians = {c: {"auc": 0.9 - i / 100, "logloss": 0.05, "calibration": 1.0 + i / 10, "auc_second_half": 0.88}
               for i, c in enumerate(("oracle", "window", "fnw", "fnc"))}
    figures = {"benchmark": "delayed_feedback", "machine": {"nproc": 2, "cpu": "x", "python": "3.11.7",
                                                            "date": "2026-11-29 10:00 UTC", "loadavg_1m": 0.5},
               "days": 40.0, "events": 864_000, "median_delay_days": 5.0,
               "delay": "log-normal, sigma 1.0, capped at 120 days", "window_s": 1000.0, "runs": 3,
               "medians": medians, "auc_gap_to_oracle": {c: m["auc"] - 0.9 for c, m in medians.items()},
               "targets": {"auc_within_of_oracle": 0.02, "calibration": [0.8, 1.25]},
               "met": {"fnw": True, "fnc": False}, "per_run": {}}
    out = tables.RENDERERS["delayed_feedback"](json.loads(json.dumps(figures)))
    assert "| `fnw` | 0.8800 | -0.0200 |" in out and "**not met**" in out and "2026-11-29 10:00 UTC" in out


def test_write_section_starts_a_section_with_its_table(tmp_path):
    from load.bench.common import write_section

    bench, page = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    bench.mkdir()
    shutil.copy(tables.BENCH_DIR / "faults.json", bench / "faults.json")
    page.write_text("# Benchmarks\n\nintro\n")
    for body in ("first run\n", "second run\n"):  # a re-run replaces its section, table and all
        write_section("faults-bench", "Recovery", body, path=page, bench_dir=bench)
        write_section("join_checkpoints", "No JSON of its own", "text\n", path=page, bench_dir=bench)
    text = page.read_text()
    table = tables.render("faults", bench)
    assert f"<!-- bench:faults-bench -->\n## Recovery\n\n{table}\n\nsecond run\n<!-- /bench:faults-bench -->" in text
    assert "first run" not in text and text.count("<!-- table: ") == 1
    assert "<!-- bench:join_checkpoints -->\n## No JSON of its own\n\ntext\n<!-- /bench:join_checkpoints -->" in text


def test_gpu_renders_what_its_benchmark_writes():
    """docs/bench/gpu.json was transcribed from a run cut short; load/bench/gpu.py keys figures per contender."""
    names = ("baseline-cpu", "baseline-cuda", "gloo-1", "gloo-2", "nccl-1")
    runs = {n: [{"steady_events_per_s": 1000.0 * (i + 1), "first_step_s": 20.0, "gpu_util_peak_pct": i}]
            for i, n in enumerate(names)}
    figures = {"benchmark": "gpu", "machine": {"nproc": 16, "cpu": "x", "python": "3.12.3",
                                               "date": "2026-11-29 10:00 UTC", "loadavg_1m": 1.0},
               "events": 200_000, "gpu": "NVIDIA H200", "rounds_done": 1, "rounds_asked": 3,
               **{f"{n}_events_per_s": 1000.0 * (i + 1) for i, n in enumerate(names)},
               **{f"ratio_{n}_vs_baseline_cpu": float(i + 1) for i, n in enumerate(names)},
               "ratio_nccl_1_vs_gloo_1": 5 / 3, **{f"first_step_s_{n}": 20.0 for n in names[2:]},
               "killed": {"fault": "f", "audit": {"learned": 10, "produced": 10, "passed": True}}, "runs": runs}
    out = tables.RENDERERS["gpu"](json.loads(json.dumps(figures)))
    assert "| `nccl-1` | 5,000 | 5.00× | 1 | 20.0 s | 4 % |" in out and "Rounds done: 1 of 3." in out
