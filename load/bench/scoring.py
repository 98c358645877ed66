"""POST /score on Ray Serve against the same model in plain uvicorn + FastAPI, same client.

    python -m load.bench.scoring [--seconds 15] [--variants defaults,haproxy_r1,...]

Client: wrk (one thread; 1 and 8 keep-alive connections; one event per request, rotating
over 64 different banking events) with a Lua script that prints its figures as JSON.
Baseline: `streamlearn.serve.local_app(cfg)` under uvicorn in one process (uvloop, httptools),
started once as a subprocess. Contenders: `streamlearn.serve.deploy(cfg)` in a fresh local
Ray per variant, started by a child process of this script (`--serve-child`), because
several of Serve's switches (HAProxy ingress, throughput-optimized mode) are read from the
environment when Ray's processes start. The baseline is measured again right before each
variant, and each variant's ratio is against that adjacent baseline (the machine is noisy).

The HTTP endpoints (uvicorn, Serve's proxy, HAProxy's frontend, the replicas' own ports) listen on
127.0.0.1 and the client only talks to 127.0.0.1; so do HAProxy's stats and metrics ports, through the
project's loopback wrapper (streamlearn/serve/ingress.py). Ray's internal ports bind to all interfaces
(token auth guards them); each variant's listening sockets are recorded in the JSON. Every run is
bounded in time. Needs `wrk` on PATH (`apt-get install -y wrk`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from load.bench.common import BENCH_DIR, machine_line, median, write_json, write_section
from streamlearn.localray import free_agent_port
from streamlearn.serve.ingress import with_ingress

CFG_ENV = "STREAMLEARN_BENCH_SCORING_CFG"
CONNECTIONS = (1, 8)
# Issue 14's targets at 8 connections: half plain uvicorn's throughput, and a p99 within twice plain's own
# p99 measured right before (a relative bound: the machine's speed moves both).
TARGET_RATIO, TARGET_P99_VS_PLAIN = 0.5, 2.0

# name -> (what it is, extra environment for Ray's processes, ServeConfig overrides[, extra deployment
# options]). Extra deployment options are an EXPERIMENT: the child passes them to its `Scorer.options(...)`
# call over what streamlearn.serve's deploy() sets, to measure a change to the service. deploy() itself sets
# logging_config (no access log, level WARNING) since 2026-11-22 04:38, so every other row has that.
ACCESS_LOG = {"logging_config": {"enable_access_log": True, "log_level": "INFO"}}  # Serve's default
# Since 2026-11-24 every Ray start of the project (and so every variant's child) gets Serve's HAProxy ingress
# on loopback with throughput-optimised mode (streamlearn/serve/ingress.py); a variant's own environment wins,
# so the proxy-actor rows switch it off and the plain-HAProxy rows switch throughput mode off.
PROXY_ACTOR, NO_TPUT = {"RAY_SERVE_ENABLE_HA_PROXY": "0"}, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}
HAPROXY, TPUT = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
R1, R2 = {"min_replicas": 1, "max_replicas": 1}, {"min_replicas": 2, "max_replicas": 2}
VARIANTS: dict[str, tuple] = {
    "defaults": ("Serve, project defaults (HAProxy ingress on loopback + throughput-optimised, autoscaling 1-2 "
                 "replicas, target 4 ongoing, max_ongoing_requests 16)", {}, {}),
    "proxy_actor": ("Serve, the defaults before 2026-11-24: Serve's proxy actor, autoscaling 1-2 replicas",
                    PROXY_ACTOR, {}),
    "r1": ("Serve, 1 replica (proxy actor)", PROXY_ACTOR, R1),
    "r2": ("Serve, 2 replicas (proxy actor)", PROXY_ACTOR, R2),
    "r1_mor100": ("Serve, 1 replica, max_ongoing_requests 100 (proxy actor)", PROXY_ACTOR,
                  R1 | {"max_ongoing_requests": 100}),
    "r2_mor4": ("Serve, 2 replicas, max_ongoing_requests 4 (proxy actor)", PROXY_ACTOR,
                R2 | {"max_ongoing_requests": 4}),
    "tput_r1": ("Serve, 1 replica, RAY_SERVE_THROUGHPUT_OPTIMIZED=1 (proxy actor, gRPC to replica)",
                PROXY_ACTOR | TPUT, R1),
    "haproxy_r1": ("Serve, 1 replica, RAY_SERVE_ENABLE_HA_PROXY=1 (HAProxy → replica's own HTTP server)",
                   HAPROXY | NO_TPUT, R1),
    "haproxy_r2": ("Serve, 2 replicas, RAY_SERVE_ENABLE_HA_PROXY=1", HAPROXY | NO_TPUT, R2),
    "haproxy_tput_r1": ("Serve, 1 replica, HAProxy + RAY_SERVE_THROUGHPUT_OPTIMIZED=1", HAPROXY | TPUT, R1),
    "haproxy_tput_r1_nbt1": ("Serve, 1 replica, HAProxy (1 thread) + RAY_SERVE_THROUGHPUT_OPTIMIZED=1",
                             HAPROXY | TPUT | {"RAY_SERVE_HAPROXY_NBTHREAD": "1"}, R1),
    "haproxy_tput_r1_accesslog": ("Serve, 1 replica, HAProxy + RAY_SERVE_THROUGHPUT_OPTIMIZED=1, EXPERIMENT: "
                                  "access log on, level INFO (Serve's default; the service before 04:38)",
                                  HAPROXY | TPUT, R1, ACCESS_LOG),
    "haproxy_tput_r2": ("Serve, 2 replicas, HAProxy + RAY_SERVE_THROUGHPUT_OPTIMIZED=1", HAPROXY | TPUT, R2),
    "haproxy_tput_r2_nbt1": ("Serve, 2 replicas, HAProxy (1 thread) + RAY_SERVE_THROUGHPUT_OPTIMIZED=1",
                             HAPROXY | TPUT | {"RAY_SERVE_HAPROXY_NBTHREAD": "1"}, R2),
    "defaults_nbt1": ("Serve, project defaults with HAProxy on 1 thread (RAY_SERVE_HAPROXY_NBTHREAD=1)",
                      {"RAY_SERVE_HAPROXY_NBTHREAD": "1"}, {}),
    "retry_conn_only": ("Serve, project defaults but HAProxy retries connection failures only (Ray's default; "
                        "the defaults before 2026-11-30, which added empty responses)",
                        {"RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure"}, {}),
}
# The defaults against the old defaults, each measured twice in the run (an A/B repeat gives the spread).
DEFAULT_VARIANTS = ("defaults", "proxy_actor", "defaults#2", "proxy_actor#2", "defaults#3")

LUA = r"""
local bodies = {%(bodies)s}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, nil, nil, bodies[i])
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%%d,"duration_us":%%d,"connect_errors":%%d,"read_errors":%%d,' ..
    '"write_errors":%%d,"status_errors":%%d,"timeouts":%%d,"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,' ..
    '"p999_us":%%d,"max_us":%%d,"mean_us":%%.1f}\n', summary.requests, summary.duration, e.connect, e.read,
    e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max, latency.mean))
end
"""


def base_name(name: str) -> str:
    """`haproxy_r1#2` is a second measurement of `haproxy_r1` in the same run (an A/B repeat)."""
    return name.split("#", 1)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- setup: a checkpoint, the events, the wrk script ------------------------------------------

def make_checkpoint(checkpoint_dir: Path):
    import torch

    from streamlearn.pipeline import load_pipeline
    from streamlearn.rundir import checkpoint
    from streamlearn.serve.config import ServeConfig

    cfg = ServeConfig(checkpoint_dir=str(checkpoint_dir), pipeline="fraud", auth_token=None)
    fraud = load_pipeline("fraud")
    torch.manual_seed(1)
    meta = {"version": 1, "offsets": {"0": 1000, "1": 900, "2": 950, "3": 1010}, "counters": {},
            "metrics": {"online": {"auc": 0.8, "logloss": 0.3, "window": 5000}, "train_loss": 0.3},
            "pipeline": fraud.describe(), "written_at": time.time(), "topic": "transactions"}
    checkpoint.write(cfg.run_dir / "checkpoint_000000001", fraud.build_model().state_dict(), None, meta)
    return cfg


def cfg_kwargs(cfg, **overrides) -> dict[str, Any]:
    kw = {k: v for k, v in asdict(cfg).items() if k not in ("auth_token",)}
    return kw | overrides


def event_bodies(n: int = 64) -> list[bytes]:
    from streamlearn.loadgen.generator import BankingSimulator, encode_batch

    return encode_batch(BankingSimulator(seed=7).events(n))


def lua_script(bodies: list[bytes], path: Path) -> Path:
    quoted = ", ".join(f"[[{b.decode()}]]" for b in bodies)
    path.write_text(LUA % {"bodies": quoted})
    return path


def post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/score", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"detail": e.read().decode(errors="replace")}


def wait_ready(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
                if json.loads(r.read()).get("ready"):
                    return True
        except Exception:
            pass
        time.sleep(0.25)
    return False


# ---- the client --------------------------------------------------------------------------------

def wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "5s", "-s", str(script), url + "/score"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no figures (rc {done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    r = json.loads(line[len("WRKJSON "):])
    errors = sum(r[k] for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts"))
    return {"connections": connections, "req_per_s": r["requests"] / (r["duration_us"] / 1e6),
            "p50_ms": r["p50_us"] / 1000, "p90_ms": r["p90_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
            "p999_ms": r["p999_us"] / 1000, "max_ms": r["max_us"] / 1000, "mean_ms": r["mean_us"] / 1000,
            "requests": r["requests"], "errors": errors, "raw": r}


def measure(url: str, script: Path, seconds: float, label: str) -> dict[int, dict[str, Any]]:
    out = {}
    for c in CONNECTIONS:
        out[c] = wrk(url, script, c, seconds)
        r = out[c]
        print(f"  {label:<18} c={c}: {r['req_per_s']:8,.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms"
              f"  errors {r['errors']}", flush=True)
    return out


# ---- the plain baseline: uvicorn in a subprocess -----------------------------------------------

def plain_app():
    """uvicorn factory: the scoring app without Ray, from the config in the environment."""
    from streamlearn.serve import ServeConfig, local_app

    return local_app(ServeConfig(**json.loads(os.environ[CFG_ENV])))


def start_plain(cfg, port: int, log: Path) -> tuple[subprocess.Popen, str]:
    env = os.environ | {CFG_ENV: json.dumps(cfg_kwargs(cfg))}
    cmd = [sys.executable, "-m", "uvicorn", "load.bench.scoring:plain_app", "--factory", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    if not wait_ready(url, 60):
        stop(proc, 10)
        raise RuntimeError(f"uvicorn did not become ready: {log.read_text()[-1500:]}")
    return proc, url


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL to the process group this script created for it."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


def reap_group(pgid: int) -> None:
    """Stop what is left of the process group this script created (start_new_session) for a child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
        if not left:
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(5)


# ---- a Serve variant: a child process owning its own local Ray ---------------------------------

def serve_child(spec: dict[str, Any]) -> None:
    """Runs in the child: start Ray, deploy, answer 'status'/'stop' on stdin."""
    import ray
    from ray import serve

    from streamlearn.serve import ServeConfig, deploy

    cfg = ServeConfig(**spec["cfg"])
    if spec.get("deploy_options"):  # the experiment: deploy() unchanged, its Scorer.options(...) gets more
        from streamlearn.serve import app as serve_app

        scorer, extra = serve_app.Scorer, spec["deploy_options"]

        class _WithExtra:
            def options(self, **kw):
                return scorer.options(**(kw | extra))

        serve_app.Scorer = _WithExtra()
    with free_agent_port():  # a second Ray on this machine (the other engineer's tests, say)
        ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=spec["ray_tmp"],
                 _node_ip_address="127.0.0.1",
                 object_store_memory=128 * 1024 * 1024, log_to_driver=False, configure_logging=False)
    try:
        url = deploy(cfg)
        print(f"READY {url}", flush=True)
        for line in sys.stdin:
            if line.strip() == "status":
                try:
                    app = serve.status().applications[cfg.app_name]
                    states = {name: {str(k): v for k, v in d.replica_states.items()}
                              for name, d in app.deployments.items()}
                except Exception as e:  # figures still count; the replica count is a note
                    states = {"error": repr(e)}
                print("STATUS " + json.dumps(states), flush=True)
            elif line.strip() == "stop":
                break
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


class ServeVariant:
    def __init__(self, name: str, cfg, tmp: Path, start_timeout: float):
        desc, env, overrides, *rest = VARIANTS[base_name(name)]
        self.name, self.desc, self.env = name, desc, env
        self.cfg = cfg_kwargs(cfg, port=free_port(), **overrides)
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="slr-", dir="/tmp"))  # short: Ray's socket paths have a limit
        # What every Ray start of the project gets (HAProxy files and ports of this variant's own), under
        # the variant's own switches.
        child_env = with_ingress(os.environ | env, self.ray_tmp)
        child_env.pop("RAY_ADDRESS", None)
        self.log = tmp / f"serve-{name}.log"
        spec = {"cfg": self.cfg, "ray_tmp": str(self.ray_tmp), "deploy_options": rest[0] if rest else None}
        self.proc = subprocess.Popen([sys.executable, "-m", "load.bench.scoring", "--serve-child", json.dumps(spec)],
                                     env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log.open("w"), text=True, start_new_session=True)
        started = time.monotonic()
        try:
            self.url = self._read("READY", start_timeout)
            self.startup_s = time.monotonic() - started
            if not wait_ready(self.url, 60):
                raise RuntimeError(f"{name}: {self.url}/healthz never said ready")
        except BaseException:
            self.close(keep_logs=Path(tempfile.gettempdir()) / f"bench-scoring-failed-{name}-{self.proc.pid}")
            raise

    def _read(self, prefix: str, timeout: float) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sel.select(timeout=1.0):
                if self.proc.poll() is not None:
                    break
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix + " "):
                return line[len(prefix) + 1:].strip()
        raise RuntimeError(f"{self.name}: no {prefix} line within {timeout:.0f} s; log tail:\n"
                           f"{self.log.read_text()[-3000:]}")

    def status(self) -> dict:
        try:
            self.proc.stdin.write("status\n")
            self.proc.stdin.flush()
            return json.loads(self._read("STATUS", 30))
        except Exception as e:
            return {"error": repr(e)}

    def listening(self) -> list[str]:
        """Addresses the variant's processes listen on (to check everything stays on loopback)."""
        done = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10)
        pids = set(subprocess.run(["pgrep", "-s", str(self.proc.pid)], capture_output=True, text=True,
                                  timeout=10).stdout.split())
        found = []
        for line in done.stdout.splitlines():
            if any(f"pid={p}," in line for p in pids):
                parts = line.split()
                proc = line.split('(("', 1)[1].split('"', 1)[0] if '(("' in line else "?"
                found.append(f"{parts[3]} ({proc})")
        return sorted(set(found))

    def close(self, keep_logs: Path | None = None) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
        except Exception:
            pass
        finally:
            stop(self.proc, 10)  # only if it did not exit by itself: its own process group
            reap_group(self.proc.pid)  # Ray processes a crashed child left behind, in the group it led
            if keep_logs is not None:  # for a failed start-up: what Ray said, after its processes are gone
                logs = [p for p in self.ray_tmp.glob("session_*/logs") if not p.parent.is_symlink()]
                try:
                    for src in logs[:1]:
                        shutil.copytree(src, keep_logs, ignore_dangling_symlinks=True, dirs_exist_ok=True)
                        print(f"  {self.name}: Ray's logs kept in {keep_logs}", flush=True)
                except OSError as e:
                    print(f"  {self.name}: could not keep Ray's logs: {e}", flush=True)
            shutil.rmtree(self.ray_tmp, ignore_errors=True)


def start_variant(name: str, cfg, tmp: Path, start_timeout: float, attempts: int = 2) -> ServeVariant:
    """On a busy 2-core machine Ray's own start-up sometimes times out; one more try is fair."""
    for attempt in range(1, attempts + 1):
        try:
            return ServeVariant(name, cfg, tmp, start_timeout)
        except RuntimeError as e:
            if attempt == attempts:
                raise
            print(f"  start-up failed ({str(e).strip().splitlines()[-1][:200]}); trying again", flush=True)
    raise AssertionError("unreachable")


# ---- what a request costs inside the app (for serve.batch) --------------------------------------

def inprocess_costs(bodies: list[bytes], reps: int = 2000) -> dict[str, float]:
    """Microseconds per call of the endpoint's non-HTTP work: parse + validate + featurize + forward,
    for 1 event and for 8 events at once (what serve.batch could merge at 8 connections)."""
    import torch

    from streamlearn.pipeline import load_pipeline

    torch.set_num_threads(1)
    fraud = load_pipeline("fraud")
    model = fraud.build_model().eval()

    def work(batch: list[bytes]) -> None:
        events = [fraud.schema.validate(json.loads(b)) for b in batch]
        with torch.inference_mode():
            fraud.score(model(torch.from_numpy(fraud.features(events)))).tolist()

    out = {}
    for k in (1, 8):
        batch = bodies[:k]
        for _ in range(200):
            work(batch)
        t0 = time.perf_counter()
        for _ in range(reps):
            work(batch)
        out[f"us_per_call_{k}_events"] = (time.perf_counter() - t0) / reps * 1e6
    out["us_per_event_batched_8"] = out["us_per_call_8_events"] / 8
    return out


# ---- run ---------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="per wrk run")
    parser.add_argument("--warmup", type=float, default=3.0, help="wrk at 8 connections before measuring")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from: {', '.join(VARIANTS)}; NAME#2 measures NAME again")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="seconds for Ray + deploy per variant")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other variants of docs/bench/scoring.json; replace only those measured now")
    parser.add_argument("--drop", default="", help="with --merge: variants to remove from the stored figures")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the BENCHMARKS.md section from docs/bench/scoring.json")
    parser.add_argument("--serve-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_child:
        serve_child(json.loads(args.serve_child))
        return
    if args.render:
        figures = json.loads((BENCH_DIR / "scoring.json").read_text())
        summarize(figures)
        write_section("scoring", TITLE, render(json.loads(write_json("scoring", figures).read_text())))
        return
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed: this benchmark drives HTTP with wrk. Install it with "
                 "`apt-get update && apt-get install -y wrk` (Debian/Ubuntu), then run again.")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if base_name(v) not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-scoring-") as tmp_name:
        tmp = Path(tmp_name)
        cfg = make_checkpoint(tmp / "ckpt")
        bodies = event_bodies()
        script = lua_script(bodies, tmp / "score.lua")
        costs = inprocess_costs(bodies)
        print(f"in-process scoring work: {costs}", flush=True)
        plain, plain_url = start_plain(cfg, free_port(), tmp / "uvicorn.log")
        try:
            status, answer = post(plain_url, bodies[0])
            if status != 200:
                raise RuntimeError(f"plain app answered {status}: {answer}")
            reference = answer["scores"]
            wrk(plain_url, script, 8, args.warmup)
            for name in names:
                spec = VARIANTS[base_name(name)]
                desc = spec[0] + (f" (repeat {name.split('#', 1)[1]})" if "#" in name else "")
                print(f"[{name}] {desc}", flush=True)
                base = measure(plain_url, script, args.seconds, "plain uvicorn")
                row: dict[str, Any] = {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                       "variant": name, "description": desc, "env": spec[1], "overrides": spec[2],
                                       "baseline": base, "deploy_options": spec[3] if len(spec) > 3 else None}
                variant = None
                try:
                    variant = start_variant(name, cfg, tmp, args.start_timeout)
                    row["startup_s"] = variant.startup_s
                    status, answer = post(variant.url, bodies[0])
                    if status != 200 or answer["scores"] != reference:
                        raise RuntimeError(f"Serve answered {status} {answer}, plain gave scores {reference}")
                    row["listening"] = variant.listening()
                    wrk(variant.url, script, 8, args.warmup)
                    row["serve"] = measure(variant.url, script, args.seconds, name)
                    direct = [a.split()[0] for a in row["listening"] if a.startswith("127.0.0.1:")
                              and "ServeRepli" in a]
                    if spec[1].get("RAY_SERVE_ENABLE_HA_PROXY") and len(direct) == 1:
                        # Where the time goes: the same replica without HAProxy in front (c=8 only).
                        row["replica_direct_8c"] = wrk(f"http://{direct[0]}", script, 8, args.seconds)
                        d = row["replica_direct_8c"]
                        print(f"  {'replica directly':<18} c=8: {d['req_per_s']:8,.0f} req/s  p50 {d['p50_ms']:6.2f} "
                              f"ms  p99 {d['p99_ms']:6.2f} ms  errors {d['errors']}", flush=True)
                    row["replicas"] = variant.status()
                    print(f"  listening: {row['listening']}; replicas: {row['replicas']}", flush=True)
                except Exception as e:  # one variant failing must not lose the others
                    row["error"] = f"{type(e).__name__}: {e}"[:3000]
                    print(f"  FAILED: {row['error']}", flush=True)
                finally:
                    if variant is not None:
                        variant.close()
                results.append(row)
        finally:
            stop(plain, 15)
    report(args, results, costs)


TITLE = "Scoring: Ray Serve vs plain uvicorn (issue: real-time scoring)"


def report(args, results: list[dict], costs: dict) -> None:
    variants = {}
    for r in results:
        ratio = ({c: r["serve"][c]["req_per_s"] / r["baseline"][c]["req_per_s"] for c in CONNECTIONS}
                 if "serve" in r else {})
        variants[r["variant"]] = {
            "description": r["description"], "env": r["env"], "overrides": r["overrides"],
            "deploy_options_experiment": r.get("deploy_options"), "measured_at": r["measured_at"],
            "error": r.get("error"), "startup_s": r.get("startup_s"), "replicas": r.get("replicas"),
            "listening": r.get("listening"), "ratio_1c": ratio.get(1), "ratio_8c": ratio.get(8),
            "replica_direct_8c": _slim(r["replica_direct_8c"]) if "replica_direct_8c" in r else None,
            **{f"serve_{c}c": _slim(r["serve"][c]) for c in CONNECTIONS if "serve" in r},
            **{f"plain_{c}c": _slim(r["baseline"][c]) for c in CONNECTIONS},
        }
    figures: dict[str, Any] = {
        "seconds_per_run": args.seconds, "warmup_s": args.warmup, "connections": list(CONNECTIONS),
        "client": "wrk -t1, keep-alive", "inprocess_scoring_us": costs, "variants": variants,
    }
    if args.merge:  # re-measured variants replace their old entries; the others keep theirs
        old = json.loads((BENCH_DIR / "scoring.json").read_text())
        dropped = {d.strip() for d in args.drop.split(",") if d.strip()}
        figures["variants"] = {k: v for k, v in old["variants"].items() if k not in dropped} | variants
        figures["merged_runs"] = [*old.get("merged_runs", [old.get("machine", {}).get("date")]),
                                  time.strftime("%Y-%m-%d %H:%M %Z")]
    summarize(figures)
    print(json.dumps({k: v for k, v in figures.items() if k != "variants"}, default=str))
    if args.no_write:
        return
    path = write_json("scoring", figures)
    write_section("scoring", TITLE, render(json.loads(path.read_text())))


def summarize(f: dict[str, Any]) -> None:
    """The headline figures, from the variants alone."""
    variants = f["variants"]
    ok = {name: v for name, v in variants.items() if v.get("serve_8c")}
    f.pop("target_p99_ms_8c", None)  # the absolute 10 ms of the first scoring issue, before issue 14
    f["target_ratio_serve_vs_plain_8c"], f["target_p99_vs_plain_8c"] = TARGET_RATIO, TARGET_P99_VS_PLAIN
    f["plain_median"] = {str(c): {k: median([v[f"plain_{c}c"][k] for v in variants.values()])
                                  for k in ("req_per_s", "p50_ms", "p99_ms")} for c in CONNECTIONS}
    # A variant measured more than once (NAME, NAME#2, ...) counts with the median of its measurements.
    groups: dict[str, list[dict]] = {}
    for name, v in ok.items():
        groups.setdefault(base_name(name), []).append(v)
    f["by_variant"] = {name: {"measurements": len(vs), "ratio_8c_runs": [v["ratio_8c"] for v in vs],
                              "ratio_8c": median([v["ratio_8c"] for v in vs]),
                              "ratio_1c": median([v["ratio_1c"] for v in vs]),
                              "req_per_s_8c": median([v["serve_8c"]["req_per_s"] for v in vs]),
                              "p99_ms_8c": median([v["serve_8c"]["p99_ms"] for v in vs]),
                              "plain_p99_ms_8c": median([v["plain_8c"]["p99_ms"] for v in vs])}
                       for name, vs in groups.items()}
    by = f["by_variant"]
    best = max(by, key=lambda name: by[name]["ratio_8c"], default=None)
    f["best_variant"] = best
    f["best_ratio_8c"] = by[best]["ratio_8c"] if best else None
    f["best_p99_ms_8c"] = by[best]["p99_ms_8c"] if best else None
    f["best_meets_targets"] = bool(best and meets(by[best]))
    f["defaults_ratio_8c"] = by["defaults"]["ratio_8c"] if "defaults" in by else None
    f["defaults_p99_vs_plain_8c"] = (by["defaults"]["p99_ms_8c"] / by["defaults"]["plain_p99_ms_8c"]
                                     if "defaults" in by else None)
    f["defaults_meet_targets"] = bool("defaults" in by and meets(by["defaults"]))
    f["variants_meeting_targets"] = [name for name, g in by.items() if meets(g)]


def meets(g: dict) -> bool:
    """A variant's medians against issue 14's targets at 8 connections."""
    return g["ratio_8c"] >= TARGET_RATIO and g["p99_ms_8c"] <= TARGET_P99_VS_PLAIN * g["plain_p99_ms_8c"]


def render(f: dict[str, Any]) -> str:
    """The BENCHMARKS.md section, from the figures alone (so `--render` can redo it from the JSON)."""
    variants = f["variants"]
    ok = {name: v for name, v in variants.items() if v.get("serve_8c")}
    costs = f["inprocess_scoring_us"]
    target_ratio, target_p99 = f["target_ratio_serve_vs_plain_8c"], f["target_p99_vs_plain_8c"]

    def cells(s: dict, ratio: float) -> str:
        return f"{s['req_per_s']:,.0f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | {ratio:.2f}"

    pm = f["plain_median"]
    lines = [
        f"`POST /score`, one event per request (64 different events in turn), wrk with one thread and 1 or 8 "
        f"keep-alive connections, {f['seconds_per_run']:g} s per run after a {f.get('warmup_s', 3):g} s warm-up. "
        "Plain = the same app and model (`local_app`) under uvicorn in one process (uvloop, httptools); it is "
        "measured again right before each Serve variant, and each ratio is Serve / that adjacent plain run. Each "
        "Serve variant runs in a fresh local Ray (num_cpus=2) started by the benchmark; the HTTP endpoints listen "
        f"on 127.0.0.1. {machine_line(f.get('machine'))}",
        "",
        f"Issue 14's targets at 8 connections, for the defaults a user gets: throughput ratio Serve/plain ≥ "
        f"{target_ratio} and p99 ≤ {target_p99:g}× the adjacent plain run's p99. "
        "Before this project Ray Serve with its defaults reached ~0.045× (90 vs 2,000 req/s). "
        "`streamlearn.serve.deploy` turns Serve's per-request access log off (logging_config: no access log, "
        "level WARNING) since 2026-11-22 04:38, so every row measured after that has it; rows marked EXPERIMENT "
        "pass other deployment options over it. Ray's switches (HAProxy, throughput-optimized) are environment "
        "variables of Ray's processes, set before Ray starts.",
        "",
        "| variant | c=1 req/s | p50 ms | p99 ms | ratio | c=8 req/s | p50 ms | p99 ms | ratio | targets at c=8 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        "| plain uvicorn + FastAPI, 1 process (median of the adjacent runs) | "
        + " | ".join(cells(pm[str(c)], 1.0) for c in CONNECTIONS) + " | |",
    ]
    for name, v in variants.items():
        if name not in ok:
            error = [ln.strip() for ln in (v.get("error") or "?").splitlines() if ln.strip()]
            why = error[0] if len(error) == 1 else f"{error[0][:80]} … {error[-1]}"
            lines.append(f"| {v['description']} | failed: {why[:300].replace('|', '/')} | | | | | | | | |")
            continue
        ratio, p99 = v["ratio_8c"], v["serve_8c"]["p99_ms"]
        plain_p99 = v["plain_8c"]["p99_ms"]
        missed = ([f"ratio {ratio:.2f}"] if ratio < target_ratio else []) + \
                 ([f"p99 {p99:.1f} ms = {p99 / plain_p99:.1f}× plain's"] if p99 > target_p99 * plain_p99 else [])
        errors = sum(v[f"serve_{c}c"]["errors"] for c in CONNECTIONS)
        note = ("met" if not missed else "missed: " + ", ".join(missed)) + (f"; {errors} errors" if errors else "")
        lines.append(f"| {v['description']} | {cells(v['serve_1c'], v['ratio_1c'])} | "
                     f"{cells(v['serve_8c'], v['ratio_8c'])} | {note} |")
    lines += [
        "",
        "How steady the machine was: the plain baseline at c=8 ran between "
        f"{min(v['plain_8c']['req_per_s'] for v in variants.values()):,.0f} and "
        f"{max(v['plain_8c']['req_per_s'] for v in variants.values()):,.0f} req/s. Compare ratios, not req/s "
        "across rows.",
        "",
        "Adjacent plain runs (req/s at c=1 / c=8; p99 ms at c=8): "
        + "; ".join(f"{name}: {v['plain_1c']['req_per_s']:,.0f} / {v['plain_8c']['req_per_s']:,.0f}; "
                    f"{v['plain_8c']['p99_ms']:.1f}" for name, v in variants.items()) + ".",
    ]
    direct = {name: v for name, v in ok.items() if v.get("replica_direct_8c")}
    if direct:
        lines += ["", "HAProxy variants, the same replica's own HTTP port hit directly at c=8 (no HAProxy in front; "
                      "a diagnostic, not a way to deploy): "
                  + "; ".join(f"{name}: {v['replica_direct_8c']['req_per_s']:,.0f} req/s, p99 "
                              f"{v['replica_direct_8c']['p99_ms']:.1f} ms (via HAProxy "
                              f"{v['serve_8c']['req_per_s']:,.0f} req/s, p99 {v['serve_8c']['p99_ms']:.1f} ms)"
                              for name, v in direct.items()) + "."]
    lines += [
        "",
        "Replica states after each variant's runs: "
        + "; ".join(f"{name}: {_replicas(v.get('replicas'))}" for name, v in ok.items()) + ".",
        "",
        f"The scoring work itself (parse, validate, featurize, MLP forward; in-process, one thread) costs "
        f"{costs['us_per_call_1_events']:.0f} µs for one event and {costs['us_per_call_8_events']:.0f} µs for 8 "
        f"events in one call ({costs['us_per_event_batched_8']:.0f} µs each), so `serve.batch` could save at most "
        f"~{costs['us_per_call_1_events'] - costs['us_per_event_batched_8']:.0f} µs of CPU per request at 8 "
        "connections, and would add its batch wait to every request's latency.",
    ]
    repeated = {name: g for name, g in f.get("by_variant", {}).items() if g["measurements"] > 1}
    if repeated:
        lines += ["", "Variants measured more than once (`NAME#2`; ratio at c=8 each time → median; p99 median):",
                  "", "| variant | ratios at c=8 | median ratio | median p99 ms (Serve / plain) |",
                  "|---|---|---:|---:|"]
        lines += [f"| {variants[name]['description']} | " + ", ".join(f"{r:.2f}" for r in g["ratio_8c_runs"])
                  + f" | {g['ratio_8c']:.2f} | {g['p99_ms_8c']:.1f} / {g['plain_p99_ms_8c']:.1f} |"
                  for name, g in repeated.items()]
    if f.get("best_variant"):
        best, g = variants[f["best_variant"]], f["by_variant"][f["best_variant"]]
        lines += ["", f"Best at c=8 (median of {g['measurements']} measurement(s)): {best['description']}: "
                      f"{f['best_ratio_8c']:.2f}× plain, p99 {f['best_p99_ms_8c']:.1f} ms (plain's own p99 in the "
                      f"adjacent runs: {g['plain_p99_ms_8c']:.1f} ms) — targets "
                      f"{'met' if f['best_meets_targets'] else 'MISSED'}."]
    if "defaults" in f.get("by_variant", {}):
        g = f["by_variant"]["defaults"]
        lines += ["", f"**The defaults a user gets** (median of {g['measurements']}): {g['ratio_8c']:.2f}× plain "
                      f"at c=8, "
                      f"p99 {g['p99_ms_8c']:.1f} ms = {f['defaults_p99_vs_plain_8c']:.2f}× plain's "
                      f"{g['plain_p99_ms_8c']:.1f} ms — issue 14's targets "
                      f"{'met' if f['defaults_meet_targets'] else 'MISSED'}."]
    if f.get("merged_runs"):
        lines += ["", f"Variants come from {len(f['merged_runs'])} runs of this benchmark (finished "
                      + ", ".join(str(d) for d in f["merged_runs"]) + "; `measured_at` per variant in the JSON), "
                      "each variant against the plain run right before it."]
    lines += ["", "Reproduce: `python -m load.bench.scoring` (one variant set: `--variants NAME,...`; redo this "
                  "section from docs/bench/scoring.json: `--render`)."]
    return "\n".join(lines)


def _slim(r: dict) -> dict:
    return {k: r[k] for k in ("req_per_s", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "requests", "errors")}


def _replicas(states: dict | None) -> str:
    if not states:
        return "?"
    if "error" in states:
        return "unknown"
    return ", ".join(f"{d} {s}" for d, s in states.items())


if __name__ == "__main__":
    main()
