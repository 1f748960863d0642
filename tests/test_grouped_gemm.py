"""Grouped GEMM on this GPU-less machine: the checks that refuse before launch (runtime/grouped.py),
the host library's choice and refusals (fx_gemm_grouped_select) on the test bundle, the torch ops'
schemas and fakes through a simulated bundle.  Values: tests/test_grouped_gemm_gpu.py and
tests/test_every_variant_gpu.py on a GPU."""

from __future__ import annotations

import pytest
import torch

from conftest import Recorder
from factory.runtime import Bundle, InputError, NoVariantError
from factory.runtime import grouped

H100 = {"name": "planned H100", "sm_count": 132}


def bf(*s):
    return torch.randn(*s, dtype=torch.bfloat16)


def w(E, N, K):
    """(E, K, N) K-contiguous: the transpose of (E, N, K) weights."""
    return bf(E, N, K).transpose(1, 2)


def i32(*v):
    return torch.tensor(v, dtype=torch.int32)


@pytest.fixture(scope="module")
def planned(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("gemm_grouped"):
        pytest.skip("the test bundle has no gemm_grouped variant")
    return b


@pytest.mark.parametrize("args,kw,match", [
    ((bf(64, 128), w(4, 64, 128)), {}, "exactly one of offs"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "masked_m": i32(1, 2, 3, 4)}, "exactly one of offs"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3)}, "4 elements"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": torch.tensor([1, 2, 3, 4])}, "int32"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4, 5, 6, 7, 8)[::2]}, "contiguous"),
    ((bf(64, 128), w(4, 64, 120)), {"offs": i32(1, 2, 3, 4)}, "K"),
    ((bf(64, 128).half(), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4)}, "one dtype"),
    ((bf(64, 128).float(), w(4, 64, 128).float()), {"offs": i32(1, 2, 3, 4)}, "bfloat16"),
    ((bf(64, 128), bf(4, 128, 64)), {"offs": i32(1, 2, 3, 4)}, "contiguous along K"),
    ((bf(64, 128), bf(64, 128)), {"offs": i32(1, 2, 3, 4)}, "3-D"),
    ((bf(2, 64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4)}, "2-D"),
    ((bf(3, 64, 128), w(4, 64, 128)), {"masked_m": i32(1, 2, 3, 4)}, "E = 4"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "out": bf(64, 32)}, "out must have shape"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "out": bf(64, 64).half()}, "out must be"),
    ((bf(64, 128), w(4, 64, 128)), {"offs": i32(1, 2, 3, 4), "expected_m": -1}, "expected_m"),
    ((bf(64, 128), w(1025, 8, 128)), {"offs": torch.zeros(1025, dtype=torch.int32)}, "at most 1024"),
])
def test_check_refuses(args, kw, match):
    with pytest.raises(InputError, match=match):
        grouped.check(*args, kw.get("offs"), kw.get("masked_m"), kw.get("out"), kw.get("expected_m"))


def _specs(M, N, K, E, masked):
    L = E if masked else 1
    return [(0, (M, K, L), (K, 1, M * K if masked else 0)), (0, (N, K, E), (K, 1, N * K)),
            (0, (M, N, L), (N, 1, M * N if masked else 0)), (0, (E,), (1,))]


def test_choice_follows_rows_per_group(planned):
    """The rule of fx_select.c: the fewest predicted tile-waves x tile work; every variant taken
    matches the layout."""
    for masked in (False, True):
        for M, E, exp in ((65536, 8, None), (64, 64, None), (256, 64, 2)):
            name = grouped.select(planned, "bf16", masked, _specs(M, 4096, 7168, E, masked), M, 4096, 7168, E,
                                  E if masked else 1, exp, 0)
            entry = planned.manifest["variants"][name]
            assert entry["op"] == "gemm_grouped" and entry["grouped"] == ("masked" if masked else "contig")


def test_selection_refusals(planned):
    with pytest.raises(NoVariantError, match="multiple of 8"):  # K rows not whole 16-byte vectors
        grouped.select(planned, "bf16", False, _specs(64, 256, 250, 4, False), 64, 256, 250, 4, 1, None, 0)
    from factory.runtime.selector import DTYPE, GroupedProblem, _I64x3

    sel = planned.selector

    def problem(**kw):
        d = dict(ab=DTYPE["bf16"], c=DTYPE["bf16"], masked=0, m=64, n=256, k=512, e=4, a=0x10000, b=0x100000,
                 c_ptr=0x200000, offs=0x300000, masked_m=None, c_stride=(256, 1, 0))
        d.update(kw)
        return GroupedProblem(d["ab"], d["c"], d["masked"], d["m"], d["n"], d["k"], d["e"], d["a"],
                              _I64x3(512, 1, 0), d["b"], _I64x3(512, 1, 256 * 512), d["c_ptr"], _I64x3(*d["c_stride"]),
                              d["offs"], d["masked_m"], 0)

    assert sel.select("gemm_grouped", problem()).name
    for kw, match in ((dict(masked=2), "masked must be 0 or 1"), (dict(masked_m=0x300000), "not both"),
                      (dict(c_ptr=0x10000), "overlaps"), (dict(c_stride=(0, 1, 0)), "overlap"),
                      (dict(e=1025), "at most 1024"), (dict(c=DTYPE["f32"]), "one dtype"), (dict(k=0), "K must be"),
                      (dict(m=-1), "must not be negative")):
        with pytest.raises(InputError, match=match):
            sel.select("gemm_grouped", problem(**kw))
    assert sel.select("gemm_grouped", problem(m=0)).variant == -1  # empty: nothing to launch


@pytest.fixture
def ops(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    if not b.candidates("gemm_grouped"):
        pytest.skip("the test bundle has no gemm_grouped variant")
    b.rec = Recorder()
    b.simulate(b.rec)
    return b, b.torch_ops()


def test_torch_ops(ops):
    b, kf = ops
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(kf.grouped_gemm, (bf(64, 128), w(4, 256, 128), i32(10, 10, 40, 64)), test_utils=checks)
    torch.library.opcheck(kf.grouped_gemm_out, (bf(64, 128), w(4, 256, 128), bf(64, 256), i32(10, 10, 40, 64)),
                          test_utils=checks)
    assert any(n.startswith("gemm_grouped_") for n in b.rec.launched)
    # A repeated problem takes the hot path (no checks beyond pointers); a new out that overlaps
    # an input falls back to the checked path, which refuses it.
    a, wt, offs = bf(64, 128), w(4, 256, 128), i32(10, 10, 40, 64)
    n0 = len(b.rec.launched)
    for _ in range(3):
        assert b.grouped_gemm(a, wt, offs).shape == (64, 256)
    assert len(b.rec.launched) == n0 + 3
    big = bf(64, 512)
    b.grouped_gemm(a, wt, offs, out=big[:, :256])
    with pytest.raises(InputError, match="overlaps"):
        b.grouped_gemm(big[:, :128], wt, offs, out=big[:, 128:384])
    from torch._subclasses.fake_tensor import FakeTensorMode

    # torch.compile traces bundle.grouped_gemm as the op (dynamic sizes: the fake selects only on
    # concrete ones), no graph break
    fn = torch.compile(lambda x, o: b.grouped_gemm(x, wt, o) * 2, fullgraph=True, dynamic=True, backend="eager")
    assert fn(a, offs).shape == (64, 256) and fn(bf(96, 128), i32(10, 10, 40, 96)).shape == (96, 256)
    with FakeTensorMode():  # the fake refuses what the real op refuses, and says why
        with pytest.raises(InputError, match="int32"):
            kf.grouped_gemm(bf(64, 128), w(4, 256, 128), torch.zeros(4, dtype=torch.int64))
        with pytest.raises(NoVariantError):
            kf.grouped_gemm(bf(64, 124), w(4, 256, 124), i32(1, 2, 3, 4))
        out = kf.grouped_gemm(bf(64, 128), w(4, 256, 128), i32(1, 2, 3, 4))
        assert out.shape == (64, 256) and out.dtype == torch.bfloat16
