"""The bundle's ops as torch custom ops, for ``torch.compile`` (Dynamo traces them as opaque
calls, no graph break) and CUDA graphs: ``gemm``, ``gemm_out``, ``gemm_packed``, ``attention``,
``attention_kvcache``, ``attention_fp8``, ``grouped_gemm``, ``grouped_gemm_out``, ``gemm_fp8_groups``,
``gemm_fp8_rows``, and the fused glue ops ``rms_norm``, ``rms_norm_fp8``, ``rope_kvcache`` and
``fp8_rows`` (defined in runtime/fused.py, ``TORCH_OPS``).

One op set per bundle: ``bundle.torch_ops()`` registers the ops of that bundle once (``torch.library``
define + impl, the lower-cost path: see notes) in a namespace of its own and returns it: the
first bundle's is ``torch.ops.kernel_factory``, later bundles get ``kernel_factory_2``,
``kernel_factory_3``, ...  Opening a second bundle never changes what the first one's ops run.

Fake (meta) implementations run the real op's data-free checks on the tensors' metadata (types,
dtypes, ranks, shapes, strides, devices, switches) and the bundle's selection where the sizes are
concrete, so a problem the real op refuses raises the same InputError / NoVariantError at trace
time; then they give the exact output shapes, dtypes and strides.  They never read data.  The
real implementations are the bundle's own ops, so every check of docs/errors.md applies unchanged.

An op is an entry of ``OPS``: name -> (schema, real, fake), where ``real`` and ``fake`` take the
bundle as their first argument.
"""

from __future__ import annotations

import functools
import threading

import torch

from . import fused

NAMESPACE = "kernel_factory"
_SETS: dict[int, tuple[object, str, object]] = {}  # id(bundle) -> (bundle, namespace, torch.library.Library)
_LOCK = threading.Lock()


def _gemm(bundle, a, b, out_dtype=None, scale_a=None, scale_b=None, b_constant=False, scale_mode=None):
    return bundle.gemm(a, b, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b, b_constant=b_constant,
                       scale_mode=scale_mode)


def _gemm_out(bundle, a, b, out, scale_a=None, scale_b=None, b_constant=False):
    bundle.gemm(a, b, out, scale_a=scale_a, scale_b=scale_b, b_constant=b_constant)


def _gemm_packed(bundle, a, packed, scale_a=None, scale_b=None, b_constant=False):
    from .packed import PackedB

    return bundle.gemm(a, PackedB(packed, packed.shape[0] * 8, packed.shape[1] * 64), scale_a=scale_a,
                       scale_b=scale_b, b_constant=b_constant)


def _gemm_epilogue(bundle, a, b, bias=None, residual=None, activation=None, out_dtype=None, scale_a=None,
                   scale_b=None, b_constant=False, scale_mode=None):
    from . import epilogue

    return epilogue.gemm_epilogue(bundle, a, b, bias=bias, residual=residual, activation=activation,
                                  out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b, b_constant=b_constant,
                                  scale_mode=scale_mode)


def _gemm_epilogue_fake(bundle, a, b, bias=None, residual=None, activation=None, out_dtype=None, scale_a=None,
                        scale_b=None, b_constant=False, scale_mode=None):
    from . import epilogue

    return epilogue.check_meta(bundle, a, b, bias, residual, activation, out_dtype, scale_a, scale_b, b_constant,
                               scale_mode)


def _gemm_fp8_groups(bundle, a, b, activation=None, scale_a=None, scale_b=None, b_constant=False, scale_mode=None):
    from . import epilogue

    return epilogue.gemm_epilogue(bundle, a, b, activation=activation, out_dtype=torch.float8_e4m3fn,
                                  scale_a=scale_a, scale_b=scale_b, b_constant=b_constant, scale_mode=scale_mode)


def _gemm_fp8_groups_fake(bundle, a, b, activation=None, scale_a=None, scale_b=None, b_constant=False,
                          scale_mode=None):
    from . import epilogue

    return epilogue.check_meta(bundle, a, b, None, None, activation, torch.float8_e4m3fn, scale_a, scale_b,
                               b_constant, scale_mode)


def _gemm_fp8_rows(bundle, a, b, activation=None, scale_a=None, scale_b=None, b_constant=False, scale_mode=None):
    from . import epilogue

    return epilogue.gemm_epilogue(bundle, a, b, activation=activation, out_dtype=torch.float8_e4m3fn,
                                  scale_a=scale_a, scale_b=scale_b, b_constant=b_constant, scale_mode=scale_mode,
                                  row_scales=True)


def _gemm_fp8_rows_fake(bundle, a, b, activation=None, scale_a=None, scale_b=None, b_constant=False,
                        scale_mode=None):
    from . import epilogue

    return epilogue.check_meta(bundle, a, b, None, None, activation, torch.float8_e4m3fn, scale_a, scale_b,
                               b_constant, scale_mode, row_scales=True)


def _attention(bundle, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
               max_seqlen_q=None):
    return bundle.attention(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, None, True)


def _attention_kvcache(bundle, q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, softmax_scale=None,
                       window_left=-1, window_right=-1, softcap=0.0, sinks=None, k_descale=None, v_descale=None,
                       cu_seqlens_q=None, max_seqlen_q=None, q_descale=None):
    return bundle.attention_kvcache(q, k_cache, v_cache, cache_seqlens, block_table=block_table, causal=causal,
                                    softmax_scale=softmax_scale, window_size=(window_left, window_right),
                                    softcap=softcap, sinks=sinks, k_descale=k_descale, v_descale=v_descale,
                                    return_lse=True, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                                    q_descale=q_descale)


def _attention_fp8(bundle, q, k, v, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
                   v_descale=None, v_layout="bshd"):
    return bundle.attention_fp8(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale, True, v_layout)


def _gemm_fake(bundle, a, b, out_dtype=None, scale_a=None, scale_b=None, b_constant=False, scale_mode=None):
    from . import gemm

    return gemm.check_meta(bundle, a, b, None, out_dtype, scale_a, scale_b, b_constant, scale_mode)


def _gemm_out_fake(bundle, a, b, out, scale_a=None, scale_b=None, b_constant=False):
    from . import gemm

    gemm.check_meta(bundle, a, b, out, None, scale_a, scale_b, b_constant)


def _gemm_packed_fake(bundle, a, packed, scale_a=None, scale_b=None, b_constant=False):
    from . import packed as pk

    return pk.check_meta(bundle, a, packed, scale_a, scale_b, b_constant)


def _attention_fake(bundle, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    max_seqlen_q=None):
    from . import attention

    return attention.check_meta(bundle, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q)


def _attention_kvcache_fake(bundle, q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True,
                            softmax_scale=None, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
                            k_descale=None, v_descale=None, cu_seqlens_q=None, max_seqlen_q=None, q_descale=None):
    """Checks as the real op does (shapes, dtypes, strides, switches, the bundle's variants; no
    data is read), then the outputs' shapes (o bfloat16 for float8_e4m3fn q)."""
    from . import kvcache

    p, _ = kvcache.check(q, k_cache, v_cache, cache_seqlens, block_table, causal, softmax_scale,
                         (window_left, window_right), softcap, sinks, k_descale, v_descale, None, cu_seqlens_q,
                         max_seqlen_q, data=False, q_descale=q_descale)
    kvcache.choose(bundle, p)
    if cu_seqlens_q is not None:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    return torch.empty_like(q, dtype=torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype), lse


def _attention_fp8_fake(bundle, q, k, v, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
                        v_descale=None, v_layout="bshd"):
    from . import attention_fp8

    return attention_fp8.check_meta(bundle, q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                                    v_layout)


def _grouped_gemm(bundle, a, b, offs=None, masked_m=None, expected_m=None, scale_a=None, scale_b=None):
    return bundle.grouped_gemm(a, b, offs, masked_m, expected_m=expected_m, scale_a=scale_a, scale_b=scale_b)


def _grouped_gemm_out(bundle, a, b, out, offs=None, masked_m=None, expected_m=None, scale_a=None, scale_b=None):
    bundle.grouped_gemm(a, b, offs, masked_m, out, expected_m=expected_m, scale_a=scale_a, scale_b=scale_b)


def _grouped_gemm_fake(bundle, a, b, offs=None, masked_m=None, expected_m=None, scale_a=None, scale_b=None):
    """Checks as the real op does (shapes, dtypes, layouts, the routing tensor, the fp8 scales'
    form and layout; the bundle's variants where the sizes are concrete; no data is read), then
    the output."""
    from . import grouped

    want = grouped.check_plan(bundle, a, b, offs, masked_m, None, expected_m, scale_a, scale_b)
    return a.new_empty(want, dtype=grouped.out_dtype(a))


def _grouped_gemm_out_fake(bundle, a, b, out, offs=None, masked_m=None, expected_m=None, scale_a=None, scale_b=None):
    from . import grouped

    grouped.check_plan(bundle, a, b, offs, masked_m, out, expected_m, scale_a, scale_b)


OPS = {
    "gemm": ("gemm(Tensor a, Tensor b, ScalarType? out_dtype=None, Tensor? scale_a=None, Tensor? scale_b=None, "
             "bool b_constant=False, str? scale_mode=None) -> Tensor", _gemm, _gemm_fake),
    "gemm_out": ("gemm_out(Tensor a, Tensor b, Tensor(a!) out, Tensor? scale_a=None, Tensor? scale_b=None, "
                 "bool b_constant=False) -> ()", _gemm_out, _gemm_out_fake),
    "gemm_epilogue": ("gemm_epilogue(Tensor a, Tensor b, Tensor? bias=None, Tensor? residual=None, "
                      "str? activation=None, ScalarType? out_dtype=None, Tensor? scale_a=None, Tensor? scale_b=None, "
                      "bool b_constant=False, str? scale_mode=None) -> Tensor", _gemm_epilogue, _gemm_epilogue_fake),
    "gemm_fp8_groups": ("gemm_fp8_groups(Tensor a, Tensor b, str? activation=None, Tensor? scale_a=None, "
                        "Tensor? scale_b=None, bool b_constant=False, str? scale_mode=None) -> (Tensor, Tensor)",
                        _gemm_fp8_groups, _gemm_fp8_groups_fake),
    "gemm_fp8_rows": ("gemm_fp8_rows(Tensor a, Tensor b, str? activation=None, Tensor? scale_a=None, "
                      "Tensor? scale_b=None, bool b_constant=False, str? scale_mode=None) -> (Tensor, Tensor)",
                      _gemm_fp8_rows, _gemm_fp8_rows_fake),
    "gemm_packed": ("gemm_packed(Tensor a, Tensor packed, Tensor? scale_a=None, Tensor? scale_b=None, "
                    "bool b_constant=False) -> Tensor", _gemm_packed, _gemm_packed_fake),
    "attention": ("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
                  "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, int? max_seqlen_q=None) -> (Tensor, Tensor)",
                  _attention, _attention_fake),
    "attention_kvcache": ("attention_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
                          "Tensor? block_table=None, bool causal=True, float? softmax_scale=None, int window_left=-1, "
                          "int window_right=-1, float softcap=0.0, Tensor? sinks=None, Tensor? k_descale=None, "
                          "Tensor? v_descale=None, Tensor? cu_seqlens_q=None, int? max_seqlen_q=None, "
                          "Tensor? q_descale=None) -> (Tensor, Tensor)", _attention_kvcache, _attention_kvcache_fake),
    "attention_fp8": ("attention_fp8(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
                      "Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, str v_layout='bshd') "
                      "-> (Tensor, Tensor)", _attention_fp8, _attention_fp8_fake),


    "grouped_gemm": ("grouped_gemm(Tensor a, Tensor b, Tensor? offs=None, Tensor? masked_m=None, "
                     "int? expected_m=None, Tensor? scale_a=None, Tensor? scale_b=None) -> Tensor", _grouped_gemm,
                     _grouped_gemm_fake),
    "grouped_gemm_out": ("grouped_gemm_out(Tensor a, Tensor b, Tensor(a!) out, Tensor? offs=None, "
                         "Tensor? masked_m=None, int? expected_m=None, Tensor? scale_a=None, "
                         "Tensor? scale_b=None) -> ()", _grouped_gemm_out, _grouped_gemm_out_fake),
}
OPS.update(fused.TORCH_OPS)


def namespace(bundle) -> str | None:
    """The namespace of ``bundle``'s op set, or None before ``register(bundle)``."""
    got = _SETS.get(id(bundle))
    return got[1] if got is not None and got[0] is bundle else None


def register(bundle):
    """``bundle``'s op set (defined on the first call for this bundle): ``torch.ops.<namespace>``,
    every op running on ``bundle`` alone.  The set keeps the bundle alive (the ops are registered
    for the life of the process)."""
    got = _SETS.get(id(bundle))
    if got is not None and got[0] is bundle:
        return getattr(torch.ops, got[1])
    with _LOCK:
        got = _SETS.get(id(bundle))
        if got is not None and got[0] is bundle:
            return getattr(torch.ops, got[1])
        ns = NAMESPACE if not _SETS else f"{NAMESPACE}_{len(_SETS) + 1}"
        lib = torch.library.Library(ns, "DEF")
        for name, (schema, real, fake) in OPS.items():
            lib.define(schema)
            # Every backend runs the bundle's op, whose checks refuse what it cannot run (a CPU
            # tensor gets the same InputError as through bundle.gemm).
            lib.impl(name, functools.partial(real, bundle), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{ns}::{name}", functools.partial(fake, bundle), lib=lib)
        _SETS[id(bundle)] = (bundle, ns, lib)
    return getattr(torch.ops, ns)
