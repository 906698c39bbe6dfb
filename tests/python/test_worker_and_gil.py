"""The Worker runs sequences pipelined over stream slots; device waits release the GIL."""

from __future__ import annotations

import threading
import time

import numpy as np

import npurt
from conftest import gemv_reference, gemv_sequence, random_bf16, random_f32, rel_l2


def test_worker_runs_are_correct_and_reuse_streams(dev, rng):
    seq = gemv_sequence(dev)
    a = random_bf16(rng, (256, 640))
    np.copyto(seq.get_buffer("A").data, a)
    worker = npurt.Worker(dev, depth=2)
    out = seq.get_buffer("out")
    for i in range(8):
        x = random_f32(rng, 640)
        np.copyto(seq.get_buffer("x").data, x)
        handle = worker.submit(seq)
        assert handle.slot == i % 2 and handle.run_id == i
        handle.wait()
        assert handle.done()
        assert rel_l2(out.data, gemv_reference(a, x)) < 1e-2, f"run {i}"
    stats = worker.stats()
    assert stats["runs_completed"] == 8 and stats["runs_failed"] == 0
    assert stats["streams_created"] == 2  # one per slot, reused after
    worker.close()
    try:
        worker.submit(seq)
        raise AssertionError("submit on a closed worker")
    except npurt.FailedPreconditionError as e:
        assert str(e) == "worker is closed"


def test_worker_pipelined_runs_with_distinct_outputs(dev, rng):
    # Two sequences on the same weights; runs in flight together, outputs read after.
    seqs = [gemv_sequence(dev, m=128, k=640) for _ in range(2)]
    a = random_bf16(rng, (128, 640))
    xs = [random_f32(rng, 640) for _ in seqs]
    for s, x in zip(seqs, xs):
        np.copyto(s.get_buffer("A").data, a)
        np.copyto(s.get_buffer("x").data, x)
        s.get_buffer("out").data[:] = np.nan
    worker = npurt.Worker(dev, depth=2)
    handles = [worker.submit(s) for s in seqs]
    worker.drain()
    for h, s, x in zip(handles, seqs, xs):
        h.wait()
        assert rel_l2(s.get_buffer("out").data, gemv_reference(a, x)) < 1e-2


def test_calls_release_the_gil(rng):
    with npurt.Device(cores=2) as dev:
        m, k = 4096, 4096
        seq = gemv_sequence(dev, m=m, k=k)
        np.copyto(seq.get_buffer("A").data, random_bf16(rng, (m, k)))
        np.copyto(seq.get_buffer("x").data, random_f32(rng, k))
        windows = []
        done = threading.Event()

        def caller():
            for _ in range(6):
                t0 = time.perf_counter()
                seq()
                windows.append((t0, time.perf_counter()))
            done.set()

        ticks = []
        t = threading.Thread(target=caller)
        t.start()
        while not done.is_set():
            ticks.append(time.perf_counter())
        t.join()
        inside = sum(1 for tick in ticks for lo, hi in windows if lo < tick < hi)
        busy = sum(hi - lo for lo, hi in windows)
        print(f"{inside} main-thread iterations during {busy * 1e3:.1f} ms of calls")
        assert busy > 0.005
        # Held GIL: the main thread could only run at the calls' edges.
        assert inside > 1000
