"""Shared helpers for the npurt Python tests: fresh random data, the host reference
and the one-step GEMV sequence the tests build on."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

import npurt

BF16 = ml_dtypes.bfloat16


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64; NaN anywhere makes it NaN (a failure)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random data for every test (never zeros); the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


def random_bf16(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(BF16)


def random_f32(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def gemv_reference(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y = A x in float64 from the exact stored (bf16) weights."""
    return a.astype(np.float64) @ x.astype(np.float64)


def gemv_sequence(dev: npurt.Device, m: int = 256, k: int = 640, fused: bool = True) -> npurt.OperatorSequence:
    """The IRON-style one-step sequence: out = A x, A bf16 (m x k), x and out f32."""
    gemv = npurt.ops.Gemv(m=m, k=k, weight="bf16")
    return npurt.OperatorSequence(
        dev,
        "gemv",
        [(gemv, {"w": "A", "x": "x", "y": "out"})],
        inputs=["A", "x"],
        outputs=["out"],
        sizes={"A": (m, k), "x": k, "out": m},
        fused=fused,
    )


@pytest.fixture
def dev():
    d = npurt.Device(cores=4)
    yield d
    d.close()
