"""The tile ISA from Python: build a kernel instruction by instruction with
:class:`Builder`, get a verified :class:`Image` from ``build()``, save, load,
assemble and disassemble images. Run one with ``Device.launch`` or make it a step of
an ``OperatorSequence`` with :class:`npurt.ops.Custom`. See docs/kernels.md.

    from npurt import isa
    from npurt.isa import r0, r1, t0, t1

    b = isa.Builder("twice")
    x = b.arg_buffer("x", "in", "f32")
    y = b.arg_buffer("y", "out", "f32")
    b.block_id(r0)
    b.alui("mul", r0, r0, 64 * 4)          # this block's byte offset
    b.tdef(t0, "f32", 1, 64)
    b.tld(t0, x, r0, "f32")
    b.tbin("add", t0, t0, t0)
    b.tst(t0, y, r0, "f32")
    b.exit()
    image = b.build()
"""

from __future__ import annotations

from ._npurt import Builder, Image, LoopScope, Reg, Tile

__all__ = ["Builder", "Image", "LoopScope", "Reg", "Tile", "CONST"]

#: The memory operand of loads from the image's constant section.
CONST = "const"

# r0 .. r31 and t0 .. t15, so code reads like its listing.
for _i in range(32):
    globals()[f"r{_i}"] = Reg(_i)
    __all__.append(f"r{_i}")
for _i in range(16):
    globals()[f"t{_i}"] = Tile(_i)
    __all__.append(f"t{_i}")
del _i
