"""npurt.DeviceGroup: the collectives against numpy on fresh random data, the checks
of their arguments, lifetimes, and Gemma3 cut over two devices (on the real model,
skipped when it is not installed)."""

from __future__ import annotations

import gc
import os
import time

import ml_dtypes
import numpy as np
import pytest

import npurt
from conftest import random_bf16, random_f32, rel_l2

COUNTS = [1, 640, 300000]
MODEL = os.environ.get("NPURT_MODEL") or os.path.join(
    os.path.dirname(__file__), "..", "..", "models", "gemma-3-270m-q4_k_m.gguf")
needs_model = pytest.mark.skipif(not os.path.isfile(MODEL), reason="no model installed (make model)")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}dev")
def group(request):
    g = npurt.DeviceGroup(request.param, cores=2, memory=64 << 20)
    yield g
    g.close()


def rank_buffers(group, arrays, dtype):
    """One buffer per rank holding arrays[r]."""
    bufs = []
    for dev, a in zip(group.devices, arrays):
        b = dev.buffer(a.size, dtype=dtype)
        b.write(a)
        bufs.append(b)
    return bufs


def poisoned(group, count, dtype):
    """One buffer per rank full of NaN, so that an element a collective skips shows."""
    bufs = [dev.buffer(count, dtype=dtype) for dev in group.devices]
    for b in bufs:
        b.data[:] = np.nan
    return bufs


def rank_order_sum(inputs):
    """What the devices compute: ranks added in rank order, each addition formed in
    float32 and rounded to the inputs' dtype."""
    acc = inputs[0]
    for a in inputs[1:]:
        acc = (acc.astype(np.float32) + a.astype(np.float32)).astype(a.dtype)
    return acc


def assert_sum(got, inputs, bound):
    """Bit-exact against the rank-order sum, and within `bound` (rel-L2) of the exact
    sum. One element's relative error is unbounded where the ranks cancel, so the
    rel-L2 bound applies to longer vectors."""
    np.testing.assert_array_equal(got.view(np.uint8), rank_order_sum(inputs).view(np.uint8))
    if got.size > 1:
        assert rel_l2(got, np.sum([a.astype(np.float64) for a in inputs], axis=0)) <= bound


def assert_same_bytes(bufs):
    first = bufs[0].data.tobytes()
    for r, b in enumerate(bufs[1:], start=1):
        assert b.data.tobytes() == first, f"rank {r} differs from rank 0"


def test_the_group_has_a_device_per_rank(group):
    assert group.size == len(group) == len(group.devices)
    for r, dev in enumerate(group.devices):
        assert isinstance(dev, npurt.Device) and not dev.closed
        assert dev.info["num_cores"] == 2 and dev.info["global_memory_bytes"] == 64 << 20
    # device(r) is rank r's device every time: buffers made through it are rank r's.
    group.all_reduce([group.device(r).buffer(4) for r in range(group.size)])


@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_f32_is_the_numpy_sum(group, rng, count):
    inputs = [random_f32(rng, count) for _ in range(group.size)]
    bufs = rank_buffers(group, inputs, "f32")
    group.all_reduce(bufs, dtype="f32")
    assert_sum(bufs[0].data, inputs, 1e-6)
    assert_same_bytes(bufs)


@pytest.mark.parametrize("count", COUNTS)
def test_all_reduce_bf16_is_the_numpy_sum(group, rng, count):
    inputs = [random_bf16(rng, count) for _ in range(group.size)]
    bufs = rank_buffers(group, inputs, ml_dtypes.bfloat16)
    group.all_reduce(bufs, dtype="bf16")
    assert bufs[0].dtype == np.dtype(ml_dtypes.bfloat16)
    assert_sum(bufs[0].data, inputs, 1e-2)
    assert_same_bytes(bufs)


def test_all_reduce_of_views_leaves_the_rest_of_the_buffers_alone(group, rng):
    inputs = [random_f32(rng, 1000) for _ in range(group.size)]
    bufs = rank_buffers(group, inputs, "f32")
    group.all_reduce([b.view(100, 640) for b in bufs])  # dtype: the views'
    for b, a in zip(bufs, inputs):
        assert_sum(b.data[100:740], [x[100:740] for x in inputs], 1e-6)
        np.testing.assert_array_equal(b.data[:100], a[:100])
        np.testing.assert_array_equal(b.data[740:], a[740:])


@pytest.mark.parametrize("count", COUNTS)
def test_all_gather_places_every_rank_in_rank_order(group, rng, count):
    inputs = [random_f32(rng, count) for _ in range(group.size)]
    locals_ = rank_buffers(group, inputs, "f32")
    gathered = poisoned(group, count * group.size, "f32")
    group.all_gather(locals_, gathered)
    want = np.concatenate(inputs)
    for g in gathered:
        np.testing.assert_array_equal(g.data, want)
    for local, a in zip(locals_, inputs):
        np.testing.assert_array_equal(local.data, a)


@pytest.mark.parametrize("count", COUNTS)
def test_broadcast_copies_the_root_everywhere(group, rng, count):
    root = group.size - 1
    bufs = poisoned(group, count, ml_dtypes.bfloat16)
    source = random_bf16(rng, count)
    bufs[root].write(source)
    group.broadcast(bufs, root=root)
    for b in bufs:
        np.testing.assert_array_equal(b.data.view(np.uint16), source.view(np.uint16))


def test_barrier_follows_the_work_before_it(group, rng):
    inputs = [random_f32(rng, 640) for _ in range(group.size)]
    bufs = rank_buffers(group, inputs, "f32")
    group.all_reduce(bufs)
    group.barrier()
    assert_sum(bufs[-1].data, inputs, 1e-6)


def test_bad_arguments_raise_by_name_and_the_group_stays_usable(group, rng):
    n = group.size
    bufs = [dev.buffer(640) for dev in group.devices]
    with pytest.raises(npurt.InvalidArgumentError, match=f"1 buffers for a group of {n} devices"):
        group.all_reduce(bufs[:1])
    with pytest.raises(npurt.InvalidArgumentError, match="expected a list of one Buffer or View per rank"):
        group.all_reduce(bufs[0])
    with pytest.raises(npurt.InvalidArgumentError, match="entry 1 is not an npurt.Buffer or View"):
        group.all_reduce([bufs[0], np.zeros(640, np.float32)] + bufs[2:])
    with pytest.raises(npurt.InvalidArgumentError, match="buffer 0 .* is not on rank 0's device"):
        group.all_reduce(bufs[::-1])
    other = npurt.Device(cores=1, global_memory_bytes=16 << 20)
    with pytest.raises(npurt.InvalidArgumentError, match="buffer 1 .* is not on rank 1's device"):
        group.all_reduce([bufs[0], other.buffer(640)] + bufs[2:])
    other.close()
    sized = [dev.buffer(640 + r) for r, dev in enumerate(group.devices)]
    with pytest.raises(npurt.InvalidArgumentError, match="buffer 1 holds 2564 bytes, buffer 0 2560"):
        group.all_reduce(sized)
    ints = [dev.buffer(8, dtype="int32") for dev in group.devices]
    with pytest.raises(npurt.DTypeError, match="all_reduce sums float32 or bfloat16, not int32"):
        group.all_reduce(ints)
    with pytest.raises(npurt.DTypeError, match="buffer 0 holds float32, not bfloat16"):
        group.all_reduce(bufs, dtype="bf16")
    gathered = [dev.buffer(640 * n - 1) for dev in group.devices]
    with pytest.raises(npurt.InvalidArgumentError, match=f"gathered 0 holds {4 * (640 * n - 1)} bytes"):
        group.all_gather(bufs, gathered)
    with pytest.raises(npurt.OutOfRangeError, match=f"broadcast: root {n} is not in"):
        group.broadcast(bufs, root=n)
    with pytest.raises(npurt.OutOfRangeError, match=f"rank {n} is not in"):
        group.device(n)

    inputs = [random_f32(rng, 640) for _ in range(n)]
    for b, a in zip(bufs, inputs):
        b.write(a)
    group.all_reduce(bufs)
    assert_sum(bufs[0].data, inputs, 1e-6)


def test_bad_group_options_raise():
    with pytest.raises(npurt.InvalidArgumentError, match="0 devices"):
        npurt.DeviceGroup(0)
    with pytest.raises(npurt.InvalidArgumentError):
        npurt.DeviceGroup(2, cores=0)


def test_a_closed_group_fails_its_collectives():
    g = npurt.DeviceGroup(2, cores=1, memory=32 << 20)
    bufs = [dev.buffer(16) for dev in g.devices]
    with g:
        g.barrier()
    assert all(dev.closed for dev in g.devices)
    with pytest.raises(npurt.FailedPreconditionError, match="device is closed"):
        g.all_reduce(bufs)
    with pytest.raises(npurt.FailedPreconditionError, match="device is closed"):
        g.barrier()


def test_one_closed_device_fails_the_collective_by_rank():
    g = npurt.DeviceGroup(2, cores=1, memory=32 << 20)
    bufs = [dev.buffer(16) for dev in g.devices]
    g.device(1).close()
    with pytest.raises(npurt.FailedPreconditionError, match="all_reduce on rank 1"):
        g.all_reduce(bufs)
    g.close()


def test_a_rank_that_cannot_take_part_fails_the_group_at_once():
    g = npurt.DeviceGroup(2, cores=1, memory=32 << 20)
    bufs = [dev.buffer(640) for dev in g.devices]
    bufs[1].free()  # rank 0's part is enqueued before rank 1's fails
    start = time.monotonic()
    with pytest.raises(npurt.FailedPreconditionError, match="rank 1: all_reduce #0: .* the buffer was freed"):
        g.all_reduce(bufs)
    assert time.monotonic() - start < 10, "rank 0 waited for its peer instead of failing"
    with pytest.raises(npurt.FailedPreconditionError, match="the group failed earlier"):
        g.barrier()
    g.close()


def test_objects_die_in_any_order(rng):
    names = ["group", "device", "buffers", "array", "view"]
    for trial in range(24):
        g = npurt.DeviceGroup(2, cores=1, memory=32 << 20)
        bufs = rank_buffers(g, [random_f32(rng, 640) for _ in range(2)], "f32")
        g.all_reduce(bufs)
        objects = {"group": g, "device": g.device(1), "buffers": bufs, "array": bufs[0].data,
                   "view": bufs[1].view(10, 20)}
        del g, bufs
        if trial % 2:
            objects["group"].close()
        for name in rng.permutation(names):
            del objects[name]
        gc.collect()


@pytest.fixture(scope="module")
def gemma3_pair():
    one = npurt.Gemma3(MODEL, cores=2, max_context=64, prefill_chunk=16)
    two = npurt.Gemma3(MODEL, cores=2, max_context=64, prefill_chunk=16, devices=2)
    return one, two


@needs_model
def test_gemma3_on_two_devices_generates_the_one_device_tokens(gemma3_pair):
    one, two = gemma3_pair
    assert one.devices == 1 and two.devices == 2
    prompt = one.encode("The capital of France is")
    want = one.generate_ids(prompt, 16)
    assert len(want) == 16
    assert two.generate_ids(prompt, 16) == want


@needs_model
def test_gemma3_device_counts_it_cannot_use_raise():
    heads = r"gemma3: the query heads \(4\) cannot be split over 3 devices"
    with pytest.raises(npurt.InvalidArgumentError, match=heads):
        npurt.Gemma3(MODEL, cores=1, max_context=16, devices=3)
    with pytest.raises(npurt.InvalidArgumentError, match="gemma3: 0 devices"):
        npurt.Gemma3(MODEL, cores=1, max_context=16, devices=0)
    with pytest.raises(npurt.InvalidArgumentError, match="the host oracle runs on no NPU: devices must be 1"):
        npurt.Gemma3(MODEL, device="host", devices=2)
