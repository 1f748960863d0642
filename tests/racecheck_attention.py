#!/usr/bin/env python3
"""One sm_90a attention call per head_dim (causal, GQA, a ragged tail), checked against float32:
run under ``compute-sanitizer --tool racecheck`` (issue 14 asks it clean on one variant per head_dim).

    compute-sanitizer --tool racecheck python3 tests/racecheck_attention.py [BUNDLE]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from factory.runtime import Bundle  # noqa: E402
from factory.runtime.attention import _choose  # noqa: E402


def main() -> int:
    b = Bundle.open(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    for d in (64, 128):
        q = torch.randn(1, 200, 4, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 200, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        name = _choose(b, "bf16", d, True, False, 200 * 4, (1, 4, 2, 200, 200))[0]
        o = b.attention(q, k, v, causal=True)
        qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).transpose(1, 2)
        err = float((o.float() - ref).norm() / ref.norm())
        print(f"D{d} {name}: rel err {err:.2e}")
        assert b.manifest["variants"][name]["target"] == "sm_90a" and err < 2e-2, (name, err)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
