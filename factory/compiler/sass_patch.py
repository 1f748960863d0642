"""Scheduling-hint edits of a compiled cubin's SASS control bits (sm_90a).

Each 128-bit Hopper instruction carries its scheduling control in the high 64-bit word: stall
cycles (bits 41-44), the yield hint (bit 45: set = keep issuing from this warp), the write and read
scoreboards (46-48, 49-51), the wait mask (52-57) and the operand reuse-cache flags (58-61), as
the encodings nvdisasm prints show (``nvdisasm -hex``: an FFMA whose B operand carries ``.reuse``
differs from its neighbour in exactly bits 59 and 45).  Neither the yield hint nor the reuse
flags change what an instruction computes: they tell the warp scheduler whether it may switch
warps after it and the register file whether to keep an operand for the next instruction (a
warp that may switch away cannot keep one, hence ptxas clears the hint wherever it sets a reuse
flag).

:func:`yield_ffma` lets every FFMA that keeps its B operand in the reuse cache yield instead: the
fp8 block-scaled GEMM's promotion issues 64 FFMAs per k-block back to back, and every second one of
them holds the scheduler on its warp while another warpgroup of the CTA waits to issue its next
WGMMA on the same scheduler.  The edit touches only those two bits of those instructions; the
cubin's size and every other byte stay as compiled.
"""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from pathlib import Path

from .cubin import _sections, nvdisasm_path

YIELD_HOLD = 1 << 45  # set: the scheduler keeps issuing from this warp
REUSE = (1 << 58, 1 << 59, 1 << 60, 1 << 61)  # operand reuse-cache flags (A, B, C, D slots)

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)[^/]*/\*\s*0x([0-9a-f]{16})\s*\*/")


def _code_sections(cubin: bytes) -> dict[str, tuple[int, int]]:
    return {name: (off, size) for name, (typ, off, size, _info) in _sections(cubin).items()
            if name.startswith(".text.")}


def yield_ffma(cubin: bytes) -> tuple[bytes, int]:
    """``cubin`` with the reuse flag and the hold-warp hint cleared on every FFMA whose only reuse
    flag is the B operand's; returns (cubin, instructions changed).  The cubin must hold exactly
    one kernel (one ``.text.`` section); each edited word is checked against nvdisasm's encoding."""
    code = _code_sections(cubin)
    if len(code) != 1:
        raise ValueError(f"expected one code section, found {sorted(code)}")
    (sec_off, sec_size), = code.values()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([nvdisasm_path(), "-c", "-hex", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"nvdisasm failed: {out.stderr.strip()}")
    buf = bytearray(cubin)
    changed = 0
    for m in _LINE.finditer(out.stdout):
        addr, op, low_hex = int(m.group(1), 16), m.group(2), int(m.group(3), 16)
        if op != "FFMA":
            continue
        if addr + 16 > sec_size:
            raise ValueError(f"instruction at {addr:#x} past the code section")
        low, high = struct.unpack_from("<QQ", buf, sec_off + addr)
        if low != low_hex:
            raise ValueError(f"FFMA at {addr:#x}: encoding {low:#018x} differs from nvdisasm's {low_hex:#018x}")
        reuse = [bool(high & r) for r in REUSE]
        if reuse != [False, True, False, False] or not high & YIELD_HOLD:
            continue
        struct.pack_into("<Q", buf, sec_off + addr + 8, high & ~(REUSE[1] | YIELD_HOLD))
        changed += 1
    return bytes(buf), changed


def patch_object(obj: bytes, cubin: bytes, patched: bytes) -> bytes:
    """The host object ``obj`` with its one embedded copy of ``cubin`` replaced by ``patched``
    (same size)."""
    if len(cubin) != len(patched) or obj.count(cubin) != 1:
        raise ValueError("the object must embed the cubin exactly once, and the patch keep its size")
    return obj.replace(cubin, patched)


# Edits a variant may name in ``cubin_edits``: name -> (edit, fewest instructions it must change).
# The floor guards against an edit that silently stops matching: a block-scaled promotion has 64
# FFMAs per k-block, about every second one reusing the scale register.
EDITS = {"yield_ffma": (yield_ffma, 16)}


def apply_edits(cubin: bytes, edits, name: str = "") -> bytes:
    """``cubin`` after each named edit of :data:`EDITS` in turn."""
    for edit in edits:
        fn, floor = EDITS[edit]
        cubin, n = fn(cubin)
        if n < floor:
            raise RuntimeError(f"{name}: {edit} changed {n} instructions (expected at least {floor})")
    return cubin
