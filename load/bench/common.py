"""What every benchmark in load/ shares: its JSON file, its section of BENCHMARKS.md, the machine.

    write_json("scoring", figures)            # docs/bench/scoring.json
    write_section("scoring", "Title", body)   # between <!-- bench:scoring --> and <!-- /bench:scoring -->,
                                              # headed by load/bench/tables.py's table of scoring.json
    audit_exactly_once(settings, cfg, produced)  # a run's last checkpoint against a re-read of Kafka
    read_whole_topic(settings, topic)         # every message of a topic (confluent-kafka Messages)

Each benchmark owns one named section of docs/BENCHMARKS.md; rewriting it leaves every
other section (and any text outside the markers) as it was. Several benchmarks may finish
at once, so the read-modify-write of the shared file holds an exclusive lock on it.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from load.bench.tables import section_table
from streamlearn.config import REPO_ROOT, KafkaSettings, TrainConfig
from streamlearn.errors import BadEvent
from streamlearn.ingest.decode import FINGERPRINT_MOD
from streamlearn.kafka.admin import end_offsets, ensure_topics
from streamlearn.kafka.broker import EmbeddedKafka
from streamlearn.pipeline import load_pipeline
from streamlearn.rundir import checkpoint as ckpt
from streamlearn.runfiles import json_safe

DOCS = REPO_ROOT / "docs"
BENCH_DIR = DOCS / "bench"
BENCHMARKS_MD = DOCS / "BENCHMARKS.md"
HEADER = ("# Benchmarks\n\nWritten by the benchmarks in `load/` (`python -m load.bench.<name>`); each section is "
          "replaced by its own benchmark and starts with a table generated from `docs/bench/<name>.json` "
          "(`python -m load.bench.tables`). Machines here are noisy: "
          "every contender is measured against its baseline in the same run, and figures are medians and ratios.\n")


@contextmanager
def bench_broker(topics: dict[str, int] | None = None) -> Iterator[tuple[Path, EmbeddedKafka, KafkaSettings]]:
    """A throwaway home directory and a broker of the benchmark's own, with `topics` (and a
    one-partition dead-letter topic for each) created; the broker stops however the run ends."""
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        broker = EmbeddedKafka(port=0, data_dir=home / "kafka").start()
        try:
            settings = KafkaSettings(bootstrap=broker.bootstrap)
            if topics:
                ensure_topics(settings, {**topics, **{f"{t}.dlq": 1 for t in topics}})
            yield home, broker, settings
        finally:
            broker.stop()


class Sampler:
    """Calls `sample()` every `every_s` seconds in a thread of its own, from entering a `with`
    block to leaving it (and once on entering)."""

    def __init__(self, every_s: float):
        self.every_s, self._stop = every_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()


def start_bench_ray(**overrides: Any):
    """The benchmarks' local Ray: room for 4 fractional workers, a small object store, quiet."""
    from streamlearn.localray import start_local_ray

    options = dict(num_cpus=4, object_store_memory=300 * 1024 * 1024, include_dashboard=False,
                   log_to_driver=False, configure_logging=False)
    return start_local_ray(**{**options, **overrides})


def score_continuously(url: str, stop: threading.Event, out: list) -> None:
    """A scoring client in a loop until `stop`: (start, seconds, HTTP status or 0) per request."""
    import httpx

    from streamlearn.loadgen.generator import BankingSimulator

    event = BankingSimulator(seed=99).events(1)[0]
    with httpx.Client(timeout=5) as client:
        while not stop.is_set():
            started = time.time()
            try:
                status = client.post(f"{url}/score", json=event).status_code
            except httpx.HTTPError:
                status = 0
            out.append((started, time.time() - started, status))


def read_whole_topic(settings: KafkaSettings, topic: str) -> list:
    """Every message of `topic`, partition by partition, as confluent-kafka Messages (value,
    key, offset, Kafka timestamp): an independent re-read, with no streamlearn reader in it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.confluent(), "group.id": "reread", "enable.auto.commit": False})
    try:
        out = []
        for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            consumer.assign([TopicPartition(topic, p, low)])
            while low < high:
                # Never more than is left: consume() waits its whole timeout for a batch it cannot fill
                # (10 s a partition, in every test that re-read a topic).
                batch = [m for m in consumer.consume(min(10_000, high - low), timeout=10) if m.error() is None]
                if not batch:
                    raise RuntimeError(f"{topic}[{p}] stopped at offset {low} of {high}")
                out += batch
                low = batch[-1].offset() + 1
        return out
    finally:
        consumer.close()


def audit_exactly_once(settings: KafkaSettings, cfg: TrainConfig, produced: int) -> dict:
    """The final checkpoint against an independent re-read of the topic and its dead-letter topic."""
    schema = load_pipeline(cfg.pipeline).schema
    learned = dead = fingerprint = 0
    for msg in read_whole_topic(settings, cfg.topic):
        try:
            schema.decode(msg.value())
            learned += 1
            fingerprint += zlib.crc32(msg.value())
        except BadEvent:
            dead += 1
    dlq_keys = [m.key() for m in read_whole_topic(settings, cfg.dlq_topic)]
    meta = ckpt.read_meta(ckpt.newest(Path(cfg.checkpoint_dir) / cfg.run_name))
    c = meta["counters"]
    checks = {
        "learned + dead-lettered == produced": c["learned"] + c["dead_lettered"] == produced,
        "learned == the re-read's valid events": c["learned"] == learned,
        "dead-lettered == the re-read's malformed events": c["dead_lettered"] == dead,
        "fingerprint == the re-read's": c["fingerprint"] == fingerprint % FINGERPRINT_MOD,
        "checkpoint offsets == the topic's end": {int(p): o for p, o in meta["offsets"].items()}
        == end_offsets(settings, cfg.topic),
        "dead-letter topic: each malformed event once": len(dlq_keys) == len(set(dlq_keys)) == dead,
    }
    return {"produced": produced, "learned": c["learned"], "dead_lettered": c["dead_lettered"],
            "reread_valid": learned, "reread_malformed": dead, "dead_letter_messages": len(dlq_keys),
            "dead_letter_unique": len(set(dlq_keys)), "checks": checks, "passed": all(checks.values())}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_json(name: str, figures: dict[str, Any]) -> Path:
    """docs/bench/<name>.json, with the machine and date; written whole, then renamed in."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    path = BENCH_DIR / f"{name}.json"
    body = {"benchmark": name, "machine": machine_info(), **figures}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(json_safe(body), indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write_section(name: str, title: str, body: str, path: Path = BENCHMARKS_MD, bench_dir: Path = BENCH_DIR) -> Path:
    """Replace (or append) the section between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->`.

    The section starts with the benchmark's table, rendered from its JSON by load/bench/tables.py
    (`faults-bench` from faults.json; none where there is no JSON or renderer), then `body`."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    body = body.rstrip()
    try:
        table = section_table(name, bench_dir)
    except Exception as e:  # a table's bug must not lose what the benchmark measured
        print(f"write_section({name!r}): no table ({e!r}); tests/unit/test_benchmarks_doc.py will say so",
              file=sys.stderr)
        table = None
    if table:
        body = f"{table}\n\n{body.lstrip(chr(10))}"
    section = f"{start}\n## {title}\n\n{body}\n{end}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # another benchmark may be rewriting its own section right now
        text = f.read() or HEADER
        i = text.find(start)
        j = text.find(end, i) if i >= 0 else -1
        if i >= 0 and j >= 0:
            text = text[:i] + section + text[j + len(end):]
        else:
            text = text.rstrip("\n") + "\n\n" + section + "\n"
        f.seek(0)
        f.write(text)
        f.truncate()
    return path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    return {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M %Z"), "loadavg_1m": round(os.getloadavg()[0], 2)}


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for a section: `Machine: 2 cores (nproc), <CPU model>; measured <date>.` Pass the
    "machine" entry of a stored JSON to describe that run rather than this moment."""
    m = machine_info() | (info or {})
    return (f"Machine: {m['nproc']} cores (nproc), {m['cpu']}; Python {m['python']}; measured {m['date']} "
            f"(1-min load average {m.get('loadavg_1m', '?')} when written).")
