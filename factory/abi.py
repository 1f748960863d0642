"""The calling convention between a compiled variant and the loader.

A variant's entry point takes a list of arguments, each a tensor or a scalar, then the stream.  A
tensor's shape and strides are written with *symbols* (strings) and integers: a symbol is a size
known only at launch (``cute.SymInt`` at compile time), an integer is fixed at compile time.  The
same symbol in two places means the same runtime value (K in A and in B).  Divisibility of a symbol
is a hard contract the compiler relies on (vector widths), so the loader checks it before launch.

This module is shared by the factory (which builds fake tensors from it) and the runtime (which
binds torch tensors to it), so it imports nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Union

Dim = Union[str, int]

# dtype names used across manifest, runtime and factory; the runtime maps them to torch dtypes,
# the factory to cutlass numeric types.
DTYPE_BYTES = {
    "f32": 4, "f16": 2, "bf16": 2, "e4m3": 1, "e5m2": 1, "i32": 4, "i64": 8, "e8m0": 1,
}
# Bits per element, sub-byte types included: "e2m1" (fp4) is stored two to a byte, the element at
# the even index in the low nibble.
DTYPE_BITS = {**{k: 8 * v for k, v in DTYPE_BYTES.items()}, "e2m1": 4}


@dataclass(frozen=True)
class TensorArg:
    name: str
    dtype: str
    shape: tuple[Dim, ...]
    stride: tuple[Dim, ...]
    align: int = 16  # assumed byte alignment of the data pointer
    kind: str = field(default="tensor", init=False)

    def __post_init__(self):
        if len(self.shape) != len(self.stride):
            raise ValueError(f"{self.name}: shape and stride ranks differ")


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str  # "f32" or "i32"
    kind: str = field(default="scalar", init=False)


Arg = Union[TensorArg, ScalarArg]


@dataclass(frozen=True)
class Signature:
    args: tuple[Arg, ...]
    divisibility: tuple[tuple[str, int], ...] = ()  # (symbol, divisor) pairs

    def divisor(self, symbol: str) -> int:
        return dict(self.divisibility).get(symbol, 1)

    def symbols(self) -> list[str]:
        seen: list[str] = []
        for a in self.args:
            if isinstance(a, TensorArg):
                for d in (*a.shape, *a.stride):
                    if isinstance(d, str) and d not in seen:
                        seen.append(d)
        return seen

    def to_json(self) -> dict:
        return {
            "args": [asdict(a) for a in self.args],
            "divisibility": dict(self.divisibility),
        }

    @staticmethod
    def from_json(d: dict) -> "Signature":
        args: list[Arg] = []
        for a in d["args"]:
            a = dict(a)
            kind = a.pop("kind")
            if kind == "tensor":
                args.append(TensorArg(a["name"], a["dtype"], tuple(a["shape"]), tuple(a["stride"]), a["align"]))
            else:
                args.append(ScalarArg(a["name"], a["dtype"]))
        return Signature(tuple(args), tuple(sorted(d.get("divisibility", {}).items())))


@dataclass(frozen=True)
class StructLayout:
    """Layout of one tensor argument's C struct, read from the exported header (never assumed):
    ``void *data; <shape_ctype> dynamic_shapes[n]; <stride_ctype> dynamic_strides[m];``."""

    shape_ctype: str  # "int32_t" or "int64_t"
    n_shapes: int
    stride_ctype: str
    n_strides: int


# --- block-scaled operands (MXFP8, NVFP4) ---------------------------------------------------------
@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled operand format: ``data`` elements, one ``scale`` factor per ``vec``
    consecutive elements along K (the scale factors laid out as ``SF_LAYOUT``), and, where
    ``global_scale``, one more fp32 factor for the whole tensor.  Decoded value of element (r, k):
    ``data[r, k] * scale[r, k // vec] (* global_scale)``."""

    name: str
    data: str
    scale: str
    vec: int
    global_scale: bool


BLOCK_FORMATS = {
    "mxf8e4m3": BlockFormat("mxf8e4m3", "e4m3", "e8m0", 32, False),  # OCP MXFP8 (E4M3)
    "mxf8e5m2": BlockFormat("mxf8e5m2", "e5m2", "e8m0", 32, False),  # OCP MXFP8 (E5M2)
    "nvf4": BlockFormat("nvf4", "e2m1", "e4m3", 16, True),  # NVFP4
}

# The scale factors' layout, in global memory as the kernels read it (the PTX ISA's tcgen05
# "scale factor" 128x4 atom, cuBLAS's block-scaling layout): an operand of R rows (M of A, N of B),
# K columns and L batches has Rb = ceil(R / 128) row blocks and Kb = ceil(ceil(K / vec) / 4) blocks
# of 4 scale factors; the buffer is a contiguous (L, Rb, Kb, 32, 4, 4) array whose element
# [l, rb, kb, i, j, s] is the scale factor of row 128 rb + 32 j + i, k-block 4 kb + s.  Entries past
# R or past ceil(K / vec) are padding (zeros).
SF_LAYOUT = "sf128x4"
SF_LAYOUT_SHAPE = "(L, ceil(R/128), ceil(ceil(K/vec)/4), 32, 4, 4)"


def sf_blocks(rows: int, k: int, vec: int) -> tuple[int, int]:
    """(row blocks, k blocks) of the ``SF_LAYOUT`` buffer of an operand with ``rows`` rows and
    ``k`` elements along K."""
    return -(-rows // 128), -(-(-(-k // vec)) // 4)
