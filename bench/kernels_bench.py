#!/usr/bin/env python3
"""Kernels written in Python (npurt.isa), measured against the library's.

1. Build cost: instructions emitted and verified per second from Python, next to the
   C++ builder compiling the identical kernel (Operator.compile() of the library's
   elementwise add, called from Python).
2. Run speed: the Python-built add kernel (asserted byte-identical to the library's)
   as an npurt.ops.Custom step against the library operator, the same buffers, one
   call of each in turn. Same bytes should mean the same speed within noise.

Build figures: medians of --rounds rounds; run figures: medians over every call. Prints a table and writes JSON (--out)."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import npurt
from npurt import isa
from npurt.isa import r0, r1, r2, r3, r4, r5, r6, r7, t0, t1

from bench_report import write_report


def python_add(n: int, grid: int, tile: int = 4096) -> isa.Image:
    """The library's `Elementwise(kind="add")` for n f32 values over `grid` blocks,
    written instruction by instruction: the same bytes."""
    b = isa.Builder(f"add f32 {n}")
    a = b.arg_buffer("a", "in", "f32")
    bb = b.arg_buffer("b", "in", "f32")
    out = b.arg_buffer("out", "out", "f32")
    tiles = -(-n // tile)
    per_block = -(-tiles // grid)
    b.reserve_local(2 * tile * 4)            # two tiles whose width is a register
    b.block_id(r0)
    b.li(r7, n)                              # elements in all
    b.alui("mul", r1, r0, per_block)         # this block's first tile
    b.li(r2, tiles)
    b.alu("sub", r2, r2, r1)
    b.alui("min", r2, r2, per_block)
    b.alui("max", r2, r2, 0)                 # and how many it takes
    b.alui("mul", r3, r1, tile * 4)          # byte offset
    b.alui("mul", r5, r1, -tile)
    b.alu("add", r5, r5, r7)                 # elements left from there
    with b.loop(r2):
        b.alui("min", r4, r5, tile)          # the last tile may be short
        b.tdef(t0, "f32", 1, r4)
        b.tdef(t1, "f32", 1, r4, local_offset=tile * 4)
        b.tld(t0, a, r3, "f32")
        b.tld(t1, bb, r3, "f32")
        b.tbin("add", t0, t0, t1)
        b.tst(t0, out, r3, "f32")
        b.alui("mul", r6, r4, 4)
        b.alu("add", r3, r3, r6)
        b.alu("sub", r5, r5, r4)
    b.exit()
    return b.build()


def long_program(insns: int) -> isa.Image:
    """`insns` scalar instructions and an exit: the builder's cost per instruction."""
    b = isa.Builder("long")
    b.li(r0, 0)
    for i in range(insns - 2):
        b.alui("add", r0, r0, i)
    b.exit()
    return b.build()


def host_cpu() -> str:
    """The CPU's model name and whether it has AVX-512 (figures depend on both)."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    return model + (" with AVX-512" if "avx512f" in text else " without AVX-512")


def seconds(fn, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def sequence(dev: npurt.Device, op: npurt.ops.Operator, n: int, a: np.ndarray, b: np.ndarray):
    seq = npurt.OperatorSequence(dev, "add", [(op, {"a": "a", "b": "b", "out": "out"})], ["a", "b"], ["out"],
                                 {"a": n, "b": n, "out": n})
    np.copyto(seq.get_buffer("a").data, a)
    np.copyto(seq.get_buffer("b").data, b)
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 20, help="values added per call")
    ap.add_argument("--cores", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=40, help="calls per kernel per round")
    ap.add_argument("--out", default="build/kernels_bench.json")
    args = ap.parse_args()

    library = npurt.ops.Elementwise(kind="add", n=args.n)
    kernel = library.compile(cores=args.cores)
    image = python_add(args.n, kernel.grid)
    assert image == kernel.image, "the Python kernel is not the library's bytes"
    insns = image.num_insns

    build_py, build_cpp, per_insn = [], [], []
    for _ in range(args.rounds):
        build_py.append(seconds(lambda: python_add(args.n, kernel.grid), 200))
        build_cpp.append(seconds(lambda: library.compile(cores=args.cores), 200))
        per_insn.append(seconds(lambda: long_program(4096), 5) / 4096)

    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, args.n).astype(np.float32)
    b = rng.uniform(-1, 1, args.n).astype(np.float32)
    run_py, run_lib = [], []
    with npurt.Device(cores=args.cores) as dev:
        custom = npurt.ops.Custom(image, kernel.grid, {"a": args.n, "b": args.n, "out": args.n})
        seq_py, seq_lib = sequence(dev, custom, args.n, a, b), sequence(dev, library, args.n, a, b)
        for seq in (seq_py, seq_lib):  # warm: code published, streams made, inputs uploaded
            seq()
        np.testing.assert_array_equal(seq_py.get_buffer("out").data, seq_lib.get_buffer("out").data)
        # One call of each in turn, so both see the same moments of a noisy host.
        for _ in range(args.rounds * args.calls):
            run_py.append(seconds(seq_py, 1))
            run_lib.append(seconds(seq_lib, 1))

    med = statistics.median
    report = {
        "host": host_cpu(),
        "kernel": kernel.name,
        "insns": insns,
        "same_bytes": True,
        "build_python_us": med(build_py) * 1e6,
        "build_cpp_compile_us": med(build_cpp) * 1e6,
        "build_python_us_per_insn": med(per_insn) * 1e6,
        "run_python_built_us": med(run_py) * 1e6,
        "run_library_us": med(run_lib) * 1e6,
        "n": args.n,
        "rounds": args.rounds,
    }
    print(f"host: {report['host']}")
    print(f"kernel '{kernel.name}': {insns} instructions, grid {kernel.grid}; Python-built bytes == library bytes")
    print(f"{'figure':44} {'Python':>10} {'C++ peer':>10} {'ratio':>7}")
    print(f"{'build the kernel (us)':44} {report['build_python_us']:10.1f} {report['build_cpp_compile_us']:10.1f} "
          f"{report['build_python_us'] / report['build_cpp_compile_us']:7.2f}")
    print(f"{'build from Python, per instruction (us)':44} {report['build_python_us_per_insn']:10.2f}")
    print(f"{'one call of the one-step sequence (us)':44} {report['run_python_built_us']:10.1f} "
          f"{report['run_library_us']:10.1f} {report['run_python_built_us'] / report['run_library_us']:7.3f}")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
