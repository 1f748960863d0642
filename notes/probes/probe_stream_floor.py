#!/usr/bin/env python3
"""Probe: how fast can *any* kernel read a decode GEMM's bytes on this GPU, timed the way bench.py
times a GEMM?

Answer (H100 SXM, 2026-11-22, results committed in 05a3caf 15:07 UTC and cc898cb 16:52 UTC;
notes/gemm-sm90.md, "Where a decode GEMM's time goes" and "The register-fed prototype with PDL"):
for fp8 16x4096x4096 (17 MB, copy floor 6.98 us) the fastest plain 16-byte-load read takes 7.27-7.38
us (1.04-1.06x the floor), the fastest TMA-bulk read 8.32-8.35 us (1.19-1.20x; 7.97-8.02 in graphs
of 8), so only plain loads could meet the 1.1x line there. The register-fed prototype below, with
pre-packed weights loaded before its PDL wait in CTAs of 128 weight rows x K/4 (no cross-CTA
reduction yet), took 7.17 us at M = 16: the design factory/gemm/decode.py then followed.

The decode-GEMM criterion of the Hopper issue compares a GEMM with bytes / (1 GiB copy bandwidth).
For a 16-50 MB weight stream a kernel also pays its launch, the first bytes' DRAM latency and its
tail, none of which that floor holds.  This probe measures those costs directly with kernels that
do nothing but read (no GEMM in them), in graphs of back-to-back calls rotating over enough input
sets to defeat the L2 (factory.benchmark.time_graph, the same timer as bench.py):

- ``empty``: a kernel that does nothing; per-call time in graphs of n calls (n = 1..64).
- ``ldg``: each CTA streams one contiguous chunk with 16-byte loads, ``unroll`` loads in flight
  per thread (grid = ``ctas``, 256 or 512 threads).
- ``bulk``: each CTA streams its chunk with ``cp.async.bulk`` (the TMA's 1-D form, what our GEMM's
  producer issues) into a ring of ``stages`` x ``stage_kb`` of shared memory, one thread issuing.

For each size it prints the best time of each kind, that time over bench.py's floor, and (with a
bundle) our GEMM and torch's on the matching decode shape in the same run.

It also holds ``dec_gemm``, a CUDA C prototype of a decode GEMM fed from registers (16-byte loads
whose K order is permuted alike for both operands so that they are mma.sync fragments), timed on
the same shapes with the weights as given and pre-packed (notes/gemm-sm90.md, "Experiments, each
with its prediction").

Needs nvcc (compiles a small .so at start-up).  Run:
  python3 notes/probes/probe_stream_floor.py [BUNDLE] [--json OUT.json]
      [--profile | --overhead [--m1] | --dec-pdl [--extra BUNDLE2]]
``--profile``: one call each of the best read kernels, the prototype and our GEMM between
cudaProfilerStart/Stop (for ``ncu --profile-from-start off``).  ``--overhead``: ours (the decode
variants in OVERHEAD_VARIANTS that the bundle has), cuBLAS, the reads and an empty kernel
interleaved as K and N grow; ``--m1``: fp8 at M = 1 and 16.  ``--dec-pdl``: the prototype
launched with programmatic dependent launch, its weight loads issued before griddepcontrol.wait
(and without), beside our decode variants (and every variant of ``--extra BUNDLE2``) and the reads,
graphs of 8 calls; ``DEC_SHAPES=dt:M:N:K,...`` picks the shapes, ``DEC_NO_PROTO=1`` skips the
prototype (notes/gemm-sm90.md, "The register-fed prototype with PDL").
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory.benchmark import (copy_bandwidth, gemm_bytes, read_bandwidth, sets_for, time_graph,  # noqa: E402
                               time_interleaved)

CU = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

__global__ void empty_kernel() {}

template <int UNROLL>
__global__ void __launch_bounds__(512) ldg_read(const int4 *__restrict__ p, long long n16, int *out) {
  long long per = (n16 + gridDim.x - 1) / gridDim.x;
  long long beg = (long long)blockIdx.x * per;
  long long end = beg + per < n16 ? beg + per : n16;
  int acc = 0;
  for (long long i = beg + threadIdx.x; i < end; i += (long long)blockDim.x * UNROLL) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      long long j = i + (long long)u * blockDim.x;
      if (j < end) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + j));
      } else {
        v[u] = make_int4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7f3a5c21) out[0] = acc;  // never true in practice; keeps the loads
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One thread keeps `stages` bulk copies of `stage_bytes` in flight over this CTA's chunk.
__global__ void bulk_read(const char *__restrict__ p, long long nbytes, int stages, int stage_bytes, int *out) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bars[32];
  if (threadIdx.x != 0) return;
  long long per = (nbytes + gridDim.x - 1) / gridDim.x;
  per = (per + 15) / 16 * 16;
  long long beg = (long long)blockIdx.x * per;
  long long end = beg + per < nbytes ? beg + per : nbytes;
  if (beg >= end) return;
  for (int s = 0; s < stages; ++s)
    asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(smem_u32(&bars[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  long long n_chunks = (end - beg + stage_bytes - 1) / stage_bytes;
  auto issue = [&](long long c) {
    int s = (int)(c % stages);
    long long off = beg + c * stage_bytes;
    int bytes = (int)((end - off) < stage_bytes ? (end - off) : stage_bytes);
    uint32_t bar = smem_u32(&bars[s]);
    asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(smem + (size_t)s * stage_bytes)), "l"(p + off), "r"(bytes), "r"(bar) : "memory");
  };
  long long c = 0;
  for (; c < n_chunks && c < stages; ++c) issue(c);
  for (long long w = 0; w < n_chunks; ++w) {
    int s = (int)(w % stages);
    uint32_t parity = (uint32_t)((w / stages) & 1);
    uint32_t bar = smem_u32(&bars[s]);
    asm volatile(
        "{\n .reg .pred P;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared.b64 P, [%0], %1;\n"
        " @!P bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
    if (c < n_chunks) issue(c++);
  }
  if (smem[0] == 0x5a && smem[1] == 0x3c && smem[2] == 0x7e && smem[3] == 0x11) out[0] = 1;
}


// ---- A decode GEMM with register-fed mma.sync (prototype for the DSL kernel) ----------------
// C[m, n] = scale * sum_k X[m, k] W[n, k] for M <= 16.  Each thread loads 16 contiguous bytes of
// a weight row (and of two activation rows) per 64-byte step; the K order inside a step is
// permuted identically for both operands so that those 16 bytes are exactly the thread's
// fragments of two mma.sync (bf16 m16n8k16 or e4m3 m16n8k32): no shared memory, no shuffles.
__device__ __forceinline__ void mma_step(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1, bool fp8) {
  if (fp8)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg16(const char *p, bool ok, bool stream) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (ok) {
    if (stream)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

template <bool FP8, int G, int KW, int U, bool PACKED>
__global__ void __launch_bounds__(512) dec_gemm(const char *__restrict__ W, const char *__restrict__ X, __nv_bfloat16 *__restrict__ C,
                         int M, int N, int K, long long ldw, long long ldx, long long ldc, float scale, int pdl) {
  extern __shared__ float red[];
  // pdl: launched with programmatic dependent launch; the weights (constant) are loaded before
  // griddepcontrol.wait, the activations (the previous kernel's output) after it.
  // pdl == 2 (an experiment, not a valid kernel): the activations are loaded before the wait too.
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  bool waited = pdl != 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int nwn = (blockDim.x >> 5) / KW;
  const int wn = warp / KW, wk = warp % KW;
  const long long kbytes = (long long)K * (FP8 ? 1 : 2);
  const int steps = (int)((kbytes + 63) / 64);
  // gridDim.y > 1 (timing experiment only): CTAs split K too, each writing its partial sums to its
  // own M x N slice of C (no reduction: the time of the loads and MMAs of such a design).
  const int cs = (steps + gridDim.y - 1) / gridDim.y, cb = blockIdx.y * cs, ce = min(cb + cs, steps);
  const int per = (ce - cb + KW - 1) / KW;
  const int s0 = cb + wk * per, s1 = min(s0 + per, ce);
  const int n0 = (blockIdx.x * nwn + wn) * 8 * G;
  const bool vg = g < M, vh = g + 8 < M;
  float acc[G][4];
#pragma unroll
  for (int i = 0; i < G; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int s = s0; s < s1; s += U) {
    uint4 wv[U][G], av[U], bv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long kb = (long long)(s + u) * 64 + q * 16;
      bool ok = (s + u < s1) && kb < kbytes;
#pragma unroll
      for (int i = 0; i < G; ++i) {
        int n = n0 + i * 8 + g;
        // PACKED: W was rearranged as [N / 8][steps][8 rows][64 bytes], so that a warp's load of
        // 8 rows x 64 bytes is 512 contiguous bytes (as a pure read's is).
        const char *wp = PACKED ? W + ((long long)(n >> 3) * steps + (s + u)) * 512 + (n & 7) * 64 + q * 16
                                : W + n * ldw + kb;
        wv[u][i] = ldg16(wp, ok && n < N, true);
      }
    }
    if (!waited) {
      asm volatile("griddepcontrol.wait;" ::: "memory");
      waited = true;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      long long kb = (long long)(s + u) * 64 + q * 16;
      bool ok = (s + u < s1) && kb < kbytes;
      av[u] = ldg16(X + g * ldx + kb, ok && vg, false);
      bv[u] = ldg16(X + (g + 8) * ldx + kb, ok && vh, false);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < G; ++i) {
        mma_step(acc[i], av[u].x, bv[u].x, av[u].y, bv[u].y, wv[u][i].x, wv[u][i].y, FP8);
        mma_step(acc[i], av[u].z, bv[u].z, av[u].w, bv[u].w, wv[u][i].z, wv[u][i].w, FP8);
      }
  }
  if (!waited || pdl == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
  float *mine = red + ((size_t)warp * G * 32 + lane) * 4;
#pragma unroll
  for (int i = 0; i < G; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) mine[i * 128 + r] = acc[i][r];
  __syncthreads();
  const int outs = nwn * G * 128;
  for (int idx = threadIdx.x; idx < outs; idx += blockDim.x) {
    int r = idx & 3, ln = (idx >> 2) & 31, i = (idx >> 7) % G, w = idx / (G * 128);
    int m = (ln >> 2) + 8 * (r >> 1), n = (blockIdx.x * nwn + w) * 8 * G + i * 8 + 2 * (ln & 3) + (r & 1);
    if (m < M && n < N) {
      float sum = 0.f;
      for (int k = 0; k < KW; ++k) sum += red[(((size_t)(w * KW + k) * G + i) * 32 + ln) * 4 + r];
      C[((long long)blockIdx.y * M + m) * ldc + n] = __float2bfloat16(sum * scale);
    }
  }
}

#define DEC1(FP8, G, KW, U, P) if (fp8 == FP8 && g == G && kw == KW && u == U && packed == P) { \
    int smem = warps * G * 128 * 4; \
    cudaFuncSetAttribute(dec_gemm<FP8, G, KW, U, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); \
    cudaLaunchConfig_t cfg = {}; cudaLaunchAttribute at[1]; \
    cfg.gridDim = dim3(grid, ks); cfg.blockDim = dim3(warps * 32); cfg.dynamicSmemBytes = smem; cfg.stream = s; \
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = pdl != 0; \
    cfg.attrs = at; cfg.numAttrs = 1; \
    cudaLaunchKernelEx(&cfg, dec_gemm<FP8, G, KW, U, P>, (const char *)W, (const char *)X, (__nv_bfloat16 *)C, M, N, K, ldw, ldx, ldc, scale, pdl); \
    return (int)cudaGetLastError(); }

#define DEC(FP8, G, KW, U) DEC1(FP8, G, KW, U, false) DEC1(FP8, G, KW, U, true)

extern "C" int launch_dec(int packed, int fp8, int g, int kw, int u, int nwn, const void *W, const void *X, void *C, int M, int N, int K,
                          long long ldw, long long ldx, long long ldc, float scale, cudaStream_t s, int pdl, int ks) {
  int warps = nwn * kw;
  int grid = (N + nwn * 8 * g - 1) / (nwn * 8 * g);
  DEC(0, 1, 8, 4) DEC(0, 2, 8, 4) DEC(0, 1, 16, 4) DEC(0, 4, 16, 4) DEC(0, 4, 16, 2) DEC(0, 2, 16, 4) DEC(0, 4, 8, 4)
  DEC(1, 1, 8, 4) DEC(1, 2, 8, 4) DEC(1, 1, 16, 4) DEC(1, 4, 16, 4) DEC(1, 4, 16, 2) DEC(1, 2, 16, 4) DEC(1, 4, 8, 4)
  DEC(0, 1, 8, 8) DEC(0, 2, 8, 8) DEC(0, 1, 16, 8) DEC(0, 2, 16, 8) DEC(1, 1, 8, 8) DEC(1, 2, 8, 8) DEC(1, 1, 4, 8)
  DEC(1, 2, 4, 8) DEC(1, 1, 4, 16) DEC(0, 1, 4, 8) DEC(1, 4, 4, 4) DEC(1, 2, 4, 4) DEC(1, 4, 4, 2)
  return -1;
}

extern "C" int launch_empty(cudaStream_t s) {
  empty_kernel<<<1, 32, 0, s>>>();
  return (int)cudaGetLastError();
}

extern "C" int launch_ldg(const void *p, long long nbytes, int ctas, int threads, int unroll, int *out, cudaStream_t s) {
  long long n16 = nbytes / 16;
  const int4 *q = (const int4 *)p;
  switch (unroll) {
    case 4: ldg_read<4><<<ctas, threads, 0, s>>>(q, n16, out); break;
    case 8: ldg_read<8><<<ctas, threads, 0, s>>>(q, n16, out); break;
    case 16: ldg_read<16><<<ctas, threads, 0, s>>>(q, n16, out); break;
    default: return -1;
  }
  return (int)cudaGetLastError();
}

extern "C" int launch_bulk(const void *p, long long nbytes, int ctas, int stages, int stage_bytes, int *out, cudaStream_t s) {
  int smem = stages * stage_bytes;
  cudaFuncSetAttribute(bulk_read, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  bulk_read<<<ctas, 32, smem, s>>>((const char *)p, nbytes, stages, stage_bytes, out);
  return (int)cudaGetLastError();
}
"""

# Decode shapes of bench.py's grid (M = 16) whose floor is 7-14 us, and two larger ones.
SHAPES = [("e4m3", 16, 4096, 4096), ("e4m3", 16, 6144, 4096), ("bf16", 16, 4096, 4096),
          ("bf16", 16, 6144, 4096), ("e4m3", 16, 8192, 8192), ("bf16", 16, 8192, 8192)]


def build_lib() -> ctypes.CDLL:
    d = Path(tempfile.mkdtemp(prefix="probe_stream_"))
    (d / "k.cu").write_text(CU)
    subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC",
                    "-o", str(d / "k.so"), str(d / "k.cu")], check=True)
    lib = ctypes.CDLL(str(d / "k.so"))
    lib.launch_empty.argtypes = [ctypes.c_void_p]
    lib.launch_ldg.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_void_p]
    lib.launch_dec.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + \
        [ctypes.c_longlong] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.launch_bulk.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _stream() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


def read_configs(sms: int) -> list[tuple]:
    out = []
    for mult in (1, 2, 4):
        for threads, unroll in ((256, 8), (512, 8), (256, 16), (512, 4)):
            out.append(("ldg", sms * mult, threads, unroll))
    for ctas in (64, 128, sms, 2 * sms):
        for stages, kb in ((8, 8), (16, 8), (8, 16), (12, 16)):
            if ctas > sms and stages * kb > 100:
                continue
            out.append(("bulk", ctas, stages, kb * 1024))
    return out


def launch_read(lib, cfg, buf, nbytes, out) -> None:
    kind, ctas, a, b = cfg
    f = lib.launch_ldg if kind == "ldg" else lib.launch_bulk
    rc = f(buf.data_ptr(), nbytes, ctas, a, b, out.data_ptr(), _stream())
    if rc:
        raise RuntimeError(f"{cfg}: CUDA error {rc}")


def main() -> int:
    import torch

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    jpath = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    if jpath in args:
        args.remove(jpath)
    if "--extra" in sys.argv:
        args.remove(sys.argv[sys.argv.index("--extra") + 1])
    bundle = None
    if args:
        from factory.runtime import Bundle

        bundle = Bundle.open(args[0])
    lib = build_lib()
    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    res = {"device": props.name, "sms": sms, "l2": l2}

    if "--profile" in sys.argv:
        return profile(lib, bundle, out)
    if "--overhead" in sys.argv:
        return overhead(lib, bundle, out, jpath)
    if "--dec-pdl" in sys.argv:
        return dec_pdl(lib, bundle, out, jpath)

    bw, rbw = copy_bandwidth(), read_bandwidth()
    res.update(copy_tbs=bw / 1e12, read_tbs=rbw / 1e12)
    print(f"{props.name}: copy {bw / 1e12:.3f} TB/s (1 GiB, read+write), read {rbw / 1e12:.3f} TB/s", flush=True)

    empty = {n: time_graph(lambda i: lib.launch_empty(_stream()), n, replays=40) * 1e6 for n in (1, 2, 4, 7, 8, 16, 64)}
    res["empty_us_by_calls_per_graph"] = empty
    print("empty kernel, us per call by calls per graph: " + ", ".join(f"{n}: {t:.2f}" for n, t in empty.items()))

    rows = []
    for dt, M, N, K in SHAPES:
        nbytes = gemm_bytes(M, N, K, dt)
        nbytes16 = nbytes // 16 * 16
        n_sets = sets_for(nbytes, l2)
        bufs = [torch.empty(nbytes16, dtype=torch.uint8, device="cuda").random_() for _ in range(n_sets)]
        floor_us = nbytes / bw * 1e6
        times = {}
        for cfg in read_configs(sms):
            times[cfg] = time_graph(lambda i, c=cfg: launch_read(lib, c, bufs[i], nbytes16, out), n_sets,
                                    replays=30) * 1e6
        best = {k: min((t, c) for c, t in times.items() if c[0] == k) for k in ("ldg", "bulk")}
        row = {"dtype": dt, "M": M, "N": N, "K": K, "bytes": nbytes, "input_sets": n_sets, "floor_us": floor_us,
               "read_floor_us": nbytes / rbw * 1e6, "empty_us": empty.get(n_sets) or time_graph(
                   lambda i: lib.launch_empty(_stream()), n_sets, replays=40) * 1e6,
               "reads": [{"cfg": list(c), "us": t} for c, t in sorted(times.items(), key=lambda x: x[1])]}
        for k, (t, c) in best.items():
            row[f"best_{k}_us"], row[f"best_{k}_cfg"] = t, list(c)
        bufs = None
        row.update(dec_rows(lib, dt, M, N, K, n_sets))
        line0 = f"  dec small M (rc, err, row M untouched): {row['dec_small_m']}\n  dec: " + ", ".join(f"{c}:{t:.2f}(err {e:.1e})" for c, t, e in row["dec"])
        print(line0, flush=True)
        torch.cuda.empty_cache()
        if bundle is not None:
            row.update(gemm_row(bundle, dt, M, N, K, n_sets))
        rows.append(row)
        line = (f"{dt} {M}x{N}x{K} ({nbytes / 1e6:.1f} MB, {n_sets} sets): floor {floor_us:.2f} us; "
                f"empty {row['empty_us']:.2f}; best ldg {best['ldg'][0]:.2f} ({best['ldg'][0] / floor_us:.3f}x floor) "
                f"{best['ldg'][1]}; best bulk {best['bulk'][0]:.2f} ({best['bulk'][0] / floor_us:.3f}x) {best['bulk'][1]}")
        line += f"; dec {row['best_dec_us']:.2f} ({row['best_dec_us'] / floor_us:.3f}x) {row['best_dec_cfg']}"
        if "ours_us" in row:
            line += (f"; ours {row['ours_us']:.2f} ({row['ours_us'] / floor_us:.3f}x) ref {row['ref_us']:.2f} "
                     f"({row['ref_us'] / floor_us:.3f}x) [{row['variant']}]")
        print(line, flush=True)
    res["rows"] = rows
    if jpath:
        Path(jpath).write_text(json.dumps(res, indent=1))
    return 0


PACKED_CFGS = [(4, 16, 4, 1), (2, 8, 4, 1), (1, 16, 4, 1), (1, 8, 4, 2)]
DEC_CFGS = [(1, 8, 4, 2), (2, 8, 4, 1), (1, 16, 4, 1), (4, 16, 4, 1), (4, 16, 2, 1), (2, 16, 4, 1), (4, 8, 4, 2),
            (4, 8, 4, 1)]


def dec_rows(lib, dt, M, N, K, n_sets) -> dict:
    """The register-fed mma.sync decode prototype (CU: dec_gemm) on this shape: error against a
    float32 reference, and the time per call for each (G, KW, U, NWN)."""
    import torch

    from factory import testing

    fp8 = dt == "e4m3"
    sets = [testing.gemm_inputs(M, N, K, dt) for _ in range(n_sets)]
    e = 1 if fp8 else 2
    ref = sets[0][0].float() @ sets[0][1].float().t()
    out = []

    packed = []
    for A, B, C in sets:  # [N / 8][K bytes / 64][8][64]: see dec_gemm
        nb = K * e
        packed.append(B.view(torch.uint8).view(N // 8, 8, nb // 64, 64).permute(0, 2, 1, 3).contiguous())

    def call(cfg, i, pk=False):
        G, KW, U, NWN = cfg
        A, B, C = sets[i]
        rc = lib.launch_dec(int(pk), int(fp8), G, KW, U, NWN, (packed[i] if pk else B).data_ptr(), A.data_ptr(), C.data_ptr(), M, N, K,
                            B.stride(0) * e, A.stride(0) * e, C.stride(0), 1.0, _stream(), 0, 1)
        if rc:
            raise RuntimeError(f"dec {cfg}: {rc}")

    for cfg in DEC_CFGS:
        for i in range(n_sets):
            sets[i][2].fill_(float("nan"))
        call(cfg, 0)
        torch.cuda.synchronize()
        err = ((sets[0][2].float() - ref).abs().max() / ref.abs().max()).item()
        t = time_graph(lambda i, c=cfg: call(c, i), n_sets, replays=30) * 1e6
        out.append((cfg, t, err))
        if cfg in PACKED_CFGS:
            sets[0][2].fill_(float("nan"))
            call(cfg, 0, True)
            torch.cuda.synchronize()
            err = ((sets[0][2].float() - ref).abs().max() / ref.abs().max()).item()
            t = time_graph(lambda i, c=cfg: call(c, i, True), n_sets, replays=30) * 1e6
            out.append(((*cfg, "packed"), t, err))
    best = min(((t, c) for c, t, e in out if e < 2e-2), default=(float("nan"), None))
    small = {}
    for m in (1, 5, 9):  # rows past M are neither read nor written
        A = testing.gemm_operand(m, K, 1, "k", dt)[0]
        C = torch.full((m + 1, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        rc = lib.launch_dec(0, int(fp8), 2, 8, 4, 2, sets[0][1].data_ptr(), A.data_ptr(), C.data_ptr(), m, N, K,
                            sets[0][1].stride(0) * e, A.stride(0) * e, C.stride(0), 1.0, _stream(), 0, 1)
        torch.cuda.synchronize()
        r = A.float() @ sets[0][1].float().t()
        small[m] = (rc, ((C[:m].float() - r).abs().max() / r.abs().max()).item(), bool(C[m].isnan().all()))
    return {"dec_small_m": small, "dec": out, "best_dec_us": best[0], "best_dec_cfg": list(best[1])}


def gemm_row(bundle, dt, M, N, K, n_sets) -> dict:
    """Ours (the loader's pick) and torch's on the same shape, interleaved (bench's timer)."""
    import torch

    from factory import testing
    from factory.runtime.gemm import rkl_spec, select

    sets = [testing.gemm_inputs(M, N, K, dt, poison=False) for _ in range(n_sets)]
    one = torch.ones(1, device="cuda")
    if dt == "e4m3":
        ours = lambda i: bundle.gemm(*sets[i], scale_a=one, scale_b=one)  # noqa: E731
        ref = lambda i: torch._scaled_mm(sets[i][0], sets[i][1].t(), scale_a=one, scale_b=one,  # noqa: E731
                                         out_dtype=torch.bfloat16)
    else:
        ours = lambda i: bundle.gemm(*sets[i])  # noqa: E731
        ref = lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])  # noqa: E731
    t = time_interleaved({"ours": ours, "ref": ref}, n_sets, rounds=4, warm_s=0.05)
    A, B, C = sets[0]
    scales = [(one.data_ptr(), (1,), (1,))] * 2 if dt == "e4m3" else []
    variant = select(bundle, rkl_spec(A, "a"), rkl_spec(B, "b"), rkl_spec(C, "c"), dt, "bf16", scales)
    return {"ours_us": t["ours"] * 1e6, "ref_us": t["ref"] * 1e6, "variant": variant}


# Decode variants of the default tier (PDL: launched with programmatic dependent launch) and two
# of their non-PDL twins (build them with the full tier or by hand to compare).
OVERHEAD_VARIANTS = {"e4m3": ["gemm_sm90a_e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1",
                              "gemm_sm90a_e4m3_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl",
                              "gemm_sm90a_e4m3_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl_eb",
                              "gemm_sm90a_e4m3_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl_eb",
                              "gemm_sm90a_e4m3_obf16_ak_bk_t64x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl_eb"],
                     "bf16": ["gemm_sm90a_bf16_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1",
                              "gemm_sm90a_bf16_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl",
                              "gemm_sm90a_bf16_obf16_ak_bk_t16x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl_eb",
                              "gemm_sm90a_bf16_obf16_ak_bk_t32x64x128_c1x1_ws_rm_sw1_swap_sk1_pdl_eb"]}


def overhead(lib, bundle, out, jpath) -> int:
    """Time per call against K and N at M = 16 (ours per variant, cuBLAS, and the TMA-bulk and
    LDG reads of the same bytes), all in graphs of 8 calls on 8 input sets: what a call costs
    beyond streaming its bytes.  ``--m1``: fp8 only, M = 1 and 16 at N = 4096 and 6144."""
    import torch

    from factory import testing

    res = {}
    n_sets = 8
    one = torch.ones(1, device="cuda")
    if "--m1" in sys.argv:
        cases = [(M, N, K) for M in (1, 16) for N, K in ((4096, 4096), (6144, 4096))]
        dtypes = ["e4m3"]
    else:
        cases = [(16, N, K) for N, K in ((4096, 1024), (4096, 4096), (6144, 4096), (8192, 8192), (28672, 4096))]
        dtypes = list(OVERHEAD_VARIANTS)
    for dt in dtypes:
        variants = OVERHEAD_VARIANTS[dt]
        e = 1 if dt == "e4m3" else 2
        for M, N, K in cases:
            sets = [testing.gemm_inputs(M, N, K, dt, poison=False) for _ in range(n_sets)]
            calls = {}
            for v in variants:
                if v not in bundle.manifest["variants"]:
                    continue
                if dt == "e4m3":
                    calls[v] = lambda i, v=v: bundle.gemm(*sets[i], scale_a=one, scale_b=one, variant=v)
                else:
                    calls[v] = lambda i, v=v: bundle.gemm(*sets[i], variant=v)
            if dt == "e4m3":
                calls["ref"] = lambda i: torch._scaled_mm(sets[i][0], sets[i][1].t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16)
            else:
                calls["ref"] = lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])
            nb = N * K * e
            calls["bulk128"] = lambda i: launch_read(lib, ("bulk", 128, 8, 16384), sets[i][1], nb, out)
            calls["ldg264"] = lambda i: launch_read(lib, ("ldg", 264, 512, 8), sets[i][1], nb, out)
            calls["empty"] = lambda i: lib.launch_empty(_stream())
            t = time_interleaved(calls, n_sets, rounds=3, warm_s=0.02)
            res[f"{dt} M={M} N={N} K={K}"] = {k: v * 1e6 for k, v in t.items()}
            print(f"{dt} M={M} N={N} K={K}: " + ", ".join(f"{k[-40:]}={v * 1e6:.2f}" for k, v in t.items()), flush=True)
    if jpath:
        Path(jpath).write_text(json.dumps(res, indent=1))
    return 0


# (G, KW, U, NWN): rows per warp / 8, warps along K, 64-byte steps per load batch, warps along N.
DEC_PDL_CFGS = [(1, 16, 4, 1), (2, 16, 4, 1), (4, 16, 4, 1), (2, 8, 4, 1), (4, 8, 4, 1), (1, 8, 8, 2),
                (2, 8, 8, 1), (1, 16, 8, 1), (2, 16, 8, 1), (1, 4, 8, 4), (2, 4, 8, 2), (1, 4, 16, 4)]


def dec_pdl(lib, bundle, out, jpath) -> int:
    """The register-fed decode prototype launched with programmatic dependent launch, its weight
    loads issued before griddepcontrol.wait (weights constant, activations after the wait),
    beside ours (PDL; early_b) and the LDG read, graphs of 8 consecutive calls: can any design
    of this kind meet 1.1x the copy floor at fp8 4096x4096?"""
    import torch

    from factory import testing

    res = {}
    n_sets = 8
    one = torch.ones(1, device="cuda")
    bw = copy_bandwidth()
    extra = None
    if "--extra" in sys.argv:
        from factory.runtime import Bundle

        extra = Bundle.open(sys.argv[sys.argv.index("--extra") + 1])
    shapes = [("e4m3", 16, 4096, 4096), ("e4m3", 1, 4096, 4096), ("bf16", 16, 4096, 4096), ("e4m3", 16, 6144, 4096)]
    if os.environ.get("DEC_SHAPES"):  # e.g. "e4m3:16:4096:4096,bf16:1:4096:4096"
        shapes = [(d, int(m), int(n), int(k)) for d, m, n, k in
                  (x.split(":") for x in os.environ["DEC_SHAPES"].split(","))]
    cfgs = DEC_PDL_CFGS if not os.environ.get("DEC_NO_PROTO") else []
    if os.environ.get("DEC_SPLIT"):  # CTAs split K as well (G, KW, U, NWN, KS): timing of that design
        cfgs = [(4, 4, 4, 4, 4), (2, 4, 4, 4, 2), (4, 4, 2, 4, 4), (2, 4, 8, 4, 2), (4, 8, 4, 2, 4),
                (2, 8, 4, 2, 2), (4, 8, 4, 1, 1), (2, 8, 4, 1, 1)]
    for dt, M, N, K in shapes:
        fp8 = dt == "e4m3"
        e = 1 if fp8 else 2
        sets = [testing.gemm_inputs(M, N, K, dt) for _ in range(n_sets)]
        packed = [B.view(torch.uint8).view(N // 8, 8, K * e // 64, 64).permute(0, 2, 1, 3).contiguous()
                  for _, B, _ in sets]
        ref = sets[0][0].float() @ sets[0][1].float().t()
        # KS > 1 (CTAs split K; partial sums, no reduction): outputs KS x M x N.
        parts = [torch.full((4 * M, N), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(n_sets)]
        calls, errs = {}, {}
        for cfg in cfgs:
            cfg, ks = (cfg, 1) if len(cfg) == 4 else (cfg[:4], cfg[4])
            for pk in (0, 1):
                for pdl in (0, 1, 2) if os.environ.get("DEC_EARLY_X") else (0, 1):
                    def call(i, cfg=cfg, pk=pk, pdl=pdl, ks=ks):
                        A, B, C = sets[i]
                        C = C if ks == 1 else parts[i]
                        rc = lib.launch_dec(pk, int(fp8), *cfg, (packed[i] if pk else B).data_ptr(), A.data_ptr(),
                                            C.data_ptr(), M, N, K, B.stride(0) * e, A.stride(0) * e, C.stride(0),
                                            1.0, _stream(), pdl, ks)
                        if rc:
                            raise RuntimeError(f"dec {cfg}: {rc}")
                    key = f"dec{cfg}{f'/ks{ks}' if ks > 1 else ''}{'p' if pk else ''}{('', '+pdl', '+pdl+earlyX')[pdl]}"
                    try:
                        sets[0][2].fill_(float("nan"))
                        parts[0].fill_(float("nan"))
                        call(0)
                        torch.cuda.synchronize()
                    except RuntimeError as ex:
                        print(f"  {key}: {ex}")
                        continue
                    got = sets[0][2].float() if ks == 1 else parts[0][:ks * M].float().view(ks, M, N).sum(0)
                    errs[key] = ((got - ref).abs().max() / ref.abs().max()).item()
                    calls[key] = call
        sc = dict(scale_a=one, scale_b=one) if fp8 else {}
        if bundle is not None:
            for v in OVERHEAD_VARIANTS[dt]:
                if v in bundle.manifest["variants"]:
                    calls[v] = lambda i, v=v, sc=sc: bundle.gemm(*sets[i], variant=v, **sc)
        if extra is not None:  # --extra BUNDLE: its variants of this dtype too
            for v in extra.manifest["variants"]:
                if f"_{dt}_" in v:
                    calls["x:" + v] = lambda i, v=v, sc=sc: extra.gemm(*sets[i], variant=v, **sc)
        for k, f in calls.items():
            if k not in errs:  # the bundle's variants: checked like the prototype
                sets[0][2].fill_(float("nan"))
                f(0)
                torch.cuda.synchronize()
                errs[k] = ((sets[0][2].float() - ref).abs().max() / ref.abs().max()).item()
        nb = N * K * e
        calls["ldg264"] = lambda i: launch_read(lib, ("ldg", 264, 512, 8), sets[i][1], nb, out)
        calls["bulk128"] = lambda i: launch_read(lib, ("bulk", 128, 8, 16384), sets[i][1], nb, out)
        t = time_interleaved(calls, n_sets, rounds=3, warm_s=0.02)
        floor = gemm_bytes(M, N, K, dt) / bw * 1e6
        row = {"floor_us": floor, "line_us": 1.1 * floor, "us": {k: v * 1e6 for k, v in t.items()}, "err": errs}
        res[f"{dt} M={M} N={N} K={K}"] = row
        best = sorted(row["us"].items(), key=lambda x: x[1])
        print(f"{dt} M={M} N={N} K={K}: floor {floor:.2f} line {1.1 * floor:.2f}; " + ", ".join(
            f"{k[-44:]}={v:.2f}" + (f"(err {errs[k]:.0e})" if k in errs else "") for k, v in best[:14]), flush=True)
        bad = {k: v for k, v in errs.items() if not v < 2e-2}
        if bad:
            print(f"  WRONG: {bad}")
    if jpath:
        Path(jpath).write_text(json.dumps(res, indent=1))
    return 0


def profile(lib, bundle, out) -> int:
    import torch

    for nbytes, cfgs in ((gemm_bytes(16, 4096, 4096, "e4m3"), [("bulk", 128, 16, 8192), ("ldg", 264, 256, 8)]),):
        buf = torch.empty(nbytes // 16 * 16, dtype=torch.uint8, device="cuda").random_()
        for cfg in cfgs:
            launch_read(lib, cfg, buf, nbytes // 16 * 16, out)
            torch.cuda.synchronize()
            print(f"profiled: read {nbytes} bytes {cfg}", flush=True)
            torch.cuda.profiler.start()
            launch_read(lib, cfg, buf, nbytes // 16 * 16, out)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    from factory import testing

    A = testing.gemm_operand(16, 4096, 1, "k", "e4m3")[0]
    B = testing.gemm_operand(4096, 4096, 1, "k", "e4m3")[0]
    C = torch.empty((16, 4096), dtype=torch.bfloat16, device="cuda")
    for cfg in ((4, 16, 4, 1), (2, 8, 4, 1)):
        args = (0, 1, *cfg, B.data_ptr(), A.data_ptr(), C.data_ptr(), 16, 4096, 4096, 4096, 4096, 4096, 1.0)
        lib.launch_dec(*args, _stream(), 0, 1)
        torch.cuda.synchronize()
        print(f"profiled: dec e4m3 16x4096x4096 {cfg}", flush=True)
        torch.cuda.profiler.start()
        lib.launch_dec(*args, _stream(), 0, 1)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    if bundle is not None:
        A = testing.gemm_operand(16, 4096, 1, "k", "e4m3")[0]
        B = testing.gemm_operand(4096, 4096, 1, "k", "e4m3")[0]
        C = torch.empty((16, 4096), dtype=torch.bfloat16, device="cuda")
        one = torch.ones(1, device="cuda")
        for _ in range(3):
            bundle.gemm(A, B, C, scale_a=one, scale_b=one)
        torch.cuda.synchronize()
        print("profiled: ours e4m3 16x4096x4096", flush=True)
        torch.cuda.profiler.start()
        bundle.gemm(A, B, C, scale_a=one, scale_b=one)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
