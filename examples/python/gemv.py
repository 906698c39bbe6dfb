"""A one-step fused GEMV operator sequence on the simulated NPU, from Python:
y = A x with bf16 weights A (256 x 640) and f32 x. The inputs are written into the
sequence's buffers through their numpy arrays, one call runs it, and the output is
compared with numpy by relative L2 error.

    pip install npurt   # or, from a checkout: pip install .
    python gemv.py
"""

import sys

import ml_dtypes
import numpy as np

import npurt

ROWS, COLS = 256, 640


def main() -> int:
    print(f"npurt {npurt.__version__}")
    rng = np.random.default_rng(2024)
    a = rng.uniform(-1.0, 1.0, size=(ROWS, COLS)).astype(ml_dtypes.bfloat16)
    x = rng.uniform(-1.0, 1.0, size=COLS).astype(np.float32)

    with npurt.Device(cores=8) as dev:
        gemv = npurt.ops.Gemv(m=ROWS, k=COLS, weight="bf16")
        seq = npurt.OperatorSequence(
            dev,
            "gemv",
            [(gemv, {"w": "A", "x": "x", "y": "y"})],
            inputs=["A", "x"],
            outputs=["y"],
            sizes={"A": (ROWS, COLS), "x": COLS, "y": ROWS},
        )
        # .data is the buffer's host memory itself: the writes are tracked and the
        # call uploads them, with no sync call.
        np.copyto(seq.get_buffer("A").data, a)
        np.copyto(seq.get_buffer("x").data, x)
        seq()
        y = seq.get_buffer("y").data.astype(np.float64)

    ref = a.astype(np.float64) @ x.astype(np.float64)
    rel_l2 = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(f"gemv {ROWS}x{COLS} bf16: rel-L2 {rel_l2:.3g}")
    if not rel_l2 <= 1e-2:
        print("FAILED: rel-L2 above 1e-2")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
