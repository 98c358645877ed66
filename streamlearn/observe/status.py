"""`streamlearn status`: one screen on a running pipeline, refreshed in place.

Three sources: the run's scale controller actor on Ray (rate, lag, workers, checkpoint, resizes),
the scorer's GET /model (the version served, its age, scoring latency) and the evaluator's newest
row in the run directory (served.jsonl: the quality of the answers callers got). Any may be
missing; its part of the screen then says why and what to do, never a traceback. Once connected
to Ray, a last part says how to reach its dashboard and `ray job` CLI (token auth included).
Drawing is a pure function of the dicts (`render`), so it is tested without Ray or a terminal.
"""

from __future__ import annotations

import io
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from streamlearn.autoscale.naming import NAMESPACE, actor_name, find_controller
from streamlearn.errors import ConfigError

TOKEN_ENV = "STREAMLEARN_SERVE_TOKEN"  # streamlearn.serve's, spelled here: importing it loads torch (~18 s)
UNAVAILABLE = "unavailable"
MAX_PARTITIONS_SHOWN = 12


# -- drawing (pure) --


def render(snapshot: dict | None, model: dict | None, *, now: float, run_name: str = "",
           problems: dict[str, str] | None = None, ray: dict | None = None, served: dict | None = None,
           failure: dict | None = None) -> Group:
    """The whole screen. `problems` says why a source is None: {"controller": ..., "scorer": ...};
    `ray` (Sources.ray_access) is None when not connected to Ray, and its part is then left out;
    `served` is the evaluator's newest row (None: no evaluator has written one); `failure` the
    newest group failure, diagnosed by a worker or a worker's death seen by Ray Train's controller
    (failures.jsonl; None: none)."""
    problems = problems or {}
    title = Text.assemble(("streamlearn status", "bold"), f"  run {run_name or (snapshot or {}).get('run_name', '?')}",
                          f"  {time.strftime('%H:%M:%S', time.localtime(now))}")
    parts = [title, Text(""), _training(snapshot, now, problems.get("controller"), failure), Text(""),
             _serving(model, now, problems.get("scorer"), served)]
    return Group(*parts, Text(""), _ray(ray)) if ray else Group(*parts)


def render_text(snapshot: dict | None, model: dict | None, *, now: float, run_name: str = "",
                problems: dict[str, str] | None = None, ray: dict | None = None, served: dict | None = None,
                failure: dict | None = None, width: int = 100) -> str:
    """The screen as plain text (no colours, no cursor moves): for pipes, logs and tests."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None, highlight=False)
    console.print(render(snapshot, model, now=now, run_name=run_name, problems=problems, ray=ray, served=served,
                         failure=failure))
    return out.getvalue()


def _grid(heading: str) -> Table:
    table = Table.grid(padding=(0, 2))
    table.title = heading
    table.title_justify = "left"
    table.title_style = "bold cyan"
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    return table


def _training(snap: dict | None, now: float, problem: str | None, failure: dict | None = None) -> Table:
    table = _grid("Training (scale controller)")
    if failure:  # from the run directory: shown whether or not the controller answers
        table.add_row("last failure", Text(f"{_age(now, failure.get('t'))} ago, rank {failure.get('rank', '?')} "
                                           f"of the group at v{failure.get('version', '?')}: {failure.get('error')}: "
                                           f"{str(failure.get('message', ''))[:300]}", style="yellow"))
    if snap is None:
        table.add_row("controller", Text(f"{UNAVAILABLE}: {problem or 'not asked'}", style="yellow"))
        return table
    table.add_row("input rate", f"{_rate(snap.get('input_rate'))}   learned {_rate(snap.get('learned_rate'))}"
                                f"   (total {_int(snap.get('learned_total'))})")
    table.add_row("lag", f"{_int(snap.get('lag'))} events   {_partitions(snap.get('lag_by_partition'))}")
    table.add_row("workers", f"{snap.get('workers_active', '?')} active / {snap.get('workers_desired', '?')} desired"
                             f"   (min {snap.get('min_workers', '?')}, max {snap.get('max_workers', '?')}, "
                             f"~{_rate(snap.get('capacity_per_worker'))} per worker)")
    if snap.get("reason"):
        table.add_row("decision", str(snap["reason"]))
    cp = snap.get("checkpoint")
    if cp:
        table.add_row("checkpoint", f"v{cp.get('version', '?')}, written {_age(now, cp.get('written_at'))} ago")
        feedback = "reports" in (cp.get("join") or {})
        # With delayed feedback the trainer's own figure counts every unreported event as legitimate.
        table.add_row("online metric", _metric(cp.get("online")) + (
            "  (against fake negatives: every event legitimate until reported; not matured)" if feedback else ""))
        if feedback:
            table.add_row("matured metric", _matured(cp.get("matured")))
        if cp.get("ingest"):
            table.add_row("ingest", _ingest(cp["ingest"]))
        if feedback:
            join = cp["join"]
            table.add_row("labels", f"delayed feedback: every event learned at once with the silent answer, "
                                    f"{_int(join.get('reports'))} reports applied, {_int(join.get('ignored'))} "
                                    f"gave the silent answer (lineage)")
        elif cp.get("join"):  # joined labels: what waits, what left unlabelled
            join = cp["join"]
            unlabelled = (f", {_int(join['unlabelled'])} learned without one (no label within the TTL)"
                          if "unlabelled" in join else "")
            table.add_row("labels", f"joined from the labels topic: {_int(join.get('events'))} events and "
                                    f"{_int(join.get('labels'))} labels waiting, {_int(join.get('expired'))} "
                                    f"events expired unlabelled{unlabelled} (lineage)")
    else:
        table.add_row("checkpoint", "none yet")
    going = snap.get("resizing")
    if going:
        kind = "warm: the new group starts beside the running one" if going.get("warm") else "cold: stop, then start"
        since = going.get("decided_at") or going.get("requested_at")
        table.add_row("resizing", f"{going.get('frm')} → {going.get('to')} workers, {going.get('state')} ({kind}), "
                                  f"{_age(now, since)} since the decision")
    resizes = snap.get("resizes") or []
    if resizes:
        last = resizes[-1]
        mode = f"{last['mode']}, " if last.get("mode") else ""
        took = (f", {_num(last['decision_to_first_step_s'], 1)} s from the decision to its first step"
                if last.get("decision_to_first_step_s") is not None else "")
        table.add_row("last resize", f"{last.get('from')} → {last.get('to')} workers, {_age(now, last.get('t'))} "
                                     f"ago, {mode}paused {_num(last.get('pause_s'), 1)} s{took} "
                                     f"({last.get('reason', '')}); {len(resizes)} recent")
    table.add_row("sampled", f"{_age(now, snap.get('t'))} ago   topic {snap.get('topic', '?')}, "
                             f"pipeline {snap.get('pipeline', '?')}")
    return table


def _serving(model: dict | None, now: float, problem: str | None, served: dict | None = None) -> Table:
    table = _grid("Serving (scorer GET /model)")
    if model is None:
        table.add_row("scorer", Text(f"{UNAVAILABLE}: {problem or 'not asked'}", style="yellow"))
        table.add_row("served quality", _served(served, now))
        return table
    version = model.get("version")
    if version is None:
        table.add_row("model version", "none loaded yet (waiting for the first checkpoint that passes the gates)")
    else:
        pinned = "  (pinned)" if model.get("serving_pinned") else ""
        table.add_row("model version", f"v{version}{pinned}, trained {_age(now, model.get('written_at'))} ago, "
                                       f"swapped in {_age(now, model.get('swapped_at'))} ago")
        table.add_row("online metric", _metric((model.get("metrics") or {}).get("online")))
        table.add_row("gate", _gate(model, now))
        table.add_row("behind", _behind(model.get("behind")))
    table.add_row("scoring", _scoring(model.get("scoring")))
    table.add_row("served quality", _served(served, now))
    last = model.get("last_rejection")
    if last:
        table.add_row("last rejection", f"v{last.get('version')} ({last.get('kind')}): {last.get('reason')}")
    return table


def _ray(info: dict) -> Table:
    """Ray's CLI sends the token only where RAY_AUTH_MODE=token is exported; the dashboard asks for it."""
    table = _grid("Ray (dashboard, `ray job` CLI)")
    dashboard, cli, mode = info.get("dashboard", "?"), info.get("ray", "ray"), info.get("auth_mode")
    jobs = f"{cli} job list --address {dashboard}   (job submit, job logs <id> alike)"
    if mode == "token":
        table.add_row("dashboard", f"{dashboard}   asks for the token: paste what `{cli} get-auth-token` prints")
        table.add_row("token auth", f"{info.get('export')}   (token in {info.get('token_file')})")
        table.add_row("ray job", f"after that export: {jobs}")
    else:
        table.add_row("dashboard", dashboard)
        table.add_row("ray job", jobs if mode == "disabled" else f"{jobs}; auth mode unknown: {mode or 'no answer'}")
    return table


def _gate(model: dict, now: float) -> str:
    """The lineage's decision on the served version, and what every replica switches to next."""
    decision = model.get("decision") if isinstance(model.get("decision"), dict) else {}
    against = decision.get("compared_with")
    said = (f"approved by {decision.get('by')}" + (f" against v{against}" if against is not None else " (first)")
            if decision else "served by pin" if model.get("serving_pinned") else "no recorded decision")
    evidence = decision.get("evidence") if isinstance(decision.get("evidence"), dict) else None
    if evidence and evidence.get("candidate") is not None:
        said += (f" ({evidence.get('metric')} {_num(evidence.get('candidate'), 3)} vs "
                 f"{_num(evidence.get('served'), 3)} on the same {_int(evidence.get('events'))} events)")
    elif evidence:
        said += f" ({evidence.get('why')})"
    upcoming = [n for n in model.get("next") or [] if isinstance(n, dict)]
    if upcoming:
        said += "; next " + ", ".join(f"v{n.get('version')} in {_num(n.get('serve_at', now) - now, 1)} s"
                                      for n in upcoming)
    late, polls = model.get("late_swaps"), model.get("request_polls")
    return (said + (f"; {polls} requests polled for a late poller" if polls else "")
            + (f"; {late} late swaps on this replica" if late else ""))


def _behind(behind: Any) -> Text | str:
    """How far the served version trails the newest checkpoint, why, and whether past the bound."""
    if not isinstance(behind, dict) or behind.get("versions") is None:
        return "n/a (this scorer reports no staleness)"
    versions, seconds = behind.get("versions"), behind.get("seconds")
    if not versions:
        return f"serving the newest checkpoint v{behind.get('newest')}"
    bound = behind.get("bound") or {}
    said = (f"{_int(versions)} versions, {_num(seconds, 1)} s behind the newest checkpoint v{behind.get('newest')}"
            f": {behind.get('why') or 'no reason known'}")
    over = (isinstance(bound.get("versions"), int | float) and versions > bound["versions"]) or \
        (isinstance(bound.get("seconds"), int | float) and isinstance(seconds, int | float)
         and seconds > bound["seconds"])
    if over:
        return Text(f"{said}  (past the bound of {bound.get('versions')} versions or {bound.get('seconds')} s: "
                    f"StreamlearnServingStale)", style="yellow")
    return said


def _scoring(scoring: Any) -> str:
    """The figures of the replica that answered GET /model (streamlearn.serve.latency)."""
    if not isinstance(scoring, dict):
        return "p99 n/a (this scorer reports no latency figures)"
    p50, p99 = _pick(scoring, "p50"), _pick(scoring, "p99")
    window = f"last {_num(scoring['window_s'], 0)} s" if isinstance(scoring.get("window_s"), int | float) else ""
    if p99 is None:
        return f"p99 n/a (no requests{' in the ' + window if window else ''})"
    parts = [f"p99 {_num(p99, 1)} ms", f"p50 {_num(p50, 1)} ms" if p50 is not None else "p50 n/a"]
    if isinstance(scoring.get("rate"), int | float):
        parts.append(f"{_num(scoring['rate'], 1)} req/s")
    if isinstance(scoring.get("errors"), int | float):
        parts.append(f"{_int(scoring['errors'])} errors")
    if window:
        parts.append(f"({window}, one replica; {_int(scoring.get('requests'))} requests since it started)")
    return "   ".join(parts)


def _pick(d: dict, quantile: str) -> float | None:
    for key in (f"{quantile}_ms", quantile):
        if isinstance(d.get(key), int | float):
            return float(d[key])
    return None


def _metric(online: Any) -> str:
    if not isinstance(online, dict) or not online:
        return "n/a"
    names = {"auc": "AUC", "logloss": "logloss", "mae": "MAE", "rmse": "RMSE"}
    parts = [f"{label} {online[k]:.4f}" for k, label in names.items() if isinstance(online.get(k), int | float)]
    if isinstance(online.get("n"), int | float):
        parts.append(f"(last {_int(online['n'])} events)")
    return "  ".join(parts) or "n/a"


def _matured(matured: Any) -> str:
    """Delayed feedback: the trainer's figure on matured labels only, what the gate and drift judge."""
    if not isinstance(matured, dict) or not matured.get("window"):
        return ("none yet: a report matures as it comes, a legitimate payment once its attribution "
                "window (the pipeline's ttl_s, in event time) ends unreported")
    auc = matured.get("auc")
    age = matured.get("age_s")
    return (f"AUC {auc:.4f}" if isinstance(auc, int | float) else "AUC n/a (one class so far)") + (
        f"  (last {_int(matured['window'])} matured events, {_int(matured.get('positives'))} reported frauds; "
        + (f"unreported ones arrived {_days(age)} before the stream's clock" if isinstance(age, int | float)
           else "no event has outlived its attribution window yet: reports only") + ")")


def _days(seconds: float) -> str:
    return f"{seconds / 86_400:.1f} days" if seconds >= 86_400 else f"{seconds:.0f} s"


def _served(row: dict | None, now: float) -> str:
    """The evaluator's figures: answers callers got, judged by their labels (all versions, then each)."""
    if not isinstance(row, dict):
        return ("not measured: deploy the scorer with --scores-topic and run `streamlearn evaluate` "
                "(docs/OPERATIONS.md, Served quality)")
    overall = row.get("overall") or {}
    if not overall.get("window"):
        return f"no answer has met its label yet ({_int((row.get('pending') or {}).get('answers'))} waiting)"
    names = {"auc": "AUC", "logloss": "logloss", "mae": "MAE"}
    head = "  ".join(f"{label} {overall[k]:.4f}" for k, label in names.items() if isinstance(overall.get(k), float))
    versions = row.get("versions") or {}
    per = ", ".join(f"v{v} {s['auc']:.3f}" for v, s in list(versions.items())[-3:]
                    if isinstance(s.get("auc"), float))
    expired = sum(n for k, n in (row.get("expired") or {}).items() if k.startswith("answers"))
    judged = f" ({_int(row['unlabelled'])} of them judged as unlabelled_as says)" if "unlabelled" in row else ""
    matured = ""
    if row.get("matured_only"):  # delayed feedback: which answers count, and what the cap left unjudged
        capped = (row.get("expired") or {}).get("answers.cap", 0)
        matured = ("; matured labels only: an answer counts once its report came or its attribution window "
                   f"ended unreported{', ' + str(row['sample']) + ' of event ids sampled' if 'sample' in row else ''}"
                   + (f"; {_int(capped)} left unjudged by the join's cap (lower --sample)" if capped else ""))
    return (f"{head or 'n/a'} (last {_int(overall['window'])} answers{'; ' + per if per else ''}), "
            f"{_int(row.get('joined'))} joined, {_int(expired)} answers never labelled{judged}{matured}, "
            f"{_age(now, row.get('t'))} ago")


def _ingest(ingest: dict) -> str:
    why = f" — {ingest['why']}" if ingest.get("why") else ""
    if ingest.get("mode") != "ray-data":
        return str(ingest.get("mode", "?")) + why
    return (f"ray-data: dataset {ingest.get('dataset', '?')} (Ray dashboard → Data), {ingest.get('lanes')} lanes "
            f"(read + decode); rank 0's last checkpoint interval: "
            f"{_int(ingest.get('slices'))} slices, read {_num(ingest.get('read_s'), 2)} s, "
            f"decode {_num(ingest.get('decode_s'), 2)} s{why}")


def _partitions(by_partition: Any) -> str:
    if not isinstance(by_partition, dict) or not by_partition:
        return ""
    items = sorted(by_partition.items(), key=lambda kv: -(kv[1] or 0))[:MAX_PARTITIONS_SHOWN]
    shown = "  ".join(f"p{p}={_int(v)}" for p, v in sorted(items, key=lambda kv: int(kv[0])))
    more = len(by_partition) - len(items)
    return f"by partition: {shown}" + (f"  (+{more} more)" if more > 0 else "")


def _age(now: float, t: Any) -> str:
    if not isinstance(t, int | float):
        return "?"
    s = max(0.0, now - t)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s // 60:.0f} min {s % 60:.0f} s"
    return f"{s // 3600:.0f} h {s % 3600 // 60:.0f} min"


def _rate(v: Any) -> str:
    return f"{_num(v, 0)} ev/s"


def _int(v: Any) -> str:
    return f"{int(v):,}" if isinstance(v, int | float) else "?"


def _num(v: Any, digits: int) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, int | float) else "?"


# -- sources --


@dataclass
class Sources:
    """Where the figures come from; every failure becomes a sentence for the screen."""

    address: str
    run_name: str
    serve_url: str
    run_dir: Path | None = None  # where the evaluator writes served.jsonl
    timeout_s: float = 5.0
    _actor: Any = None
    _access: dict | None = None

    def controller(self) -> tuple[dict | None, str | None]:
        try:
            import ray

            from streamlearn.localray import join_ray  # refuses in seconds an address nothing answers at

            if not ray.is_initialized():
                join_ray(self.address, local_if_none=False, namespace=NAMESPACE, logging_level="ERROR",
                         log_to_driver=False, configure_logging=False)
        except Exception as e:
            if "uthentication" in str(e):  # an explicit address never turns token auth on by itself
                return None, (f"the Ray cluster at --address {self.address} wants its token ({_first_line(e)}): "
                              "export RAY_AUTH_MODE=token (the token is ~/.ray/auth_token, or RAY_AUTH_TOKEN_PATH)")
            return None, (f"no Ray cluster at --address {self.address} ({_first_line(e)}); start one with "
                          "`make demo` or pass --address ray://HOST:10001 or HOST:6379")
        name = actor_name(self.run_name)
        if self._actor is None:
            try:
                self._actor = find_controller(self.run_name)
            except ConfigError as e:
                return None, str(e)
        try:
            return ray.get(self._actor.snapshot.remote(), timeout=self.timeout_s), None
        except Exception as e:
            self._actor = None  # the run may have restarted it: look the actor up again next time
            return None, f"the controller {name!r} did not answer ({_first_line(e)})"

    def model(self) -> tuple[dict | None, str | None]:
        request = urllib.request.Request(f"{self.serve_url.rstrip('/')}/model")
        token = os.environ.get(TOKEN_ENV)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read()), None
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                return None, f"the scorer at {self.serve_url} wants a token: set {TOKEN_ENV}"
            return None, f"the scorer at {self.serve_url} answered HTTP {e.code}"
        except Exception as e:
            return None, (f"no scorer answers at {self.serve_url} ({_first_line(e)}); start one with "
                          "`streamlearn serve up` or pass --serve-url")

    def ray_access(self) -> dict | None:
        """The dashboard of the cluster `controller` connected to, its auth mode (a public endpoint
        says it), and what a new shell exports for `ray job`; None when not connected."""
        import ray

        if not ray.is_initialized():
            return None
        from ray._private.worker import get_dashboard_url  # pinned Ray 2.60; what RayContext reads

        from streamlearn.localray import client_auth, ray_cli

        if self._access is None:
            dashboard = f"http://{get_dashboard_url()}"
            mode = _auth_mode(dashboard, self.timeout_s)
            auth = client_auth(os.environ, mode=mode or "unknown")
            self._access = {"dashboard": dashboard, "auth_mode": mode, "export": auth.export,
                            "token_file": auth.token_where, "ray": ray_cli()}
        return self._access

    def served(self) -> dict | None:
        return self._newest("served")

    def failure(self) -> dict | None:
        return self._newest("failures")

    def _newest(self, name: str) -> dict | None:
        """The newest row of <run dir>/<name>.jsonl (None without a run directory or a row)."""
        if self.run_dir is None:
            return None
        from streamlearn.runfiles import read_last_jsonl

        return read_last_jsonl(self.run_dir / f"{name}.jsonl")

    def frame(self) -> Group:
        snapshot, controller_problem = self.controller()
        model, scorer_problem = self.model()
        return render(snapshot, model, now=time.time(), run_name=self.run_name, ray=self.ray_access(),
                      problems={"controller": controller_problem, "scorer": scorer_problem}, served=self.served(),
                      failure=self.failure())


def _auth_mode(dashboard: str, timeout_s: float) -> str | None:
    try:
        with urllib.request.urlopen(f"{dashboard}/api/authentication_mode", timeout=timeout_s) as response:
            return json.loads(response.read()).get("authentication_mode")
    except (OSError, ValueError, AttributeError):
        return None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def run_status(sources: Sources, once: bool = False, interval_s: float = 2.0, console: Console | None = None) -> None:
    """`--once`, or output that is not a terminal, prints plain frames; a terminal gets one live screen."""
    console = console or Console()
    if once:
        console.print(sources.frame())
        return
    try:
        if not console.is_terminal:
            while True:
                console.print(sources.frame())
                console.print()
                time.sleep(interval_s)
        with Live(sources.frame(), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval_s)
                live.update(sources.frame(), refresh=True)
    except KeyboardInterrupt:
        pass
