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


# --- attention over a KV cache (paged or dense), FlashAttention's flash_attn_with_kvcache -------
# One signature for every kvcache variant (decode and prefill families); a variant whose
# compile-time switch is off ignores the matching argument, and the runtime passes a cached
# 1-element dummy where the caller gave none:
#   q             (B, Sq, Hq, D)   dtype (bf16/f16)        [varlen q: (Tq, Hq, D)]
#   k_cache       (P, PS, Hkv, D)  kv_dtype (dtype or e4m3) paged: P pages of PS rows (PS fixed at
#   v_cache       (P, PS, Hkv, D)  kv_dtype                 compile time); dense: P = B, PS = Sk
#   o             (B, Sq, Hq, D)   dtype                    [varlen q: (Tq, Hq, D)]
#   lse           (B, Hq, Sq)      f32                      [varlen q: (Hq, Tq)]
#   [o_partial (splits, B, Hq, Sq, D) f32, lse_partial (splits, B, Hq, Sq) f32]  workspace splits only
#   [counters (B, Hq, Sq) i32: the in-kernel merge's arrival counters, zero at launch and left zero]
#   block_table   (B, MP)          i32  page indices of each sequence (dense: a (B, 1) dummy)
#   cache_seqlens (B,)             i32  each sequence's key count (read on the device only)
#   [cu_seqlens_q (B+1,) i32: varlen q only]
#   sinks         (Hq,)            f32  learned sink logits (a variant without sinks ignores it)
#   kv_descale    (2, Hkv)         f32  bf16/f16 caches: unread (a unit stand-in)
#   [e4m3 caches instead: k_descale (Hkv,) f32 and v_descale (Hkv,) f32, each with its own stride:
#    the caller's tensors as given, per kv head (stride 1) or per tensor (stride 0)]
#   softmax_scale f32, softcap f32 (0: off), window_left i32, window_right i32 (-1: unbounded)
#   [max_seqlen_q i32: varlen q only]
# Causal is bottom-right: query s of Sq sees keys j <= s + L - Sq, L = cache_seqlens[b]; with a
# window also j >= s + L - Sq - window_left and j <= s + L - Sq + window_right.
KV_DTYPES = ("bf16", "f16", "e4m3")
PAGE_SIZES = (1, 8, 16, 32, 64, 128, 256)


def signature_kvcache(dtype: str, kv_dtype: str, head_dim: int, paged: bool, page_size: int | None = None,
                      splits: int = 1, varlen_q: bool = False, counters: bool = False) -> Signature:
    """The kernel arguments of an attention-over-KV-cache variant (see the table above).
    ``splits`` > 1: the variant merges its key splits through the fp32 workspace (dense q only);
    ``counters``: the last split to arrive merges them (one int32 arrival counter per CTA group,
    zero at launch; the kernel leaves it zero)."""
    d, dt, kt = head_dim, dtype, kv_dtype
    if paged and page_size is not None and page_size not in PAGE_SIZES:
        raise ValueError(f"page_size {page_size} not one of {PAGE_SIZES}")
    # A paged variant fixes its page size at compile time, or (page_size None) takes it at launch
    # as the symbol PS (a kernel that handles several page sizes: manifest "page_sizes").
    ps: Any = ("PS" if page_size is None else page_size) if paged else "Sk"
    pages = "P" if paged else "B"
    if varlen_q:
        q_shape, q_stride = ("Tq", "Hq", d), ("sQt", "sQh", 1)
        o_shape, o_stride = ("Tq", "Hq", d), ("sOt", "sOh", 1)
        lse = TensorArg("lse", "f32", ("Hq", "Tq"), ("sLh", 1), align=4)
        q_strided = ("sQt", "sQh", "sOt", "sOh")
    else:
        q_shape, q_stride = ("B", "Sq", "Hq", d), ("sQb", "sQs", "sQh", 1)
        o_shape, o_stride = ("B", "Sq", "Hq", d), ("sOb", "sOs", "sOh", 1)
        lse = TensorArg("lse", "f32", ("B", "Hq", "Sq"), ("sLb", "sLh", 1), align=4)
        q_strided = ("sQb", "sQs", "sQh", "sOb", "sOs", "sOh")
    args = [
        TensorArg("q", dt, q_shape, q_stride),
        TensorArg("k_cache", kt, (pages, ps, "Hkv", d), ("sKp", "sKs", "sKh", 1)),
        TensorArg("v_cache", kt, (pages, ps, "Hkv", d), ("sVp", "sVs", "sVh", 1)),
        TensorArg("o", dt, o_shape, o_stride),
        lse,
    ]
    if splits > 1 and not varlen_q:
        args += [
            # (the last-arrival merge reads its rows in 16-byte vectors: 16-byte aligned rows)
            TensorArg("o_partial", "f32", (splits, "B", "Hq", "Sq", d), ("sWs", "sWb", "sWh", "sWq", 1),
                      align=16 if counters else 4),
            TensorArg("lse_partial", "f32", (splits, "B", "Hq", "Sq"), ("sPs", "sPb", "sPh", 1), align=4),
        ]
        if counters:
            args.append(TensorArg("counters", "i32", ("B", "Hq", "Sq"), ("sCb", "sCh", 1), align=4))
    args += [
        TensorArg("block_table", "i32", ("B", "MP"), ("sTb", 1), align=4),
        TensorArg("cache_seqlens", "i32", ("B",), (1,), align=4),
    ]
    if varlen_q:
        args.append(TensorArg("cu_seqlens_q", "i32", ("B1",), (1,), align=4))
    args.append(TensorArg("sinks", "f32", ("Hq",), (1,), align=4))
    if kt == "e4m3":
        args += [
            TensorArg("k_descale", "f32", ("Hkv",), ("sKD",), align=4),
            TensorArg("v_descale", "f32", ("Hkv",), ("sVD",), align=4),
        ]
    else:
        args.append(TensorArg("kv_descale", "f32", (2, "Hkv"), ("sDk", 1), align=4))
    args += [
        ScalarArg("softmax_scale", "f32"),
        ScalarArg("softcap", "f32"),
        ScalarArg("window_left", "i32"),
        ScalarArg("window_right", "i32"),
    ]
    if varlen_q:
        args.append(ScalarArg("max_seqlen_q", "i32"))
    qvec, kvec = 16 // DTYPE_BYTES[dt], 16 // DTYPE_BYTES[kt]
    div = {s: qvec for s in q_strided}
    div.update({s: kvec for s in ("sKp", "sKs", "sKh", "sVp", "sVs", "sVh")})
    if counters and splits > 1 and not varlen_q:
        div.update({s: 4 for s in ("sWs", "sWb", "sWh", "sWq")})
    return Signature(tuple(args), tuple(sorted(div.items())))


def manifest_fields_kvcache(dtype: str, kv_dtype: str, head_dim: int, *, paged: bool, page_size: int | None,
                            causal: bool, local: bool, softcap: bool, sinks: bool,
                            varlen_q: bool = False) -> dict[str, Any]:
    """The manifest fields every kvcache variant has (its family adds tile, splits, ...); the
    runtime's selection (runtime/kvcache.py) filters on these."""
    return {
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "dtypes": {"q": dtype, "k_cache": kv_dtype, "v_cache": kv_dtype, "o": dtype, "lse": "f32", "acc": "f32"},
        "head_dim": head_dim,
        "paged": paged,
        "page_size": page_size if paged else None,
        "causal": causal,
        "local": local,
        "softcap": softcap,
        "sinks": sinks,
        "varlen": varlen_q,
        "constraints": {
            "head_dim_contiguous": True,
            "stride_divisibility_elems": {"q": 16 // DTYPE_BYTES[dtype], "kv": 16 // DTYPE_BYTES[kv_dtype]},
            "data_align_bytes": 16,
            "gqa": "Hq % Hkv == 0",
            "causal_alignment": "bottom-right",
            "block_table": "int32 (B, max_pages), page indices < num_pages (caller's contract)",
            "cache_seqlens": "int32 (B,), <= max_pages * page_size (caller's contract)",
        },
    }


# --- fp8 (e4m3) forward (attention/sm90_fp8.py) -----------------------------------------------
#   q (B,Sq,Hq,D) e4m3, k (B,Sk,Hkv,D) e4m3, v (B,Sk,Hkv,D) e4m3 (v_layout "bshd") or (B,Hkv,D,Sk)
#   ("bhds": pre-transposed, keys contiguous),
#   o (B,Sq,Hq,D) bf16, lse (B,Hq,Sq) f32, q_descale / k_descale / v_descale (B,Hkv) f32 with any
#   strides (a per-tensor factor is a zero-stride view), softmax_scale
def signature_fp8(head_dim: int, v_layout: str = "bhds", varlen: bool = False) -> Signature:
    """v_layout "bhds": v (B, Hkv, D, Sk); "bshd": v (B, Sk, Hkv, D) like k (the kernel transposes).
    ``varlen``: q/o (Tq, Hq, D), k/v (Tk, Hkv, D), lse (Hq, Tq), cu_seqlens_q/k (B+1,) int32 after
    lse, max_seqlen_q last; descales (B, Hkv) with B the sequence count."""
    d = head_dim
    if varlen:
        args = [
            TensorArg("q", "e4m3", ("Tq", "Hq", d), ("sQt", "sQh", 1)),
            TensorArg("k", "e4m3", ("Tk", "Hkv", d), ("sKt", "sKh", 1)),
            TensorArg("v", "e4m3", ("Tk", "Hkv", d), ("sVt", "sVh", 1)),
            TensorArg("o", "bf16", ("Tq", "Hq", d), ("sOt", "sOh", 1)),
            TensorArg("lse", "f32", ("Hq", "Tq"), ("sLh", 1), align=4),
            TensorArg("cu_seqlens_q", "i32", ("B1",), (1,), align=4),
            TensorArg("cu_seqlens_k", "i32", ("B1",), (1,), align=4),
            TensorArg("q_descale", "f32", ("B", "Hkv"), ("sQDb", "sQDh"), align=4),
            TensorArg("k_descale", "f32", ("B", "Hkv"), ("sKDb", "sKDh"), align=4),
            TensorArg("v_descale", "f32", ("B", "Hkv"), ("sVDb", "sVDh"), align=4),
            ScalarArg("softmax_scale", "f32"),
            ScalarArg("max_seqlen_q", "i32"),
        ]
        div = {s: 16 for s in ("sQt", "sQh", "sKt", "sKh", "sVt", "sVh")}
        div.update({s: 8 for s in ("sOt", "sOh")})
        return Signature(tuple(args), tuple(sorted(div.items())))
    v = (TensorArg("v", "e4m3", ("B", "Hkv", d, "Sk"), ("sVb", "sVh", "sVd", 1)) if v_layout == "bhds"
         else TensorArg("v", "e4m3", ("B", "Sk", "Hkv", d), ("sVb", "sVs", "sVh", 1)))
    args = [
        TensorArg("q", "e4m3", ("B", "Sq", "Hq", d), ("sQb", "sQs", "sQh", 1)),
        TensorArg("k", "e4m3", ("B", "Sk", "Hkv", d), ("sKb", "sKs", "sKh", 1)),
        v,
        TensorArg("o", "bf16", ("B", "Sq", "Hq", d), ("sOb", "sOs", "sOh", 1)),
        TensorArg("lse", "f32", ("B", "Hq", "Sq"), ("sLb", "sLh", 1), align=4),
        TensorArg("q_descale", "f32", ("B", "Hkv"), ("sQDb", "sQDh"), align=4),
        TensorArg("k_descale", "f32", ("B", "Hkv"), ("sKDb", "sKDh"), align=4),
        TensorArg("v_descale", "f32", ("B", "Hkv"), ("sVDb", "sVDh"), align=4),
        ScalarArg("softmax_scale", "f32"),
    ]
    div = {s: 16 for s in ("sQb", "sQs", "sQh", "sKb", "sKs", "sKh", *(x for x in v.stride if isinstance(x, str)))}
    div.update({s: 8 for s in ("sOb", "sOs", "sOh")})
    return Signature(tuple(args), tuple(sorted(div.items())))


def manifest_fields_fp8(head_dim: int, causal: bool, v_layout: str, varlen: bool = False) -> dict[str, Any]:
    """The manifest fields of an fp8 forward variant (runtime/attention_fp8.py selects on them)."""
    return {
        "dtype": "e4m3",
        "dtypes": {"q": "e4m3", "k": "e4m3", "v": "e4m3", "o": "bf16", "lse": "f32", "acc": "f32",
                   "descale": "f32"},
        "head_dim": head_dim,
        "causal": causal,
        "varlen": varlen,
        "v_layout": v_layout,
        "constraints": {
            "head_dim_contiguous": True,
            "stride_divisibility_elems": 16,
            "data_align_bytes": 16,
            "gqa": "Hq % Hkv == 0",
            "causal_alignment": "bottom-right",
            "softmax_scale": "> 0",
            "v": "(B, Hkv, D, Sk), Sk contiguous" if v_layout == "bhds" else "(B, Sk, Hkv, D), D contiguous",
            "descale": "float32 (B, Hkv), any strides",
            "lse": "float32, (Hq, Tq)" if varlen else "float32, (B, Hq, Sq) compact",
            "grid_yz_max": 65535,
        },
    }
