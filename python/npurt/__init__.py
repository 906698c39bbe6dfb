"""npurt: a runtime for compiled NPU operators, on its simulated NPU.

    import numpy as np, npurt

    dev = npurt.Device(cores=8)
    gemv = npurt.ops.Gemv(m=64, k=640, weight="bf16")
    seq = npurt.OperatorSequence(dev, "gemv", [(gemv, {"w": "A", "x": "x", "y": "out"})],
                                 inputs=["A", "x"], outputs=["out"],
                                 sizes={"A": (64, 640), "x": 640, "out": 64})
    np.copyto(seq.get_buffer("A").data, weights)   # tracked: no sync call needed
    np.copyto(seq.get_buffer("x").data, x)
    seq()                                          # uploads what was written, runs, brings back out
    y = seq.get_buffer("out").data

See docs/python.md for the whole API.
"""

from __future__ import annotations

from . import _npurt
from ._npurt import __version__
from ._npurt import (
    Arg,
    Buffer,
    Device,
    DeviceFaultError,
    DeviceGroup,
    DTypeError,
    Engine,
    Error,
    FailedPreconditionError,
    Gemma3,
    HazardError,
    InternalError,
    InvalidArgumentError,
    Kernel,
    NotFoundError,
    Operator,
    OperatorSequence,
    OutOfRangeError,
    ResourceExhaustedError,
    RunHandle,
    UnimplementedError,
    View,
    Worker,
    drivers,
    page_size,
    start_trace,
    stop_trace,
    userfaultfd_supported,
)
from . import isa
from . import ops
from . import models

__all__ = [
    "Arg",
    "Buffer",
    "Device",
    "DeviceFaultError",
    "DeviceGroup",
    "DTypeError",
    "Engine",
    "Error",
    "FailedPreconditionError",
    "Gemma3",
    "HazardError",
    "InternalError",
    "InvalidArgumentError",
    "Kernel",
    "NotFoundError",
    "Operator",
    "OperatorSequence",
    "OutOfRangeError",
    "ResourceExhaustedError",
    "RunHandle",
    "UnimplementedError",
    "View",
    "Worker",
    "isa",
    "models",
    "ops",
    "drivers",
    "page_size",
    "start_trace",
    "stop_trace",
    "userfaultfd_supported",
]

# Exceptions read as npurt.X in tracebacks.
for _cls in (Error, InvalidArgumentError, DTypeError, OutOfRangeError, NotFoundError,
             FailedPreconditionError, ResourceExhaustedError, DeviceFaultError, HazardError,
             UnimplementedError, InternalError):
    _cls.__module__ = "npurt"
