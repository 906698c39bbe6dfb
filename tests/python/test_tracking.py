"""Tracked writes: numpy slicing, ufuncs with out=, and writes from a second Python
thread all reach the device before the next call, with no call by the user, and the
bytes uploaded are exactly the written pages (clipped to the bytes the call reads)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import npurt
from conftest import BF16, gemv_reference, gemv_sequence, random_bf16, random_f32, rel_l2

MECHANISMS = ["auto", "mprotect", "uffd"]


@pytest.fixture(params=MECHANISMS)
def mechanism(request, monkeypatch):
    """Runs a test under each write-tracking mechanism (sequence arenas use 'auto',
    which follows NPURT_WRITE_TRACKING)."""
    if request.param == "uffd" and not npurt.userfaultfd_supported():
        pytest.skip("this kernel has no asynchronous userfaultfd write-protect")
    if request.param != "auto":
        monkeypatch.setenv("NPURT_WRITE_TRACKING", request.param)
    return request.param


def address_range(arr: np.ndarray) -> tuple[int, int]:
    start = arr.__array_interface__["data"][0]
    return start, start + arr.nbytes


def pages_written(arr: np.ndarray, index) -> set[int]:
    """Host pages holding the bytes of arr[index] (by address)."""
    mask = np.zeros(arr.shape, dtype=bool)
    mask[index] = True
    flat = np.flatnonzero(mask)
    base = arr.__array_interface__["data"][0]
    ps = npurt.page_size()
    first = (base + flat * arr.itemsize) // ps
    last = (base + flat * arr.itemsize + arr.itemsize - 1) // ps
    return set(first.tolist()) | set(last.tolist())


def expected_upload(pages: set[int], ranges: list[tuple[int, int]]) -> int:
    """Bytes of the written pages that lie in the ranges the call reads."""
    ps = npurt.page_size()
    total = 0
    for p in pages:
        lo, hi = p * ps, (p + 1) * ps
        for start, end in ranges:
            total += max(0, min(hi, end) - max(lo, start))
    return total


class Rig:
    """A resident GEMV sequence with known A and x, ready for one tracked write."""

    def __init__(self, dev, rng):
        self.dev = dev
        self.seq = gemv_sequence(dev, m=256, k=640)
        self.a = random_bf16(rng, (256, 640))
        self.x = random_f32(rng, 640)
        np.copyto(self.seq.get_buffer("A").data, self.a)
        np.copyto(self.seq.get_buffer("x").data, self.x)
        self.call_and_check()  # everything resident now
        self.A = self.seq.get_buffer("A").data
        self.X = self.seq.get_buffer("x").data
        self.ranges = [address_range(self.A), address_range(self.X)]

    def call_and_check(self) -> int:
        """Calls, checks out against numpy on the host's copies, returns bytes uploaded."""
        self.seq.get_buffer("out").data[:] = np.nan
        before = self.dev.counters()["h2d_bytes"]
        self.seq()
        uploaded = self.dev.counters()["h2d_bytes"] - before
        err = rel_l2(self.seq.get_buffer("out").data, gemv_reference(self.a, self.x))
        assert err < 1e-2, f"rel-L2 {err}: the device did not see the write"
        return uploaded


def test_slice_assignment_is_seen(dev, rng, mechanism):
    rig = Rig(dev, rng)
    rows = slice(37, 101)  # 64 rows of 1280 bytes: starts and ends mid-page
    new = random_bf16(rng, (64, 640))
    rig.A[rows] = new
    rig.a[rows] = new
    pages = pages_written(rig.A, rows)
    uploaded = rig.call_and_check()
    want = expected_upload(pages, rig.ranges)
    print(f"{mechanism}: slice write of {new.nbytes} B on {len(pages)} pages, uploaded {uploaded} B")
    assert uploaded == want
    assert uploaded >= new.nbytes


def test_strided_column_write_is_seen(dev, rng, mechanism):
    rig = Rig(dev, rng)
    index = (slice(3, 256, 17), 5)  # one element in every 17th row
    values = random_bf16(rng, 15)
    rig.A[index] = values
    rig.a[index] = values
    uploaded = rig.call_and_check()
    assert uploaded == expected_upload(pages_written(rig.A, index), rig.ranges)


def test_ufunc_out_writes_are_seen(dev, rng, mechanism):
    rig = Rig(dev, rng)
    scale = np.float32(rng.uniform(1.5, 2.5))
    np.multiply(rig.X, scale, out=rig.X)
    rig.x = rig.x * scale
    row = 200
    np.negative(rig.A[row], out=rig.A[row])
    rig.a[row] = -rig.a[row]
    pages = pages_written(rig.X, slice(None)) | pages_written(rig.A, row)
    uploaded = rig.call_and_check()
    assert uploaded == expected_upload(pages, rig.ranges)


def test_write_from_a_second_thread_is_seen(dev, rng, mechanism):
    rig = Rig(dev, rng)
    rows = slice(120, 131)
    new = random_bf16(rng, (11, 640))
    new_x = random_f32(rng, 640)

    def writer():
        rig.A[rows] = new
        rig.X[:] = new_x

    t = threading.Thread(target=writer)
    t.start()
    t.join()
    rig.a[rows] = new
    rig.x = new_x
    pages = pages_written(rig.A, rows) | pages_written(rig.X, slice(None))
    uploaded = rig.call_and_check()
    print(f"{mechanism}: second-thread write on {len(pages)} pages, uploaded {uploaded} B")
    assert uploaded == expected_upload(pages, rig.ranges)


def test_unwritten_calls_upload_nothing(dev, rng):
    rig = Rig(dev, rng)
    assert rig.call_and_check() == 0


def test_device_buffer_uploads_exactly_the_written_pages(dev, rng, mechanism):
    ps = npurt.page_size()
    n = 16 * ps // 4
    buf = dev.buffer(n, np.float32, name="b", tracking="auto" if mechanism == "auto" else mechanism)
    buf.data[:] = random_f32(rng, n)
    before = dev.counters()["h2d_bytes"]
    buf.to_device()
    assert dev.counters()["h2d_bytes"] - before == n * 4
    data = buf.data
    index = slice(ps // 4 * 3 + 5, ps // 4 * 5 + 9)  # pages 3, 4 and 5
    t = threading.Thread(target=lambda: data.__setitem__(index, random_f32(rng, data[index].size)))
    t.start()
    t.join()
    before = dev.counters()["h2d_bytes"]
    buf.to_device()
    assert dev.counters()["h2d_bytes"] - before == 3 * ps
    assert dev.memory_stats()["tracked_pages_collected"] >= 16 + 3


def test_bf16_buffer_round_trip(dev, rng):
    buf = dev.buffer((8, 64), "bf16")
    assert buf.dtype == np.dtype(BF16)
    assert buf.data.dtype == np.dtype(BF16) and buf.data.shape == (8, 64)
    v = random_bf16(rng, (8, 64))
    buf.data[...] = v
    assert buf.data.tobytes() == v.tobytes()
