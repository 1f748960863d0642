"""The bundle of the rotary-prologue measurements (sm_90): the KV-cache decode variants of bf16
head_dim 128 paged caches (default tier, no switches), their rotary-prologue builds (full tier),
rope_kvcache's bf16 builds, rms_norm's and fp8_rows' (default tier).

    python3 notes/probes/build_rope_bundle.py OUT
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from factory import registry  # noqa: E402
from factory.compiler import builder  # noqa: E402


def pick(op, tier, keep):
    return [v for v in registry.enumerate_variants(["sm_90"], [op], tier=tier) if keep(v)]


def main():
    vs = pick("attention_kvcache", "default", lambda v: v.dtype == "bf16" and v.head_dim == 128 and v.paged
              and v.kv_dtype == "bf16" and not v.local)
    vs += pick("attention_kvcache_rope", "full", lambda v: True)
    vs += pick("rope_kvcache", "default", lambda v: not v.fp8_cache)
    vs += pick("rms_norm", "default", lambda v: True)  # (the C entries' GPU tests)
    vs += pick("fp8_rows", "default", lambda v: True)
    builder.enumerate_variants = lambda *a, **k: vs
    print(builder.build(sys.argv[1], ["sm_90"], jobs=1))


if __name__ == "__main__":
    main()
