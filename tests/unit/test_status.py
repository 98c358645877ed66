"""`streamlearn status` draws from a controller snapshot and the scorer's /model, without a terminal."""

from __future__ import annotations

import subprocess
import sys

from streamlearn.observe.status import render_text

NOW = 1_795_000_100.0

SNAPSHOT = {
    "t": NOW - 1, "pipeline": "fraud", "run_name": "fraud", "topic": "transactions",
    "lag": 12345, "lag_by_partition": {"0": 3000, "1": 4000, "2": 5000, "3": 345},
    "input_rate": 1523.4, "learned_rate": 1610.0, "learned_total": 1234567,
    "workers_active": 2, "workers_desired": 3, "reason": "lag grows faster than 2 workers learn",
    "capacity_per_worker": 900.0, "min_workers": 1, "max_workers": 4,
    "checkpoint": {"version": 42, "written_at": NOW - 12, "online": {"auc": 0.9531, "logloss": 0.0381, "n": 10000}},
    "resizes": [{"t": NOW - 300, "from": 1, "to": 2, "reason": "lag growing", "pause_s": 6.2}],
}

MODEL = {
    "version": 41, "written_at": NOW - 17, "swapped_at": NOW - 9, "serving_pinned": False,
    "metrics": {"online": {"auc": 0.9502, "logloss": 0.04, "n": 10000}},
    "scoring": {"requests": 52000, "recent": 4096, "window_s": 60.0, "errors": 3, "p50_ms": 3.2, "p99_ms": 14.7,
                "rate": 812.5},
    "last_rejection": {"version": 40, "kind": "quality", "reason": "auc fell 0.05 below the serving model"},
}


def test_status_shows_every_figure_from_both_sources():
    text = render_text(SNAPSHOT, MODEL, now=NOW, run_name="fraud")
    for figure in ("1,523 ev/s", "12,345 events", "p0=3,000", "p2=5,000", "p3=345", "2 active / 3 desired",
                   "lag grows faster", "v42, written 12 s ago", "AUC 0.9531", "logloss 0.0381",
                   "v41", "trained 17 s ago", "swapped in 9 s ago", "p99 14.7 ms", "p50 3.2 ms",
                   "812.5 req/s", "3 errors", "52,000 requests",
                   "1 → 2 workers", "paused 6.2 s", "v40 (quality)"):
        assert figure in " ".join(text.split()), f"{figure!r} missing from:\n{text}"
    assert "\x1b[" not in text  # plain text: no escape codes when there is no terminal


def test_status_shows_a_resize_under_way_and_the_kind_of_the_last():
    going = {"frm": 2, "to": 3, "state": "started", "warm": True, "decided_at": NOW - 52, "requested_at": NOW - 40}
    done = [{"t": NOW - 300, "from": 1, "to": 2, "reason": "lag growing", "pause_s": 1.4, "mode": "warm",
             "decision_to_first_step_s": 31.24}]
    flat = " ".join(render_text(SNAPSHOT | {"resizing": going, "resizes": done}, MODEL, now=NOW).split())
    assert ("2 → 3 workers, started (warm: the new group starts beside the running one), 52 s since the decision"
            in flat), flat
    assert "warm, paused 1.4 s, 31.2 s from the decision to its first step" in flat


def test_status_names_the_ray_data_pipeline_and_its_work():
    ingest = {"mode": "ray-data", "dataset": "streamlearn-streamlearn-fraud", "lanes": 2,
              "slices": 40, "read_s": 0.31, "decode_s": 2.5, "why": "auto: GPU trainers"}
    snapshot = SNAPSHOT | {"checkpoint": {**SNAPSHOT["checkpoint"], "ingest": ingest}}
    flat = " ".join(render_text(snapshot, MODEL, now=NOW).split())
    assert "dataset streamlearn-streamlearn-fraud (Ray dashboard → Data), 2 lanes (read + decode)" in flat, flat
    assert "40 slices, read 0.31 s, decode 2.50 s — auto: GPU trainers" in flat, flat


def test_status_shows_what_waits_in_the_join_of_delayed_labels():
    join = {"events": 1234, "labels": 5, "expired": 67}
    snapshot = SNAPSHOT | {"checkpoint": {**SNAPSHOT["checkpoint"], "join": join}}
    flat = " ".join(render_text(snapshot, MODEL, now=NOW).split())
    assert "1,234 events and 5 labels waiting, 67 events expired unlabelled" in flat, flat
    assert "labels waiting" not in " ".join(render_text(SNAPSHOT, MODEL, now=NOW).split())  # inline labels
    chargebacks = {**join, "unlabelled": 9876}  # a pipeline with unlabelled_as
    snapshot = SNAPSHOT | {"checkpoint": {**SNAPSHOT["checkpoint"], "join": chargebacks}}
    flat = " ".join(render_text(snapshot, MODEL, now=NOW).split())
    assert "67 events expired unlabelled, 9,876 learned without one (no label within the TTL)" in flat, flat


def test_status_says_delayed_feedbacks_online_metric_is_not_matured():
    join = {"events": 0, "labels": 0, "expired": 0, "unlabelled": 50_000, "reports": 321, "ignored": 4}
    snapshot = SNAPSHOT | {"checkpoint": {**SNAPSHOT["checkpoint"], "join": join}}
    flat = " ".join(render_text(snapshot, MODEL, now=NOW).split())
    assert "321 reports applied, 4 gave the silent answer" in flat, flat
    assert "against fake negatives: every event legitimate until reported; not matured" in flat, flat
    assert "not matured" not in " ".join(render_text(SNAPSHOT, MODEL, now=NOW).split())
    assert "matured metric none yet" in flat, flat  # before any report or attribution window ended


def test_status_shows_delayed_feedbacks_matured_metric_and_how_old_its_labels_are():
    join = {"events": 0, "labels": 0, "reports": 321, "ignored": 4}
    matured = {"window": 5000, "positives": 812, "auc": 0.9112, "age_s": 120.4 * 86_400}
    snapshot = SNAPSHOT | {"checkpoint": {**SNAPSHOT["checkpoint"], "join": join, "matured": matured}}
    flat = " ".join(render_text(snapshot, MODEL, now=NOW).split())
    assert "matured metric AUC 0.9112 (last 5,000 matured events, 812 reported frauds; unreported ones " \
           "arrived 120.4 days before the stream's clock)" in flat, flat
    reports_only = snapshot | {"checkpoint": {**snapshot["checkpoint"], "matured": {**matured, "age_s": None}}}
    assert "reports only" in " ".join(render_text(reports_only, MODEL, now=NOW).split())


def test_status_without_any_source_says_unavailable_with_hints():
    problems = {"controller": "no Ray cluster at --address auto; start one with `make demo`",
                "scorer": "no scorer answers at http://127.0.0.1:8000; start one with `streamlearn serve up`"}
    text = render_text(None, None, now=NOW, run_name="fraud", problems=problems)
    assert text.count("unavailable") == 2
    flat = " ".join(text.split())  # long hints wrap at the console width
    assert "make demo" in flat and "streamlearn serve up" in flat
    assert "Traceback" not in text


def test_status_with_a_scorer_that_reports_no_latency_and_no_model_yet():
    text = render_text(SNAPSHOT | {"checkpoint": None, "resizes": []}, {"version": None}, now=NOW)
    assert "none yet" in text and "none loaded yet" in text
    assert "p99 n/a (this scorer reports no latency figures)" in text
    idle = {"requests": 0, "recent": 0, "window_s": 60.0, "errors": 0, "p50_ms": None, "p99_ms": None, "rate": 0.0}
    assert "p99 n/a (no requests in the last 60 s)" in render_text(None, MODEL | {"scoring": idle}, now=NOW)


def test_status_reads_the_scorer_token_from_the_same_variable_as_the_scorer():
    from streamlearn.observe import status
    from streamlearn.serve.config import TOKEN_ENV

    assert status.TOKEN_ENV == TOKEN_ENV


def test_status_command_once_without_sources_prints_plain_unavailable(tmp_path):
    """The real command, piped (no terminal), with no Ray cluster and no scorer: two clear lines, exit 0."""
    done = subprocess.run([sys.executable, "-m", "streamlearn.cli", "status", "--once", "--address", "127.0.0.1:1",
                           "--serve-url", "http://127.0.0.1:1", "--run-name", "nothing-here"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("unavailable") == 2, done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_status_shows_the_lineage_decision_and_the_next_swap():
    model = MODEL | {"decision": {"version": 41, "approved": True, "by": "node-a:311", "compared_with": 39},
                     "next": [{"version": 43, "serve_at": NOW + 0.6}], "late_swaps": 2, "request_polls": 3}
    flat = " ".join(render_text(SNAPSHOT, model, now=NOW).split())
    assert ("approved by node-a:311 against v39; next v43 in 0.6 s; 3 requests polled for a late poller; "
            "2 late swaps on this replica") in flat, flat


def test_status_shows_the_quality_of_what_was_served_or_how_to_measure_it():
    served = {"t": NOW - 3, "overall": {"window": 5000, "auc": 0.9312, "logloss": 0.0811},
              "versions": {"40": {"auc": 0.925, "joined": 900}, "41": {"auc": 0.94, "joined": 300}},
              "joined": 123456, "expired": {"answers.ttl": 7, "labels.ttl": 99}}
    flat = " ".join(render_text(SNAPSHOT, MODEL, now=NOW, served=served).split())
    assert ("served quality AUC 0.9312 logloss 0.0811 (last 5,000 answers; v40 0.925, v41 0.940), 123,456 "
            "joined, 7 answers never labelled, 3 s ago") in flat
    flat = " ".join(render_text(SNAPSHOT, MODEL, now=NOW, served={**served, "unlabelled": 5}).split())
    assert "7 answers never labelled (5 of them judged as unlabelled_as says), 3 s ago" in flat, flat
    feedback = {**served, "unlabelled": 5, "matured_only": True, "sample": 0.05,
                "expired": {"answers.ttl": 5, "answers.cap": 2}}
    flat = " ".join(render_text(SNAPSHOT, MODEL, now=NOW, served=feedback).split())
    assert ("matured labels only: an answer counts once its report came or its attribution window ended "
            "unreported, 0.05 of event ids sampled; 2 left unjudged by the join's cap (lower --sample)") in flat, flat
    flat = " ".join(render_text(SNAPSHOT, MODEL, now=NOW).split())
    assert "served quality not measured: deploy the scorer with --scores-topic and run `streamlearn evaluate`" in flat
    waiting = {"t": NOW, "overall": {"window": 0}, "pending": {"answers": 42}}
    assert "no answer has met its label yet (42 waiting)" in " ".join(
        render_text(None, None, now=NOW, served=waiting).split())


def test_status_shows_the_newest_group_failure_a_worker_diagnosed():
    failure = {"t": NOW - 42, "rank": 0, "gen": 0, "version": 17, "error": "IngestError",
               "message": "window 3: 4001 of its 8002 rows arrived, and every read lane read past it 31 s ago"}
    for snapshot in (SNAPSHOT, None):  # from the run directory: there whether or not the controller answers
        flat = " ".join(render_text(snapshot, MODEL, now=NOW, failure=failure).split())
        assert "last failure 42 s ago, rank 0 of the group at v17: IngestError: window 3: 4001 of its" in flat
    assert "last failure" not in render_text(SNAPSHOT, MODEL, now=NOW)


def test_status_says_how_far_serving_is_behind_why_and_past_which_bound():
    evidence = {"metric": "auc", "candidate": 0.9412, "served": 0.9377, "events": 4096, "hold": False}
    decision = {"by": "host:1", "compared_with": 40, "evidence": evidence}
    held = MODEL | {"decision": decision, "behind": {
        "versions": 12, "seconds": 31.0, "newest": 53, "bound": {"versions": 10, "seconds": 300.0},
        "why": "holding v41: v53 refused (quality): auc 0.52 against the served model's 0.94"}}
    flat = " ".join(render_text(SNAPSHOT, held, now=NOW).split())
    assert "approved by host:1 against v40 (auc 0.941 vs 0.938 on the same 4,096 events)" in flat, flat
    assert ("12 versions, 31.0 s behind the newest checkpoint v53: holding v41: v53 refused (quality)" in flat), flat
    assert "past the bound of 10 versions or 300.0 s: StreamlearnServingStale" in flat, flat
    fresh = MODEL | {"behind": {"versions": 0, "seconds": 0.0, "newest": 41, "why": None}}
    assert "serving the newest checkpoint v41" in " ".join(render_text(SNAPSHOT, fresh, now=NOW).split())
