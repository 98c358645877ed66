"""confluent-kafka against kafka-python on one broker, and the load generator's own rate.

    python -m load.bench.kafka_clients [--events 200000] [--repeats 3]

The data behind DESIGN.md's "Kafka clients" decision (confluent-kafka on the data plane,
kafka-python on the control plane). One embedded broker on loopback, a 4-partition topic,
the same `--events` pre-encoded JSON banking events (`encode_batch`) for every contender.

- produce: every event sent with its customer id as key to partition_for(key, 4), then a
  flush; both clients with acks=all, linger 5 ms, ~1 MB batches, no compression.
- consume: the pre-filled topic read from offset 0 of all 4 partitions by an assigned
  consumer (no group rebalance); confluent-kafka `consume(10000)`, kafka-python
  `poll(max_records=10000)`; every value touched.
- generator: `run_load(count=N)` unthrottled (generation + encoding + confluent producer
  with the generator's own settings: lz4, idempotent, acks=all), with the process's CPU
  seconds and the calling thread's CPU seconds beside the wall time.

Each contender runs `--repeats` times, interleaved; figures are medians, ratios are
confluent/kafka-python. Every run is bounded (`--trial-timeout`).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from load.bench.common import BENCH_DIR, machine_line, median, write_json, write_section
from streamlearn.config import KafkaSettings
from streamlearn.kafka.admin import ensure_topics
from streamlearn.kafka.broker import EmbeddedKafka
from streamlearn.loadgen.generator import BankingSimulator, bench_generation, encode_batch, partition_for, run_load

PARTITIONS = 4
BATCH_BYTES = 1_000_000


class Trial(dict):
    """One timed run: events, seconds, events_per_s, complete."""


def _trial(events: int, seconds: float, expected: int) -> Trial:
    return Trial(events=events, seconds=seconds, events_per_s=events / seconds if seconds > 0 else 0.0,
                 complete=events >= expected)


def make_records(n: int, seed: int = 0) -> list[tuple[bytes, bytes, int]]:
    events = BankingSimulator(seed).events(n)
    out = []
    for event, value in zip(events, encode_batch(events), strict=True):
        key = event["customer_id"].encode()
        out.append((key, value, partition_for(key, PARTITIONS)))
    return out


# ---- produce ------------------------------------------------------------------------------

def produce_confluent(bootstrap: str, topic: str, records: list, timeout: float) -> Trial:
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(str(err))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.size": BATCH_BYTES, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 500_000, "compression.type": "none",
                         "on_delivery": on_delivery, "delivery.report.only.error": True})
    producer.list_topics(topic, timeout=10)  # connect before the clock starts, like kafka-python's bootstrap
    start = time.perf_counter()
    deadline = start + timeout
    sent = 0
    for key, value, partition in records:
        while True:
            try:
                producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.005)
        sent += 1
        if sent % 10_000 == 0:
            producer.poll(0)
            if time.perf_counter() > deadline:
                break
    left = producer.flush(max(1.0, deadline - time.perf_counter()))
    seconds = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"confluent producer: {len(failures)} failed deliveries, first: {failures[0]}")
    return _trial(sent - left, seconds, len(records))


def produce_kafka_python(bootstrap: str, topic: str, records: list, timeout: float) -> Trial:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=BATCH_BYTES,
                             compression_type=None)
    producer.partitions_for(topic)  # metadata before the clock starts
    start = time.perf_counter()
    deadline = start + timeout
    futures = []
    for i, (key, value, partition) in enumerate(records):
        futures.append(producer.send(topic, value=value, key=key, partition=partition))
        if i % 10_000 == 0 and time.perf_counter() > deadline:
            break
    producer.flush(timeout=max(1.0, deadline - time.perf_counter()))
    seconds = time.perf_counter() - start
    done = sum(1 for f in futures if f.is_done and f.succeeded())
    failed = [f for f in futures if f.is_done and f.failed()]
    producer.close(timeout=5)
    if failed:
        raise RuntimeError(f"kafka-python producer: {len(failed)} failed sends, first: {failed[0].exception!r}")
    return _trial(done, seconds, len(records))


# ---- consume ------------------------------------------------------------------------------

def consume_confluent(bootstrap: str, topic: str, n: int, timeout: float) -> Trial:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen = nbytes = 0
        deadline = start + timeout
        while seen < n and time.perf_counter() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is None:
                    seen += 1
                    nbytes += len(msg.value())
        return _trial(seen, time.perf_counter() - start, n)
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, topic: str, n: int, timeout: float) -> Trial:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        start = time.perf_counter()
        parts = [KpTopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        seen = nbytes = 0
        deadline = start + timeout
        while seen < n and time.perf_counter() < deadline:
            for records in consumer.poll(timeout_ms=1000, max_records=10_000).values():
                for record in records:
                    seen += 1
                    nbytes += len(record.value)
        return _trial(seen, time.perf_counter() - start, n)
    finally:
        consumer.close()


# ---- generator ----------------------------------------------------------------------------

def generator_trial(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    usage0, proc0, thread0, start = (resource.getrusage(resource.RUSAGE_SELF), time.process_time(),
                                     time.thread_time(), time.perf_counter())
    summary = run_load(bootstrap, topic, partitions=PARTITIONS, count=n)
    wall = time.perf_counter() - start
    usage1, proc1, thread1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.thread_time()
    process_cpu = proc1 - proc0
    return {"events": summary["events"], "seconds": summary["seconds"], "events_per_s": summary["events_per_s"],
            "wall_s": wall, "process_cpu_s": process_cpu,
            "rusage_user_s": usage1.ru_utime - usage0.ru_utime, "rusage_sys_s": usage1.ru_stime - usage0.ru_stime,
            "calling_thread_cpu_s": thread1 - thread0, "cores_used": process_cpu / wall if wall else 0.0}


# ---- run ----------------------------------------------------------------------------------

def repeat(label: str, runs: list, fn: Callable[..., Trial], *args: Any) -> None:
    trial = fn(*args)
    runs.append(trial)
    flag = "" if trial["complete"] else "  (INCOMPLETE: hit the trial timeout)"
    print(f"  {label}: {trial['events']:,} events in {trial['seconds']:.2f} s = {trial['events_per_s']:,.0f}/s{flag}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trial-timeout", type=float, default=120.0, help="seconds; a run stops there")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite both BENCHMARKS.md sections from docs/bench/{kafka_clients,generator}.json")
    args = parser.parse_args()
    if args.render:
        write_section("kafka_clients", KAFKA_TITLE, render_clients(json.loads((BENCH_DIR / "kafka_clients.json")
                                                                              .read_text())))
        write_section("generator", GENERATOR_TITLE, render_generator(json.loads((BENCH_DIR / "generator.json")
                                                                                .read_text())))
        return
    n = args.events

    print(f"encoding {n:,} events ...", flush=True)
    records = make_records(n)
    avg_bytes = sum(len(v) for _, v, _ in records) / n
    runs: dict[str, list] = {k: [] for k in ("produce_confluent", "produce_kafka_python",
                                             "consume_confluent", "consume_kafka_python")}
    gen_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as tmp:
        broker = EmbeddedKafka(port=0, data_dir=tmp).start()
        try:
            bootstrap = broker.bootstrap
            settings = KafkaSettings(bootstrap=bootstrap)
            topics = {"consume": PARTITIONS, "gen": PARTITIONS}
            topics |= {f"produce-{c}-{r}": PARTITIONS for c in ("confluent", "kp") for r in range(args.repeats)}
            ensure_topics(settings, topics)
            print(f"broker {bootstrap}; filling the consume topic", flush=True)
            fill = produce_confluent(bootstrap, "consume", records, args.trial_timeout * 2)
            if not fill["complete"]:
                raise SystemExit(f"could not fill the consume topic: {fill}")
            for r in range(args.repeats):
                print(f"round {r + 1}/{args.repeats}", flush=True)
                limit = args.trial_timeout
                repeat("produce confluent-kafka", runs["produce_confluent"], produce_confluent,
                       bootstrap, f"produce-confluent-{r}", records, limit)
                repeat("produce kafka-python   ", runs["produce_kafka_python"], produce_kafka_python,
                       bootstrap, f"produce-kp-{r}", records, limit)
                repeat("consume confluent-kafka", runs["consume_confluent"], consume_confluent,
                       bootstrap, "consume", n, limit)
                repeat("consume kafka-python   ", runs["consume_kafka_python"], consume_kafka_python,
                       bootstrap, "consume", n, limit)
            gen_only = [bench_generation(n) for _ in range(args.repeats)]
            for _ in range(args.repeats):
                trial = generator_trial(bootstrap, "gen", n)
                gen_runs.append(trial)
                print(f"  generator run_load: {trial['events_per_s']:,.0f} events/s, process CPU "
                      f"{trial['process_cpu_s']:.1f} s over {trial['wall_s']:.1f} s wall", flush=True)
        finally:
            broker.stop()
    report(n, avg_bytes, runs, gen_runs, gen_only)


KAFKA_TITLE = "Kafka clients: confluent-kafka vs kafka-python"
GENERATOR_TITLE = "Load generator rate (issue: load generator)"
GENERATOR_TARGET = 50_000


def report(n: int, avg_bytes: float, runs: dict[str, list], gen_runs: list[dict], gen_only: list[float]) -> None:
    med = {k: median([t["events_per_s"] for t in v]) for k, v in runs.items()}
    # Rounds are interleaved, so a round's two clients saw the same machine: the median of the
    # per-round ratios is the figure least moved by noise between rounds.
    round_ratio = {op: median([c["events_per_s"] / k["events_per_s"] for c, k in
                               zip(runs[f"{op}_confluent"], runs[f"{op}_kafka_python"], strict=True)])
                   for op in ("produce", "consume")}
    figures = {"events": n, "partitions": PARTITIONS, "avg_event_bytes": avg_bytes,
               "produce_confluent_events_per_s": med["produce_confluent"],
               "produce_kafka_python_events_per_s": med["produce_kafka_python"],
               "produce_ratio_confluent_vs_kafka_python": med["produce_confluent"] / med["produce_kafka_python"],
               "consume_confluent_events_per_s": med["consume_confluent"],
               "consume_kafka_python_events_per_s": med["consume_kafka_python"],
               "consume_ratio_confluent_vs_kafka_python": med["consume_confluent"] / med["consume_kafka_python"],
               "produce_ratio_median_of_rounds": round_ratio["produce"],
               "consume_ratio_median_of_rounds": round_ratio["consume"],
               "incomplete_runs": {k: sum(not t["complete"] for t in v) for k, v in runs.items()}, "runs": runs}
    path = write_json("kafka_clients", figures)
    write_section("kafka_clients", KAFKA_TITLE, render_clients(json.loads(path.read_text())))

    for t in gen_runs:
        t["events_per_cpu_s"] = t["events"] / t["process_cpu_s"] if t["process_cpu_s"] else 0.0
    g = {k: median([t[k] for t in gen_runs]) for k in gen_runs[0]}
    gen_figures = {"events": n, "partitions": PARTITIONS, "events_per_s": g["events_per_s"],
                   "target_events_per_s": GENERATOR_TARGET, "ratio_to_target": g["events_per_s"] / GENERATOR_TARGET,
                   "meets_target": g["events_per_s"] >= GENERATOR_TARGET,
                   "process_cpu_s": g["process_cpu_s"], "calling_thread_cpu_s": g["calling_thread_cpu_s"],
                   "wall_s": g["wall_s"], "cores_used": g["cores_used"], "events_per_cpu_s": g["events_per_cpu_s"],
                   "generation_only_events_per_s": median(gen_only), "generation_only_runs": gen_only,
                   "runs": gen_runs}
    path = write_json("generator", gen_figures)
    write_section("generator", GENERATOR_TITLE, render_generator(json.loads(path.read_text())))
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}))
    print(json.dumps({k: v for k, v in gen_figures.items() if k != "runs"}))


def render_clients(f: dict[str, Any]) -> str:
    runs, incomplete = f["runs"], f["incomplete_runs"]

    def spread(key: str) -> str:
        return " / ".join(f"{t['events_per_s'] / 1000:,.0f}k" for t in runs[key])

    return "\n".join([
        f"One embedded broker on loopback, {f['events']:,} JSON banking events (`encode_batch`, "
        f"{f['avg_event_bytes']:.0f} bytes each), {f['partitions']} partitions, {len(runs['produce_confluent'])} "
        f"interleaved rounds (each round runs all four once); medians. {machine_line(f.get('machine'))}",
        "",
        "| operation | confluent-kafka (librdkafka) | kafka-python | ratio of medians | median of per-round ratios |",
        "|---|---:|---:|---:|---:|",
        f"| produce (acks=all, linger 5 ms, 1 MB batches, no compression; keyed, explicit partition; incl. flush) "
        f"| {f['produce_confluent_events_per_s']:,.0f} /s | {f['produce_kafka_python_events_per_s']:,.0f} /s | "
        f"{f['produce_ratio_confluent_vs_kafka_python']:.1f} | {f['produce_ratio_median_of_rounds']:.1f} |",
        f"| consume (assigned, from offset 0; `consume(10000)` vs `poll(max_records=10000)`) "
        f"| {f['consume_confluent_events_per_s']:,.0f} /s | {f['consume_kafka_python_events_per_s']:,.0f} /s | "
        f"{f['consume_ratio_confluent_vs_kafka_python']:.1f} | {f['consume_ratio_median_of_rounds']:.1f} |",
        "",
        f"Runs (events/s): produce confluent {spread('produce_confluent')}; produce kafka-python "
        f"{spread('produce_kafka_python')}; consume confluent {spread('consume_confluent')}; consume kafka-python "
        f"{spread('consume_kafka_python')}."
        + (f" Runs that hit the time limit (rate over what they did): {incomplete}." if any(incomplete.values())
           else ""),
        "",
        "Decision (DESIGN.md, \"Kafka clients\"): confluent-kafka on the data plane (ingest, load generation), "
        "kafka-python on the control plane (topic admin, lag, group commits), where its rate does not matter.",
        "",
        "Reproduce: `python -m load.bench.kafka_clients` (redo both sections from the JSON: `--render`).",
    ])


def render_generator(g: dict[str, Any]) -> str:
    target = g["target_events_per_s"]
    thread_share = g["calling_thread_cpu_s"] / g["wall_s"] if g["wall_s"] else 0.0
    return "\n".join([
        f"`streamlearn.loadgen.generator.run_load(count={g['events']:,})` unthrottled into a "
        f"{g['partitions']}-partition topic on "
        "the same broker (generation, encoding and the confluent-kafka producer with the generator's settings: lz4, "
        f"idempotent, acks=all, flush at the end); {len(g['runs'])} runs, the median of each measure. "
        f"{machine_line(g.get('machine'))}",
        "",
        "| measure | value | target |",
        "|---|---:|---|",
        f"| events/s, end to end (incl. final flush) | {g['events_per_s']:,.0f} | ≥ {target:,} on one core: "
        f"{'met' if g['meets_target'] else 'MISSED'} ({g['ratio_to_target']:.2f}× the target) |",
        f"| wall seconds | {g['wall_s']:.2f} | |",
        f"| process CPU seconds (all threads, incl. librdkafka's) | {g['process_cpu_s']:.2f} | |",
        f"| CPU seconds of the calling (Python) thread | {g['calling_thread_cpu_s']:.2f} | |",
        f"| cores used = process CPU / wall | {g['cores_used']:.2f} | one core (the Python thread alone: "
        f"{thread_share:.2f}) |",
        f"| events per CPU second of the whole process (what one fully busy core gives) | "
        f"{g['events_per_cpu_s']:,.0f} | ≥ {target:,}: {'met' if g['events_per_cpu_s'] >= target else 'MISSED'} |",
        f"| generation + encoding only, no Kafka (`bench_generation`) | {g['generation_only_events_per_s']:,.0f} | |",
        "",
        "Runs (events/s): " + " / ".join(f"{t['events_per_s']:,.0f}" for t in g["runs"]) + ".",
        "",
        "Reproduce: `python -m load.bench.kafka_clients` (writes this section too).",
    ])


if __name__ == "__main__":
    main()
