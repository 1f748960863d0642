"""Every variant of the bundle this GPU runs, launched by name (``Bundle.launch`` / the
``fx_launch_<name>`` launchers behind ``bundle.gemm(variant=)``) on fresh random data, NaN-poisoned
outputs, against a float32 reference (``factory.testing.check_variant``): GEMM (bf16/fp16, fp8
e4m3 with scales, split-K, the packed-weight decode GEMMs), attention (the sm80 family's
portability build with its split-KV and varlen variants, the sm90 family, the sm90_decode family),
attention over a KV cache (the sm90_decode family's paged, dense-cache, switch and fp8 builds; the sm90
family's chunked-prefill builds, paged by TMA page boxes or cp.async rows), the grouped GEMM of
mixture-of-experts layers (contiguous and masked layouts, factory.testing.GROUPED_CASES).
Each variant's checks go into the test run's record (``--run-record``): the evidence that
``python -m factory build`` turns into ``executed`` labels (docs/proof.md)."""

from __future__ import annotations

import pytest

from conftest import GPU_BUNDLE, gpu_marks

pytestmark = gpu_marks()
torch = pytest.importorskip("torch")

# (op, family): every family with variants for sm_90 / sm_90a.
FAMILIES = [("gemm", "sm80"), ("gemm", "sm90"), ("gemm", "decode"),
            ("attention", "sm80"), ("attention", "sm90"), ("attention", "sm90_decode"),
            ("attention_kvcache", "sm90_decode"), ("attention_kvcache", "sm90"), ("attention_kvcache", "sm80"),
            ("gemm_grouped", "sm90_grouped")]


_LOST: list[str] = []  # the variant after which the CUDA context was lost, if it was


@pytest.fixture(scope="module")
def bundle():
    from factory.runtime import Bundle

    return Bundle.open(GPU_BUNDLE)


@pytest.mark.parametrize("op,family", FAMILIES, ids=lambda x: x)
def test_every_variant_against_float32(bundle, run_record, op, family):
    from factory.testing import check_variant

    if _LOST:
        pytest.fail(f"not run: the CUDA context was lost after {_LOST[0]}")
    entries = [e for e in bundle.candidates(op) if e["family"] == family]
    if not entries:
        pytest.skip(f"{GPU_BUNDLE} has no {op}/{family} variant this GPU runs")
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)  # fresh data every run
    failures = []
    for e in entries:
        try:
            results = check_variant(bundle, e, gen)
        except Exception as ex:  # noqa: BLE001 - a launch error fails this variant, the others still run
            results = [{"variant": e["name"], "rel_err": None, "tol": None, "ok": False,
                        "error": f"{type(ex).__name__}: {ex}"}]
            try:
                torch.cuda.synchronize()
            except Exception as lost:  # noqa: BLE001 - the context is gone: record no one else's failure
                run_record.add(bundle, e["name"], results)
                _LOST.append(e["name"])
                pytest.fail(f"{e['name']}: {ex}; the CUDA context is lost ({lost}): the variants after it "
                            f"in this family were not run")
        run_record.add(bundle, e["name"], results)
        failures += [f"{r['variant']} {r.get('shape')}: rel_err {r.get('rel_err')} lse_err {r.get('lse_err')} "
                     f"nan {r.get('nan')} {r.get('error', '')}" for r in results if not r["ok"]]
    assert not failures, f"{len(failures)} failed checks:\n" + "\n".join(failures[:40])
