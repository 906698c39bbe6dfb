#!/usr/bin/env python3
"""Peak resident memory of `npurt generate` against llama.cpp's llama-simple.

Both load the same GGUF file and generate the same number of tokens from the same
prompt, each sizing its context to prompt + tokens; they run alternately, and each
run's peak resident set size is what wait4(2) reports for it (the figure
`/usr/bin/time -v` prints as "Maximum resident set size"). Prints the medians and
their ratio, and writes them as JSON.
"""

import argparse
import os
import statistics
import subprocess
import sys

from bench_report import write_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SIMPLE = os.path.join(ROOT, ".venv-peer", "llama.cpp-build", "bin", "llama-simple")


def fail(message):
    print(f"resident_bench: error: {message}", file=sys.stderr)
    sys.exit(1)


def run(cmd):
    """Runs cmd; returns (its peak RSS in MiB, its stdout text)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    proc.stdout.close()
    # Reaped here rather than by Popen, for the child's own rusage.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        fail(f"{' '.join(cmd)} exited with status {proc.returncode}")
    return usage.ru_maxrss / 1024.0, out.decode("utf-8", "replace")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--npurt", required=True, help="the npurt binary")
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--llama-simple", default=DEFAULT_SIMPLE,
                   help="llama-simple binary (default: where scripts/install-peer.sh builds it)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--tokens", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--reps", type=int, default=3, help="runs of each (default 3)")
    p.add_argument("--out", required=True, help="JSON output path")
    args = p.parse_args()
    if args.reps < 1 or args.tokens < 1:
        p.error("--reps and --tokens must be at least 1")
    for path, what in ((args.npurt, "npurt"), (args.model, "model"),
                       (args.llama_simple, "llama-simple (scripts/install-peer.sh builds it)")):
        if not os.path.isfile(path):
            fail(f"{what} not found: {path}")

    sides = {
        "npurt": [args.npurt, "generate", "--model", args.model, "--prompt", args.prompt,
                  "--max-tokens", str(args.tokens)],
        "llama.cpp": [args.llama_simple, "-m", args.model, "-n", str(args.tokens), args.prompt],
    }
    samples = {name: [] for name in sides}
    texts = {}
    for rep in range(args.reps):
        for name, cmd in sides.items():
            mib, text = run(cmd)
            samples[name].append(mib)
            texts[name] = text.strip()
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    medians = {name: statistics.median(v) for name, v in samples.items()}
    ratio = medians["npurt"] / medians["llama.cpp"]
    file_mib = os.path.getsize(args.model) / 2**20
    print(f"peak resident memory, {os.path.basename(args.model)} ({file_mib:.1f} MiB), "
          f"{args.tokens} tokens from {args.prompt!r}, medians of {args.reps}")
    print(f"{'side':<12} {'MiB':>8}  samples")
    for name in sides:
        print(f"{name:<12} {medians[name]:>8.1f}  {', '.join(f'{v:.1f}' for v in samples[name])}")
    print(f"npurt / llama.cpp: {ratio:.2f}")
    for name in sides:
        print(f"{name} text: {texts[name][:100]!r}")
    report = {"model": args.model, "tokens": args.tokens, "prompt": args.prompt, "reps": args.reps,
              "file_mib": file_mib, "median_mib": medians, "samples_mib": samples, "ratio": ratio}
    write_report(args.out, report)


if __name__ == "__main__":
    main()
