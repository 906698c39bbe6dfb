"""Bad input raises a clear npurt exception carrying the C++ message, the device stays
usable, closed devices raise instead of crashing, and arrays keep their memory alive."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import npurt
from conftest import gemv_reference, gemv_sequence, random_bf16, random_f32, rel_l2


def run_ok(seq, a, x):
    np.copyto(seq.get_buffer("A").data, a)
    np.copyto(seq.get_buffer("x").data, x)
    seq.get_buffer("out").data[:] = np.nan
    seq()
    return rel_l2(seq.get_buffer("out").data, gemv_reference(a, x))


def test_unknown_buffer_name_is_a_key_error_with_the_runtime_message(dev):
    seq = gemv_sequence(dev)
    with pytest.raises(KeyError) as e:
        seq.get_buffer("weights")
    assert isinstance(e.value, npurt.NotFoundError) and isinstance(e.value, npurt.Error)
    assert str(e.value) == "no buffer 'weights' in this sequence"  # verbatim, not quoted
    assert e.value.code == "NOT_FOUND"


def test_wrong_dtype_and_size_writes_are_refused(dev, rng):
    seq = gemv_sequence(dev)
    x = seq.get_buffer("x")
    with pytest.raises(TypeError) as e:
        x.write(random_f32(rng, 640).astype(np.float64))
    assert isinstance(e.value, npurt.DTypeError)
    assert str(e.value) == "buffer 'x' holds float32, got an array of float64"
    with pytest.raises(ValueError) as e:
        x.write(random_f32(rng, 10))
    assert isinstance(e.value, npurt.InvalidArgumentError)
    assert str(e.value) == "buffer 'x' view holds 640 elements, got an array of 10"
    with pytest.raises(npurt.DTypeError):
        seq.get_buffer("A").write(random_f32(rng, (256, 640)))  # f32 into bf16
    with pytest.raises(npurt.DTypeError, match="unsupported dtype 'float64'"):
        dev.buffer(16, np.float64)
    with pytest.raises(npurt.DTypeError):
        seq.reference({"A": random_f32(rng, (256, 640)), "x": random_f32(rng, 640)})
    # Still usable, with the right inputs.
    a, xv = random_bf16(rng, (256, 640)), random_f32(rng, 640)
    assert run_ok(seq, a, xv) < 1e-2


def test_bad_sizes_and_bindings_name_the_step(dev):
    gemv = npurt.ops.Gemv(m=64, k=640, weight="bf16")
    with pytest.raises(npurt.InvalidArgumentError) as e:
        npurt.OperatorSequence(dev, "bad", [(gemv, {"w": "A", "x": "x", "y": "out"})], ["A", "x"], ["out"],
                               {"A": 64 * 640, "x": 639, "out": 64})
    assert "step 0" in str(e.value) and "'x'" in str(e.value)
    with pytest.raises(npurt.InvalidArgumentError, match="no binding for argument 'y'"):
        npurt.OperatorSequence(dev, "bad", [(gemv, {"w": "A", "x": "x"})], ["A", "x"], ["out"],
                               {"A": 64 * 640, "x": 640, "out": 64})
    with pytest.raises(npurt.InvalidArgumentError, match="parameter 'm'"):
        npurt.ops.Gemv(m=0, k=640).compile()
    with pytest.raises(npurt.OutOfRangeError):
        dev.buffer(100).view(90, 20)


def test_device_options_are_checked(dev):
    with pytest.raises(npurt.InvalidArgumentError) as e:
        npurt.Device(cores=0)
    assert "cores" in str(e.value)


def test_devices_come_from_drivers_by_name(dev):
    assert "sim" in npurt.drivers()
    with pytest.raises(npurt.NotFoundError) as e:
        npurt.Device(driver="tpu9")
    assert "'tpu9'" in str(e.value) and "sim" in str(e.value)
    with pytest.raises(npurt.InvalidArgumentError) as e:
        npurt.Device(settings={"warp_size": 32})
    assert "'warp_size'" in str(e.value) and "host_threads" in str(e.value)
    with npurt.Device(driver="sim", cores=2, settings={"host_threads": 1}) as d:
        assert d.info["num_cores"] == 2


def test_missing_scalar_and_device_fault_leave_the_device_usable(dev, rng):
    vocab, dim = 50, 64
    emb = npurt.ops.Embedding(vocab=vocab, dim=dim, dtype="f32")
    seq = npurt.OperatorSequence(dev, "embed", [(emb, {"table": "table", "out": "out"})], ["table"], ["out"],
                                 {"table": (vocab, dim), "out": dim})
    table = random_f32(rng, (vocab, dim))
    np.copyto(seq.get_buffer("table").data, table)
    with pytest.raises(npurt.InvalidArgumentError, match="no value for scalar 'token'"):
        seq()
    with pytest.raises(npurt.DeviceFaultError) as fault:
        seq(token=vocab + 3)  # outside the vocabulary: the kernel faults
    assert "out-of-bounds" in str(fault.value)
    # The output the failed run should have written is never handed out stale.
    with pytest.raises(npurt.DeviceFaultError, match="the device work writing it failed"):
        seq.get_buffer("out").data
    for token in (7, 49):
        seq(token=token)  # a successful call replaces the bytes
        assert rel_l2(seq.get_buffer("out").data, table[token]) < 1e-6
        seq.get_buffer("out").data[:] = np.nan
    assert dev.counters()["kernel_faults"] == 1


def test_unknown_scalars_are_refused_by_name_before_anything_runs(dev, rng):
    rope = npurt.ops.Rope(n_heads=2, head_dim=64)
    seq = npurt.OperatorSequence(dev, "rope", [(rope, {"x": "q", "out": "q_rot"})], ["q"], ["q_rot"],
                                 {"q": 128, "q_rot": 128})
    q = random_f32(rng, 128)
    np.copyto(seq.get_buffer("q").data, q)
    want = "sequence 'rope': unknown scalar 'typo' (its scalars: base, pos)"
    launches = dev.counters()["launches"]
    with pytest.raises(npurt.InvalidArgumentError) as e:
        seq(pos=3, base=10000.0, typo=3)
    assert str(e.value) == want
    with pytest.raises(npurt.InvalidArgumentError) as e:
        seq(pso=3, base=10000.0)  # a misspelled name is named, not reported as missing
    assert str(e.value) == "sequence 'rope': unknown scalar 'pso' (its scalars: base, pos)"
    with pytest.raises(npurt.InvalidArgumentError, match="unknown scalars 'Pos', 'bsae'"):
        seq(Pos=3, bsae=10000.0)
    with pytest.raises(npurt.InvalidArgumentError) as e:
        seq.reference({"q": q}, pos=3, base=10000.0, typo=3)
    assert str(e.value) == want
    with pytest.raises(npurt.InvalidArgumentError) as e:
        rope.reference({"x": q}, pos=3, base=10000.0, typo=3)
    assert str(e.value) == "rope neox 2x64: unknown scalar 'typo' (its scalars: pos, base)"
    assert dev.counters()["launches"] == launches  # nothing ran
    # Worker.submit refuses at once, not when the run is waited for.
    worker = npurt.Worker(dev)
    with pytest.raises(npurt.InvalidArgumentError) as e:
        worker.submit(seq, pos=3, base=10000.0, typo=3)
    assert str(e.value) == want
    assert worker.stats()["runs_submitted"] == 0
    # A sequence without scalars says so.
    gemv = gemv_sequence(dev, m=64)
    with pytest.raises(npurt.InvalidArgumentError) as e:
        gemv(pos=0)
    assert str(e.value) == "sequence 'gemv': unknown scalar 'pos' (it binds no scalars)"
    # Everything stays usable with the right names.
    seq(pos=3, base=10000.0)
    want_out = seq.reference({"q": q}, pos=3, base=10000.0)["q_rot"]
    assert rel_l2(seq.get_buffer("q_rot").data, want_out) < 1e-5
    worker.submit(seq, pos=4, base=10000.0).wait()
    a, x = random_bf16(rng, (64, 640)), random_f32(rng, 640)
    assert run_ok(gemv, a, x) < 1e-2


def test_closed_device_raises_and_arrays_stay_valid(rng):
    dev = npurt.Device(cores=2)
    seq = gemv_sequence(dev, m=64, k=640)
    a, x = random_bf16(rng, (64, 640)), random_f32(rng, 640)
    assert run_ok(seq, a, x) < 1e-2
    out = seq.get_buffer("out").data
    xs = seq.get_buffer("x").data
    buf = dev.buffer(1000)
    arr = buf.data
    dev.close()
    assert dev.closed
    for action in (lambda: seq(), lambda: seq.get_buffer("x"), lambda: buf.data, lambda: dev.buffer(4),
                   lambda: dev.counters(), lambda: buf.to_device(), lambda: npurt.Worker(dev)):
        with pytest.raises(npurt.FailedPreconditionError, match="device is closed"):
            action()
    # The host mirrors are still mapped: reading and writing old arrays is safe.
    assert rel_l2(out, gemv_reference(a, x)) < 1e-2
    xs[:] = 1.0
    arr[:] = 2.0
    assert float(arr.sum()) == 2000.0
    dev.close()  # idempotent


def test_arrays_keep_their_buffer_and_device_alive(rng):
    def make():
        d = npurt.Device(cores=2)
        return d.buffer((4, 256), np.float32, name="kept").data

    arr = make()
    gc.collect()
    v = random_f32(rng, (4, 256))
    arr[...] = v  # a tracked write into a buffer that only the array keeps alive
    assert np.array_equal(arr, v)
    view = npurt.Device(cores=2).buffer(1024, "bf16").view(512, 256)
    sub = view.data
    del view
    gc.collect()
    sub[:] = random_f32(rng, 256).astype(sub.dtype)
    assert sub.dtype == np.dtype("bfloat16") and sub.shape == (256,)


BAD_INPUT_SCRIPT = r"""
import numpy as np, npurt
dev = npurt.Device(cores=2)
gemv = npurt.ops.Gemv(m=64, k=640, weight="bf16")
seq = npurt.OperatorSequence(dev, "g", [(gemv, {"w": "A", "x": "x", "y": "out"})], ["A", "x"], ["out"],
                             {"A": (64, 640), "x": 640, "out": 64})
attempts = [lambda: seq.get_buffer("nope"), lambda: seq.get_buffer("x").write(np.ones(640)),
            lambda: seq.get_buffer("x").write(np.ones(3, np.float32)), lambda: dev.buffer(0),
            lambda: dev.buffer(8, "q8_0"), lambda: seq.get_buffer("A[0:999999]"), lambda: seq(pos="x"),
            lambda: dev.buffer(4).view(5), lambda: npurt.ops.Gemv(m=1, k=1, weight="nope")]
for f in attempts:
    try:
        f()
        print("no exception")
    except npurt.Error as e:
        print(type(e).__name__, e)
dev.close()
try:
    seq()
except npurt.Error as e:
    print(type(e).__name__, e)
print("alive")
"""


def test_interpreter_survives_bad_input():
    r = subprocess.run([sys.executable, "-c", BAD_INPUT_SCRIPT], capture_output=True, text=True, timeout=120)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "alive"
    assert "no exception" not in r.stdout
    assert len(lines) == 11
    assert "leaked" not in r.stderr, r.stderr


def test_freed_buffer_raises_and_its_array_stays_valid(dev, rng):
    buf = dev.buffer(2000, name="gone")
    arr = buf.data
    buf.free()
    with pytest.raises(npurt.FailedPreconditionError, match="buffer 'gone': the buffer was freed"):
        buf.data
    with pytest.raises(npurt.FailedPreconditionError):
        buf.to_device()
    v = random_f32(rng, 2000)
    arr[:] = v
    assert np.array_equal(arr, v)
    assert dev.memory_stats()["buffers_live"] == 0


def test_close_while_other_threads_call(rng):
    dev = npurt.Device(cores=2)
    seq = gemv_sequence(dev, m=512, k=640)
    a, x = random_bf16(rng, (512, 640)), random_f32(rng, 640)
    np.copyto(seq.get_buffer("A").data, a)
    np.copyto(seq.get_buffer("x").data, x)
    worker = npurt.Worker(dev)
    outcomes = []

    def caller(use_worker):
        deadline = time.monotonic() + 60  # bounded: close() comes long before
        while time.monotonic() < deadline:
            try:
                if use_worker:
                    worker.submit(seq).wait()
                else:
                    seq()
                outcomes.append(rel_l2(seq.get_buffer("out").data, gemv_reference(a, x)))
            except npurt.FailedPreconditionError as e:
                outcomes.append(str(e))
                return

    threads = [threading.Thread(target=caller, args=(w,)) for w in (False, True, False)]
    for t in threads:
        t.start()
    while len(outcomes) < 6:
        time.sleep(0.001)
    dev.close()
    for t in threads:
        t.join()
    errors = [o for o in outcomes if isinstance(o, str)]
    results = [o for o in outcomes if not isinstance(o, str)]
    assert len(errors) == 3 and all(e in ("device is closed", "worker is closed") for e in errors)
    assert len(results) >= 6 and all(r < 1e-2 for r in results)
