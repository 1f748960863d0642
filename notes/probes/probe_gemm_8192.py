"""8192^3 bf16: the selection's choice and the 128x256 / 256x128 tiles by name, CUDA-event timing
(graph of 10 launches, median of 15), then one launch each for ncu (--launch)."""
import sys, json, torch
from factory.runtime import Bundle
b = Bundle.open(sys.argv[1])
M = N = K = 8192
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
names = ["gemm_sm90a_bf16_obf16_ak_bk_t128x256x64_c2x1_coop_rm_sw8_sk1_pdl",
         "gemm_sm90a_bf16_obf16_ak_bk_t128x256x64_c2x1_coop_rm_sw1_sk1_pdl",
         "gemm_sm90a_bf16_obf16_ak_bk_t256x128x64_c1x2_coop_rm_sw8_sk1_pdl",
         "gemm_sm90a_bf16_obf16_ak_bk_t256x128x64_c1x2_coop_rm_sw1_sk1_pdl", None, "cublas"]
if len(sys.argv) > 2 and sys.argv[2] == "--launch":
    for n in names[:4]:
        b.gemm(a, w, out, variant=n)
    torch.cuda.synchronize()
    sys.exit(0)
res = {}
for rnd in range(2):
    for n in names:
        f = (lambda: torch.mm(a, w.t(), out=out)) if n == "cublas" else (lambda n=n: b.gemm(a, w, out, variant=n))
        f(); torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                f()
        ts = []
        for _ in range(15):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); g.replay(); e1.record(); e1.synchronize()
            ts.append(e0.elapsed_time(e1) / 10 * 1e3)
        us = sorted(ts)[7]
        res.setdefault(str(n), []).append(round(us, 1))
sel = b.selections
print(json.dumps({k: {"us": v, "tflops": [round(2 * M * N * K / (u * 1e-6) / 1e12, 1) for u in v]} for k, v in res.items()}, indent=1))
print("selected:", [v for k, v in sel.items() if isinstance(v, str) and v.startswith("gemm_")][:3])
