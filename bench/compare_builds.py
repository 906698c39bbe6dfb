#!/usr/bin/env python3
"""Runtime overheads of two builds side by side: the figures a refactoring must keep.

    bench/compare_builds.py --before OLD/bench --after build/bench --model models/x.gguf

Runs each build's benchmarks alternately (before, after, after, before, ...) so both see
the same machine state, and prints a Markdown table of medians over the rounds with
the after/before ratio: launch round trip, launch bookkeeping per argument, sequence
call overhead per step, GEMV weight bandwidth and Gemma-3 decode tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

# (binary, benchmark name, counter, label, unit)
FIGURES = [
    ("npurt_bench", "BM_LaunchRoundTrip/grid:1", "median_roundtrip_us", "launch round trip, grid 1", "us"),
    ("npurt_bench", "BM_LaunchRoundTrip/grid:8", "median_roundtrip_us", "launch round trip, grid 8", "us"),
    ("npurt_bench", "BM_LaunchBookkeepingPerArgument/tracked:0/iterations:200/manual_time", "ns_per_arg",
     "bookkeeping per launch argument (untracked)", "ns"),
    ("npurt_bench", "BM_LaunchBookkeepingPerArgument/tracked:1/iterations:200/manual_time", "ns_per_arg",
     "bookkeeping per launch argument (tracked)", "ns"),
    ("npurt_ops_bench", "BM_SequenceOverheadPerStep/separate:0/real_time", "per_step_us", "sequence call overhead per step, fused", "us"),
    ("npurt_ops_bench", "BM_SequenceOverheadPerStep/separate:1/real_time", "per_step_us", "sequence call overhead per step, separate",
     "us"),
]
FILTERS = {
    "npurt_bench": "BM_LaunchRoundTrip|BM_LaunchBookkeepingPerArgument",
    "npurt_ops_bench": "BM_SequenceOverheadPerStep|BM_GemvQuantVsStreamRead",
}


def run_bench(binary: str) -> dict[str, dict]:
    out = subprocess.run([binary, f"--benchmark_filter={FILTERS[binary.rsplit('/', 1)[-1]]}",
                          "--benchmark_format=json"], capture_output=True, text=True, check=True).stdout
    return {b["name"]: b for b in json.loads(out)["benchmarks"]}


def gemv_bandwidth(results: dict[str, dict]) -> dict[str, float]:
    return {f"GEMV weight bandwidth, {b['label']}": b["weight_GBps"]
            for name, b in results.items() if name.startswith("BM_GemvQuantVsStreamRead")}


def decode_tps(bench_dir: str, model: str) -> float:
    out = subprocess.run([f"{bench_dir}/npurt_model_bench", "--model", model, "--peer-json", "--tokens", "64"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["decode_128_tokens_per_s"]


def one_round(bench_dir: str, model: str | None) -> dict[str, float]:
    figures: dict[str, float] = {}
    for binary in ("npurt_bench", "npurt_ops_bench"):
        results = run_bench(f"{bench_dir}/{binary}")
        for b, name, counter, label, _ in FIGURES:
            if b == binary:
                figures[label] = results[name][counter]
        if binary == "npurt_ops_bench":
            figures.update(gemv_bandwidth(results))
    if model:
        figures["Gemma-3 decode"] = decode_tps(bench_dir, model)
    return figures


def unit_of(label: str) -> str:
    for _, _, _, l, unit in FIGURES:
        if l == label:
            return unit
    return "tokens/s" if label.startswith("Gemma") else "GB/s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="bench/ folder of the old build")
    p.add_argument("--after", required=True, help="bench/ folder of the new build")
    p.add_argument("--model", help="GGUF file for the decode figure (omitted without it)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(a.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for which in order:
            rounds[which].append(one_round(getattr(a, which), a.model))
    print("| figure | before (median) | after (median) | after / before |")
    print("| --- | --- | --- | --- |")
    for label in rounds["before"][0]:
        b = statistics.median(x[label] for x in rounds["before"])
        f = statistics.median(x[label] for x in rounds["after"])
        print(f"| {label} ({unit_of(label)}) | {b:.3g} | {f:.3g} | {f / b:.2f} |")


if __name__ == "__main__":
    main()
