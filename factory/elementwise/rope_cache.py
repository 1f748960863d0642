"""Rotary position embedding of q and k, and the write of the new k and v into the (paged) KV
cache, in one kernel: vLLM's ``rotary_embedding`` followed by ``reshape_and_cache_flash``.

Per token t (one CTA each), with ``pos = positions[t]`` and ``R`` the rotary dimension
(``cos_sin_cache[pos, :R/2]`` the cosines, ``[pos, R/2:]`` the sines, float32):

* neox (GPT-NeoX / Llama form): element i < R/2 of a head pairs with i + R/2:
  ``o[i] = x[i] cos[i] - x[i + R/2] sin[i]``, ``o[i + R/2] = x[i + R/2] cos[i] + x[i] sin[i]``;
* interleaved (GPT-J form): element 2j pairs with 2j + 1, angle j;
* elements from R to the head dim are left as they are (partial rotary).

q and k are rotated in place.  With ``slot = slot_mapping[t]``, the rotated k and the unchanged v
of the token are written to ``k_cache[slot // PS, slot % PS]`` and ``v_cache[...]`` (caches of
(pages, PS, kv heads, head dim), the layout ``attention_kvcache`` reads).  A slot outside
``[0, pages·PS)`` (vLLM pads with -1) writes nothing; a position outside the cos/sin table reads its
nearest row (never memory outside the table).

``fp8_cache`` variants write e4m3 caches (vLLM's ``kv_cache_dtype="fp8"``): the rotated k and the v
of token t, kv head h, are stored as ``e4m3(x · rcp(k_scale[h]))`` (``v_scale``; MUFU.RCP, within an
ulp of the quotient), saturating at ±448 —
the scales ``attention_kvcache`` then takes as its ``k_descale`` / ``v_descale`` (per kv head; a
per-tensor scale is a stride-0 view).

``table`` variants take FlashAttention's ``flash_attn_with_kvcache`` form instead of positions and
slots: q, k, v hold ``Sq`` new tokens of each of B sequences (token t = b·Sq + s), ``cache_seqlens[b]``
(int32) is sequence b's cached length before them, so token (b, s) has position
``cache_seqlens[b] + s`` and goes to page ``block_table[b, pos // PS]``, row ``pos % PS``; a
position past the block table, or a page outside the cache, writes nothing.

Work: threads loop over 16-byte vectors; a neox unit is the vector at i and its partner at i + R/2
(R a multiple of 16), an interleaved unit one vector of 4 pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..abi import Signature, TensorArg
from ..atoms.common import cutlass_dtype
from ..atoms.targets import Target
from ..registry import register
from .common import DEFAULT_TARGETS, RowwiseVariant, builds_for

VEC = 8  # elements per 16-byte vector of a 16-bit dtype
F32 = cutlass.Float32


@dataclass(frozen=True, kw_only=True)
class RopeCacheVariant(RowwiseVariant):
    op: ClassVar[str] = "rope_kvcache"
    family: ClassVar[str] = "rowwise"
    sources: ClassVar[tuple[str, ...]] = ("elementwise/rope_cache.py", "elementwise/common.py", "atoms/rowwise.py",
                                          "atoms/common.py", "abi.py")

    threads: int = field(default=128, metadata={"tag": "t"})
    neox: bool = field(default=True, metadata={"tag": "neox"})
    table: bool = field(default=False, metadata={"tag": "bt"})
    fp8_cache: bool = field(default=False, metadata={"tag": "ce4m3"})

    @property
    def cache_dtype(self) -> str:
        return "e4m3" if self.fp8_cache else self.dtype

    @property
    def is_fp8(self) -> bool:
        """fp8 caches (an sm_89 build is kept beside the sm_86 code for them)."""
        return self.fp8_cache

    def can_implement(self) -> str | None:
        why = super().can_implement()
        if why:
            return why
        if not builds_for(self.tgt, self.fp8_cache):
            return f"rope_kvcache{' into fp8 caches' if self.fp8_cache else ''} is not built for {self.target}"
        return None

    def sass_requirements(self) -> tuple[str, ...]:
        req = (r"\bLDG\.E\.128\b", r"\bSTG\.E\.128\b")
        if self.fp8_cache:  # 8 e4m3 values per cache store, converted in pairs with saturation
            req += (r"\bSTG\.E\.64\b", r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB")
        return req

    def signature(self) -> Signature:
        dt = self.dtype
        args = (
            TensorArg("q", dt, ("T", "HQ", "D"), ("sQt", "sQh", 1)),
            TensorArg("k", dt, ("T", "HKV", "D"), ("sKt", "sKh", 1)),
            TensorArg("v", dt, ("T", "HKV", "D"), ("sVt", "sVh", 1)),
            (TensorArg("cache_seqlens", "i32", ("B",), (1,), align=4) if self.table
             else TensorArg("positions", "i64", ("T",), (1,), align=8)),
            TensorArg("cos_sin_cache", "f32", ("MAXPOS", "R"), ("sCp", 1)),
            TensorArg("k_cache", self.cache_dtype, ("P", "PS", "HKV", "D"), ("sKCp", "sKCs", "sKCh", 1)),
            TensorArg("v_cache", self.cache_dtype, ("P", "PS", "HKV", "D"), ("sVCp", "sVCs", "sVCh", 1)),
            (TensorArg("block_table", "i32", ("B", "MP"), ("sTb", 1), align=4) if self.table
             else TensorArg("slot_mapping", "i64", ("T",), (1,), align=8)),
        )
        if self.fp8_cache:  # per kv head; stride 0: one scale for every head
            args += (TensorArg("k_scale", "f32", ("HKV",), ("sKS",), align=4),
                     TensorArg("v_scale", "f32", ("HKV",), ("sVS",), align=4))
        div = {s: VEC for s in ("D", "sQt", "sQh", "sKt", "sKh", "sVt", "sVh", "sKCp", "sKCs", "sKCh",
                                "sVCp", "sVCs", "sVCh")}
        div.update({"R": 16, "sCp": 4})
        return Signature(args, tuple(sorted(div.items())))

    def make_kernel(self):
        k = RopeCacheKernel(self)
        return k.launch_fp8 if self.fp8_cache else k.launch

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "neox": self.neox, "table": self.table, "cache_dtype": self.cache_dtype,
                "rotary_multiple": 16, "head_dim_multiple": VEC}


@register("rope_kvcache")
def enumerate_rope(target: Target, tier: str) -> list[RopeCacheVariant]:
    """default: bf16 neox (positions and slots) into bf16 and into e4m3 caches; full: f16, the
    interleaved form and the block-table form too, each into both caches; test: bf16 neox for sm_90
    and sm_120a, bf16 interleaved, bf16 neox block-table and bf16 neox into e4m3 for sm_90."""
    if tier == "default" and target.name not in DEFAULT_TARGETS:
        return []
    if tier == "test":
        combos = {"sm_90": (("bf16", True, False, False), ("bf16", False, False, False), ("bf16", True, True, False),
                            ("bf16", True, False, True)),
                  "sm_120a": (("bf16", True, False, False),)}.get(target.name, ())
    elif tier == "default":
        combos = (("bf16", True, False, False), ("bf16", True, False, True))
    else:
        combos = tuple((dt, nx, bt, f8) for dt in ("bf16", "f16") for nx in (True, False) for bt in (False, True)
                       for f8 in (False, True))
    out = []
    for dt, neox, bt, f8 in combos:
        v = RopeCacheVariant(target=target.name, dtype=dt, neox=neox, table=bt, fp8_cache=f8)
        if v.can_implement() is None:
            out.append(v)
    return out


class RopeCacheKernel:
    def __init__(self, v: RopeCacheVariant):
        self.v = v
        self.dt = cutlass_dtype(v.dtype)

    @cute.jit
    def launch(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mPos: cute.Tensor, mCS: cute.Tensor,
               mKC: cute.Tensor, mVC: cute.Tensor, mSlot: cute.Tensor, stream: cuda.CUstream):
        T = cute.size(mQ, mode=[0])
        # (the scale arguments are read only by the fp8 form: cos_sin_cache stands in for them)
        self.kernel(mQ, mK, mV, mPos, mCS, mKC, mVC, mSlot, mCS, mCS).launch(
            grid=(T, 1, 1), block=(self.v.threads, 1, 1), stream=stream)

    @cute.jit
    def launch_fp8(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mPos: cute.Tensor, mCS: cute.Tensor,
                   mKC: cute.Tensor, mVC: cute.Tensor, mSlot: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor,
                   stream: cuda.CUstream):
        T = cute.size(mQ, mode=[0])
        self.kernel(mQ, mK, mV, mPos, mCS, mKC, mVC, mSlot, mKS, mVS).launch(
            grid=(T, 1, 1), block=(self.v.threads, 1, 1), stream=stream)

    @cute.jit
    def _rotate(self, gH, gCS, rx, rc, rs, w, half):
        """Rotate unit ``w`` of one head (``gH``: the head as (VEC, D/VEC) vectors) in the
        registers ``rx`` (2 vectors for neox, 1 interleaved); ``gCS``: the position's cos/sin row
        as (VEC, R/VEC) vectors for neox, (VEC/2, 2R/VEC) for interleaved."""
        if cutlass.const_expr(self.v.neox):
            cute.autovec_copy(gH[None, w], rx[None, 0])
            cute.autovec_copy(gH[None, w + half // VEC], rx[None, 1])
            cute.autovec_copy(gCS[None, w], rc)
            cute.autovec_copy(gCS[None, w + half // VEC], rs)
            x1 = rx[None, 0].load().to(F32)
            x2 = rx[None, 1].load().to(F32)
            c = rc.load()
            s = rs.load()
            rx[None, 0].store((x1 * c - x2 * s).to(self.dt))
            rx[None, 1].store((x2 * c + x1 * s).to(self.dt))
        else:
            cute.autovec_copy(gH[None, w], rx[None, 0])
            cute.autovec_copy(gCS[None, w], rc[None, 0])  # VEC/2 cosines
            cute.autovec_copy(gCS[None, w + half * 2 // VEC], rs[None, 0])
            for j in cutlass.range_constexpr(VEC // 2):
                a = rx[2 * j, 0].to(F32)
                b = rx[2 * j + 1, 0].to(F32)
                c = rc[j, 0]
                s = rs[j, 0]
                rx[2 * j, 0] = (a * c - b * s).to(self.dt)
                rx[2 * j + 1, 0] = (b * c + a * s).to(self.dt)

    @cute.jit
    def _store(self, rx, gH, w, half):
        cute.autovec_copy(rx[None, 0], gH[None, w])
        if cutlass.const_expr(self.v.neox):
            cute.autovec_copy(rx[None, 1], gH[None, w + half // VEC])

    @cute.jit
    def _store_cache(self, rx, gC, w, half, inv):
        """``_store`` into a cache row: as it is, or (fp8 caches) as e4m3(x · inv), saturating."""
        if cutlass.const_expr(self.v.fp8_cache):
            rq = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float8E4M3FN)
            rq.store((rx[None, 0].load().to(F32) * inv).to(cutlass.Float8E4M3FN))
            cute.autovec_copy(rq, gC[None, w])
            if cutlass.const_expr(self.v.neox):
                rq.store((rx[None, 1].load().to(F32) * inv).to(cutlass.Float8E4M3FN))
                cute.autovec_copy(rq, gC[None, w + half // VEC])
        else:
            self._store(rx, gC, w, half)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mPos: cute.Tensor, mCS: cute.Tensor,
               mKC: cute.Tensor, mVC: cute.Tensor, mSlot: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor):
        NT = self.v.threads
        tidx, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        HQ = cute.size(mQ, mode=[1])
        HKV = cute.size(mK, mode=[1])
        D = cute.size(mQ, mode=[2])
        R = cute.size(mCS, mode=[1])
        MAXPOS = cute.size(mCS, mode=[0])
        P = cute.size(mKC, mode=[0])
        PS = cute.size(mKC, mode=[1])
        half = R // 2
        # neox: a unit is a vector in the first half and its partner; interleaved: one vector.
        upr = half // VEC if cutlass.const_expr(self.v.neox) else R // VEC
        dv = D // VEC

        if cutlass.const_expr(self.v.table):
            # mPos: cache_seqlens (B,), mSlot: block_table (B, MP)
            B = cute.size(mPos, mode=[0])
            MP = cute.size(mSlot, mode=[1])
            sq = cute.size(mQ, mode=[0]) // B
            b = t // sq
            p0 = cutlass.Int64(mPos[b]) + cutlass.Int64(t - b * sq)
            pi = p0 // cutlass.Int64(PS)
            pi_ok = p0 >= 0 and pi < cutlass.Int64(MP)
            page = cutlass.Int64(mSlot[b, cutlass.Int32(cutlass.min(cutlass.max(pi, cutlass.Int64(0)),
                                                                      cutlass.Int64(MP) - 1))])
            write = pi_ok and page >= 0 and page < cutlass.Int64(P)
            off = p0 - pi * cutlass.Int64(PS)
            pos = cutlass.max(cutlass.min(p0, cutlass.Int64(MAXPOS) - 1), cutlass.Int64(0))
        else:
            pos = mPos[t]
            pos = cutlass.max(cutlass.min(pos, cutlass.Int64(MAXPOS) - 1), cutlass.Int64(0))
            slot = mSlot[t]
            write = slot >= 0 and slot < cutlass.Int64(P) * cutlass.Int64(PS)
            page = slot // cutlass.Int64(PS)
            off = slot - page * cutlass.Int64(PS)
        cvec = VEC if cutlass.const_expr(self.v.neox) else VEC // 2
        gCS = cute.zipped_divide(mCS[cutlass.Int32(pos), None], (cvec,))

        rx = cute.make_rmem_tensor(cute.make_layout((VEC, 2)), self.dt)
        if cutlass.const_expr(self.v.neox):
            rc = cute.make_rmem_tensor(cute.make_layout(VEC), F32)
            rs = cute.make_rmem_tensor(cute.make_layout(VEC), F32)
        else:
            rc = cute.make_rmem_tensor(cute.make_layout((VEC // 2, 1)), F32)
            rs = cute.make_rmem_tensor(cute.make_layout((VEC // 2, 1)), F32)

        for u in range(tidx, HQ * upr, NT):
            h = u // upr
            w = u - h * upr
            gH = cute.zipped_divide(mQ[t, h, None], (VEC,))
            self._rotate(gH, gCS, rx, rc, rs, w, half)
            self._store(rx, gH, w, half)
        for u in range(tidx, HKV * upr, NT):
            h = u // upr
            w = u - h * upr
            gH = cute.zipped_divide(mK[t, h, None], (VEC,))
            self._rotate(gH, gCS, rx, rc, rs, w, half)
            self._store(rx, gH, w, half)
            if write:
                inv = F32(1.0)
                if cutlass.const_expr(self.v.fp8_cache):
                    inv = cute.arch.rcp_approx(mKS[h])
                self._store_cache(rx, cute.zipped_divide(mKC[cutlass.Int32(page), cutlass.Int32(off), h, None],
                                                             (VEC,)), w, half, inv)
        if write:
            pg = cutlass.Int32(page)
            of = cutlass.Int32(off)
            rv = cute.make_rmem_tensor(cute.make_layout(VEC), self.dt)
            npass = dv - R // VEC  # the k vectors past the rotary part
            for u in range(tidx, HKV * npass, NT):
                h = u // npass
                w = u - h * npass + R // VEC
                cute.autovec_copy(cute.zipped_divide(mK[t, h, None], (VEC,))[None, w], rv)
                self._copy_cache(rv, cute.zipped_divide(mKC[pg, of, h, None], (VEC,))[None, w], mKS, h)
            for u in range(tidx, HKV * dv, NT):
                h = u // dv
                w = u - h * dv
                cute.autovec_copy(cute.zipped_divide(mV[t, h, None], (VEC,))[None, w], rv)
                self._copy_cache(rv, cute.zipped_divide(mVC[pg, of, h, None], (VEC,))[None, w], mVS, h)

    @cute.jit
    def _copy_cache(self, rv, gDst, mScale, h):
        """One vector of a token's k or v into its cache row (fp8 caches: e4m3(x / scale[h]))."""
        if cutlass.const_expr(self.v.fp8_cache):
            rq = cute.make_rmem_tensor(cute.make_layout(VEC), cutlass.Float8E4M3FN)
            rq.store((rv.load().to(F32) * cute.arch.rcp_approx(mScale[h])).to(cutlass.Float8E4M3FN))
            cute.autovec_copy(rq, gDst)
        else:
            cute.autovec_copy(rv, gDst)
