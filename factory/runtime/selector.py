"""The variant selection: the bundle's host library (``fx_*_select`` of compiler/csrc/fx_select.c,
no GPU, no CUDA call), called through ctypes.  The one implementation of the selection rules, the
cost models and the tuning table's overrides (compiled into the library by ``python -m factory
link``); the op modules call it once per problem key and cache the answer.

Standard library only."""

from __future__ import annotations

import ctypes
from pathlib import Path

from .errors import InputError, NoVariantError

FX_ERR_INPUT, FX_ERR_NO_VARIANT = -1, -2
DTYPE = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4}
FORMAT = {"mxf8e4m3": 1, "mxf8e5m2": 2, "nvf4": 3}
_I64x2, _I64x3, _I64x4 = ctypes.c_int64 * 2, ctypes.c_int64 * 3, ctypes.c_int64 * 4
_P = ctypes.c_void_p


class Device(ctypes.Structure):
    _fields_ = [("cc_major", ctypes.c_int32), ("cc_minor", ctypes.c_int32), ("sm_count", ctypes.c_int32),
                ("name", ctypes.c_char * 256)]


class GemmProblem(ctypes.Structure):
    _fields_ = [("ab_dtype", ctypes.c_int), ("c_dtype", ctypes.c_int),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("l", ctypes.c_int64),
                ("a", _P), ("a_stride", _I64x3), ("b", _P), ("b_stride", _I64x3),
                ("c", _P), ("c_stride", _I64x3), ("scale_a", _P), ("scale_b", _P), ("b_constant", ctypes.c_int32)]


class GemmScales(ctypes.Structure):
    _fields_ = [("mode", ctypes.c_int32), ("scale_a_stride", ctypes.c_int64 * 2),
                ("scale_b_stride", ctypes.c_int64 * 2)]


class GemmEpilogue(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_int32), ("n_out", ctypes.c_int64), ("bias", _P), ("residual", _P),
                ("residual_stride", _I64x3), ("scale_out", _P), ("scale_out_stride", ctypes.c_int64)]


class AttentionProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("varlen", ctypes.c_int32),
                ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("seqlen_k", ctypes.c_int64),
                ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("q", _P), ("k", _P), ("v", _P), ("o", _P),
                ("q_stride", _I64x3), ("k_stride", _I64x3), ("v_stride", _I64x3), ("o_stride", _I64x3),
                ("lse", _P), ("lse_stride", _I64x2), ("cu_seqlens_q", _P), ("cu_seqlens_k", _P),
                ("max_seqlen_q", ctypes.c_int32), ("causal", ctypes.c_int32), ("softmax_scale", ctypes.c_float)]


class PackedProblem(ctypes.Structure):
    _fields_ = [("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("a", _P), ("a_stride", _I64x2), ("b_packed", _P), ("b_stride", _I64x4),
                ("c", _P), ("c_stride", _I64x2), ("scale_a", _P), ("scale_b", _P), ("b_constant", ctypes.c_int32)]


class BlockScaledProblem(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("c_dtype", ctypes.c_int),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("l", ctypes.c_int64),
                ("a", _P), ("a_stride", _I64x3), ("b", _P), ("b_stride", _I64x3), ("c", _P), ("c_stride", _I64x3),
                ("a_scale", _P), ("b_scale", _P), ("a_global", _P), ("b_global", _P)]


class KVCacheProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("kv_dtype", ctypes.c_int),
                ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("heads_q", ctypes.c_int64),
                ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("num_pages", ctypes.c_int64),
                ("page_size", ctypes.c_int64), ("max_pages", ctypes.c_int64),
                ("q", _P), ("q_stride", _I64x3), ("k_cache", _P), ("v_cache", _P), ("k_stride", _I64x3),
                ("v_stride", _I64x3), ("o", _P), ("o_stride", _I64x3), ("lse", _P), ("lse_stride", _I64x2),
                ("block_table", _P), ("block_table_stride", ctypes.c_int64), ("cache_seqlens", _P),
                ("sinks", _P), ("kv_descale", _P), ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float), ("softmax_scale", ctypes.c_float),
                ("varlen_q", ctypes.c_int32), ("max_seqlen_q", ctypes.c_int32), ("cu_seqlens_q", _P)]


class AttentionFp8Problem(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("seqlen_k", ctypes.c_int64),
                ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("v_layout", ctypes.c_int32), ("causal", ctypes.c_int32), ("softmax_scale", ctypes.c_float),
                ("varlen", ctypes.c_int32)]


class GroupedProblem(ctypes.Structure):
    _fields_ = [("ab_dtype", ctypes.c_int), ("c_dtype", ctypes.c_int), ("masked", ctypes.c_int32),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("groups", ctypes.c_int64),
                ("a", _P), ("a_stride", _I64x3), ("b", _P), ("b_stride", _I64x3), ("c", _P), ("c_stride", _I64x3),
                ("offs", _P), ("masked_m", _P), ("expected_m", ctypes.c_int64), ("scale_mode", ctypes.c_int32),
                ("scale_a", _P), ("scale_a_stride", _I64x3), ("scale_b", _P), ("scale_b_stride", _I64x3)]


class RmsNormProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("x", _P),
                ("x_stride", ctypes.c_int64), ("weight", _P), ("residual_add", ctypes.c_int32), ("residual", _P),
                ("residual_stride", ctypes.c_int64), ("quantize", ctypes.c_int32), ("y", _P),
                ("y_stride", ctypes.c_int64), ("scale", _P), ("eps", ctypes.c_float)]


class Fp8RowsProblem(ctypes.Structure):
    _fields_ = [("m", ctypes.c_int64), ("n", ctypes.c_int64), ("codes", _P), ("codes_stride", ctypes.c_int64),
                ("group_scale", _P), ("group_scale_stride", ctypes.c_int64), ("out", _P),
                ("out_stride", ctypes.c_int64), ("scale", _P)]


class RopeKVCacheProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("cache_dtype", ctypes.c_int), ("neox", ctypes.c_int32),
                ("table", ctypes.c_int32), ("tokens", ctypes.c_int64), ("heads_q", ctypes.c_int64),
                ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("rotary_dim", ctypes.c_int64),
                ("max_position", ctypes.c_int64), ("num_pages", ctypes.c_int64), ("page_size", ctypes.c_int64),
                ("batch", ctypes.c_int64), ("max_pages", ctypes.c_int64),
                ("q", _P), ("q_stride", _I64x2), ("k", _P), ("k_stride", _I64x2), ("v", _P), ("v_stride", _I64x2),
                ("positions", _P), ("slot_mapping", _P), ("cache_seqlens", _P), ("block_table", _P),
                ("block_table_stride", ctypes.c_int64), ("cos_sin_cache", _P), ("cos_sin_stride", ctypes.c_int64),
                ("k_cache", _P), ("k_cache_stride", _I64x3), ("v_cache", _P), ("v_cache_stride", _I64x3),
                ("k_scale", _P), ("k_scale_stride", ctypes.c_int64), ("v_scale", _P),
                ("v_scale_stride", ctypes.c_int64)]


class Selection(ctypes.Structure):
    _fields_ = [("variant", ctypes.c_int32), ("name", ctypes.c_char_p), ("workspace_bytes", ctypes.c_uint64),
                ("max_clusters", ctypes.c_int32), ("splits", ctypes.c_int32)]


_LOADED: dict[str, str] = {}  # path -> sha256 of the library loaded from it in this process


def load(path: Path, sha256: str | None = None):
    """The library at ``path`` (sha256 as its manifest records it).  The dynamic loader hands out
    the library first loaded from a path for as long as the process lives; where the file has
    changed since (``python -m factory link`` relinked it), the new one is loaded from a private
    copy named by its hash."""
    key = str(path)
    seen = _LOADED.setdefault(key, sha256 or "")
    if sha256 is None or seen == sha256:
        return ctypes.CDLL(key)
    import shutil
    import tempfile

    d = Path(tempfile.gettempdir()) / "factory-host-libraries"
    d.mkdir(exist_ok=True)
    copy = d / f"{sha256}.so"
    if not copy.exists():
        tmp = d / f".{sha256}.{id(path)}.tmp"
        shutil.copyfile(path, tmp)
        tmp.replace(copy)
    return ctypes.CDLL(str(copy))


class Selector:
    """``fx_*_select`` of one host library for one device (capability, SM count, name)."""

    def __init__(self, path: Path, capability: tuple[int, int], device: dict, sha256: str | None = None):
        self.lib = load(path, sha256)
        self.lib.fx_last_error_message.restype = ctypes.c_char_p
        self.device = Device(int(capability[0]), int(capability[1]), int(device["sm_count"]),
                             (device.get("name") or "").encode()[:255])
        self._dev = ctypes.byref(self.device)
        self._fns = {}
        for op, problem in (("gemm", GemmProblem), ("attention", AttentionProblem), ("gemm_packed", PackedProblem),
                            ("gemm_blockscaled", BlockScaledProblem), ("attention_kvcache", KVCacheProblem),
                            ("attention_fp8", AttentionFp8Problem), ("gemm_grouped", GroupedProblem),
                            ("rms_norm", RmsNormProblem), ("fp8_rows", Fp8RowsProblem),
                            ("rope_kvcache", RopeKVCacheProblem)):
            fn = getattr(self.lib, f"fx_{op}_select", None)
            if fn is not None:
                fn.restype = ctypes.c_int32
                fn.argtypes = [ctypes.POINTER(Device), ctypes.POINTER(problem), ctypes.POINTER(Selection)]
            self._fns[op] = fn
        fn = getattr(self.lib, "fx_gemm_scaled_select", None)
        if fn is not None:
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.POINTER(Device), ctypes.POINTER(GemmProblem), ctypes.POINTER(GemmScales),
                           ctypes.POINTER(Selection)]
        self._scaled = fn

    def variant_names(self) -> list[str]:
        """The variants the library's selection tables hold, in its index order."""
        fn = self.lib.fx_variant_name
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int32]
        return [fn(i).decode() for i in range(self.lib.fx_variant_count())]

    def _result(self, rc: int, sel: Selection, fn_name: str) -> Selection:
        """``sel`` when a select entry returned 0, else InputError / NoVariantError with the
        library's reason (any other code: RuntimeError)."""
        if rc == 0:
            return sel
        msg = (self.lib.fx_last_error_message() or b"").decode(errors="replace")
        if rc == FX_ERR_INPUT:
            raise InputError(msg)
        if rc == FX_ERR_NO_VARIANT:
            raise NoVariantError(msg)
        raise RuntimeError(f"{fn_name} returned {rc}: {msg}")

    def select(self, op: str, problem) -> Selection:
        """The selection of ``problem`` (a ``*Problem``), or InputError / NoVariantError with the
        library's reason."""
        fn = self._fns[op]
        if fn is None:
            raise NoVariantError(f"this bundle's host library has no fx_{op}_select: relink it (python -m factory link)")
        sel = Selection()
        rc = fn(self._dev, ctypes.byref(problem), ctypes.byref(sel))
        return self._result(rc, sel, f"fx_{op}_select")

    def select_epilogue(self, problem, form: tuple | None, flags: int, n_out: int, bias: int, residual: int,
                        residual_stride: tuple, scale_out: int = 0, scale_out_stride: int = 0) -> Selection:
        """``fx_gemm_epilogue_select``: a GEMM problem with a fused epilogue (runtime/epilogue.py);
        ``form`` as :meth:`select_scaled`'s, or None for per-tensor scales."""
        fn = getattr(self.lib, "fx_gemm_epilogue_select", None)
        if fn is None:
            raise NoVariantError("this bundle's host library has no fx_gemm_epilogue_select: relink it "
                                 "(python -m factory link)")
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.POINTER(Device), ctypes.POINTER(GemmProblem), ctypes.POINTER(GemmScales),
                       ctypes.POINTER(GemmEpilogue), ctypes.POINTER(Selection)]
        sc = None
        if form is not None:
            mode, sa, sb = form
            sc = ctypes.byref(GemmScales(int(mode), (ctypes.c_int64 * 2)(*sa), (ctypes.c_int64 * 2)(*sb)))
        ep = GemmEpilogue(int(flags), int(n_out), bias or None, residual or None, _I64x3(*residual_stride),
                          scale_out or None, int(scale_out_stride))
        sel = Selection()
        rc = fn(self._dev, ctypes.byref(problem), sc, ctypes.byref(ep), ctypes.byref(sel))
        return self._result(rc, sel, "fx_gemm_epilogue_select")

    def select_scaled(self, problem, form: tuple) -> Selection:
        """``fx_gemm_scaled_select`` of a GEMM problem with fp8 row / block scales; ``form`` is
        (mode: 1 row, 2 block, scale_a strides, scale_b strides) (runtime/fp8.py)."""
        if self._scaled is None:
            raise NoVariantError("this bundle's host library has no fx_gemm_scaled_select: relink it (python -m factory link)")
        mode, sa, sb = form
        sc = GemmScales(int(mode), (ctypes.c_int64 * 2)(*sa), (ctypes.c_int64 * 2)(*sb))
        sel = Selection()
        rc = self._scaled(self._dev, ctypes.byref(problem), ctypes.byref(sc), ctypes.byref(sel))
        return self._result(rc, sel, "fx_gemm_scaled_select")

    # --- the cost models (tools) ----------------------------------------------------------------------
    def index(self, name: str) -> int:
        """The library's index of variant ``name``."""
        names = getattr(self, "_index", None)
        if names is None:
            fn = self.lib.fx_variant_name
            fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int32]
            names = self._index = {fn(i).decode(): i for i in range(self.lib.fx_variant_count())}
        return names[name]

    def estimate_us(self, name: str, M: int, N: int, K: int, L: int = 1) -> float:
        """The family's cost model's predicted time (us) of GEMM variant ``name`` on (M, N, K, L):
        what the selection ranks by (``fx_gemm_estimate_us``)."""
        us = ctypes.c_double()
        fn = self.lib.fx_gemm_estimate_us
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.POINTER(Device), ctypes.c_int32] + [ctypes.c_int64] * 4 + [ctypes.POINTER(ctypes.c_double)]
        rc = fn(self._dev, self.index(name), M, N, K, L, ctypes.byref(us))
        if rc:
            raise InputError((self.lib.fx_last_error_message() or b"").decode(errors="replace"))
        return us.value

    def set_cost_model(self, sm90: dict | None = None, sm100: dict | None = None) -> None:
        """For fitting tools: evaluate with these constants (tuning.MODEL / cost_sm100.MODEL's
        keys; None: the compiled-in ones) from now on, in this process."""
        from .cost_sm100 import MODEL_KEYS as SM100_MODEL_KEYS
        from .tuning import MODEL_KEYS as SM90_MODEL_KEYS

        def arr(model, keys):
            return None if model is None else (ctypes.c_double * len(keys))(*(float(model[k]) for k in keys))

        a, b = arr(sm90, SM90_MODEL_KEYS), arr(sm100, SM100_MODEL_KEYS)
        rc = self.lib.fx_cost_model_set(a, len(SM90_MODEL_KEYS), b, len(SM100_MODEL_KEYS))
        if rc:
            raise InputError((self.lib.fx_last_error_message() or b"").decode(errors="replace"))

    # --- problems from (data_ptr, shape, stride) specs ---------------------------------------------
    @staticmethod
    def gemm_problem(a3, b3, c3, ab: str, c: str, scales: list, b_constant: bool) -> GemmProblem:
        """a3, b3, c3: (R, K, L) / (M, N, L) specs as runtime/gemm.py's ``rkl_spec``."""
        M, K, L = a3[1]
        return GemmProblem(DTYPE.get(ab, -1), DTYPE.get(c, -1), M, b3[1][0], K, L, a3[0] or None, _I64x3(*a3[2]),
                           b3[0] or None, _I64x3(*b3[2]), c3[0] or None, _I64x3(*c3[2]),
                           (scales[0][0] or None) if scales else None, (scales[1][0] or None) if scales else None,
                           int(bool(b_constant)))
