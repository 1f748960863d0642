"""The C selection (fx_gemm_select / fx_attention_select of a bundle's host library) through ctypes,
the Python loader's answer for the same problem, and the two compared over grids of problems.

Python's answer is what ``bundle.gemm`` / ``bundle.attention`` launch on a simulated bundle
(``BundleCore.simulate``) given meta tensors (shapes and strides without memory), or, where data
pointers must be misaligned, what ``runtime.gemm.select`` answers for (pointer, shape, stride)
specs.  An answer is ("ok", variant name), ("empty",) (nothing launched), ("input",) (InputError /
FX_ERR_INPUT) or ("novariant",) (NoVariantError / FX_ERR_NO_VARIANT).
"""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import torch

from conftest import Recorder
from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import gemm as rt_gemm

DTYPE = {"bf16": 1, "f16": 2, "f32": 3, "e4m3": 4}
TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "e4m3": torch.float8_e4m3fn}
FX_OK, FX_ERR_INPUT, FX_ERR_NO_VARIANT, FX_ERR_WORKSPACE = 0, -1, -2, -3
I64x3 = ctypes.c_int64 * 3
# fp8 scale pointers of the planned problems: far above the small offsets the operands get, so
# that no range overlaps.
SCALE_A, SCALE_B = 1 << 40, (1 << 40) + 0x100


class Device(ctypes.Structure):
    _fields_ = [("cc_major", ctypes.c_int32), ("cc_minor", ctypes.c_int32), ("sm_count", ctypes.c_int32),
                ("name", ctypes.c_char * 256)]


class GemmProblem(ctypes.Structure):
    _fields_ = [("ab_dtype", ctypes.c_int), ("c_dtype", ctypes.c_int),
                ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("l", ctypes.c_int64),
                ("a", ctypes.c_void_p), ("a_stride", I64x3), ("b", ctypes.c_void_p), ("b_stride", I64x3),
                ("c", ctypes.c_void_p), ("c_stride", I64x3), ("scale_a", ctypes.c_void_p),
                ("scale_b", ctypes.c_void_p), ("b_constant", ctypes.c_int32)]


class AttentionProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("varlen", ctypes.c_int32),
                ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("seqlen_k", ctypes.c_int64),
                ("heads_q", ctypes.c_int64), ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64),
                ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("q_stride", I64x3), ("k_stride", I64x3), ("v_stride", I64x3), ("o_stride", I64x3),
                ("lse", ctypes.c_void_p), ("lse_stride", ctypes.c_int64 * 2),
                ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("max_seqlen_q", ctypes.c_int32), ("causal", ctypes.c_int32), ("softmax_scale", ctypes.c_float)]


class KVCacheProblem(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("kv_dtype", ctypes.c_int),
                ("batch", ctypes.c_int64), ("seqlen_q", ctypes.c_int64), ("heads_q", ctypes.c_int64),
                ("heads_kv", ctypes.c_int64), ("head_dim", ctypes.c_int64), ("num_pages", ctypes.c_int64),
                ("page_size", ctypes.c_int64), ("max_pages", ctypes.c_int64),
                ("q", ctypes.c_void_p), ("q_stride", I64x3), ("k_cache", ctypes.c_void_p),
                ("v_cache", ctypes.c_void_p), ("k_stride", I64x3), ("v_stride", I64x3),
                ("o", ctypes.c_void_p), ("o_stride", I64x3), ("lse", ctypes.c_void_p),
                ("lse_stride", ctypes.c_int64 * 2), ("block_table", ctypes.c_void_p),
                ("block_table_stride", ctypes.c_int64), ("cache_seqlens", ctypes.c_void_p),
                ("sinks", ctypes.c_void_p), ("kv_descale", ctypes.c_void_p), ("causal", ctypes.c_int32),
                ("window_left", ctypes.c_int32), ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("softmax_scale", ctypes.c_float), ("varlen_q", ctypes.c_int32), ("max_seqlen_q", ctypes.c_int32),
                ("cu_seqlens_q", ctypes.c_void_p)]


class Selection(ctypes.Structure):
    _fields_ = [("variant", ctypes.c_int32), ("name", ctypes.c_char_p), ("workspace_bytes", ctypes.c_uint64),
                ("max_clusters", ctypes.c_int32), ("splits", ctypes.c_int32)]


class CLib:
    """A host library's C API."""

    def __init__(self, path: str | Path):
        from factory.runtime.manifest import sha256_file
        from factory.runtime.selector import load

        self.lib = load(Path(path), sha256_file(Path(path)))  # (the file as it is now, also after a relink)
        for fn in ("fx_last_error_message", "fx_selection_info", "fx_error_string", "fx_variant_name"):
            getattr(self.lib, fn).restype = ctypes.c_char_p
        self.lib.fx_error_string.argtypes = [ctypes.c_int32]
        self.lib.fx_variant_name.argtypes = [ctypes.c_int32]

    @staticmethod
    def device(cc, sm_count: int, name: str | None) -> Device:
        return Device(cc[0], cc[1], sm_count, (name or "").encode())

    def _answer(self, rc: int, sel: Selection) -> tuple:
        if rc == FX_OK:
            return ("ok", sel.name.decode()) if sel.variant >= 0 else ("empty",)
        if rc == FX_ERR_INPUT:
            return ("input",)
        if rc == FX_ERR_NO_VARIANT:
            return ("novariant",)
        return ("error", rc, self.lib.fx_last_error_message().decode())

    def gemm_select(self, dev: Device, p: GemmProblem) -> tuple[tuple, Selection]:
        sel = Selection()
        rc = self.lib.fx_gemm_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
        return self._answer(rc, sel), sel

    def attention_select(self, dev: Device, p: AttentionProblem) -> tuple[tuple, Selection]:
        sel = Selection()
        rc = self.lib.fx_attention_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
        return self._answer(rc, sel), sel

    def kvcache_select(self, dev: Device, p: KVCacheProblem) -> tuple[tuple, Selection]:
        sel = Selection()
        rc = self.lib.fx_attention_kvcache_select(ctypes.byref(dev), ctypes.byref(p), ctypes.byref(sel))
        return self._answer(rc, sel), sel

    def message(self) -> str:
        return self.lib.fx_last_error_message().decode()




def open_simulated(path, cc, sm_count: int, name: str | None):
    b = Bundle.open(path, capability=tuple(cc), device={"name": name, "sm_count": sm_count})
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


# --- GEMM -------------------------------------------------------------------------------------------
def gemm_problems(seed: int, n: int, fp8: bool = True) -> list[dict]:
    """``n`` GEMM problems: decode, odd, square, Llama-sized and batched shapes, K- and M-major a,
    K- and N-major b, padded (misaligned) leading dimensions, empty sizes, b_constant; with
    pointer offsets (``*_off``) on some."""
    r = random.Random(seed)
    ms = [0, 1, 2, 7, 8, 15, 16, 17, 33, 64, 100, 128, 200, 256, 512, 777, 1000, 1024, 2048, 3000, 4096, 8192, 16384]
    nks = [0, 8, 16, 24, 64, 72, 100, 128, 1000, 1001, 1024, 2048, 2050, 4096, 5120, 6144, 8192, 11008, 14336, 28672]
    kinds = [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32"), ("f16", "f32"), ("bf16", "f16")]
    if fp8:
        kinds += [("e4m3", "bf16"), ("e4m3", "bf16"), ("e4m3", "f32")]
    out = []
    for i in range(n):
        ab, c = r.choice(kinds)
        m = r.choice(ms if r.random() < 0.7 else [1, 2, 4, 8, 16])
        p = dict(ab=ab, c=c, M=m, N=r.choice(nks[1:] if r.random() < 0.95 else nks), K=r.choice(nks[1:] if r.random() < 0.95 else nks),
                 L=r.choice([1, 1, 1, 1, 2, 3, 8]), a_major=r.choice("kkkkkkkmmx"), b_major=r.choice("kkkkkkknnx"),
                 pad_a=r.choice([0] * 8 + [1, 8]), pad_b=r.choice([0] * 8 + [1, 8]), pad_c=r.choice([0] * 9 + [4]),
                 b_constant=r.random() < 0.3, a_off=0, b_off=0, c_off=0)
        if r.random() < 0.08 and 0 not in (p["M"], p["N"], p["K"]):
            p[r.choice(["a_off", "b_off", "c_off"])] = r.choice([2, 4, 8])
        out.append(p)
    return out


def _operand(rows: int, k: int, L: int, major: str, pad: int, dtype) -> torch.Tensor:
    """An (rows, k) or (L, rows, k) meta tensor, contiguous along k ("k"), along rows ("m"), or
    along neither ("x": every other element of a row-major matrix)."""
    if major == "x":
        shape, stride = (rows, k), (2 * k, 2)
        batch = 2 * rows * k
    elif major == "k":
        ld = k + pad
        shape, stride = (rows, k), (ld, 1)
        batch = rows * ld
    else:
        ld = rows + pad
        shape, stride = (rows, k), (1, ld)
        batch = k * ld
    if L > 1:
        shape, stride = (L, *shape), (batch, *stride)
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


def gemm_tensors(p: dict):
    a = _operand(p["M"], p["K"], p["L"], p["a_major"], p["pad_a"], TORCH[p["ab"]])
    b = _operand(p["N"], p["K"], p["L"], {"n": "m"}.get(p["b_major"], p["b_major"]), p["pad_b"], TORCH[p["ab"]])
    c = _operand(p["M"], p["N"], p["L"], "k", p["pad_c"], TORCH[p["c"]])
    return a, b, c


def majors(p: dict) -> tuple[str, str]:
    """The (a, b) majorness runtime/gemm.py reads of the problem's operands."""
    a, b, _ = gemm_tensors(p)
    from factory.runtime.gemm import _major

    return _major(rt_gemm.rkl_spec(a, "a"), "m"), _major(rt_gemm.rkl_spec(b, "b"), "n")


def c_gemm_problem(p: dict, a, b, c) -> GemmProblem:
    specs = [rt_gemm.rkl_spec(t, w) for t, w in ((a, "a"), (b, "b"), (c, "c"))]
    fp8 = p["ab"] == "e4m3"
    return GemmProblem(DTYPE[p["ab"]], DTYPE[p["c"]], p["M"], p["N"], p["K"], p["L"],
                       p["a_off"], I64x3(*specs[0][2]), p["b_off"], I64x3(*specs[1][2]),
                       p["c_off"], I64x3(*specs[2][2]), SCALE_A if fp8 else None, SCALE_B if fp8 else None,
                       int(p["b_constant"]))


def py_gemm(bundle, p: dict, a, b, c) -> tuple:
    """What the Python loader does with this problem: end to end on meta tensors, or, with pointer
    offsets (meta tensors have none; such problems are never empty), gemm.select on specs."""
    fp8 = p["ab"] == "e4m3"
    try:
        if not (p["a_off"] or p["b_off"] or p["c_off"]):
            s = torch.ones(1, dtype=torch.float32, device="meta") if fp8 else None
            n = len(bundle.rec.launched)
            bundle.gemm(a, b, out=c, scale_a=s, scale_b=s, b_constant=p["b_constant"])
            return ("ok", bundle.rec.launched[-1]) if len(bundle.rec.launched) > n else ("empty",)
        specs = []
        for t, w, off in ((a, "a", p["a_off"]), (b, "b", p["b_off"]), (c, "c", p["c_off"])):
            _, shape, stride = rt_gemm.rkl_spec(t, w)
            specs.append((off, shape, stride))
        scales = [(SCALE_A, (1,), (1,)), (SCALE_B, (1,), (1,))] if fp8 else []
        return ("ok", rt_gemm.select(bundle, *specs, p["ab"], p["c"], scales, p["b_constant"], -1))
    except NoVariantError:
        return ("novariant",)
    except InputError:
        return ("input",)


def compare_gemm(bundle_path, lib: CLib, problems: list[dict], cc, sm_count: int, name: str | None):
    """[(problem, python answer, C answer)] for every problem, and the C selections' details."""
    bundle = open_simulated(bundle_path, cc, sm_count, name)
    dev = lib.device(cc, sm_count, name)
    rows = []
    for p in problems:
        a, b, c = gemm_tensors(p)
        want = py_gemm(bundle, p, a, b, c)
        got, sel = lib.gemm_select(dev, c_gemm_problem(p, a, b, c))
        rows.append((p, want, got, sel.workspace_bytes, sel.max_clusters))
    return bundle, rows


# --- attention --------------------------------------------------------------------------------------
def attention_problems(seed: int, n_dense: int, n_varlen: int) -> list[dict]:
    """Dense prefill, decode (seqlen_q 1, GQA), odd sizes, transposed and padded layouts, causal or
    not, GQA/MQA, unsupported head dims and head ratios, empty and key-less problems; varlen
    batches with empty sequences and max_seqlen_q beyond the tokens."""
    r = random.Random(seed)
    heads = [(16, 16), (32, 8), (32, 32), (8, 1), (12, 4), (64, 8)]

    def rare(common, odd, p=0.04):  # mostly valid problems; now and then an invalid or empty one
        return r.choice(odd) if r.random() < p else r.choice(common)

    out = []
    for i in range(n_dense):
        hq, hkv = rare(heads, [(6, 4), (4, 0)])
        out.append(dict(varlen=False, dtype=r.choice(["bf16", "f16"]), D=rare([64, 128], [96]),
                        causal=r.random() < 0.5, B=rare([1, 1, 2, 4, 8, 16, 64, 256], [0]),
                        Sq=rare([1, 1, 1, 2, 3, 7, 64, 100, 128, 129, 512, 1000, 2048, 4096], [0]),
                        Sk=rare([1, 64, 100, 128, 513, 1024, 4096, 8192, 32768], [0]),
                        Hq=hq, Hkv=hkv, layout=rare(["bshd"] * 6 + ["bhsd", "pad8"], ["pad4"], 0.06),
                        scale=rare([None, None, 0.125], [-1.0, float("inf")]), q_off=0))
    for i in range(n_dense // 20):  # q 2 bytes off 16-byte alignment: small CPU tensors hold it
        hq, hkv = r.choice(heads[:6])
        out.append(dict(varlen=False, dtype=r.choice(["bf16", "f16"]), D=r.choice([64, 128]), causal=r.random() < 0.5,
                        B=r.choice([1, 2]), Sq=r.choice([1, 3, 64]), Sk=r.choice([1, 100]), Hq=hq, Hkv=hkv,
                        layout="bshd", scale=None, q_off=1))
    for i in range(n_varlen):
        hq, hkv = r.choice(heads[:6])
        tq = r.choice([0, 5, 100, 3000, 8192])
        out.append(dict(varlen=True, dtype=r.choice(["bf16", "f16"]), D=r.choice([64, 128, 128]),
                        causal=r.random() < 0.5, B=r.choice([0, 1, 3, 8, 100]), Sq=tq,
                        Sk=r.choice([0, 50, 500, 5000]) if r.random() < 0.95 else 0, Hq=hq, Hkv=hkv,
                        layout=r.choice(["bshd"] * 6 + ["pad4"]), scale=None, q_off=0,
                        max_q=r.choice([tq, max(tq // 3, 1), tq + 1, 0])))
    return out


def _qkv(p: dict, s: int, h: int, offset: int = 0) -> torch.Tensor:
    """Meta tensors; with ``offset`` (elements) a CPU tensor that many elements into its storage."""
    D, dt = p["D"], TORCH[p["dtype"]]
    pad = {"pad8": 8, "pad4": 4}.get(p["layout"], 0)
    if p["varlen"]:
        shape, stride = (s, h, D), (h * (D + pad), D + pad, 1)
    elif p["layout"] == "bhsd":  # (B, H, S, D) storage seen as (B, S, H, D)
        shape, stride = (p["B"], s, h, D), (h * s * D, D, s * D, 1)
    else:
        shape, stride = (p["B"], s, h, D), (s * h * (D + pad), h * (D + pad), D + pad, 1)
    if not offset:
        return torch.empty_strided(shape, stride, dtype=dt, device="meta")
    n = 1 + sum((x - 1) * st for x, st in zip(shape, stride))
    return torch.empty(n + offset, dtype=dt).as_strided(shape, stride, storage_offset=offset)


def attention_tensors(p: dict):
    cpu = int(p["q_off"])  # all on the CPU when q must be misaligned (one device for all)
    q = _qkv(p, p["Sq"], p["Hq"], cpu)
    k, v = (_qkv(p, p["Sk"], p["Hkv"]) if not cpu else _qkv(p, p["Sk"], p["Hkv"], 8) for _ in range(2))
    return q, k, v, torch.empty_like(q)  # o: what attention() allocates


def _strides3(t, varlen: bool) -> I64x3:
    s = t.stride()
    return I64x3(0, s[0], s[1]) if varlen else I64x3(*s[:3])


LSE = 0x4000  # a caller's lse (16-byte aligned): the workspace then holds only split partials


def c_attention_problem(p: dict, q, k, v, o) -> AttentionProblem:
    vl = p["varlen"]
    lse_stride = (0, p["Sq"]) if vl else (p["Hq"] * p["Sq"], p["Sq"])
    return AttentionProblem(DTYPE[p["dtype"]], int(vl), p["B"], p["Sq"], p["Sk"], p["Hq"], p["Hkv"], p["D"],
                            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                            _strides3(q, vl), _strides3(k, vl), _strides3(v, vl),
                            _strides3(o, vl), LSE, (ctypes.c_int64 * 2)(*lse_stride), 0, 0,
                            p.get("max_q", 0), int(p["causal"]), p["scale"] or 0.0)


def py_attention(bundle, p: dict, q, k, v) -> tuple:
    """bundle.attention end to end on meta tensors (CPU ones where q is misaligned)."""
    try:
        kw = dict(causal=p["causal"], softmax_scale=p["scale"])
        if p["varlen"]:
            cu = torch.empty(p["B"] + 1, dtype=torch.int32, device=q.device)
            kw.update(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=p["max_q"])
        n = len(bundle.rec.launched)
        bundle.attention(q, k, v, **kw)
        return ("ok", bundle.rec.launched[-1]) if len(bundle.rec.launched) > n else ("empty",)
    except NoVariantError:
        return ("novariant",)
    except InputError:
        return ("input",)


def keyless(p: dict) -> bool:
    """A problem Python answers by filling o = 0 and lse = -inf without a launch, and fx_attention
    refuses (FX_ERR_INPUT, documented): queries present, no keys."""
    if p["varlen"]:
        return p["Sk"] == 0 and p["Sq"] > 0 and p["B"] > 0 and p["max_q"] > 0
    return p["Sk"] == 0 and p["B"] * p["Sq"] * p["Hq"] * p["D"] > 0


def compare_attention(bundle_path, lib: CLib, problems: list[dict], cc, sm_count: int, monkeypatch,
                      name: str | None = None):
    """``name``: the device's name (whether a tuning.json compiled in applies)."""
    bundle = open_simulated(bundle_path, cc, sm_count, name)
    dev = lib.device(cc, sm_count, name)
    rows = []
    for p in problems:
        q, k, v, o = attention_tensors(p)
        want = py_attention(bundle, p, q, k, v)
        if want == ("empty",) and keyless(p):
            want = ("input",)  # fx_attention leaves o = 0, lse = -inf to the caller
        got, sel = lib.attention_select(dev, c_attention_problem(p, q, k, v, o))
        rows.append((p, want, got, sel.workspace_bytes, sel.splits))
    return bundle, rows
