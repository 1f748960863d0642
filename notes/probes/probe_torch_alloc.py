import time, torch
q = torch.randn(1, 512, 8, 64, device="cuda", dtype=torch.bfloat16)
dev = q.device
shape = tuple(q.shape)
def t(fn, n=20000):
    best = []
    for _ in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(best)[2]
ee, e, ne = torch.empty_like, torch.empty, q.new_empty
bf = torch.bfloat16
rows = {
  "empty_like(q)": lambda: ee(q),
  "torch.empty(shape, dtype, device)": lambda: e(shape, dtype=bf, device=dev),
  "q.new_empty(shape)": lambda: ne(shape),
  "q.data_ptr()": lambda: q.data_ptr(),
  "torch.cuda.current_device()": torch.cuda.current_device,
  "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
  "torch._C._cuda_getCurrentRawStream(0)": lambda: torch._C._cuda_getCurrentRawStream(0),
}
for k, f in rows.items():
    print(f"{k:45s} {t(f):.3f} us")
