"""The calling convention every attention family (sm80, sm90, sm100) compiles to: the arguments
the loader (runtime/attention.py) packs, in order, and the manifest fields it selects on.  One
definition, so the families cannot drift apart.  Standard library and ``factory.abi`` only.

  dense:  q (B,Sq,Hq,D), k/v (B,Sk,Hkv,D), o (B,Sq,Hq,D), lse (B,Hq,Sq) f32,
          [o_partial (splits,B,Hq,Sq,D), lse_partial (splits,B,Hq,Sq) f32: split-KV only], scale
  varlen: q (Tq,Hq,D), k/v (Tk,Hkv,D), o (Tq,Hq,D), lse (Hq,Tq) f32, cu_seqlens_q, cu_seqlens_k
          (B+1,) i32, scale, max_seqlen_q
head_dim contiguous; every other stride a multiple of 16 bytes; 16-byte aligned data.
"""

from __future__ import annotations

from typing import Any

from ..abi import DTYPE_BYTES, ScalarArg, Signature, TensorArg


def signature(dtype: str, head_dim: int, varlen: bool = False, splits: int = 1) -> Signature:
    d, dt = head_dim, dtype
    if varlen:
        args = [
            TensorArg("q", dt, ("Tq", "Hq", d), ("sQt", "sQh", 1)),
            TensorArg("k", dt, ("Tk", "Hkv", d), ("sKt", "sKh", 1)),
            TensorArg("v", dt, ("Tk", "Hkv", d), ("sVt", "sVh", 1)),
            TensorArg("o", dt, ("Tq", "Hq", d), ("sOt", "sOh", 1)),
            TensorArg("lse", "f32", ("Hq", "Tq"), ("sLh", 1), align=4),
            TensorArg("cu_seqlens_q", "i32", ("B1",), (1,), align=4),
            TensorArg("cu_seqlens_k", "i32", ("B1",), (1,), align=4),
            ScalarArg("softmax_scale", "f32"),
            ScalarArg("max_seqlen_q", "i32"),
        ]
        strided = ("sQt", "sQh", "sKt", "sKh", "sVt", "sVh", "sOt", "sOh")
    else:
        args = [
            TensorArg("q", dt, ("B", "Sq", "Hq", d), ("sQb", "sQs", "sQh", 1)),
            TensorArg("k", dt, ("B", "Sk", "Hkv", d), ("sKb", "sKs", "sKh", 1)),
            TensorArg("v", dt, ("B", "Sk", "Hkv", d), ("sVb", "sVs", "sVh", 1)),
            TensorArg("o", dt, ("B", "Sq", "Hq", d), ("sOb", "sOs", "sOh", 1)),
            TensorArg("lse", "f32", ("B", "Hq", "Sq"), ("sLb", "sLh", 1), align=4),
            ScalarArg("softmax_scale", "f32"),
        ]
        strided = ("sQb", "sQs", "sQh", "sKb", "sKs", "sKh", "sVb", "sVs", "sVh", "sOb", "sOs", "sOh")
        if splits > 1:
            # The fp32 workspace (the runtime carves both from one torch.empty): per split, O
            # normalised by its own row sum, and that split's LSE (-inf: no key in range).
            args[5:5] = [
                TensorArg("o_partial", "f32", (splits, "B", "Hq", "Sq", d),
                          ("sWs", "sWb", "sWh", "sWq", 1), align=4),
                TensorArg("lse_partial", "f32", (splits, "B", "Hq", "Sq"), ("sPs", "sPb", "sPh", 1), align=4),
            ]
    vec = 16 // DTYPE_BYTES[dt]
    return Signature(tuple(args), tuple(sorted((s, vec) for s in strided)))


def manifest_fields(dtype: str, head_dim: int, causal: bool, varlen: bool) -> dict[str, Any]:
    """The manifest fields every attention variant has (its family adds tile, stages, ...)."""
    return {
        "dtype": dtype,
        "dtypes": {"q": dtype, "k": dtype, "v": dtype, "o": dtype, "lse": "f32", "acc": "f32"},
        "head_dim": head_dim,
        "causal": causal,
        "varlen": varlen,
        "constraints": {
            "head_dim_contiguous": True,
            "stride_divisibility_elems": 16 // DTYPE_BYTES[dtype],
            "data_align_bytes": 16,
            "gqa": "Hq % Hkv == 0",
            "causal_alignment": "bottom-right",
            "softmax_scale": "> 0",
            "lse": "float32, (Hq, Tq)" if varlen else "float32, (B, Hq, Sq) compact",
            "grid_yz_max": 65535,
        },
    }
