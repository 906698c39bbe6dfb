"""One owner for every device resource: Python objects die in any order, a closed
device fails them by name, and a sequence and a worker publish one priming kernel."""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest

import npurt
from conftest import gemv_reference, gemv_sequence, random_bf16, random_f32, rel_l2


def make_objects(rng):
    """A device and everything a program holds at once, with a worker run in flight."""
    dev = npurt.Device(cores=2, global_memory_bytes=64 << 20)
    seq = gemv_sequence(dev, m=64, k=640)
    a, x = random_bf16(rng, (64, 640)), random_f32(rng, 640)
    np.copyto(seq.get_buffer("A").data, a)
    np.copyto(seq.get_buffer("x").data, x)
    buf = dev.buffer(1000)
    worker = npurt.Worker(dev)
    run = worker.submit(seq)
    return {
        "device": dev,
        "sequence": seq,
        "buffer": buf,
        "array": buf.data,
        "view": seq.get_buffer("out"),
        "worker": worker,
        "run": run,
    }, gemv_reference(a, x)


def test_objects_die_in_every_order(rng):
    names = ["device", "sequence", "buffer", "array", "worker", "run"]
    orders = 0
    for order in itertools.permutations(names):
        objects, _ = make_objects(rng)
        for name in order:
            del objects[name]
        objects.clear()
        orders += 1
    gc.collect()
    assert orders == 720


def test_objects_die_in_any_order_after_close(rng):
    names = ["device", "sequence", "buffer", "array", "view", "worker", "run"]
    for trial in range(40):
        objects, ref = make_objects(rng)
        objects["run"].wait()
        assert rel_l2(objects["view"].data, ref) < 1e-2
        objects["device"].close()
        for name in rng.permutation(names):
            del objects[name]


def test_a_run_in_flight_finishes_when_its_owners_go(rng):
    objects, ref = make_objects(rng)
    run, view = objects.pop("run"), objects.pop("view")
    objects.clear()  # device, sequence and worker go; the worker waits for the run
    gc.collect()
    assert run.done()
    run.wait()
    assert rel_l2(view.data, ref) < 1e-2


def test_a_sequence_and_a_worker_publish_one_priming_kernel(rng):
    dev = npurt.Device(cores=2, global_memory_bytes=64 << 20)
    seq = gemv_sequence(dev, m=64, k=640)
    assert dev.counters()["code_uploads"] == 2, "the fused gemv kernel and one priming kernel"
    worker = npurt.Worker(dev)
    np.copyto(seq.get_buffer("A").data, random_bf16(rng, (64, 640)))
    for _ in range(3):
        np.copyto(seq.get_buffer("x").data, random_f32(rng, 640))
        seq()
        worker.submit(seq).wait()
    stats = worker.stats()
    assert stats["code_publications"] == 2 and dev.counters()["code_uploads"] == 2
    assert stats["prime_launches"] == 2, "one per fresh slot stream"
    dev.close()


def test_a_closed_worker_and_sequence_fail_by_name(rng):
    objects, _ = make_objects(rng)
    objects["run"].wait()
    objects["worker"].close()
    with pytest.raises(npurt.FailedPreconditionError, match="worker is closed"):
        objects["worker"].submit(objects["sequence"])
    objects["device"].close()
    with pytest.raises(npurt.FailedPreconditionError, match="device is closed"):
        objects["sequence"]()
