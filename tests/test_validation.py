"""The validation layer on this GPU-less machine: every row of docs/errors.md that can be shown
without a GPU.  A bundle opened for a planned H100 either refuses CPU tensors (as on a real device)
or, simulated (``BundleCore.simulate``), takes them as device -1 with a launcher that records
instead of launching.  Tensors "on cuda:N" are CPU tensors whose ``get_device()`` says N."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import Recorder
from factory.runtime import Bundle, BundleError, InputError, NoVariantError

H100 = {"name": "planned H100", "sm_count": 132}




class OnDevice(torch.Tensor):
    """A CPU tensor that says it is on CUDA device ``index`` (to test the device guards)."""

    index = 0

    def get_device(self):
        return self.index


def on(t, index: int):
    x = torch.Tensor._make_subclass(OnDevice, t)
    x.index = index
    return x


@pytest.fixture
def real(test_bundle):
    """As on a GPU: CPU tensors are refused; the current device is cuda:0; launches recorded."""
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    rec = Recorder()
    b.simulate(rec)
    b.simulated, b.lowest_device = False, 0
    b.current = 0  # the current device (a test switches it)
    b._cur = lambda: b.current
    b.rec = rec
    return b


@pytest.fixture
def sim(test_bundle):
    b = Bundle.open(test_bundle, capability=(9, 0), device=H100)
    b.rec = Recorder()
    b.simulate(b.rec)
    return b


def bf(*shape):
    return torch.randn(*shape, dtype=torch.bfloat16)


def e4m3(*shape):
    return torch.randn(*shape).to(torch.float8_e4m3fn)


# --- devices -------------------------------------------------------------------------------------
def test_cpu_tensors_are_refused(real):
    with pytest.raises(InputError, match="a is on cpu: the kernels need CUDA tensors"):
        real.gemm(bf(16, 64), bf(32, 64))
    with pytest.raises(InputError, match="q is on cpu"):
        real.attention(bf(1, 8, 2, 64), bf(1, 8, 2, 64), bf(1, 8, 2, 64))
    with pytest.raises(InputError, match="a is on cpu"):
        real.gemm(e4m3(16, 1024), real.pack_b(e4m3(64, 1024)))
    assert real.rec.launched == []


def test_mixed_devices_are_refused(real):
    a, b = on(bf(16, 64), 0), on(bf(32, 64), 0)
    with pytest.raises(InputError, match=r"different devices \(a on cuda:0, b on cpu\)"):
        real.gemm(a, bf(32, 64))
    with pytest.raises(InputError, match=r"out on cpu"):
        real.gemm(a, b, out=torch.empty(16, 32, dtype=torch.bfloat16))
    with pytest.raises(InputError, match=r"b on cuda:1"):
        real.gemm(a, on(bf(32, 64), 1))
    q = on(bf(1, 8, 2, 64), 0)
    with pytest.raises(InputError, match=r"q on cuda:0, k on cpu"):
        real.attention(q, bf(1, 8, 2, 64), q)
    assert real.rec.launched == []


def test_fp8_scales_are_checked(real):
    a, b = on(e4m3(16, 64), 0), on(e4m3(32, 64), 0)
    with pytest.raises(InputError, match="scale_a is on cpu but a is on cuda:0"):
        real.gemm(a, b, scale_a=torch.ones(1))
    with pytest.raises(InputError, match="scale_b must hold one element"):
        real.gemm(a, b, scale_b=on(torch.ones(2), 0))
    with pytest.raises(InputError, match="one-element torch.Tensor"):
        real.gemm(a, b, scale_a=2.0)
    with pytest.raises(InputError, match="floating-point"):
        real.gemm(a, b, scale_a=on(torch.ones(1, dtype=torch.int32), 0))
    with pytest.raises(InputError, match="fp8 GEMMs only"):
        real.gemm(on(bf(16, 64), 0), on(bf(32, 64), 0), scale_a=on(torch.ones(1), 0))
    assert real.rec.launched == []


def test_another_device_than_the_current_one_is_refused(real):
    """Tensors on cuda:1 while cuda:0 is current: refused (never launched on the wrong device)."""
    a, b = on(bf(16, 64), 1), on(bf(32, 64), 1)
    with pytest.raises(InputError, match=r"on cuda:1 but the current device is cuda:0.*torch.cuda.device\(1\)"):
        real.gemm(a, b)
    q = on(bf(1, 8, 2, 64), 1)
    with pytest.raises(InputError, match="current device is cuda:0"):
        real.attention(q, q, q)
    real.current = 1  # the caller switched devices: now it runs
    assert real.gemm(a, b).shape == (16, 32) and len(real.rec.launched) == 1


def test_launch_with_tensors_checks_their_device(real, sim):
    name = next(n for n, v in sim.manifest["variants"].items() if v["op"] == "gemm" and v["family"] == "sm90")
    args = [bf(1, r, c).permute(1, 2, 0) for r, c in ((128, 64), (128, 64), (128, 128))] + [132]  # (rows, K, L)
    with pytest.raises(InputError, match="a is on the CPU; every tensor must be on the current CUDA device"):
        real.launch(name, args)
    with pytest.raises(InputError, match=r"b is on cuda:1; every tensor must be on the current CUDA device \(cuda:0\)"):
        real.launch(name, [on(args[0], 0), on(args[1], 1), *args[2:]])
    with pytest.raises(InputError, match="takes 4 arguments"):
        real.launch(name, args[:3])
    assert real.rec.launched == []
    real.launch(name, [on(t, 0) for t in args[:3]] + [132])
    sim.launch(name, args)  # simulated: CPU tensors are the device
    assert real.rec.launched == [name] and sim.rec.launched == [name]


def test_a_hot_cache_does_not_skip_the_device_check(real):
    a, b, out = on(bf(16, 64), 0), on(bf(32, 64), 0), on(torch.empty(16, 32, dtype=torch.bfloat16), 0)
    real.gemm(a, b, out)  # selected and cached
    with pytest.raises(InputError, match="a is on cpu"):
        real.gemm(bf(16, 64), bf(32, 64), torch.empty(16, 32, dtype=torch.bfloat16))  # same key but the CPU
    q = on(bf(1, 8, 2, 64), 0)
    real.attention(q, q, q)
    with pytest.raises(InputError, match="k on cpu"):
        real.attention(q, bf(1, 8, 2, 64), q)


# --- shapes, zero sizes, autograd ------------------------------------------------------------------
def test_out_of_the_wrong_shape_or_dtype(sim):
    a, b = bf(16, 64), bf(32, 64)
    with pytest.raises(InputError, match=r"out must have shape \(16, 32\).*got \(32, 16\)"):
        sim.gemm(a, b, out=torch.empty(32, 16, dtype=torch.bfloat16))
    with pytest.raises(InputError, match=r"out must have shape \(16, 32\)"):
        sim.gemm(a, b, out=torch.empty(1, 16, 32, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="out_dtype"):
        sim.gemm(a, b, out=torch.empty(16, 32, dtype=torch.bfloat16), out_dtype=torch.float32)
    with pytest.raises(InputError, match="not one the kernels write"):
        sim.gemm(a, b, out=torch.empty(16, 32, dtype=torch.int32))
    with pytest.raises(InputError, match="must be a torch.Tensor"):
        sim.gemm(a.numpy() if False else [1, 2], b)
    assert sim.rec.launched == []


@pytest.mark.parametrize("m,n,k,batch", [(0, 32, 64, None), (16, 0, 64, None), (16, 32, 0, None), (16, 32, 64, 0),
                                         (0, 0, 0, None)])
def test_zero_size_gemm_gives_torchs_result_without_a_launch(sim, m, n, k, batch):
    lead = () if batch is None else (batch,)
    a, b = bf(*lead, m, k), bf(*lead, n, k)
    out = torch.full((*lead, m, n), float("nan"), dtype=torch.bfloat16)
    assert sim.gemm(a, b, out) is out
    assert torch.equal(out, a @ b.transpose(-1, -2))  # zeros for K = 0
    assert sim.gemm(a, b).shape == (*lead, m, n)
    assert sim.rec.launched == []


def test_fp8_k0_is_zeros_times_the_scales(sim):
    a, b = e4m3(4, 0), e4m3(8, 0)
    out = sim.gemm(a, b, scale_a=torch.tensor([2.0]), scale_b=torch.tensor([float("inf")]))
    assert out.dtype == torch.bfloat16 and torch.isnan(out).all()  # 0 * inf, as the scaled sum would be
    assert torch.equal(sim.gemm(a, b, scale_a=torch.tensor([2.0])), torch.zeros(4, 8, dtype=torch.bfloat16))
    assert sim.rec.launched == []


def test_packed_zero_rows_and_refusals(sim):
    p = sim.pack_b(e4m3(256, 2048))
    assert sim.gemm(e4m3(0, 2048), p).shape == (0, 256) and sim.rec.launched == []
    with pytest.raises(InputError, match=r"out must have shape \(4, 256\)"):
        sim.gemm(e4m3(4, 2048), p, out=torch.empty(4, 128, dtype=torch.bfloat16))
    with pytest.raises(InputError, match="positive multiple of 64"):
        sim.pack_b(e4m3(8, 0))
    with pytest.raises(InputError, match="2-D a of K=2048"):
        sim.gemm(e4m3(4, 1024), p)


def test_inputs_that_require_grad(sim):
    a, b = bf(16, 64).requires_grad_(), bf(32, 64)
    with pytest.raises(InputError, match="gemm: a require grad, and gemm has no backward"):
        sim.gemm(a, b)
    with torch.no_grad():
        sim.gemm(a, b)
    with torch.inference_mode():
        sim.gemm(a, b)
    q = bf(1, 8, 2, 64)
    with pytest.raises(InputError, match="attention: k, v require grad"):
        sim.attention(q, q.clone().requires_grad_(), q.clone().requires_grad_())
    with torch.no_grad():
        sim.attention(q, q.clone().requires_grad_(), q)
    assert len(sim.rec.launched) == 3


def test_attention_zero_queries_and_zero_keys(sim):
    q, kv = bf(2, 0, 4, 64), bf(2, 16, 4, 64)
    o, lse = sim.attention(q, kv, kv, return_lse=True)
    assert o.shape == q.shape and lse.shape == (2, 4, 0)
    q, kv = bf(2, 5, 4, 64), bf(2, 0, 4, 64)
    o, lse = sim.attention(q, kv, kv, return_lse=True, causal=True)
    assert torch.equal(o, torch.zeros_like(q)) and bool((lse == float("-inf")).all())
    # varlen: no keys anywhere, and no queries
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    o, lse = sim.attention(bf(5, 4, 64), bf(0, 4, 64), bf(0, 4, 64), cu_seqlens_q=cu,
                           cu_seqlens_k=torch.zeros(3, dtype=torch.int32), return_lse=True)
    assert torch.equal(o, torch.zeros(5, 4, 64, dtype=torch.bfloat16)) and bool((lse == float("-inf")).all())
    z = torch.zeros(3, dtype=torch.int32)
    assert sim.attention(bf(0, 4, 64), bf(5, 4, 64), bf(5, 4, 64), cu_seqlens_q=z, cu_seqlens_k=cu).shape == (0, 4, 64)
    assert sim.rec.launched == []


# --- varlen ----------------------------------------------------------------------------------------
VARLEN_BAD = [
    ([0, 3, 2, 5], [0, 3, 4, 5], None, "cu_seqlens_q must not decrease: cu_seqlens_q\\[2\\] = 2"),
    ([0, 3, 4, 9], [0, 3, 4, 5], None, "cu_seqlens_q must end at the token count 5, ends at 9"),
    ([0, 3, 4, 5], [0, 2, 4, 7], None, "cu_seqlens_k must end at the token count 5"),
    ([1, 3, 4, 5], [0, 3, 4, 5], None, "cu_seqlens_q must start at 0"),
    ([0, 3, 4, 5], [0, 3, 4, 5], 2, "max_seqlen_q = 2 is below the longest query sequence \\(3\\)"),
]


def vq(t):
    """Varlen q/k/v of the test bundle's varlen variant (f16, head_dim 128, causal)."""
    return torch.randn(t, 4, 128, dtype=torch.float16)


@pytest.mark.parametrize("cq,ck,maxq,msg", VARLEN_BAD)
def test_varlen_checked_mode(sim, monkeypatch, cq, ck, maxq, msg):
    q = vq(5)
    args = dict(cu_seqlens_q=torch.tensor(cq, dtype=torch.int32), cu_seqlens_k=torch.tensor(ck, dtype=torch.int32),
                max_seqlen_q=maxq if maxq is not None else 3, causal=True)
    with pytest.raises(InputError, match=msg):
        sim.attention(q, q, q, check_varlen=True, **args)
    monkeypatch.setenv("FACTORY_CHECK_VARLEN", "1")
    with pytest.raises(InputError, match=msg):
        sim.attention(q, q, q, **args)
    sim.attention(q, q, q, check_varlen=False, **args)  # trusted: launched as given
    monkeypatch.setenv("FACTORY_CHECK_VARLEN", "0")
    sim.attention(q, q, q, **args)
    assert len(sim.rec.launched) == 2


def test_varlen_checks_that_need_no_synchronisation(sim):
    q, cu = vq(5), torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(InputError, match="1-D int32"):
        sim.attention(q, q, q, cu_seqlens_q=cu.long(), cu_seqlens_k=cu)
    with pytest.raises(InputError, match="lengths differ"):
        sim.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(InputError, match="exceeds the 5 query tokens"):
        sim.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6)
    with pytest.raises(InputError, match="both cu_seqlens_q and cu_seqlens_k"):
        sim.attention(q, q, q, cu_seqlens_q=cu)
    sim.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, check_varlen=True, causal=True)  # valid: launched
    assert len(sim.rec.launched) == 1


# --- the bundle on disk ----------------------------------------------------------------------------
@pytest.fixture
def copy(test_bundle, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(test_bundle, dst)
    return dst


WHY = {"altered": r"is altered \(its sha256 differs from the manifest's\)",
       "truncated": r"is truncated or altered \(\d+ bytes, the manifest says \d+\)", "missing": "is missing"}


def _launch_first_gemm(path):
    b = Bundle.open(path, capability=(9, 0), device=H100)
    rec = Recorder()
    b.simulate(rec)
    b.gemm(bf(128, 256), bf(256, 256))
    return rec.launched[-1]


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing"])
@pytest.mark.parametrize("kind", ["cubin", "object"])
def test_damaged_variant_files_are_refused_before_loading(copy, damage, kind):
    name = _launch_first_gemm(copy)
    rec = json.loads((copy / "manifest.json").read_text())["variants"][name]["files"][kind]
    p = copy / rec["path"]
    if damage == "altered":
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    elif damage == "truncated":
        p.write_bytes(p.read_bytes()[:-1])
    else:
        p.unlink()
    with pytest.raises(BundleError, match=f"{rec['path']}: {name}'s {kind} {WHY[damage]}.*; nothing was loaded"):
        _launch_first_gemm(copy)


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing"])
def test_damaged_host_library_is_refused_at_open(copy, damage):
    m = json.loads((copy / "manifest.json").read_text())
    p = copy / m["host_library"]["path"]
    if damage == "missing":
        p.unlink()
    else:
        data = p.read_bytes()
        p.write_bytes(data[:-1] if damage == "truncated" else data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(BundleError, match=f"{m['host_library']['path']}: host library {WHY[damage]}"):
        Bundle.open(copy)


def test_manifest_schema_and_corruption(copy):
    m = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**m, "schema_version": 2}))
    with pytest.raises(BundleError, match="manifest schema 2 is newer than this loader, which reads schema 1"):
        Bundle.open(copy)
    (copy / "manifest.json").write_text(json.dumps({**m, "schema_version": 0}))
    with pytest.raises(BundleError, match="rebuild the bundle"):
        Bundle.open(copy)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not a readable manifest"):
        Bundle.open(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(BundleError, match="no manifest.json"):
        Bundle.open(copy)


def test_named_variant_must_fit(sim):
    a, b = bf(128, 256), bf(256, 256)
    other = next(n for n, v in sim.manifest["variants"].items()
                 if v["op"] == "gemm" and v["dtypes"]["a"] == "e4m3" and v["family"] != "decode"
                 and not v.get("epilogue"))
    with pytest.raises(InputError, match="does not fit"):
        sim.gemm(a, b, variant=other)
    with pytest.raises(NoVariantError, match="no gemm variant 'nope'"):
        sim.gemm(a, b, variant="nope")
    assert sim.rec.launched == []
