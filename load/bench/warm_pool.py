"""A resize with and without its warm pool (streamlearn/autoscale/warmpool.py): decision to the
bigger group's first step, and where those seconds went.

    python -m load.bench.warm_pool [--rounds 3] [--trickle-s 90]

Each run is load/bench/scaling.py's spike on the local autoscaling cluster (`fraud_heavy`, a
trickle, 30k events/s for 10 s, a trickle; min 1, max 3 one-CPU workers; a fresh cluster each
run): the default (`--warm-pool`) and `--no-warm-pool` alternate, one of each per round, and the
first scale-up's record (`resizes.jsonl`) is compared: medians of the rounds, and their ratio.
"""

from __future__ import annotations

import argparse
import sys

from load.bench.common import bench_broker, machine_line, median, write_json, write_section
from load.bench.scaling import reaction

MODES = {"warm pool (default)": (), "no warm pool": ("--no-warm-pool",)}
PARTS = ("waiting_for_room", "until_started", "group_start", "old_group_to_stop", "pause")


def first_up(spike: dict) -> dict:
    up = next((r for r in spike["resizes"] if r["to"] > r["from"]), None)
    if up is None:
        raise RuntimeError("the spike caused no scale-up")
    return {"from": up["from"], "to": up["to"], "mode": up["mode"], "prestarted": up.get("prestarted", 0),
            "decision_to_first_step_s": up["decision_to_first_step_s"], **up["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak", type=float, default=30_000)
    parser.add_argument("--trickle-s", type=float, default=90, help="long enough for the scale-up, not the down")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with bench_broker() as (home, broker, _settings):
        for i in range(args.rounds):
            for j, (mode, train_args) in enumerate(MODES.items()):
                run_home = home / f"run{i}-{j}"  # a lineage of its own: the next run must not resume this one
                run_home.mkdir()
                up = first_up(reaction(broker.bootstrap, args.peak, run_home, args.trickle_s, train_args))
                runs[mode].append(up)
                print(f"{mode}: {up}", file=sys.stderr, flush=True)
    report(args, runs)


def report(args, runs: dict[str, list[dict]]) -> None:
    med = {mode: {k: median([r[k] for r in rs if r.get(k) is not None])
                  for k in ("decision_to_first_step_s", *PARTS, "prestarted")} for mode, rs in runs.items()}
    on, off = (med[m]["decision_to_first_step_s"] for m in MODES)
    write_json("warm_pool", {"rounds": args.rounds, "peak_events_per_s": args.peak, "trickle_s": args.trickle_s,
                             "runs": runs, "medians": med, "decision_to_first_step_ratio": on / off})
    def each(mode: str) -> str:
        return ", ".join(f"{r['decision_to_first_step_s']:.1f}" for r in runs[mode])

    rows = [f"| {mode} | {m['decision_to_first_step_s']:.1f} ({each(mode)}) | "
            + " | ".join(f"{m[k]:.1f}" for k in PARTS) + f" | {m['prestarted']:.0f} |" for mode, m in med.items()]
    write_section("warm_pool", "A resize's warm pool: decision to the bigger group's first step", "\n".join([
        f"{machine_line()} `python -m load.bench.warm_pool --rounds {args.rounds} --trickle-s {args.trickle_s:g}`: "
        f"load/bench/scaling.py's spike ({args.peak:,.0f} events/s for 10 s, `fraud_heavy`, 1-3 one-CPU workers, "
        "a fresh local autoscaling cluster each run), the first scale-up of each run, the default and "
        "`--no-warm-pool` alternating; medians of the rounds, seconds (each run's figure in brackets).", "",
        "| | decision → first step | waiting for room | until started | group start | old group to stop | pause "
        "| processes prestarted |", "|---|---:|---:|---:|---:|---:|---:|---:|", *rows, "",
        f"Warm pool / none: **{on / off:.2f}×** the seconds from the decision to the bigger group's first step "
        "(issue 12's bar: ≤ 40 s)."]))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
