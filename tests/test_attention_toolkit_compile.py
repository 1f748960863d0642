"""The attention toolkit's switched-off code paths compile: a small sm_80 kernel (one warp, one
m16n8k16 16 x 64 score tile) runs the mask with causal + sliding window (runtime window_left /
window_right), the softcap transform, the online softmax and the finalisation with an attention
sink, and the split-KV combine with a sink; it is compiled for sm_80 and its SASS checked for what
those paths add (tanh on the MUFU, the window's compares).  No family builds these switches yet,
so without this nothing would trace them.  Nothing runs (no GPU needed): the numbers are not
checked here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                reason="nvidia-cutlass-dsl is not installed")

_WORKER = textwrap.dedent(
    """
    import json, re, sys
    from factory.compiler.compile import init_worker
    init_worker("sm_80")
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor
    from factory.atoms.sm80 import acc_mn_view
    from factory.attention import mask, softmax
    from factory.compiler.cubin import disassemble, extract_cubins, opcode_histogram

    M, N, D, SPLITS = 16, 64, 64, 4
    SPEC = mask.MaskSpec(causal=True, local=True)


    class Probe:
        @cute.kernel
        def tile(self, mS: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mSink: cute.Tensor,
                 mTiles: cute.Tensor, q_len: cutlass.Int32, k_len: cutlass.Int32,
                 window_left: cutlass.Int32, window_right: cutlass.Int32, softmax_scale: cutlass.Float32,
                 softcap: cutlass.Float32, tiled_mma: cute.TiledMma):
            tidx, _, _ = cute.arch.thread_idx()
            thr = tiled_mma.get_slice(tidx)
            tSg = thr.partition_C(mS)
            acc_S = cute.make_rmem_tensor(thr.partition_shape_C((M, N)), cutlass.Float32)
            for i in cutlass.range_constexpr(cute.size(acc_S)):
                acc_S[i] = tSg[i]
            acc_O = cute.make_rmem_tensor(thr.partition_shape_C((M, N)), cutlass.Float32)
            acc_O.fill(1.0)
            cS = acc_mn_view(thr.partition_C(cute.make_identity_tensor((M, N))))
            win = mask.window(SPEC, window_left, window_right, q_len, k_len)
            kt = mask.key_tiles(SPEC, 0, M, q_len, k_len, N, win=win)
            if tidx == 0:
                mTiles[0] = kt.lo
                mTiles[1] = kt.hi
                mTiles[2] = kt.mask_lo
                mTiles[3] = kt.mask_hi
            scale_log2, factor = softmax.log2_scale(softmax_scale, softcap)
            softmax.softcap_scores(acc_S, factor)
            mask.apply_mask(SPEC, acc_mn_view(acc_S), cS, 0, 0, q_len, k_len, win=win)
            row_max, row_sum = softmax.row_state(acc_O.shape[0][1] * acc_O.shape[1])
            softmax.online_softmax(acc_mn_view(acc_S), row_max, row_sum, scale_log2, o_mn=acc_mn_view(acc_O))
            softmax.finalize(acc_mn_view(acc_O), cS, row_max, row_sum, scale_log2, 0, q_len, mLSE, tidx,
                             sink=mSink[0])
            tOg = thr.partition_C(mO)
            for i in cutlass.range_constexpr(cute.size(acc_O)):
                tOg[i] = acc_O[i]

        @cute.kernel
        def combine(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                    mSink: cute.Tensor):
            softmax.combine_splits(mOp, mLp, mO, mLSE, D, SPLITS, cutlass.BFloat16, 4, sink=mSink[0])

        @cute.jit
        def run(self, mS, mO, mLSE, mSink, mTiles, mOp, mLp, mO2, mLSE2, q_len: cutlass.Int32,
                k_len: cutlass.Int32, window_left: cutlass.Int32, window_right: cutlass.Int32,
                softmax_scale: cutlass.Float32, softcap: cutlass.Float32, stream: cuda.CUstream):
            tiled_mma = cute.make_tiled_mma(
                cute.nvgpu.warp.MmaF16BF16Op(cutlass.BFloat16, cutlass.Float32, (16, 8, 16)), (1, 1, 1),
                permutation_mnk=(16, 16, 16))
            self.tile(mS, mO, mLSE, mSink, mTiles, q_len, k_len, window_left, window_right, softmax_scale,
                      softcap, tiled_mma).launch(grid=(1, 1, 1), block=[32, 1, 1], stream=stream)
            self.combine(mOp, mLp, mO2, mLSE2, mSink).launch(grid=(1, 1, 1), block=[128, 1, 1], stream=stream)


    f32, bf16, i32 = cutlass.Float32, cutlass.BFloat16, cutlass.Int32
    args = [make_fake_tensor(f32, (M, N), (N, 1)), make_fake_tensor(f32, (M, N), (N, 1)),
            make_fake_tensor(f32, (M,), (1,)), make_fake_tensor(f32, (1,), (1,)),
            make_fake_tensor(i32, (4,), (1,)),
            make_fake_tensor(f32, (SPLITS, 1, 1, 4, D), (4 * D, 4 * D, 4 * D, D, 1)),
            make_fake_tensor(f32, (SPLITS, 1, 1, 4), (4, 4, 4, 1)),
            make_fake_tensor(bf16, (1, 4, 1, D), (4 * D, D, D, 1), assumed_align=16),
            make_fake_tensor(f32, (1, 1, 4), (4, 4, 1)),
            i32(0), i32(0), i32(0), i32(0), f32(0), f32(0), cuda.CUstream(0)]
    compiled = cute.compile(Probe().run, *args, options="--gpu-arch sm_80")
    compiled.export_to_c(file_path=sys.argv[1], file_name="probe", function_prefix="probe")
    cubin = extract_cubins(open(sys.argv[1] + "/probe.o", "rb").read())[0]
    open(sys.argv[1] + "/probe.cubin", "wb").write(cubin)
    sass = disassemble(sys.argv[1] + "/probe.cubin")
    print("REPORT" + json.dumps({"hist": opcode_histogram(sass)}))
    """
)


def test_toolkit_switches_compile(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    worker = tmp_path / "probe_worker.py"  # the DSL reads kernel sources from a file
    worker.write_text(_WORKER)
    p = subprocess.run([sys.executable, str(worker), str(tmp_path)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    hist = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("REPORT"))[6:])["hist"]
    # softcap: one tanh per score of the thread's 16 x 64 share (32 scores)
    assert hist.get("MUFU.TANH", 0) >= 32, hist
    # the mask: a select per score and side (causal/tail and the window's left side)
    assert hist.get("FSEL", 0) >= 2 * 32, hist
    assert hist.get("MUFU.EX2", 0) >= 32 and hist.get("MUFU.LG2", 0) >= 2, hist
