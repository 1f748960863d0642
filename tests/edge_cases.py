#!/usr/bin/env python3
"""Valid edge cases through the bundle on a GPU, each checked against torch: zero-size GEMMs
(M, N, K, L = 0), one-row and odd-sized problems, attention with zero queries or keys, and ragged
varlen batches with sequences of length 0 and 1.  Run by tests/test_validation_gpu.py, directly and
under ``compute-sanitizer --tool memcheck`` (which must report no error).

    python3 tests/edge_cases.py [BUNDLE]
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from factory.runtime import Bundle  # noqa: E402


def rel_err(x, ref) -> float:
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30)) if ref.numel() else 0.0


def ref_attention(q, k, v, causal: bool):
    """float32 reference for one sequence (Sq, H, D) / (Sk, Hkv, D), bottom-right causal; rows
    with no visible key give 0 and LSE -inf."""
    sq, hq, d = q.shape
    sk, hkv = k.shape[0], k.shape[1]
    kk = k.float().repeat_interleave(hq // hkv, dim=1)
    vv = v.float().repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), kk) / math.sqrt(d)
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vv), lse


def main() -> int:
    bundle = Bundle.open(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "FACTORY_BUNDLE", ROOT / "artifacts" / "default"))
    dev = "cuda"
    bf = dict(dtype=torch.bfloat16, device=dev)
    fails = []

    def check(what, ok):
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            fails.append(what)

    # GEMM: zero sizes (nothing launched) beside tiny and odd ones (launched).
    for m, n, k in [(0, 64, 64), (64, 0, 64), (64, 64, 0), (0, 0, 0), (1, 8, 8), (17, 24, 40), (1, 4096, 64)]:
        a, b = torch.randn(m, k, **bf), torch.randn(n, k, **bf)
        out = torch.full((m, n), float("nan"), **bf)
        bundle.gemm(a, b, out)
        check(f"gemm {m}x{n}x{k}", not out.isnan().any() and rel_err(out, a.float() @ b.float().T) < 2e-2)
    a, b = torch.randn(0, 8, 64, **bf), torch.randn(0, 16, 64, **bf)
    check("gemm L=0", bundle.gemm(a, b).shape == (0, 8, 16))
    a8, b8 = (torch.randn(s, 0, device=dev).to(torch.float8_e4m3fn) for s in (16, 32))
    sa = torch.tensor([3.0], device=dev)
    check("fp8 gemm K=0", bool((bundle.gemm(a8, b8, scale_a=sa, scale_b=sa) == 0).all()))

    # Attention, dense: zero queries, zero keys, one query, seqlen_q > seqlen_k (causal: empty rows).
    for (bsz, sq, sk, hq, hkv, d, causal) in [(2, 0, 16, 4, 4, 64, False), (2, 5, 0, 4, 2, 128, True),
                                             (1, 1, 37, 8, 2, 64, True), (1, 9, 4, 4, 4, 64, True),
                                             (3, 33, 65, 4, 1, 128, False)]:
        q = torch.randn(bsz, sq, hq, d, **bf)
        k, v = (torch.randn(bsz, sk, hkv, d, **bf) for _ in range(2))
        o, lse = bundle.attention(q, k, v, causal=causal, return_lse=True)
        ok = o.shape == q.shape and lse.shape == (bsz, hq, sq)
        for i in range(bsz):
            ro, rl = ref_attention(q[i], k[i], v[i], causal)
            ok = ok and rel_err(o[i], ro) < 2e-2 and torch.allclose(lse[i], rl, atol=1e-2, rtol=1e-3)
        check(f"attention B{bsz} Sq{sq} Sk{sk} H{hq}/{hkv} D{d} causal={causal}", bool(ok))

    # Varlen: ragged, with empty and one-token sequences, checked mode on.
    for d, causal in [(64, False), (128, True)]:
        for lens_q, lens_k in [([3, 0, 1, 17], [5, 0, 1, 40]), ([1, 1, 1], [1, 2, 3]), ([0, 0], [4, 0])]:
            cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=dev)
            q = torch.randn(sum(lens_q), 4, d, **bf)
            k, v = (torch.randn(sum(lens_k), 2, d, **bf) for _ in range(2))
            o, lse = bundle.attention(q, k, v, causal=causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                      max_seqlen_q=max(lens_q), return_lse=True, check_varlen=True)
            ok = True
            for i in range(len(lens_q)):
                qs, ks = slice(int(cq[i]), int(cq[i + 1])), slice(int(ck[i]), int(ck[i + 1]))
                if lens_q[i] == 0:
                    continue
                if lens_k[i] == 0:
                    ok = ok and bool((o[qs] == 0).all()) and bool(lse[:, qs].isneginf().all())
                    continue
                ro, _ = ref_attention(q[qs], k[ks], v[ks], causal)
                ok = ok and rel_err(o[qs], ro) < 2e-2
            check(f"varlen D{d} causal={causal} q{lens_q} k{lens_k}", ok)
    torch.cuda.synchronize()
    print(f"{len(fails)} failed" if fails else "all edge cases ok")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
