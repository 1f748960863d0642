"""examples/llama_block.py --check on the GPU: a small Llama-style layer from the bundle's ops equals
the same layer from torch ops (prefill with ragged varlen sequences, decode against a KV cache;
bf16 and fp8 weights)."""

from __future__ import annotations

import subprocess
import sys

from conftest import GPU_BUNDLE, ROOT, gpu_marks

pytestmark = gpu_marks()


def test_llama_block_matches_torch():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "llama_block.py"), "--bundle", str(GPU_BUNDLE),
                        "--check"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("check fp8=") == 4, r.stdout
    assert r.stdout.count("compiled fp8=") == 2, r.stdout  # torch.compile'd layer, bf16 and fp8 weights
