"""FlashAttention-4-class forward for Blackwell datacenter GPUs (sm_100a): warp-specialised, two
query tiles ping-ponged per CTA, S, P and O in Tensor Memory.  Our own CuTe DSL kernel.

One CTA computes 2 x 128 query rows (two "Q tiles", stages 0 and 1) of one (q head, batch) and
walks the key tiles they see, the last first.  16 warps:

* warps 0-3 and 4-7 — **softmax** warpgroups, one per Q tile: thread t owns row t of its tile =
  TMEM lane t.  Per key tile: wait for S = Q·Kᵀ (tcgen05.commit), tcgen05.ld the row (128 fp32),
  mask (key tail, bottom-right causal diagonal) where the tile needs it, row max; if the max grew
  by more than 2^8 (``RESCALE_THRESHOLD``) the rescale factor goes to shared memory for the
  correction warpgroup, else the old max stays (P <= 2^8) and the factor is 1; exp2 — 3/4 on
  MUFU.EX2, 1/4 as an FMA polynomial (attention/sm100_logic.py) —, P to 16 bits, tcgen05.st
  into the S columns it came from (P aliases S: columns BN/2..BN of the tile's S), and one
  mbarrier arrive per thread tells the MMA warp that P is there (after tcgen05.wait::st and
  tcgen05.fence::before_thread_sync; every TMEM handoff between threads is fenced so).  At the end, row sum and max for the
  correction warpgroup.
* warps 8-11 — the **correction** warpgroup: per key tile and Q tile, rescales the running O in
  TMEM (tcgen05.ld, multiply, tcgen05.st) when some row of its warp needs it, off the softmax's
  critical path, and tells the MMA warp the O tile is ready; at the end O / row sum from TMEM ->
  16 bits -> global, and the LSE.  Warp 8 allocates the 512 TMEM columns and frees them.
* warp 12 — the **MMA** warp: S0 = Q0·K0ᵀ, S1 = Q1·K0ᵀ, then per key tile j:
  O0 += P0·V(j-1), S0 = Q0·K(j)ᵀ, O1 += P1·V(j-1), S1 = Q1·K(j)ᵀ, and the last P·V.  Q and K
  from smem (SS form); P·V takes P from TMEM as its A operand (tcgen05.mma ``[a_tmem]``: the TS
  form), V from smem MN-major.  S(j+1) overwrites the P(j) it aliases only after P(j)·V was
  issued: tcgen05.mma from one thread run in issue order.
* warp 13 — the **TMA** warp: Q0, K, Q1, V, then K and V of each tile into two rings
  (``PipelineTmaUmma``: "full" completed by the TMA's bytes, "empty" by the MMA's commit).
* warps 14-15: idle (setmaxnreg works on whole warpgroups: 4 x 4 warps).

Registers (setmaxnreg): softmax 208, correction 72, MMA/TMA/idle 24 (2·208 + 72 + 24 = 512 per
thread slot of a warpgroup: the SM's 64K).  FA4's 192/80/48 left one spilled value in the varlen
softmax; O moves in 16-column chunks so the correction needs ~50.  TMEM: S0 [0, 128), S1 [128, 256), O0 [256, 256 + D),
O1 [256 + D, 256 + 2D); P_s in the second half of S_s's columns.

Handshakes (mbarriers, one per Q tile s): ``s_full`` (MMA commit -> softmax), ``p_ready`` (softmax
128 + correction 128 arrivals -> MMA: P(j) is in TMEM and O was rescaled for step j), ``stats``
(softmax -> correction: the rescale factor of step j >= 1), ``final`` (softmax -> correction: row
sum and max), ``o_full`` (MMA commit after the last P·V -> correction).  The correction may touch
O_s for step j once it has the factor: the softmax sent it after S_s(j) completed, and S_s(j) was
committed after P_s(j-1)·V, so that has completed too.  Every wait reads a phase that cannot have
been overtaken (each producer's next arrival depends on the consumer's last).

Varlen (cu_seqlens): a CTA offsets the (tokens, D, heads) TMA tensors to its sequence (boxes past
its end read the next sequence's rows, masked for K/V and never stored for Q) and leaves at once if
its first row is past the sequence (the grid is sized by max_seqlen_q).  GQA: kv head = q head //
(Hq / Hkv).  A row with no visible key writes O = 0 and LSE = -inf.  Causal grids start with the
last query tiles (the longest rows).  O leaves by 16-byte stores, one row per thread.

Nothing here has run (no Blackwell GPU): the proof is the SASS (sass-only).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05
from cutlass.utils import blackwell_helpers as bw

from ..abi import DTYPE_BYTES
from ..atoms import sm100 as atoms
from ..atoms.smem import SMEM_ALIGN as _SMEM_ALIGN
from ..atoms.smem import STATIC_SMEM as _STATIC_SMEM
from ..atoms.smem import round_up as _round_up
from ..atoms.targets import Target
from ..registry import register
from . import keyrange, layout, mask
from . import sm100_logic as logic
from .base import DTYPES, TOOLKIT_SOURCES, AttentionVariant, causal_field, varlen_field
from .softmax import LN_2, LOG2_E

HEAD_DIMS = (64, 128)
TILE_M = 128  # rows of one Q tile = tcgen05.mma M = TMEM lanes = threads of a warpgroup
Q_STAGES = 2  # Q tiles per CTA (ping-pong)
CTA_M = TILE_M * Q_STAGES
TILE_N = 128
THREADS = 512
MIN_SEQLEN_Q = 2

SOFTMAX_WARPS = 8  # warps 0-7: two warpgroups
CORRECTION_WARP0 = 8  # warps 8-11
MMA_WARP = 12
LOAD_WARP = 13
REGS_SOFTMAX = 208
REGS_CORRECTION = 72
REGS_OTHER = 24

TMEM_COLUMNS = 512
_CHUNK = 16  # TMEM columns per tcgen05.ld/st of O (rescale, epilogue)
_HEADER_BYTES = 4096  # mbarriers, the TMEM address, the softmax -> correction row statistics


class _Bar(enum.IntEnum):
    """Named hardware barriers (id 0 is the CTA-wide bar.sync)."""

    CORRECTION = 1  # the correction warpgroup, before warp 8 frees the TMEM


def kv_stages(head_dim: int) -> int:
    """K and V ring depth (each): what fits next to Q in 227 KB."""
    return 2 if head_dim == 128 else 3


# tcgen05.mma with 16-bit operands (UTCHMMA; both the smem-A form for S = Q·Kᵀ and the TMEM-A form
# for O += P·V), TMEM alloc/free (UTCATOMSWS), tcgen05.ld/st (LDTM/STTM), tcgen05.commit (UTCBAR),
# mbarriers (SYNCS), setmaxnreg (USETMAXREG), MUFU.EX2 and the emulated exp2's round-down add
# (FADD.RM or its packed form: the Cody-Waite floor, which nothing else in the kernel emits).
SASS_COMMON = (r"\bUTCHMMA\b", r"\bUTCATOMSWS\.AND\b", r"\bUTCATOMSWS\.FIND_AND_SET\b",
               r"\bLDTM\.", r"\bSTTM\.", r"\bUTCBAR\b", r"\bSYNCS\.", r"\bUSETMAXREG\b",
               r"\bMUFU\.EX2\b", r"\bFADD2?(?:\.FTZ)?\.RM\b")
# The TMEM-A form: UTCHMMA whose first source is tmem[...] (the SS form reads gdesc[...]).
SASS_TMEM_A = r"\bUTCHMMA\s+tmem\["


@dataclass(frozen=True, kw_only=True)
class AttentionSm100Fa4(AttentionVariant):
    family: ClassVar[str] = "sm100"
    sources = ("attention/sm100_fa4.py", "attention/sm100_logic.py", "atoms/sm100.py", "attention/layout.py",
               "atoms/smem.py", *TOOLKIT_SOURCES)
    HEAD_DIMS = HEAD_DIMS

    q_tiles: int = field(default=Q_STAGES, metadata={"tag": "q"})
    tile_n: int = field(default=TILE_N, metadata={"tag": "n"})
    causal: bool = causal_field()
    varlen: bool = varlen_field()

    @property
    def stages(self) -> int:
        return kv_stages(self.head_dim)

    @property
    def tmem_used(self) -> int:
        return Q_STAGES * self.tile_n + Q_STAGES * self.head_dim

    @property
    def tmem_cols(self) -> int:
        return atoms.tmem_alloc_columns(self.tmem_used)

    def sass_requirements(self) -> tuple[str, ...]:
        from ..gemm.sm100 import sass_tmem_alloc
        tma = r"\bUTMALDG\.3D\b" if self.varlen else r"\bUTMALDG\.4D\b"
        return SASS_COMMON + (SASS_TMEM_A, tma, sass_tmem_alloc(self.tmem_cols))

    def proof_level(self) -> str:
        return "sass-only"

    def smem_bytes(self) -> int:
        e = DTYPE_BYTES[self.dtype]
        q = Q_STAGES * _round_up(TILE_M * self.head_dim * e, _SMEM_ALIGN)
        kv = 2 * self.stages * _round_up(self.tile_n * self.head_dim * e, _SMEM_ALIGN)
        return _HEADER_BYTES + q + kv

    def can_implement(self) -> str | None:
        t = self.tgt
        if t.family != "sm100" or not t.tmem:
            return f"target {self.target} is not a Blackwell datacenter (sm100) target"
        if (problem := self.check_problem()) is not None:
            return problem
        if self.q_tiles != Q_STAGES or self.tile_n != TILE_N:
            return f"the structure is {Q_STAGES} Q tiles of {TILE_M} rows, {TILE_N}-key tiles"
        if self.tmem_cols > atoms.TMEM_COLUMNS:
            return f"needs {self.tmem_cols} TMEM columns"
        return self.smem_problem(_STATIC_SMEM)

    def describe(self) -> dict[str, Any]:
        return {
            **self.contract_fields(),
            # The rows one CTA covers (the loader counts CTAs with tile[0]).
            "tile": [CTA_M, self.tile_n],
            "warps": THREADS // 32,
            "stages": self.stages,
            "splits": 1,
            "pack_gqa": False,
            "structure": ("fa4: 2 x 128-row Q tiles ping-ponged by two softmax warpgroups, a "
                          "correction warpgroup, MMA and TMA warps; S, P, O in TMEM (P·V reads P "
                          "from TMEM); exp2 1/4 emulated"),
            "registers_per_role": {"softmax": REGS_SOFTMAX, "correction": REGS_CORRECTION,
                                   "mma_tma": REGS_OTHER},
            "ex2_emulation": {"degree": logic.EX2_DEGREE[self.dtype],
                              "fraction": logic.EX2_EMU_COUNT / logic.EX2_EMU_GROUP},
            "smem_bytes": self.smem_bytes(),
            "tmem_columns": self.tmem_cols,
            "min_seqlen_q": MIN_SEQLEN_Q,
            "ctas_per_sm": 1,
            "threads": THREADS,
            "preferred": True,
        }

    def make_kernel(self):
        k = FlashFwdSm100Fa4(dtype=self.cutlass_dtype, head_dim=self.head_dim,
                             causal=self.causal, stages=self.stages, tmem_cols=self.tmem_cols,
                             smem_plan=self.smem_bytes(), ex2_degree=logic.EX2_DEGREE[self.dtype])
        return k.packed if self.varlen else k.dense


# Key-tile arithmetic: the DSL's, dividing by adding bn - 1 (as this kernel was verified).
_OPS = mask.DSL._replace(ceil_div=keyrange.PY.ceil_div)


# ------------------------------------------------------------------------------------------------
# exp2 on the FMA pipe (two at a time: packed f32x2 operations)
# ------------------------------------------------------------------------------------------------
@cute.jit
def _ex2_emulated_x2(x0: cutlass.Float32, x1: cutlass.Float32, degree: cutlass.Constexpr[int]):
    """2^x0, 2^x1 without MUFU: x = j + f (j = floor x by a round-down add of 1.5·2^23), p(f) by
    Horner on packed FMAs, j added to p's exponent field.  x <= 127 (the rescale threshold keeps
    x <= 8); x <= -127 gives exactly 0."""
    magic = logic.EX2_ROUND_MAGIC
    x0 = cute.arch.fmax(x0, logic.EX2_CLAMP)
    x1 = cute.arch.fmax(x1, logic.EX2_CLAMP)
    r0, r1 = cute.arch.add_packed_f32x2((x0, x1), (magic, magic), rnd="rm")
    b0, b1 = cute.arch.sub_packed_f32x2((r0, r1), (magic, magic))
    f0, f1 = cute.arch.sub_packed_f32x2((x0, x1), (b0, b1))
    c = logic.EX2_POLY[degree]
    p0, p1 = cutlass.Float32(c[degree]), cutlass.Float32(c[degree])
    for k in cutlass.range_constexpr(degree - 1, -1, -1):
        p0, p1 = cute.arch.fma_packed_f32x2((p0, p1), (f0, f1), (c[k], c[k]))
    return _ex2_combine(r0, p0), _ex2_combine(r1, p1)


@cute.jit
def _ex2_combine(rounded: cutlass.Float32, frac_ex2: cutlass.Float32) -> cutlass.Float32:
    """bits(frac_ex2) + (bits(rounded) << 23): floor(x) into the exponent field."""
    return cute.arch.inline_ptx(
        "{\n.reg .b32 fx_r, fx_p;\nmov.b32 fx_r, {$r0};\nmov.b32 fx_p, {$r1};\n"
        "shl.b32 fx_r, fx_r, 23;\nadd.s32 fx_p, fx_p, fx_r;\nmov.b32 {$w0}, fx_p;\n}",
        write_only_types=[cutlass.Float32], read_only_args=[rounded, frac_ex2])


# ------------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------------
class FlashFwdSm100Fa4(layout.TmaViewsKernel):
    def __init__(self, *, dtype, head_dim: int, causal: bool, stages: int, tmem_cols: int,
                 smem_plan: int, ex2_degree: int):
        super().__init__(dtype=dtype, head_dim=head_dim, causal=causal)
        self.stages = stages
        self.tmem_cols = tmem_cols
        self.smem_plan = smem_plan
        self.ex2_degree = ex2_degree
        self.cta_rows = CTA_M
        self.qk_tiler = (TILE_M, TILE_N, head_dim)
        self.pv_tiler = (TILE_M, head_dim, TILE_N)
        # TMEM columns (32-bit): S_s, P_s (inside S_s), O_s.
        self.tmem_s = (0, TILE_N)
        self.tmem_p = (TILE_N // 2, TILE_N + TILE_N // 2)
        self.tmem_o = (2 * TILE_N, 2 * TILE_N + head_dim)

    # --- host ------------------------------------------------------------------------------------
    # (dense, packed: layout.TmaViewsKernel)
    @cute.jit
    def _launch(self, mQ, mK, mVt, mO, lse, mCuQ, mCuK, softmax_scale, grid, stream):
        dt, S = self.dtype, self.stages
        qk_mma = bw.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K,
                                           cutlass.Float32, tcgen05.CtaGroup.ONE, self.qk_tiler[:2])
        pv_mma = atoms.tiled_mma_tmem_a(dt, OperandMajorMode.MN, self.pv_tiler[:2])
        sQ_layout = bw.make_smem_layout_a(qk_mma, self.qk_tiler, dt, Q_STAGES)
        sK_layout = bw.make_smem_layout_b(qk_mma, self.qk_tiler, dt, S)
        sV_layout = bw.make_smem_layout_b(pv_mma, self.pv_tiler, dt, S)

        vmnk = cute.make_layout((1, 1, 1, 1))
        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_q, tQ = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, None, 0)), self.qk_tiler, qk_mma, vmnk.shape)
        tma_k, tK = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mK, cute.slice_(sK_layout, (None, None, None, 0)), self.qk_tiler, qk_mma, vmnk.shape)
        tma_v, tV = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mVt, cute.slice_(sV_layout, (None, None, None, 0)), self.pv_tiler, pv_mma, vmnk.shape)
        self.q_bytes = cute.size_in_bytes(dt, cute.slice_(sQ_layout, (None, None, None, 0)))
        self.k_bytes = cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, None, 0)))
        self.v_bytes = cute.size_in_bytes(dt, cute.slice_(sV_layout, (None, None, None, 0)))

        @cute.struct
        class SharedStorage:
            q_full: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            s_full: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            p_ready: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            stats: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            final: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            o_full: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            k_bars: cute.struct.MemRange[cutlass.Int64, 2 * S]
            v_bars: cute.struct.MemRange[cutlass.Int64, 2 * S]
            tmem_address: cutlass.Int32
            s_alpha: cute.struct.MemRange[cutlass.Float32, CTA_M]
            s_row_sum: cute.struct.MemRange[cutlass.Float32, CTA_M]
            s_row_max: cute.struct.MemRange[cutlass.Float32, CTA_M]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], _SMEM_ALIGN]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], _SMEM_ALIGN]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], _SMEM_ALIGN]

        self.shared_storage = SharedStorage
        # The smem plan (manifest, occupancy) is what the kernel allocates.
        if cutlass.const_expr(SharedStorage.size_in_bytes() != self.smem_plan):
            raise ValueError(f"SharedStorage is {SharedStorage.size_in_bytes()} B, the plan {self.smem_plan}")
        self.kernel(qk_mma, pv_mma, tma_q, tQ, tma_k, tK, tma_v, tV, mO, lse, mCuQ, mCuK,
                    softmax_scale * LOG2_E, sQ_layout, sK_layout, sV_layout,
                    ).launch(grid=grid, block=[THREADS, 1, 1], min_blocks_per_mp=1, stream=stream)

    # --- device ----------------------------------------------------------------------------------
    @cute.kernel
    def kernel(self, qk_mma: cute.TiledMma, pv_mma: cute.TiledMma,
               tma_q: cute.CopyAtom, mQ: cute.Tensor, tma_k: cute.CopyAtom, mK: cute.Tensor,
               tma_v: cute.CopyAtom, mVt: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
               mCuQ, mCuK, scale_log2: cutlass.Float32,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == LOAD_WARP:
            for atom in (tma_q, tma_k, tma_v):
                cpasync.prefetch_descriptor(atom)

        smem = utils.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        bars = (storage.q_full.data_ptr(), storage.s_full.data_ptr(), storage.p_ready.data_ptr(),
                storage.stats.data_ptr(), storage.final.data_ptr(), storage.o_full.data_ptr())
        stats = (storage.s_alpha.get_tensor(cute.make_layout(CTA_M)),
                 storage.s_row_sum.get_tensor(cute.make_layout(CTA_M)),
                 storage.s_row_max.get_tensor(cute.make_layout(CTA_M)))
        if warp == LOAD_WARP:
            with cute.arch.elect_one():
                q_full, s_full, p_ready, stat_bar, final, o_full = bars
                for s in cutlass.range_constexpr(Q_STAGES):
                    cute.arch.mbarrier_init(q_full + s, 1)
                    cute.arch.mbarrier_init(s_full + s, 1)
                    cute.arch.mbarrier_init(p_ready + s, 2 * TILE_M)  # softmax + correction rows
                    cute.arch.mbarrier_init(stat_bar + s, TILE_M)
                    cute.arch.mbarrier_init(final + s, TILE_M)
                    cute.arch.mbarrier_init(o_full + s, 1)
        kv_pipes = [
            pipeline.PipelineTmaUmma.create(
                barrier_storage=bar, num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
                tx_count=nbytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            for bar, nbytes in ((storage.k_bars.data_ptr(), self.k_bytes),
                                (storage.v_bars.data_ptr(), self.v_bytes))
        ]
        cute.arch.mbarrier_init_fence()

        tmem = atoms.tmem_allocator(storage.tmem_address, None, int(_Bar.CORRECTION), TILE_M,
                                    CORRECTION_WARP0, False)
        if warp == CORRECTION_WARP0:
            tmem.allocate(self.tmem_cols)
            tmem.relinquish_alloc_permit()
        atoms.tmem_fence_before_sync()
        cute.arch.barrier()  # barriers initialised, TMEM allocated
        atoms.tmem_fence_after_sync()

        # The roles.  Everything a role needs is derived after its setmaxnreg, so that no value
        # lives across the register reconfiguration (ptxas would spill it).
        if warp < SOFTMAX_WARPS:
            cute.arch.setmaxregister_increase(REGS_SOFTMAX)
            p = self.problem(mQ, mK, mVt, mO, mLSE, mCuQ, mCuK)
            stage = warp // 4
            s_layout = qk_mma.make_fragment_C(qk_mma.partition_shape_C(self.qk_tiler[:2])).layout
            self.softmax(stage, tidx % TILE_M, s_layout, tmem.retrieve_ptr(cutlass.Float32), bars,
                         stats, scale_log2, p["m0"] + stage * TILE_M, p["q_len"], p["k_len"],
                         p["n_hi"], p["n_mask"])
        elif warp < MMA_WARP:
            cute.arch.setmaxregister_decrease(REGS_CORRECTION)
            p = self.problem(mQ, mK, mVt, mO, mLSE, mCuQ, mCuK)
            o_layout = pv_mma.make_fragment_C(pv_mma.partition_shape_C(self.pv_tiler[:2])).layout
            tmem_ptr = tmem.retrieve_ptr(cutlass.Float32)
            if p["has_rows"]:
                self.correction(tidx % TILE_M, o_layout, tmem_ptr, bars, stats, p["seqO"],
                                p["seqL"], p["m_blk"], p["q_len"], p["n_hi"])
            # Every TMEM access of this warpgroup has completed (tcgen05.wait in each thread);
            # the other roles finished theirs before the last arrivals it waited on.
            atoms.tmem_fence_before_sync()
            cute.arch.barrier(barrier_id=int(_Bar.CORRECTION), number_of_threads=4 * 32)
            if warp == CORRECTION_WARP0:
                atoms.tmem_fence_after_sync()
                tmem.free(tmem_ptr, self.tmem_cols)
        else:
            cute.arch.setmaxregister_decrease(REGS_OTHER)
            # The TMA warp's code comes first: the MMA warp's ACCUMULATE updates of the tiled MMAs
            # must not reach another role's use of them.
            if warp == LOAD_WARP:
                p = self.problem(mQ, mK, mVt, mO, mLSE, mCuQ, mCuK)
                views = self.tma_views(tma_q, p["seqQ"], tma_k, p["seqK"], tma_v, p["seqVt"],
                                       qk_mma, pv_mma, sQ, sK, sV)
                self.load(tma_q, tma_k, tma_v, views, bars, kv_pipes, p["m_blk"], p["n_hi"])
            if warp == MMA_WARP:
                p = self.problem(mQ, mK, mVt, mO, mLSE, mCuQ, mCuK)
                s_layout = qk_mma.make_fragment_C(qk_mma.partition_shape_C(self.qk_tiler[:2])).layout
                o_layout = pv_mma.make_fragment_C(pv_mma.partition_shape_C(self.pv_tiler[:2])).layout
                self.mma(qk_mma, pv_mma, s_layout, o_layout, sQ, sK, sV,
                         tmem.retrieve_ptr(cutlass.Float32), bars, kv_pipes, p["n_hi"])

    @cute.jit
    def problem(self, mQ, mK, mVt, mO, mLSE, mCuQ, mCuK):
        """This CTA's problem: its sequence as (rows, D) views of q/k/o and (D, rows) of v, its
        LSE row, its rows and the key tiles they see (every role derives the same)."""
        m_blk, hq, b = cute.arch.block_idx()
        if cutlass.const_expr(self.causal):
            m_blk = cute.arch.grid_dim()[0] - 1 - m_blk  # the longest rows first
        q_len, k_len, seqQ, seqK, seqVt, seqO, seqL = layout.sequence_views(
            mQ, mK, mVt, mO, mLSE, mCuQ, mCuK, hq, b)
        m0 = m_blk * CTA_M
        has_rows = keyrange.cta_has_rows(m_blk, CTA_M, q_len)
        _, n_hi, _, n_mask = mask.key_tiles(self.mask, m0, m0 + CTA_M, q_len, k_len, TILE_N, _OPS)
        n_hi = cutlass.Int32(cutlass.select_(has_rows, n_hi, 0))
        return {"m_blk": m_blk, "m0": m0, "q_len": q_len, "k_len": k_len, "seqQ": seqQ,
                "seqK": seqK, "seqVt": seqVt, "seqO": seqO, "seqL": seqL, "has_rows": has_rows,
                "n_hi": n_hi, "n_mask": n_mask}

    # --- TMA warp --------------------------------------------------------------------------------
    @cute.jit
    def tma_views(self, tma_q, seqQ, tma_k, seqK, tma_v, seqVt, qk_mma, pv_mma, sQ, sK, sV):
        """(smem, global) TMA partitions of Q (per Q tile), K and V (per key tile)."""
        D = self.head_dim
        gQ = cute.local_tile(seqQ, (TILE_M, D), (None, None))  # (128, D, q tiles, 1)
        gK = cute.local_tile(seqK, (TILE_N, D), (None, None))  # (BN, D, key tiles, 1)
        gV = cute.local_tile(seqVt, (D, TILE_N), (None, None))  # (D, BN, 1, key tiles)
        tSgQ = qk_mma.get_slice(0).partition_A(gQ)
        tSgK = qk_mma.get_slice(0).partition_B(gK)
        tOgV = pv_mma.get_slice(0).partition_B(gV)
        tQsQ, tQgQ = cpasync.tma_partition(tma_q, 0, cute.make_layout(1), cute.group_modes(sQ, 0, 3),
                                           cute.group_modes(tSgQ, 0, 3))
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sK, 0, 3),
                                           cute.group_modes(tSgK, 0, 3))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sV, 0, 3),
                                           cute.group_modes(tOgV, 0, 3))
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    @cute.jit
    def load(self, tma_q, tma_k, tma_v, tma_views, bars, kv_pipes, m_blk, n_hi):
        q_full = bars[0]
        k_pipe, v_pipe = kv_pipes
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = tma_views
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        if n_hi > 0:
            for j in cutlass.range(n_hi, unroll=1):
                t = keyrange.tile_at(j, n_hi)
                if j == 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(q_full, self.q_bytes)
                    cute.copy(tma_q, tQgQ[(None, Q_STAGES * m_blk, 0)], tQsQ[(None, 0)],
                              tma_bar_ptr=q_full)
                k_pipe.producer_acquire(k_state)
                cute.copy(tma_k, tKgK[(None, t, 0)], tKsK[(None, k_state.index)],
                          tma_bar_ptr=k_pipe.producer_get_barrier(k_state))
                k_state.advance()
                if j == 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(q_full + 1, self.q_bytes)
                    cute.copy(tma_q, tQgQ[(None, Q_STAGES * m_blk + 1, 0)], tQsQ[(None, 1)],
                              tma_bar_ptr=q_full + 1)
                v_pipe.producer_acquire(v_state)
                cute.copy(tma_v, tVgV[(None, 0, t)], tVsV[(None, v_state.index)],
                          tma_bar_ptr=v_pipe.producer_get_barrier(v_state))
                v_state.advance()

    # --- MMA warp --------------------------------------------------------------------------------
    @cute.jit
    def mma(self, qk_mma, pv_mma, s_layout, o_layout, sQ, sK, sV, tmem_ptr, bars, kv_pipes, n_hi):
        q_full, s_full, p_ready, _stat, _final, o_full = bars
        k_pipe, v_pipe = kv_pipes
        tSrQ = qk_mma.make_fragment_A(sQ)  # (MMA, 1, D/16, 2)
        tSrK = qk_mma.make_fragment_B(sK)  # (MMA, 1, D/16, stages)
        tOrV = pv_mma.make_fragment_B(sV)  # (MMA, 1, BN/16, stages)
        tStS = [cute.make_tensor(tmem_ptr + self.tmem_s[s], s_layout) for s in range(Q_STAGES)]
        tOtO = [cute.make_tensor(tmem_ptr + self.tmem_o[s], o_layout) for s in range(Q_STAGES)]
        tOrP = [atoms.tmem_a_operand(pv_mma, self.pv_tiler, self.dtype, tmem_ptr, self.tmem_p[s])
                for s in range(Q_STAGES)]
        qk_blocks = cute.size(tSrQ, mode=[2])  # D / 16 tcgen05.mma per S tile (K = 16 each)
        pv_blocks = cute.size(tOrP[0], mode=[2])  # BN / 16 per P·V
        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if n_hi > 0:
            k_pipe.consumer_wait(k_state)
            for s in cutlass.range_constexpr(Q_STAGES):
                cute.arch.mbarrier_wait(q_full + s, 0)
                qk_mma.set(tcgen05.Field.ACCUMULATE, False)
                for kb in cutlass.range_constexpr(qk_blocks):
                    cute.gemm(qk_mma, tStS[s], tSrQ[(None, None, kb, s)],
                              tSrK[(None, None, kb, k_state.index)], tStS[s])
                    qk_mma.set(tcgen05.Field.ACCUMULATE, True)
                with cute.arch.elect_one():
                    tcgen05.commit(s_full + s)
            k_pipe.consumer_release(k_state)
            k_state.advance()
            for j in cutlass.range(1, n_hi, unroll=1):
                v_pipe.consumer_wait(v_state)
                for s in cutlass.range_constexpr(Q_STAGES):
                    # P_s(j-1) is in TMEM and O_s is rescaled for step j-1.
                    cute.arch.mbarrier_wait(p_ready + s, (j - 1) & 1)
                    atoms.tmem_fence_after_sync()
                    pv_mma.set(tcgen05.Field.ACCUMULATE, j > 1)
                    for kb in cutlass.range_constexpr(pv_blocks):
                        cute.gemm(pv_mma, tOtO[s], tOrP[s][(None, None, kb)],
                                  tOrV[(None, None, kb, v_state.index)], tOtO[s])
                        pv_mma.set(tcgen05.Field.ACCUMULATE, True)
                    if s == 0:
                        k_pipe.consumer_wait(k_state)
                    # Issued after P_s(j-1)·V: overwrites the P it aliases only after that read.
                    qk_mma.set(tcgen05.Field.ACCUMULATE, False)
                    for kb in cutlass.range_constexpr(qk_blocks):
                        cute.gemm(qk_mma, tStS[s], tSrQ[(None, None, kb, s)],
                                  tSrK[(None, None, kb, k_state.index)], tStS[s])
                        qk_mma.set(tcgen05.Field.ACCUMULATE, True)
                    with cute.arch.elect_one():
                        tcgen05.commit(s_full + s)
                v_pipe.consumer_release(v_state)
                v_state.advance()
                k_pipe.consumer_release(k_state)
                k_state.advance()
            v_pipe.consumer_wait(v_state)
            for s in cutlass.range_constexpr(Q_STAGES):
                cute.arch.mbarrier_wait(p_ready + s, (n_hi - 1) & 1)
                atoms.tmem_fence_after_sync()
                pv_mma.set(tcgen05.Field.ACCUMULATE, n_hi > 1)
                for kb in cutlass.range_constexpr(pv_blocks):
                    cute.gemm(pv_mma, tOtO[s], tOrP[s][(None, None, kb)],
                              tOrV[(None, None, kb, v_state.index)], tOtO[s])
                    pv_mma.set(tcgen05.Field.ACCUMULATE, True)
                with cute.arch.elect_one():
                    tcgen05.commit(o_full + s)
            v_pipe.consumer_release(v_state)

    # --- softmax warpgroups ------------------------------------------------------------------------
    @cute.jit
    def softmax(self, stage, t, s_layout, tmem_ptr, bars, stats, scale_log2, row0, q_len, k_len,
                n_hi, n_mask):
        """Warpgroup ``stage`` (0 or 1), thread ``t`` = row ``row0 + t`` = TMEM lane t."""
        _q, s_full, p_ready, stat_bar, final, _o = bars
        s_alpha, s_row_sum, s_row_max = stats
        dt = self.dtype
        tS = cute.make_tensor(tmem_ptr + stage * TILE_N, s_layout)[((None, None), 0, 0)]  # (128, BN)
        ld_s = atoms.tmem_copy_32x32b(tS, 32, store=False).get_slice(t)
        tStS = ld_s.partition_S(tS)
        tScS = ld_s.partition_D(cute.make_identity_tensor((TILE_M, TILE_N)))
        # P: BN 16-bit values in the last BN/2 columns of this stage's S.
        p_cols = TILE_N // 2
        tP = cute.make_tensor(tS.iterator + p_cols,
                              cute.composition(tS.layout, cute.make_layout((TILE_M, p_cols))))
        st_p = atoms.tmem_copy_32x32b(tP, 32, store=True).get_slice(t)
        tPtP = st_p.partition_D(tP)
        tPcP = st_p.partition_S(cute.make_identity_tensor((TILE_M, p_cols)))

        row = row0 + t
        limit = keyrange.key_limit(row, q_len, k_len, self.causal, cutlass.min, cutlass.max)
        row_max = -cutlass.Float32.inf
        row_sum = cutlass.Float32(0.0)
        for j in cutlass.range(n_hi, unroll=1):
            tile = keyrange.tile_at(j, n_hi)
            rS = cute.make_rmem_tensor(tScS.shape, cutlass.Float32)
            cute.arch.mbarrier_wait(s_full + stage, j & 1)
            atoms.tmem_fence_after_sync()
            cute.copy(ld_s, tStS, rS)
            cute.arch.fence_view_async_tmem_load()
            if keyrange.needs_mask(tile, n_mask):
                mask.mask_keys(rS, tScS, limit - tile * TILE_N)
            tile_max = rS.load().reduce(cute.ReductionOp.MAX, -cutlass.Float32.inf, 0)
            new_max = cutlass.max(row_max, tile_max * scale_log2)
            alpha = cutlass.Float32(1.0)
            if j == 0:
                row_max = new_max
            else:
                # Rescale only when the max grew past the threshold (then alpha <= 2^-8, or 0
                # from -inf); else keep the old max: P <= 2^threshold.
                if new_max > row_max + logic.RESCALE_THRESHOLD:
                    alpha = cute.math.exp2(row_max - new_max, fastmath=True)
                    row_max = new_max
                s_alpha[stage * TILE_M + t] = alpha
                cute.arch.mbarrier_arrive(stat_bar + stage)
            neg_max = -row_max
            if row_max == -cutlass.Float32.inf:
                neg_max = cutlass.Float32(0.0)  # no visible key yet: every P is exp2(-inf) = 0
            # exp2(s·scale - max): 3/4 on MUFU.EX2, 1/4 as a polynomial on the FMA pipe.
            for i in cutlass.range_constexpr(0, cute.size(rS), 2):
                x0, x1 = cute.arch.fma_packed_f32x2((rS[i], rS[i + 1]), (scale_log2, scale_log2),
                                                    (neg_max, neg_max))
                if cutlass.const_expr(logic.ex2_emulated_index(i)):
                    rS[i], rS[i + 1] = _ex2_emulated_x2(x0, x1, self.ex2_degree)
                else:
                    rS[i] = cute.math.exp2(x0, fastmath=True)
                    rS[i + 1] = cute.math.exp2(x1, fastmath=True)
            tile_sum = rS.load().reduce(cute.ReductionOp.ADD, cutlass.Float32(0.0), 0)
            # P in 16 bits, pairs packed in 32-bit registers in column order, into TMEM.
            rP32 = cute.make_rmem_tensor(tPcP.shape, cutlass.Float32)
            rP = cute.make_tensor(cute.recast_ptr(rP32.iterator, dtype=dt), rS.layout)
            rP.store(rS.load().to(dt))
            cute.copy(st_p, rP32, tPtP)
            cute.arch.fence_view_async_tmem_store()
            atoms.tmem_fence_before_sync()
            cute.arch.mbarrier_arrive(p_ready + stage)
            row_sum = row_sum * alpha + tile_sum
        if n_hi > 0:
            s_row_sum[stage * TILE_M + t] = row_sum
            s_row_max[stage * TILE_M + t] = row_max
            cute.arch.mbarrier_arrive(final + stage)

    # --- correction warpgroup ----------------------------------------------------------------------
    @cute.jit
    def correction(self, t, o_layout, tmem_ptr, bars, stats, seqO, seqL, m_blk, q_len, n_hi):
        """Thread ``t`` = TMEM lane t = row t of both Q tiles."""
        _q, _s, p_ready, stat_bar, final, o_full = bars
        s_alpha, s_row_sum, s_row_max = stats
        D, dt = self.head_dim, self.dtype
        tO = [cute.make_tensor(tmem_ptr + self.tmem_o[s], o_layout)[((None, None), 0, 0)]
              for s in range(Q_STAGES)]  # (128, D)
        tO_chunks = [cute.flat_divide(x, (TILE_M, _CHUNK)) for x in tO]  # (128, 32, 1, D/32)
        ld_o = atoms.tmem_copy_32x32b(tO_chunks[0][(None, None, 0, 0)], _CHUNK, store=False)
        st_o = atoms.tmem_copy_32x32b(tO_chunks[0][(None, None, 0, 0)], _CHUNK, store=True)
        thr_ld = ld_o.get_slice(t)
        thr_st = st_o.get_slice(t)
        tOld = [thr_ld.partition_S(x) for x in tO_chunks]
        tOst = [thr_st.partition_D(x) for x in tO_chunks]
        rO = cute.make_rmem_tensor(thr_ld.partition_D(cute.make_identity_tensor((TILE_M, _CHUNK))).shape,
                                   cutlass.Float32)
        rOut = cute.make_rmem_tensor(rO.shape, dt)

        if n_hi > 0:
            # Step 0 has nothing to rescale.
            for s in cutlass.range_constexpr(Q_STAGES):
                cute.arch.mbarrier_arrive(p_ready + s)
            for j in cutlass.range(1, n_hi, unroll=1):
                for s in cutlass.range_constexpr(Q_STAGES):
                    cute.arch.mbarrier_wait(stat_bar + s, (j - 1) & 1)
                    alpha = s_alpha[s * TILE_M + t]
                    # tcgen05.ld/st are warp-wide: rescale when any row of this warp needs it.
                    if cute.arch.vote_any_sync(alpha < cutlass.Float32(1.0)):
                        atoms.tmem_fence_after_sync()
                        for c in cutlass.range_constexpr(D // _CHUNK):
                            cute.copy(thr_ld, tOld[s][(None, None, None, 0, c)], rO)
                            cute.arch.fence_view_async_tmem_load()
                            for i in cutlass.range_constexpr(0, cute.size(rO), 2):
                                rO[i], rO[i + 1] = cute.arch.mul_packed_f32x2((rO[i], rO[i + 1]),
                                                                              (alpha, alpha))
                            cute.copy(thr_st, rO, tOst[s][(None, None, None, 0, c)])
                        cute.arch.fence_view_async_tmem_store()
                        atoms.tmem_fence_before_sync()
                    cute.arch.mbarrier_arrive(p_ready + s)

        # Epilogue: O / row sum -> 16 bits -> global, one row per thread; LSE (natural log).
        for s in cutlass.range_constexpr(Q_STAGES):
            row = (m_blk * Q_STAGES + s) * TILE_M + t
            inv = cutlass.Float32(0.0)
            lse = -cutlass.Float32.inf
            if n_hi > 0:
                cute.arch.mbarrier_wait(final + s, 0)
                row_sum = s_row_sum[s * TILE_M + t]
                row_max = s_row_max[s * TILE_M + t]
                if row_sum > cutlass.Float32(0.0):
                    inv = cute.arch.rcp_approx(row_sum)
                    lse = (row_max + cute.math.log2(row_sum, fastmath=True)) * LN_2
                cute.arch.mbarrier_wait(o_full + s, 0)
                atoms.tmem_fence_after_sync()
            gO = cute.local_tile(seqO, (TILE_M, _CHUNK), (m_blk * Q_STAGES + s, None))  # (128, 32, D/32)
            tOgO = thr_ld.partition_D(gO)
            for c in cutlass.range_constexpr(D // _CHUNK):
                rO.fill(0.0)  # no key tile ran: O's TMEM columns were never written
                if n_hi > 0:
                    cute.copy(thr_ld, tOld[s][(None, None, None, 0, c)], rO)
                    cute.arch.fence_view_async_tmem_load()
                for i in cutlass.range_constexpr(cute.size(rO)):
                    rOut[i] = (rO[i] * inv).to(dt)
                if row < q_len:
                    cute.autovec_copy(rOut, tOgO[(None, None, None, c)])
            if row < q_len:
                seqL[row] = lse


# ------------------------------------------------------------------------------------------------
# Enumeration
# ------------------------------------------------------------------------------------------------
@register("attention")
def enumerate_attention(target: Target, tier: str) -> list[AttentionSm100Fa4]:
    if target.family != "sm100":
        return []
    if tier == "test":
        # dense bf16 D128 causal (4D TMA, degree-3 exp2); varlen f16 D64 (3D TMA, degree 5)
        specs = [("bf16", 128, True, False), ("f16", 64, False, True)]
    else:
        specs = [(dt, d, c, vl) for dt in DTYPES for d in (128, 64) for c in (False, True)
                 for vl in (False, True)]
    out = [AttentionSm100Fa4(target=target.name, dtype=dt, head_dim=d, causal=c, varlen=vl)
           for dt, d, c, vl in specs]
    return [v for v in out if v.can_implement() is None]
