#!/usr/bin/env python3
"""sm_90a attention per head_dim (the loader's choice for a small causal GQA problem with a ragged
tail; the preferred, persistent tiles on more tiles than resident CTAs; packed causal sequences
through the loader), checked against float32:
run under ``compute-sanitizer --tool racecheck``, which must report no hazard on one variant per head_dim.

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
from factory.runtime.attention import _choose, dense_workspace  # noqa: E402


def _check(b, name, q, k, v, causal=True) -> None:
    """Launch ``name`` by name on (q, k, v) (a dynamic variant with its tile counters) and compare
    with float32 SDPA (bottom-right causal with Sq == Sk is SDPA's top-left)."""
    B, S, H, d = q.shape
    o = torch.full_like(q, float("nan"))
    lse = torch.empty(B, H, S, device="cuda")
    b.launch(name, [q, k, v, o, lse, *dense_workspace(torch, b.manifest["variants"][name], q), d ** -0.5])
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=True).transpose(1, 2)
    err = float((o.float() - ref).norm() / ref.norm())
    print(f"D{d} B{B} H{H}/{k.shape[2]} S{S} {name}: rel err {err:.2e}", flush=True)
    assert b.manifest["variants"][name]["target"] == "sm_90a" and err < 2e-2, (name, err)


def main() -> int:
    b = Bundle.open(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    for d in (64, 128, 256):
        # The loader's choice for a small causal GQA problem with a ragged tail (64-row tiles).
        q = torch.randn(1, 200, 4, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 200, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        _check(b, _choose(b, "bf16", d, True, False, 200 * 4, (1, 4, 2, 200, 200))[0], q, k, v)
        # The preferred (persistent at D64/D128) tiles, causal and not, on more tiles than the
        # 132 resident CTAs: each CTA runs several (the next tile's Q loads under this epilogue).
        for causal in (True, False):
            pref = [n for n, e in b.manifest["variants"].items()
                    if e["op"] == "attention" and e.get("family") == "sm90" and e["head_dim"] == d and e["dtype"] == "bf16"
                    and bool(e["causal"]) == causal and not e["varlen"] and e.get("preferred")]
            q = torch.randn(1, 512, 48, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(1, 512, 8, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            # and the loader's choice there (causal: the short-rows builds, 128 rows at head_dim 64,
            # one tile per CTA at head_dim 256)
            chosen = _choose(b, "bf16", d, causal, False, 512 * 48, (1, 48, 8, 512, 512))[0]
            for name in pref + [n for n in (chosen,) if n not in pref]:
                _check(b, name, q, k, v, causal)
        # Packed causal sequences through the loader (varlen; its dynamic twin where built: the
        # producer passes over the virtual grid's empty slots), each sequence against float32.
        lens = [700, 1, 0, 333, 1200]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        q = torch.randn(sum(lens), 8, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(sum(lens), 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o = b.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens))
        name = _choose(b, "bf16", d, True, True)[0]
        for a, n in zip(cu.tolist(), lens):
            if n:
                qs, ks, vs = (x[None, a:a + n].transpose(1, 2).float() for x in (q, k, v))
                ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True,
                                                                       enable_gqa=True).transpose(1, 2)[0]
                err = float((o[a:a + n].float() - ref).norm() / ref.norm())
                assert err < 2e-2, (name, a, n, err)
        print(f"D{d} varlen {lens} H8/2 {name}: per-sequence rel err < 2e-2", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
