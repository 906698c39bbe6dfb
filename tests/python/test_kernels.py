"""Kernels written in Python (npurt.isa): built, verified, run with Device.launch and
as custom operators in fused and separate sequences, each against numpy by rel-L2 on
fresh random data with the outputs poisoned first."""

from __future__ import annotations

import random

import numpy as np
import pytest

import npurt
from npurt import isa
from npurt.isa import r0, r1, r2, r3, r4, r5, t0, t1, t2, t3

from conftest import rel_l2, random_f32

F32 = 4  # bytes


def two_in_one_out(name: str, args: tuple[str, str, str], n: int, grid: int):
    """The start of a kernel over n f32 values in `grid` blocks: a builder with the
    inputs args[0] and args[1] and the output args[2] (their handles come back with
    it), and r0 at the first byte of this block's per_block = n / grid values."""
    b = isa.Builder(name)
    handles = (b.arg_buffer(args[0], "in", "f32"), b.arg_buffer(args[1], "in", "f32"),
               b.arg_buffer(args[2], "out", "f32"))
    per_block = n // grid
    b.block_id(r0)
    b.alui("mul", r0, r0, per_block * F32)
    return b, handles, per_block


def vector_add(n: int, grid: int, tile: int = 256) -> isa.Image:
    """z = x + y: each block adds its n / grid values, `tile` at a time."""
    b, (x, y, z), per_block = two_in_one_out("vector_add", ("x", "y", "z"), n, grid)
    b.li(r1, per_block // tile)
    b.tdef(t0, "f32", 1, tile)
    b.tdef(t1, "f32", 1, tile, local_offset=tile * F32)
    with b.loop(r1):
        b.tld(t0, x, r0, "f32")
        b.tld(t1, y, r0, "f32")
        b.tbin("add", t0, t0, t1)
        b.tst(t0, z, r0, "f32")
        b.alui("add", r0, r0, tile * F32)
    b.exit()
    return b.build()


def scaled_softmax(rows: int, cols: int, rows_per_block: int) -> isa.Image:
    """y = softmax(scale * x) over each row; block i takes rows_per_block rows."""
    b = isa.Builder("scaled_softmax")
    x = b.arg_buffer("x", "in", "f32")
    y = b.arg_buffer("y", "out", "f32")
    scale = b.arg_scalar("scale", "f32")
    b.block_id(r0)
    b.alui("mul", r0, r0, rows_per_block * cols * F32)
    b.arg_value(r1, scale)
    b.tdef(t0, "f32", rows_per_block, cols)
    b.tdef(t1, "f32", rows_per_block, 1, local_offset=rows_per_block * cols * F32)
    b.tld(t0, x, r0, "f32")
    b.tsop("mul", t0, t0, r1)
    b.tred("max", t1, t0)
    b.tbin("sub", t0, t0, t1, bcast="col")
    b.tun("exp", t0, t0)
    b.tred("sum", t1, t0)
    b.tbin("div", t0, t0, t1, bcast="col")
    b.tst(t0, y, r0, "f32")
    b.exit()
    return b.build()


def tiled_gemm(m: int, n: int, k: int, tm: int = 16, tk: int = 64) -> isa.Image:
    """c (m x n) = a (m x k) @ b (k x n); block i computes rows tm*i .. tm*i + tm."""
    bld = isa.Builder("tiled_gemm")
    a = bld.arg_buffer("a", "in", "f32")
    bb = bld.arg_buffer("b", "in", "f32")
    c = bld.arg_buffer("c", "out", "f32")
    bld.block_id(r0)
    bld.alui("mul", r0, r0, tm * k * F32)  # a: this block's rows
    bld.li(r1, 0)                          # b: row kk
    bld.li(r2, k // tk)
    bld.li(r3, k)                          # a's row stride (elements)
    bld.li(r4, n)                          # b's and c's row stride
    bld.tdef(t0, "f32", tm, tk)
    bld.tdef(t1, "f32", tk, n, local_offset=tm * tk * F32)
    bld.tdef(t2, "f32", tm, n, local_offset=(tm * tk + tk * n) * F32)
    bld.li(r5, 0)
    bld.tfill(t2, r5)
    with bld.loop(r2):
        bld.tld(t0, a, r0, "f32", row_stride=r3)
        bld.tld(t1, bb, r1, "f32", row_stride=r4)
        bld.tmma(t2, t0, t1, accumulate=True)
        bld.alui("add", r0, r0, tk * F32)
        bld.alui("add", r1, r1, tk * n * F32)
    bld.block_id(r0)
    bld.alui("mul", r0, r0, tm * n * F32)
    bld.tst(t2, c, r0, "f32", row_stride=r4)
    bld.exit()
    return bld.build()


def swiglu_rows(n: int, grid: int) -> isa.Image:
    """h = silu(gate) * up, n values over `grid` blocks (no exit but the last: a step)."""
    b, (gate, up, h), per_block = two_in_one_out("swiglu_rows", ("gate", "up", "h"), n, grid)
    b.tdef(t0, "f32", 1, per_block)
    b.tdef(t1, "f32", 1, per_block, local_offset=per_block * F32)
    b.tld(t0, gate, r0, "f32")
    b.tld(t1, up, r0, "f32")
    b.tun("silu", t0, t0)
    b.tbin("mul", t0, t0, t1)
    b.tst(t0, h, r0, "f32")
    b.exit()
    return b.build()


def silu(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float64)
    return v / (1.0 + np.exp(-v))


def poisoned(dev: npurt.Device, shape, dtype="f32") -> npurt.Buffer:
    buf = dev.buffer(shape, dtype)
    buf.data[...] = np.nan
    return buf


def filled(dev: npurt.Device, values: np.ndarray) -> npurt.Buffer:
    buf = dev.buffer(values.shape, values.dtype)
    np.copyto(buf.data, values)
    return buf


def test_vector_add_matches_numpy(dev, rng):
    n = 4096
    xs, ys = random_f32(rng, n), random_f32(rng, n)
    z = poisoned(dev, n)
    dev.launch(vector_add(n, grid=4), 4, x=filled(dev, xs), y=filled(dev, ys), z=z)
    assert rel_l2(z.data, xs.astype(np.float64) + ys) < 1e-7


def test_scaled_row_softmax_matches_numpy(dev, rng):
    rows, cols = 16, 200
    xs = random_f32(rng, (rows, cols)) * 4
    y = poisoned(dev, (rows, cols))
    dev.launch(scaled_softmax(rows, cols, rows_per_block=4), 4, x=filled(dev, xs), y=y, scale=0.75)
    e = np.exp(0.75 * xs.astype(np.float64) - (0.75 * xs).max(axis=1, keepdims=True))
    assert rel_l2(y.data, e / e.sum(axis=1, keepdims=True)) < 1e-5


def test_tiled_gemm_matches_numpy(dev, rng):
    m, n, k = 64, 48, 256
    a, b = random_f32(rng, (m, k)), random_f32(rng, (k, n))
    c = poisoned(dev, (m, n))
    dev.launch(tiled_gemm(m, n, k), m // 16, a=filled(dev, a), b=filled(dev, b), c=c)
    assert rel_l2(c.data, a.astype(np.float64) @ b) < 1e-5


def test_launch_on_views_writes_only_them(dev, rng):
    n = 1024
    xs, ys = random_f32(rng, 2 * n), random_f32(rng, n)
    x = filled(dev, xs)
    z = poisoned(dev, 2 * n)
    dev.launch(vector_add(n, grid=2), 2, x=x.view(n, n), y=filled(dev, ys), z=z.view(0, n))
    assert rel_l2(z.data[:n], xs[n:].astype(np.float64) + ys) < 1e-7
    assert np.isnan(z.data[n:]).all()  # the rest of the buffer was not touched


def test_the_same_kernel_built_twice_is_published_once(dev, rng):
    n = 2048
    first, second = vector_add(n, grid=2), vector_add(n, grid=2)
    assert first == second and first.hash == second.hash and len(first.hash) == 32
    xs, ys = random_f32(rng, n), random_f32(rng, n)
    x, y, z = filled(dev, xs), filled(dev, ys), poisoned(dev, n)
    for _ in range(2):  # the first read-back makes the memory context's transfer stream
        z.data[...] = np.nan
        dev.launch(first, 2, x=x, y=y, z=z)
    before = dev.counters()
    z.data[...] = np.nan
    dev.launch(second, 2, x=x, y=y, z=z)  # the same run again: its code and its stream
    after = dev.counters()
    assert after["code_uploads"] == before["code_uploads"]
    assert after["streams_created"] == before["streams_created"]
    assert after["launches"] == before["launches"] + 1
    assert rel_l2(z.data, xs.astype(np.float64) + ys) < 1e-7
    other = poisoned(dev, n)
    dev.launch(second, 2, x=x, y=y, z=other)  # other buffers: still no new code
    assert dev.counters()["code_uploads"] == before["code_uploads"]
    assert rel_l2(other.data, xs.astype(np.float64) + ys) < 1e-7
    dev.launch(vector_add(n, grid=2, tile=128), 2, x=x, y=y, z=z)  # another kernel is new code
    assert dev.counters()["code_uploads"] > before["code_uploads"]


def test_custom_step_fused_equals_separate_and_its_reference(dev, rng):
    d, f = 128, 256
    gate_w, up_w = random_f32(rng, (f, d)), random_f32(rng, (f, d))
    down_w, x = random_f32(rng, (d, f)), random_f32(rng, d)
    swiglu = npurt.ops.Custom(swiglu_rows(f, 4), 4, {"gate": f, "up": f, "h": f},
                              reference=lambda gate, up: silu(gate) * up)
    steps = [
        (npurt.ops.Gemv(m=f, k=d, weight="f32"), {"w": "w_gate", "x": "x", "y": "g"}),
        (npurt.ops.Gemv(m=f, k=d, weight="f32"), {"w": "w_up", "x": "x", "y": "u"}),
        (swiglu, {"gate": "g", "up": "u", "h": "h"}),
        (npurt.ops.Gemv(m=d, k=f, weight="f32"), {"w": "w_down", "x": "h", "y": "y"}),
    ]
    sizes = {"w_gate": (f, d), "w_up": (f, d), "w_down": (d, f), "x": d, "g": f, "u": f, "h": f, "y": d}
    inputs = {"w_gate": gate_w, "w_up": up_w, "w_down": down_w, "x": x}
    outs = {}
    for fused in (True, False):
        seq = npurt.OperatorSequence(dev, "mlp", steps, ["x"], ["y"], sizes, fused=fused)
        assert seq.launches_per_call == (1 if fused else 4)
        for name, value in inputs.items():
            np.copyto(seq.get_buffer(name).data, value)
        seq.get_buffer("y").data[...] = np.nan
        seq()
        outs[fused] = seq.get_buffer("y").data.copy()
    np.testing.assert_array_equal(outs[True], outs[False])
    want = down_w.astype(np.float64) @ (silu(gate_w @ x.astype(np.float64)) * (up_w @ x.astype(np.float64)))
    assert rel_l2(outs[True], want) < 1e-5
    ref = seq.reference(inputs)["y"]
    assert rel_l2(outs[True], ref) < 1e-5
    assert rel_l2(swiglu.reference({"gate": x.repeat(2), "up": x.repeat(2)})["h"],
                  silu(x.repeat(2)) * x.repeat(2)) < 1e-7


def test_a_custom_operator_without_reference_or_sizes_says_so(dev):
    image = swiglu_rows(256, 4)
    with pytest.raises(npurt.InvalidArgumentError, match="element count of buffer argument 'up'"):
        npurt.ops.Custom(image, 4, {"gate": 256, "h": 256})
    op = npurt.ops.Custom(image, 4, {"gate": 256, "up": 256, "h": 256})
    with pytest.raises(npurt.UnimplementedError, match="no host reference"):
        op.reference({"gate": np.ones(256, np.float32), "up": np.ones(256, np.float32)})
    bad = npurt.ops.Custom(image, 4, {"gate": 256, "up": 256, "h": 256}, reference=lambda gate, up: 1 / 0)
    with pytest.raises(npurt.InvalidArgumentError, match="ZeroDivisionError"):
        bad.reference({"gate": np.ones(256, np.float32), "up": np.ones(256, np.float32)})


def test_a_faulting_kernel_names_the_instruction_and_the_device_stays_usable(dev, rng):
    n = 1024
    xs, ys = random_f32(rng, n), random_f32(rng, n)
    x, y = filled(dev, xs), filled(dev, ys)
    small = poisoned(dev, n // 2)  # the kernel stores n values into n / 2
    with pytest.raises(npurt.DeviceFaultError) as fault:
        dev.launch(vector_add(n, grid=2), 2, x=x, y=y, z=small)
    assert "insn 9 (TST)" in str(fault.value) and "out-of-bounds" in str(fault.value)
    z = poisoned(dev, n)
    dev.launch(vector_add(n, grid=2), 2, x=x, y=y, z=z)
    assert rel_l2(z.data, xs.astype(np.float64) + ys) < 1e-7


def test_launch_refuses_bad_arguments_by_name(dev):
    image = vector_add(512, grid=1)
    x, y, z = dev.buffer(512), dev.buffer(512), dev.buffer(512)
    with pytest.raises(npurt.InvalidArgumentError, match="no value for argument 'z'"):
        dev.launch(image, 1, x=x, y=y)
    with pytest.raises(npurt.InvalidArgumentError, match="no argument 'w'"):
        dev.launch(image, 1, x=x, y=y, z=z, w=z)
    with pytest.raises(npurt.DTypeError, match="'x'"):
        dev.launch(image, 1, x=dev.buffer(512, "bf16"), y=y, z=z)
    with pytest.raises(npurt.InvalidArgumentError, match="pass an npurt Buffer or View"):
        dev.launch(image, 1, x=np.zeros(512, np.float32), y=y, z=z)
    with pytest.raises(npurt.InvalidArgumentError, match="overlap"):
        dev.launch(image, 1, x=x, y=y, z=x)
    with npurt.Device(cores=2) as other:
        with pytest.raises(npurt.InvalidArgumentError, match="another device"):
            dev.launch(image, 1, x=other.buffer(512), y=y, z=z)


def test_verifier_errors_name_the_instruction():
    b = isa.Builder("bad")
    b.arg_buffer("x", "in", "f32")
    b.li(r0, 0)
    b.tdef(isa.Tile(20), "f32", 1, 16)  # there are 16 tile registers
    b.exit()
    with pytest.raises(npurt.InvalidArgumentError, match=r"insn 1 \(TDEF\): operand a: tile register"):
        b.build()
    b = isa.Builder("store_to_input")
    x = b.arg_buffer("x", "in", "f32")
    b.li(r0, 0)
    b.tdef(t0, "f32", 1, 16)
    b.tst(t0, x, r0, "f32")
    b.exit()
    with pytest.raises(npurt.InvalidArgumentError, match=r"insn 2 \(TST\)"):
        b.build()
    with pytest.raises(npurt.InvalidArgumentError, match="one of: exp"):
        isa.Builder("k").tun("expp", t0, t0)
    with pytest.raises(npurt.InvalidArgumentError, match="0..255"):
        isa.Reg(256)


def test_images_save_load_and_assemble_back_to_the_same_bytes(tmp_path):
    for image in (vector_add(1024, 2), scaled_softmax(8, 64, 2), tiled_gemm(32, 16, 128), swiglu_rows(256, 4),
                  npurt.ops.Rope(n_heads=2, head_dim=64).compile().image):
        path = tmp_path / (image.name + ".img")
        image.save(str(path))
        assert path.read_bytes() == image.bytes
        assert isa.Image.load(str(path)) == image
        assert isa.Image.assemble(image.disassemble()).bytes == image.bytes
        assert isa.Image.from_bytes(image.bytes) == image
    with pytest.raises(npurt.InvalidArgumentError, match="magic"):
        isa.Image.from_bytes(b"\0" * 128)


def test_random_instruction_sequences_never_crash_the_builder():
    rnd = random.Random(1234)
    dtypes = ["f32", "bf16", "f16", "i32", "q8_0", "q4_K"]
    reg = lambda: isa.Reg(rnd.randrange(40))  # noqa: E731 - some out of range on purpose
    tile = lambda: isa.Tile(rnd.randrange(20))  # noqa: E731
    arg = lambda: rnd.choice([0, 1, 2, 7, "const"])  # noqa: E731
    emitters = [
        lambda b: b.li(reg(), rnd.randrange(-5, 1 << 20)),
        lambda b: b.alu(rnd.choice(["add", "mul", "div", "shl"]), reg(), reg(), reg()),
        lambda b: b.alui("add", reg(), reg(), rnd.randrange(-64, 64)),
        lambda b: b.falu("mul", reg(), reg(), reg()),
        lambda b: b.tdef(tile(), rnd.choice(dtypes), rnd.randrange(0, 70), rnd.choice([reg(), 16, 64, 0])),
        lambda b: b.tld(tile(), arg(), reg(), rnd.choice(dtypes)),
        lambda b: b.tst(tile(), arg(), reg(), rnd.choice(dtypes), row_stride=reg()),
        lambda b: b.tldq(tile(), arg(), reg(), reg(), rnd.choice(dtypes)),
        lambda b: b.tbin("add", tile(), tile(), tile(), bcast=rnd.choice(["none", "row", "col"])),
        lambda b: b.tun("exp", tile(), tile()),
        lambda b: b.tred("argmax", tile(), tile()),
        lambda b: b.tmma(tile(), tile(), tile(), trans_b=rnd.random() < 0.5),
        lambda b: b.tmv(tile(), arg(), reg(), reg(), tile(), rnd.choice(dtypes)),
        lambda b: b.tget(reg(), tile(), reg()),
        lambda b: b.loop_begin(reg()),
        lambda b: b.loop_end(),
        lambda b: b.barrier(),
        lambda b: b.exit(),
        lambda b: b.emit(rnd.randrange(256), *(rnd.randrange(256) for _ in range(7)), imm=rnd.randrange(-9, 9)),
    ]
    built = refused = 0
    for i in range(400):
        b = isa.Builder(f"random{i}")
        b.arg_buffer("a", rnd.choice(["in", "out", "inout"]), rnd.choice(dtypes))
        b.arg_buffer("b", "out", "f32")
        b.arg_scalar("s", rnd.choice(["f32", "i32"]))
        for _ in range(rnd.randrange(1, 12)):
            rnd.choice(emitters)(b)
        if rnd.random() < 0.8:
            b.exit()
        try:
            image = b.build()
        except (npurt.InvalidArgumentError, npurt.ResourceExhaustedError):
            refused += 1
            continue
        built += 1
        assert isa.Image.from_bytes(image.bytes) == image
    assert refused > 100 and built > 10, (built, refused)
