"""Shared-memory planning constants of the TMA-era kernels (Hopper and Blackwell).

Plain Python (no DSL): the variants' ``smem_bytes()`` and ``can_implement()`` use them on the host,
and the kernels align their ``SharedStorage`` buffers with the same numbers, so the plan and the
cubin agree (``tests/test_build.py`` checks the recorded smem against the target's capacity).
"""

from __future__ import annotations

# Swizzled TMA buffers (128-byte swizzle atoms of 8 rows) start 1024-byte aligned.
SMEM_ALIGN = 1024
# Static smem the DSL puts into every kernel (seen in the cubins: .nv.shared.<kernel> is 1 KiB);
# it counts against the same per-CTA capacity as the dynamic part.
STATIC_SMEM = 1024
# Bytes a plan keeps for its mbarriers (8 B each), padded so that the buffers after them start
# SMEM_ALIGN-aligned.
BARRIER_BYTES = 1024


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


__all__ = ["BARRIER_BYTES", "SMEM_ALIGN", "STATIC_SMEM", "round_up"]
