"""The IRON-style pattern: write the inputs of a one-step fused GEMV sequence through
get_buffer(...).data, call it, read the output; looped calls; fresh processes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np

import npurt
from conftest import gemv_reference, gemv_sequence, random_bf16, random_f32, rel_l2


def test_fused_gemv_matches_numpy(dev, rng):
    seq = gemv_sequence(dev)
    assert seq.launches_per_call == 1
    a, x = random_bf16(rng, (256, 640)), random_f32(rng, 640)
    out = seq.get_buffer("out").data
    out[:] = np.nan  # poison: a call that brings nothing back leaves NaN
    np.copyto(seq.get_buffer("A").data, a)
    np.copyto(seq.get_buffer("x").data, x)
    seq()
    got = seq.get_buffer("out").data
    assert np.shares_memory(got, out)  # zero-copy: the same host mirror
    err = rel_l2(got, gemv_reference(a, x))
    print(f"fused gemv rel-L2 {err:.3g}")
    assert err < 1e-2
    # The C++ host reference of the sequence agrees too.
    assert rel_l2(got, seq.reference({"A": a, "x": x})["out"]) < 1e-2


def test_separate_dispatch_gives_identical_bytes(rng):
    a, x = random_bf16(rng, (256, 640)), random_f32(rng, 640)
    results = []
    for fused in (True, False):
        with npurt.Device(cores=4) as d:
            seq = gemv_sequence(d, fused=fused)
            seq.get_buffer("A").write(a)
            seq.get_buffer("x").write(x)
            seq()
            results.append(seq.get_buffer("out").data.copy())
    assert rel_l2(results[0], gemv_reference(a, x)) < 1e-2
    assert results[0].tobytes() == results[1].tobytes()


CHILD = r"""
import hashlib, sys
import ml_dtypes, numpy as np
import npurt
seed = int(sys.argv[1])
rng = np.random.default_rng(seed)
a = rng.uniform(-1, 1, size=(256, 640)).astype(ml_dtypes.bfloat16)
x = rng.uniform(-1, 1, size=640).astype(np.float32)
dev = npurt.Device(cores=4)
gemv = npurt.ops.Gemv(m=256, k=640, weight="bf16")
seq = npurt.OperatorSequence(dev, "gemv", [(gemv, {"w": "A", "x": "x", "y": "out"})],
                             inputs=["A", "x"], outputs=["out"],
                             sizes={"A": (256, 640), "x": 640, "out": 256})
seq.get_buffer("out").data[:] = np.nan
np.copyto(seq.get_buffer("A").data, a)
np.copyto(seq.get_buffer("x").data, x)
seq()
out = seq.get_buffer("out").data
ref = a.astype(np.float64) @ x.astype(np.float64)
err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
print(hashlib.sha256(out.tobytes()).hexdigest(), repr(float(err)))
"""


def test_identical_in_five_fresh_processes(rng):
    seed = int(rng.integers(0, 2**62))
    lines = []
    for _ in range(5):
        r = subprocess.run([sys.executable, "-c", CHILD, str(seed)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        lines.append(r.stdout.strip())
    digests = {line.split()[0] for line in lines}
    errors = [float(line.split()[1]) for line in lines]
    print(f"5 processes: digests {digests}, rel-L2 {errors}")
    assert len(digests) == 1
    assert all(e < 1e-2 for e in errors)


def test_eight_looped_calls_with_reads_in_between(dev, rng):
    seq = gemv_sequence(dev)
    a = random_bf16(rng, (256, 640))
    np.copyto(seq.get_buffer("A").data, a)
    out_view = seq.get_buffer("out")
    x_bytes = seq.get_buffer("x").nbytes
    uploads = []
    for i in range(8):
        x = random_f32(rng, 640)
        np.copyto(seq.get_buffer("x").data, x)
        out_view.data[:] = np.nan
        before = dev.counters()
        seq()
        after = dev.counters()
        got = out_view.data.copy()
        err = rel_l2(got, gemv_reference(a, x))
        assert err < 1e-2, f"call {i}: rel-L2 {err}"
        uploads.append(after["h2d_bytes"] - before["h2d_bytes"])
    # The weights go up once; every later call sends exactly the rewritten x.
    assert uploads[0] == a.nbytes + x_bytes
    assert uploads[1:] == [x_bytes] * 7
