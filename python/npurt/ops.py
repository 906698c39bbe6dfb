"""The operator library: each operator is a set of parameters that compiles to one
kernel (``compile()``), with its argument ``signature()`` and an f32 host
``reference()``. Bind operators to buffers with :class:`npurt.OperatorSequence`."""

from __future__ import annotations

from ._npurt import (
    Argmax,
    Copy,
    Custom,
    DecodeAttention,
    Elementwise,
    Embedding,
    Gemm,
    Gemv,
    Operator,
    RmsNorm,
    Rope,
    Softmax,
    StridedCopy,
    Transpose,
)

__all__ = [
    "Argmax",
    "Copy",
    "Custom",
    "DecodeAttention",
    "Elementwise",
    "Embedding",
    "Gemm",
    "Gemv",
    "Operator",
    "RmsNorm",
    "Rope",
    "Softmax",
    "StridedCopy",
    "Transpose",
]
