"""The README's example, on the installed wheels: ``Bundle.default()`` (the kernels package that
serves this GPU), one GEMM written into a NaN-filled output and one causal attention, each checked
against a float32 reference.  ``python examples/quickstart.py`` prints the bundle, the variants
that ran and the errors; exits 1 when a result is off."""

from __future__ import annotations

import json
import sys

import torch

from factory.runtime import Bundle


def main() -> int:
    bundle = Bundle.default()
    torch.manual_seed(0)
    a = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    c = torch.full((256, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    bundle.gemm(a, b, c)
    ref = a.float() @ b.float().T
    q, k, v = (torch.randn(2, 384, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = bundle.attention(q, k, v, causal=True)
    tq, tk, tv = (t.transpose(1, 2).float() for t in (q, k, v))
    ref_o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2)
    torch.cuda.synchronize()
    err = {"gemm": float((c.float() - ref).norm() / ref.norm()), "attention": float((o.float() - ref_o).norm() / ref_o.norm())}
    ok = err["gemm"] < 1e-2 and err["attention"] < 2e-2 and not c.isnan().any() and not o.isnan().any()
    import factory

    print(json.dumps({"factory": factory.__file__, "bundle": str(bundle.path), "errors": err, "ok": ok,
                      "selections": len(bundle.selections)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
