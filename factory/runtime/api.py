"""``Bundle``: the user's entry points (``gemm``, ``pack_b``, ``attention``) on top of
``BundleCore`` (runtime/bundle.py).  The op modules are imported on first use, so that opening a
bundle (and ``python -m factory list``) does not import torch."""

from __future__ import annotations

from .bundle import BundleCore
from .errors import InputError


_OPS = None  # (gemm, packed, attention, blockscaled) modules and torch.compiler.is_compiling, bound on first use


def _ops():
    global _OPS
    if _OPS is None:
        import torch

        from . import attention, blockscaled, gemm, packed

        _OPS = (gemm, packed, attention, blockscaled, torch.compiler.is_compiling,
                getattr(torch, "float8_e4m3fn", None))
    return _OPS


_EPILOGUE = None  # runtime/epilogue.py, bound on first use


def _epilogue():
    global _EPILOGUE
    from . import epilogue

    _EPILOGUE = epilogue
    return epilogue


class Bundle(BundleCore):
    @classmethod
    def default(cls, capability: tuple[int, int] | None = None, device: dict | None = None):
        """The installed bundle for this GPU (or ``capability``): ``$KERNEL_FACTORY_BUNDLE`` when
        set, else the installed kernels package (``pip install kernel-factory-kernels-sm90``, ...)
        whose targets serve it best (runtime/installed.py); BundleError naming the package to
        install when none does.  Then as ``Bundle.open``."""
        from .installed import default_path

        return cls.open(default_path(None if capability is None else tuple(capability)), capability, device)

    def gemm(self, a, b, out=None, *, out_dtype=None, scale_a=None, scale_b=None, variant: str | None = None,
             b_constant: bool = False, scale_mode: str | None = None, bias=None, residual=None, activation=None,
             scale_out=None, row_scales=False):
        """``out = a @ b.T`` (runtime/gemm.py; ``b`` packed by ``pack_b``: runtime/packed.py).
        ``b_constant=True`` promises that no kernel that may still be running in the stream writes
        ``b`` (model weights): decode variants launched with programmatic dependent launch then
        start streaming ``b`` before the previous kernel has finished.  fp8 scales: one per tensor,
        per row of a and b, or per 1x128 / 128x128 block, told apart by their shapes (or
        ``scale_mode``); runtime/fp8.py gives the layouts and the quantizers that write them.
        ``out_dtype=torch.float8_e4m3fn``: the output quantised per row and 128 columns, returned
        as ``(out, scale_out)``; with ``row_scales=True`` one scale per row instead, ``(out, scale)``
        with ``scale`` float32 (M, 1) (``torch._scaled_mm``'s row-wise form; runtime/epilogue.py)."""
        gemm, packed, _, bs, compiling, e4m3 = _OPS or _ops()
        # An e4m3 output (with its group scales) is an epilogue form.
        quant = e4m3 is not None and (out_dtype is e4m3 or (out is not None and getattr(out, "dtype", None) is e4m3))
        if (bias is not None or residual is not None or activation is not None or quant or scale_out is not None
                or row_scales):
            # fused epilogue: out = act(a·bᵀ + bias) + residual (runtime/epilogue.py)
            epilogue = _EPILOGUE or _epilogue()
            if compiling():
                if out is not None or scale_out is not None:
                    raise InputError("under torch.compile a fused-epilogue gemm returns a new tensor: no out= or scale_out=")
                if quant and row_scales is True:
                    return self.torch_ops().gemm_fp8_rows(a, b, activation, scale_a, scale_b, b_constant, scale_mode)
                if quant:
                    return self.torch_ops().gemm_fp8_groups(a, b, activation, scale_a, scale_b, b_constant, scale_mode)
                return self.torch_ops().gemm_epilogue(a, b, bias, residual, activation, out_dtype, scale_a, scale_b,
                                                      b_constant, scale_mode)
            if isinstance(b, (bs.BlockScaled, packed.PackedB)) or isinstance(a, bs.BlockScaled):
                raise InputError("bias, residual and activation apply to plain (unpacked) operands only")
            return epilogue.gemm_epilogue(self, a, b, out, bias=bias, residual=residual, activation=activation,
                                          out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b, variant=variant,
                                          b_constant=b_constant, scale_mode=scale_mode, scale_out=scale_out,
                                          row_scales=row_scales)
        if compiling():  # traced by torch.compile: the bundle's torch op, whose fake checks like this call
            return self.traced_gemm(a, b, out, out_dtype, scale_a, scale_b, variant, b_constant, scale_mode)
        if isinstance(a, bs.BlockScaled) or isinstance(b, bs.BlockScaled):
            if scale_a is not None or scale_b is not None or b_constant or scale_mode is not None:
                raise InputError("block-scaled operands carry their own scales: scale_a, scale_b, scale_mode and "
                                    "b_constant do not apply")
            return bs.gemm_blockscaled(self, a, b, out, out_dtype=out_dtype, variant=variant)
        if isinstance(b, packed.PackedB):
            if scale_mode not in (None, "tensor"):
                raise InputError("packed weights take per-tensor fp8 scales only")
            return packed.gemm_packed(self, a, b, out, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b,
                                      variant=variant, b_constant=b_constant)
        return gemm.gemm(self, a, b, out, out_dtype=out_dtype, scale_a=scale_a, scale_b=scale_b,
                         variant=variant, b_constant=b_constant, scale_mode=scale_mode)

    def traced_gemm(self, a, b, out, out_dtype, scale_a, scale_b, variant, b_constant, scale_mode=None):
        """``gemm`` while torch.compile traces it: through this bundle's torch ops."""
        packed = (_OPS or _ops())[1]
        if variant is not None:
            raise InputError("variant= is not available under torch.compile: let the selection choose")
        ops = self.torch_ops()
        if isinstance(b, packed.PackedB) or out is not None:
            if scale_mode is not None:
                raise InputError("scale_mode= under torch.compile is taken by gemm without out= or packed "
                                 "weights: the scale shapes tell the form")
        if isinstance(b, packed.PackedB):
            import torch

            if out is not None or out_dtype not in (None, torch.bfloat16):
                raise InputError("gemm with packed weights under torch.compile returns a new bfloat16 output "
                                 "(out= and out_dtype= are not available there)")
            return ops.gemm_packed(a, b.data, scale_a, scale_b, b_constant)
        if out is not None:
            if out_dtype is not None and out_dtype != out.dtype:
                raise InputError(f"out_dtype {out_dtype} differs from out's dtype {out.dtype}: give one of them")
            ops.gemm_out(a, b, out, scale_a, scale_b, b_constant)
            return out
        return ops.gemm(a, b, out_dtype, scale_a, scale_b, b_constant, scale_mode)

    def preload(self, ops=("gemm", "gemm_blockscaled", "attention")) -> int:
        """Load every variant of ``ops`` that this device runs (``BundleCore.preload``; the modules
        load on every visible device), then ask the driver, for the current device, how many
        clusters of each persistent GEMM variant it holds at once (the grid cap; a question that
        is not asked inside a CUDA-graph capture, where the SM bound is used instead).  Call it
        under ``torch.cuda.device(d)`` for each device ``d`` that will capture.  Returns the
        number of modules loaded."""
        n = super().preload(ops)
        from .occupancy import current_device

        dev = current_device()
        if dev is not None and not self.planned:
            gemm = (_OPS or _ops())[0]
            for op in ops:
                for v in self.candidates(op):
                    if "persistent" in v:
                        gemm.launch_scalars(self, v, dev)
        return n

    def gemm_blockscaled(self, a, b, out=None, *, out_dtype=None, variant: str | None = None):
        """``out = a @ b.T`` for block-scaled (MXFP8 / NVFP4) operands made by
        ``factory.runtime.blockscaled.pack`` (or wrapped with ``BlockScaled(data, scale, fmt)``);
        Blackwell datacenter GPUs only (runtime/blockscaled.py).  ``bundle.gemm(a, b)`` with such
        operands does the same."""
        return (_OPS or _ops())[3].gemm_blockscaled(self, a, b, out, out_dtype=out_dtype, variant=variant)

    def grouped_gemm(self, a, b, offs=None, masked_m=None, out=None, *, expected_m: int | None = None,
                     variant: str | None = None, scale_a=None, scale_b=None):
        """Grouped GEMM of mixture-of-experts layers, one launch over every group (runtime/grouped.py):
        contiguous ``offs`` (a (M, K) sorted by group, torch._grouped_mm's convention) or masked
        ``masked_m`` (a (E, max_m, K)); b (E, K, N) K-contiguous.  ``expected_m``: rows per group
        the variant choice plans for.  float8_e4m3fn a and b take row or block ``scale_a`` /
        ``scale_b`` (bfloat16 out; runtime/fp8.py ``quantize_grouped_a`` / ``quantize_grouped_b``)."""
        if (_OPS or _ops())[4]():  # traced by torch.compile: the bundle's torch op, whose fake checks like this call
            if variant is not None:
                raise InputError("variant= is not available under torch.compile: let the selection choose")
            if out is not None:
                self.torch_ops().grouped_gemm_out(a, b, out, offs, masked_m, expected_m, scale_a, scale_b)
                return out
            return self.torch_ops().grouped_gemm(a, b, offs, masked_m, expected_m, scale_a, scale_b)
        from . import grouped

        return grouped.grouped_gemm(self, a, b, offs, masked_m, out, expected_m=expected_m, variant=variant,
                                    scale_a=scale_a, scale_b=scale_b)

    def pack_b(self, b):
        """(N, K) e4m3 weights packed once for the decode kernels (runtime/packed.py):
        ``bundle.gemm(a, bundle.pack_b(w), ...)`` with M ≤ 16 then runs one of them."""
        return _ops()[1].pack_b(b)

    def torch_ops(self):
        """``torch.ops.kernel_factory``, its ops running on this bundle (runtime/torch_ops.py)."""
        from . import torch_ops

        return torch_ops.register(self)

    def attention(self, q, k, v, causal=False, softmax_scale=None, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q=None, max_seqlen_k=None, return_lse=False, check_varlen=None, *,
                  q_descale=None, k_descale=None, v_descale=None, v_layout=None, window_size=None, softcap=None,
                  sinks=None, out=None):
        """FlashAttention forward (runtime/attention.py says what the arguments mean).  (Passed on
        by position: a ``**kwargs`` dict per call is a measurable part of the hot path.)

        ``out``: bf16/fp16 q, k, v: a tensor of q's shape, dtype and device to write o into (no
        allocation); it must share no memory with q, k or v.

        fp8: float8_e4m3fn q, k, v (dense), descales ``q_descale``/``k_descale``/``v_descale``
        (float32, broadcastable to (batch, kv heads); None: 1), ``v_layout`` "bshd" (default) or
        "bhds" (v pre-transposed (B, Hkv, D, Sk)); bfloat16 out (runtime/attention_fp8.py).

        ``window_size`` (left, right), ``softcap`` (Gemma 2's tanh capping), ``sinks`` (heads_q,)
        float32 logits (gpt-oss), as FlashAttention's: run by the attention_kvcache kernels over k
        and v as a paged cache (runtime/kvcache.py ``attention_switches``; bf16/fp16)."""
        ops = _OPS or _ops()
        key = None
        if (cu_seqlens_q is cu_seqlens_k is window_size is softcap is sinks is q_descale is k_descale is v_descale
                is v_layout is None) and not ops[4]():
            # The hot path: a dense problem whose key (tensor types, shapes, strides, dtypes, devices,
            # the flags, out's layout) was checked in full by an earlier call has a launch plan
            # (runtime/attention.py ``_hot_launch``) that checks per call only what can differ between
            # calls of one key (autograd, the current device, the pointers) and launches.
            try:
                key = (type(q), type(k), type(v), q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(),
                       q.dtype, k.dtype, v.dtype, q.get_device(), k.get_device(), v.get_device(), causal,
                       softmax_scale, None if out is None else
                       (type(out), out.shape, out.stride(), out.dtype, out.get_device()))
                plan = self.hot_attention.get(key)
            except (AttributeError, TypeError):  # not tensors, or an unhashable argument: checked below
                key = plan = None
            if plan is not None:
                res = (plan[1] if return_lse else plan[0])(q, k, v, out)
                if res is not None:
                    return res  # (None: a check failed; the checked path below names it)
        if window_size is not None or softcap is not None or sinks is not None:
            from . import kvcache

            if q_descale is not None or k_descale is not None or v_descale is not None or v_layout is not None:
                raise InputError("window_size, softcap and sinks are not built for fp8 q/k/v")
            if out is not None:
                raise InputError("out= is not available with window_size, softcap or sinks")
            return kvcache.attention_switches(self, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                              max_seqlen_q, max_seqlen_k, return_lse, check_varlen,
                                              (-1, -1) if window_size is None else window_size,
                                              0.0 if softcap is None else softcap, sinks,
                                              tracing=ops[4]())
        if q_descale is not None or k_descale is not None or v_descale is not None or v_layout is not None:
            if out is not None:
                raise InputError("out= is not available for fp8 q, k, v")
            return self.attention_fp8(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                                      return_lse, v_layout or "bshd", cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      check_varlen)
        if ops[4]():  # traced by torch.compile: the bundle's torch op, whose fake checks like this call
            if out is not None:
                raise InputError("out= is not available under torch.compile")
            o, lse = self.torch_ops().attention(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                                max_seqlen_q)
            return (o, lse) if return_lse else o
        return ops[2].attention(self, q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, return_lse, check_varlen, out, key)

    def attention_fp8(self, q, k, v, causal=False, softmax_scale=None, q_descale=None, k_descale=None,
                      v_descale=None, return_lse=False, v_layout="bshd", cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=None, check_varlen=None):
        """The fp8 forward (runtime/attention_fp8.py); ``attention`` routes fp8 inputs here."""
        from . import attention_fp8

        ops = _OPS or _ops()
        if cu_seqlens_q is not None or cu_seqlens_k is not None:  # (packed: no torch op yet)
            return attention_fp8.attention_fp8(self, q, k, v, causal, softmax_scale, q_descale, k_descale,
                                               v_descale, return_lse, v_layout, cu_seqlens_q, cu_seqlens_k,
                                               max_seqlen_q, check_varlen)
        if ops[4]():  # traced by torch.compile: the bundle's torch op (its fake checks like this call)
            o, lse = self.torch_ops().attention_fp8(q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                                                    v_layout)
            return (o, lse) if return_lse else o
        return attention_fp8.attention_fp8(self, q, k, v, causal, softmax_scale, q_descale, k_descale, v_descale,
                                           return_lse, v_layout)

    def attention_kvcache(self, q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal=True,
                          softmax_scale=None, window_size=(-1, -1), softcap=0.0, sinks=None, k_descale=None,
                          v_descale=None, return_lse=False, out=None, cu_seqlens_q=None, max_seqlen_q=None,
                          plan=None, check_varlen=None, variant=None, q_descale=None, rotary_cos_sin=None,
                          rotary_interleaved=False):
        """Attention over a paged (``block_table``) or dense KV cache, each sequence's first
        ``cache_seqlens[b]`` keys (runtime/kvcache.py says what the arguments mean); float8_e4m3fn q
        with ``q_descale`` over an e4m3 cache: fp8 attention, bfloat16 o; with ``rotary_cos_sin``,
        q is rotated in the kernel's prologue."""
        from . import kvcache

        return kvcache.attention_kvcache(self, q, k_cache, v_cache, cache_seqlens, block_table, causal,
                                         softmax_scale, window_size, softcap, sinks, k_descale, v_descale,
                                         return_lse, out, cu_seqlens_q, max_seqlen_q, plan, check_varlen,
                                         variant, q_descale, rotary_cos_sin, rotary_interleaved)

    def rms_norm(self, x, weight, eps=1e-6, *, residual=None, out=None, quantize=None):
        """RMSNorm over the last dimension, optionally after ``residual += x`` (in place) and with
        fp8 output plus per-row scales (runtime/fused.py says what the arguments mean)."""
        from . import fused

        if (_OPS or _ops())[4]():  # traced by torch.compile: the bundle's torch op (its fake checks alike)
            if out is not None:
                raise InputError("out= is not available under torch.compile")
            ops = self.torch_ops()
            if quantize is None:
                return ops.rms_norm(x, weight, eps, residual)
            fused.rms_norm_check(x, weight, eps, residual, None, quantize)
            return ops.rms_norm_fp8(x, weight, eps, residual)
        return fused.rms_norm(self, x, weight, eps, residual, out, quantize)

    def fp8_rows(self, codes, group_scale, *, out=None):
        """e4m3 codes with a scale per row and 128 columns re-expressed with one scale per row:
        ``(out, scale)``, ``scale`` float32 (M, 1) (runtime/fused.py says what the arguments mean)."""
        from . import fused

        if (_OPS or _ops())[4]():  # traced by torch.compile: the bundle's torch op
            if out is not None:
                raise InputError("out= is not available under torch.compile")
            return self.torch_ops().fp8_rows(codes, group_scale)
        return fused.fp8_rows(self, codes, group_scale, out)

    def rope_kvcache(self, q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping=None, *, neox=True,
                     rotary_dim=None, block_table=None, cache_seqlens=None, k_scale=None, v_scale=None):
        """Rotary embedding of q and k in place and the write of k and v into the paged KV cache at
        ``slot_mapping`` (or through ``block_table`` at ``cache_seqlens``), one kernel; float8_e4m3fn
        caches take ``k_scale`` / ``v_scale`` (runtime/fused.py says what the arguments mean)."""
        from . import fused

        if (_OPS or _ops())[4]():  # traced by torch.compile: the bundle's torch op (its fake checks alike)
            fused.rope_kvcache_check(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, neox,
                                     rotary_dim, block_table, cache_seqlens, k_scale, v_scale)
            self.torch_ops().rope_kvcache(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, neox,
                                          block_table, cache_seqlens, k_scale, v_scale)
            return q, k
        return fused.rope_kvcache(self, q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, neox,
                                  rotary_dim, block_table, cache_seqlens, k_scale, v_scale)

    def plan_kvcache(self, **problem):
        """The ``attention_kvcache`` variant for maxima fixed ahead of a CUDA-graph capture
        (batch, seqlen_q, heads, head_dim, max_pages and page_size or max_seqlen_k, dtypes,
        switches): pass the result as ``plan=`` (runtime/kvcache.py ``plan``)."""
        from . import kvcache

        return kvcache.plan(self, **problem)

