"""The fp8 attention kernel's shared-memory layouts as the DSL builds them (test helper; needs
nvidia-cutlass-dsl): the staged layouts' swizzles, cosizes and (outer) offsets at chosen
coordinates, taken while a @cute.jit function traces (static layouts give Python integers)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.tensor_utils import LayoutEnum

from factory.attention.sm90 import WG_ROWS

STAGING_COORDS = ((0, 0), (5, 200), (127, 255), (9, 129))
V_COORDS = ((0, 0), (200, 5), (255, 127), (9, 100))


@cute.jit
def _trace(out: cutlass.Constexpr, d: cutlass.Constexpr, bn: cutlass.Constexpr, stages: cutlass.Constexpr):
    f8 = cutlass.Float8E4M3FN
    # as FlashFwdSm90._launch: the staging ring in K's layout, V K-major, O's bf16 slabs
    s = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (WG_ROWS, bn, d), f8, stages)
    v = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, (WG_ROWS, d, bn), f8, stages)
    o = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, (WG_ROWS, bn, d), cutlass.BFloat16, 2)
    for name, lay, coords in (("staging", s, STAGING_COORDS), ("v", v, V_COORDS), ("o", o, ())):
        out[name] = {"swizzle": str(lay.inner), "cosize": cute.cosize(lay),
                     "at": {c: cute.crd2idx((c[0], c[1], 1), lay.outer) for c in coords}}


def fp8_d256_layouts(d: int = 256, bn: int = 128, stages: int = 2):
    """(staging, v, o): dicts of swizzle (str), cosize (elements) and offset(row, col, stage)
    for the coordinates above (stage 1)."""
    out: dict = {}
    _trace(out, d, bn, stages)
    res = []
    for name in ("staging", "v", "o"):
        e = out[name]
        at = {k: int(x) for k, x in e["at"].items()}
        res.append({"swizzle": e["swizzle"], "cosize": int(e["cosize"]),
                    "offset": lambda r, c, st, at=at: at[(r, c)] if st == 1 else None})
    return tuple(res)
