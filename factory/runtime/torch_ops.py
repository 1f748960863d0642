"""The bundle's ops as torch custom ops: ``torch.ops.kernel_factory.{gemm, gemm_out, gemm_packed,
attention, attention_kvcache, rms_norm, rms_norm_fp8, rope_kvcache}``, for ``torch.compile`` (Dynamo traces them as opaque calls, no graph break) and CUDA
graphs.  ``bundle.torch_ops()`` registers them once per process (``torch.library`` define + impl,
the lower-cost path: see notes) and routes them to that bundle; a later call routes them to
another bundle.  Fake (meta) implementations give the exact output shapes, dtypes and strides and
never touch data.  The real implementations are the bundle's own ops, so every check of
docs/errors.md applies unchanged.
"""

from __future__ import annotations

import torch

from . import fused

NAMESPACE = "kernel_factory"
_LIB = None
_BUNDLE = None  # the bundle the ops run on (set by register)

_SCHEMAS = {
    "gemm": "gemm(Tensor a, Tensor b, ScalarType? out_dtype=None, Tensor? scale_a=None, Tensor? scale_b=None, "
            "bool b_constant=False) -> Tensor",
    "gemm_out": "gemm_out(Tensor a, Tensor b, Tensor(a!) out, Tensor? scale_a=None, Tensor? scale_b=None, "
                "bool b_constant=False) -> ()",
    "gemm_packed": "gemm_packed(Tensor a, Tensor packed, Tensor? scale_a=None, Tensor? scale_b=None, "
                   "bool b_constant=False) -> Tensor",
    "attention": "attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
                 "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int? max_seqlen_q=None) -> (Tensor, Tensor)",
    "attention_kvcache": "attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
                         "Tensor? block_table=None, bool causal=True, float? softmax_scale=None, int window_left=-1, "
                         "int window_right=-1, float softcap=0.0, Tensor? sinks=None, Tensor? k_descale=None, "
                         "Tensor? v_descale=None, Tensor? cu_seqlens_q=None, int? max_seqlen_q=None) "
                         "-> (Tensor, Tensor)",
}


def _gemm(a, b, out_dtype=None, scale_a=None, scale_b=None, b_constant=False):
    return _BUNDLE.gemm(a, b, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b, b_constant=b_constant)


def _gemm_out(a, b, out, scale_a=None, scale_b=None, b_constant=False):
    _BUNDLE.gemm(a, b, out, scale_a=scale_a, scale_b=scale_b, b_constant=b_constant)


def _gemm_packed(a, packed, scale_a=None, scale_b=None, b_constant=False):
    from .packed import PackedB

    return _BUNDLE.gemm(a, PackedB(packed, packed.shape[0] * 8, packed.shape[1] * 64), scale_a=scale_a,
                        scale_b=scale_b, b_constant=b_constant)


def _attention(q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None):
    return _BUNDLE.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, cu_seqlens_q=cu_seqlens_q,
                             cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, return_lse=True)


def _attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, softmax_scale=None,
                       window_left=-1, window_right=-1, softcap=0.0, sinks=None, k_descale=None, v_descale=None,
                       cu_seqlens_q=None, max_seqlen_q=None):
    return _BUNDLE.attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=block_table, causal=causal,
                                     softmax_scale=softmax_scale, window_size=(window_left, window_right),
                                     softcap=softcap, sinks=sinks, k_descale=k_descale, v_descale=v_descale,
                                     return_lse=True, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)


def _gemm_fake(a, b, out_dtype=None, scale_a=None, scale_b=None, b_constant=False):
    dt = out_dtype or (torch.bfloat16 if a.dtype == torch.float8_e4m3fn else a.dtype)
    return a.new_empty((*a.shape[:-1], b.shape[-2]), dtype=dt)


def _gemm_out_fake(a, b, out, scale_a=None, scale_b=None, b_constant=False):
    return None


def _gemm_packed_fake(a, packed, scale_a=None, scale_b=None, b_constant=False):
    return a.new_empty((a.shape[0], packed.shape[0] * 8), dtype=torch.bfloat16)


def _attention_fake(q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    max_seqlen_q=None):
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return torch.empty_like(q), lse  # as the real op: empty_like keeps q's strides


def _attention_kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True,
                            softmax_scale=None, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
                            k_descale=None, v_descale=None, cu_seqlens_q=None, max_seqlen_q=None):
    """Checks as the real op does (shapes, dtypes, strides, switches, the bundle's variants; no
    data is read), then the outputs' shapes."""
    from . import kvcache

    p, _ = kvcache.check(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale,
                         (window_left, window_right), softcap, sinks, k_descale, v_descale, None, cu_seqlens_q,
                         max_seqlen_q, data=False)
    kvcache.choose(_BUNDLE, p)
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return torch.empty_like(q), lse


_IMPLS = {"gemm": (_gemm, _gemm_fake), "gemm_out": (_gemm_out, _gemm_out_fake),
          "gemm_packed": (_gemm_packed, _gemm_packed_fake), "attention": (_attention, _attention_fake),
          "attention_kvcache": (_attention_kvcache, _attention_kvcache_fake)}


def _on_bundle(fn):
    return lambda *args, **kw: fn(_BUNDLE, *args, **kw)


# The fused glue ops (runtime/fused.py TORCH_OPS: name -> (schema, real, fake), each taking the
# bundle first).
for _name, (_schema, _real, _fake) in fused.TORCH_OPS.items():
    _SCHEMAS[_name] = _schema
    _IMPLS[_name] = (_on_bundle(_real), _on_bundle(_fake))


def register(bundle):
    """Route ``torch.ops.kernel_factory.*`` to ``bundle`` (defining the ops on the first call);
    returns ``torch.ops.kernel_factory``."""
    global _LIB, _BUNDLE
    _BUNDLE = bundle
    if _LIB is None:
        lib = torch.library.Library(NAMESPACE, "DEF")
        for name, schema in _SCHEMAS.items():
            real, fake = _IMPLS[name]
            lib.define(schema)
            # Every backend runs the bundle's op, whose checks refuse what it cannot run (a CPU
            # tensor gets the same InputError as through bundle.gemm).
            lib.impl(name, real, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        _LIB = lib
    return getattr(torch.ops, NAMESPACE)
