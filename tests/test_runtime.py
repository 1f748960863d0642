"""The DSL-free loader on this GPU-less machine: opening, selection, errors (no launches)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from factory.runtime import Bundle, BundleError, NoVariantError
from factory.runtime.gemm import _as_rkl, select


def _select(b, a, w, out=None, dt="bf16"):
    out = out if out is not None else torch.empty(a.shape[0], w.shape[0], dtype=a.dtype)
    return select(b, _as_rkl(a, "a"), _as_rkl(w, "b"), _as_rkl(out, "c"), dt, dt, [])


def test_runtime_never_imports_the_dsl(test_bundle):
    code = (
        "import sys, torch\n"
        "from factory.runtime import Bundle\n"
        f"b = Bundle.open({str(test_bundle)!r}, capability=(8, 6))\n"
        "from factory.runtime.gemm import select, _as_rkl\n"
        "a = torch.randn(64, 256).bfloat16(); w = torch.randn(128, 256).bfloat16()\n"
        "print(select(b, _as_rkl(a,'a'), _as_rkl(w,'b'), _as_rkl(torch.empty(64,128).bfloat16(),'c'), 'bf16','bf16',[]))\n"
        "b.lib  # loads the host library with ctypes\n"
        "assert not any(m == 'cutlass' or m.startswith(('cutlass.', 'mlir', '_mlir')) for m in sys.modules), "
        "sorted(m for m in sys.modules if 'cutlass' in m or 'mlir' in m)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("gemm_sm8")


def test_selection_prefers_the_most_specific_target(test_bundle):
    a, w = torch.randn(512, 256).bfloat16(), torch.randn(512, 256).bfloat16()
    assert _select(Bundle.open(test_bundle, capability=(8, 0)), a, w).startswith("gemm_sm80_")
    assert _select(Bundle.open(test_bundle, capability=(8, 6)), a, w).startswith("gemm_sm86_")
    # 8.9: sm_89 builds only what sm_86 lacks (fp8; Target.same_code_as), so bf16 runs sm_86's code.
    assert _select(Bundle.open(test_bundle, capability=(8, 9)), a, w).startswith("gemm_sm86_")
    name = _select(Bundle.open(test_bundle, capability=(9, 0)), a, w)
    assert name.startswith(("gemm_sm90a_", "gemm_sm90_"))


def test_no_fitting_variant_names_bundle_and_device(test_bundle):
    a, w = torch.randn(64, 256).bfloat16(), torch.randn(64, 256).bfloat16()
    with pytest.raises(NoVariantError, match=r"compute capability 7\.5.*the bundle has gemm: .*sm_80"):
        _select(Bundle.open(test_bundle, capability=(7, 5)), a, w)


def test_misalignment_is_refused_with_the_reason(test_bundle):
    b = Bundle.open(test_bundle, capability=(8, 6))
    a, w = torch.randn(64, 260).bfloat16(), torch.randn(64, 260).bfloat16()
    with pytest.raises(NoVariantError, match="multiple of 8"):
        _select(b, a[:, :250], w[:, :250])
    base = torch.randn(64 * 256 + 1).bfloat16()
    with pytest.raises(NoVariantError, match="aligned"):
        _select(b, base[1:].view(64, 256), torch.randn(64, 256).bfloat16())


def test_dtype_and_shape_errors(test_bundle):
    b = Bundle.open(test_bundle, capability=(8, 6))
    with pytest.raises(ValueError, match="dtypes differ"):
        b.gemm(torch.randn(8, 16).bfloat16(), torch.randn(8, 16).half())
    with pytest.raises(ValueError, match="do not match"):
        b.gemm(torch.randn(8, 16).bfloat16(), torch.randn(8, 24).bfloat16())


def test_corrupt_host_library_is_refused(test_bundle, tmp_path):
    bad = tmp_path / "b"
    shutil.copytree(test_bundle, bad)
    lib = bad / "lib" / "libfactory_bundle.so"
    lib.write_bytes(lib.read_bytes() + b"\0")
    with pytest.raises(BundleError, match=r"host library is truncated or altered \(\d+ bytes, the manifest says \d+\)"):
        Bundle.open(bad)


def test_packed_arguments_match_the_header_structs(test_bundle):
    """The generated packer writes exactly the C layout of the header's structs (pointer, 32-bit
    sizes, padding, 64-bit strides) and the stream, for every variant's calling convention."""
    import ctypes

    from factory.runtime.loader import Binder
    from factory.runtime.manifest import load_manifest

    m = load_manifest(test_bundle)
    ctype = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64}
    for entry in m["variants"].values():
        binder = Binder(entry)
        specs, expect = [], []
        for i, (arg, (cty, _)) in enumerate(zip(binder.sig.args, entry["abi"]["params"][1:])):
            if arg.kind == "scalar":
                specs.append(1.5 if arg.dtype == "f32" else 7)
                expect.append((ctypes.c_float if arg.dtype == "f32" else ctypes.c_int32)(specs[-1]))
                continue
            st = entry["abi"]["structs"][cty.rstrip(" *")]
            shape = tuple(1000 + 10 * i + j for j in range(len(arg.shape)))
            stride = tuple(2**33 + 100 * i + j for j in range(len(arg.stride)))
            specs.append((0x10000 * (i + 1), shape, stride))
            fields = [("data", ctypes.c_void_p)]
            if st["n_shapes"]:
                fields.append(("s", ctype[st["shape_ctype"]] * st["n_shapes"]))
            if st["n_strides"]:
                fields.append(("t", ctype[st["stride_ctype"]] * st["n_strides"]))
            S = type("S", (ctypes.Structure,), {"_fields_": fields})
            val = S(data=specs[-1][0])
            if st["n_shapes"]:
                val.s[:] = [shape[j] for j, d in enumerate(arg.shape) if isinstance(d, str)]
            if st["n_strides"]:
                val.t[:] = [stride[j] for j, d in enumerate(arg.stride) if isinstance(d, str)]
            expect.append(val)
        argv, buf = binder.pack(specs, 0xABCDEF)
        for i, want in enumerate(expect):
            got = ctypes.string_at(argv[i], ctypes.sizeof(want))
            assert got == bytes(want), (entry["name"], binder.sig.args[i].name)
        assert ctypes.c_uint64.from_address(argv[len(expect)]).value == 0xABCDEF


def test_split_k_only_for_decode_shapes(test_bundle):
    b = Bundle.open(test_bundle, capability=(8, 6))
    if not any("workspace" in v for v in b.candidates("gemm")):
        pytest.skip("test bundle has no split-K variant")
    decode = _select(b, torch.randn(1, 14336).bfloat16(), torch.randn(4096, 14336).bfloat16())
    assert "_sk4" in decode
    big = _select(b, torch.randn(4096, 512).bfloat16(), torch.randn(4096, 512).bfloat16())
    assert "_sk" not in big
    short_k = _select(b, torch.randn(1, 64).bfloat16(), torch.randn(4096, 64).bfloat16())
    assert "_sk" not in short_k  # two k-tiles: nothing to split
    entry = b.manifest["variants"][decode]
    assert entry["workspace"]["dtype"] == "f32" and entry["split_k"] == 4


class _Recorder:
    """A host library whose launchers record the packed argument array instead of launching."""

    def __init__(self):
        import ctypes

        self.calls = []
        self._ctypes = ctypes
        self._fns = {}  # the bundle asks once per variant: keep each one's function alive

    def launcher(self, name):
        ctypes = self._ctypes

        def launch(argv):
            ptrs = ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p))
            # first 8 bytes of each argument slot: the data pointer of a tensor struct
            self.calls.append([ctypes.c_uint64.from_address(ptrs[i]).value for i in range(5)])
            self.name = name
            return 0

        fn = self._fns[name] = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(launch)
        return fn


def test_gemm_launch_path_without_a_gpu(test_bundle, monkeypatch):
    """bundle.gemm end to end on CPU tensors with a recording launcher: the operands' pointers
    reach the argument array; an fp8 scale that is one float32 element is passed as it is (no
    copy), another dtype is converted; a missing scale is one cached [1.0] per device, but not
    cached when made during CUDA-graph capture (its fill would not have run yet)."""
    from factory.runtime import gemm as rgemm

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    rec = _Recorder()
    b.simulate(rec)
    x, w = torch.randn(16, 256).bfloat16(), torch.randn(512, 256).bfloat16()
    out = torch.empty(16, 512, dtype=torch.bfloat16)
    assert b.gemm(x, w, out) is out
    assert rec.calls[-1][:3] == [x.data_ptr(), w.data_ptr(), out.data_ptr()]

    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5]), torch.tensor(2.0)  # float32, shapes (1,) and ()
    b.gemm(x8, w8, out, scale_a=sa, scale_b=sb)
    assert rec.name.startswith("gemm_sm90a_e4m3")
    assert rec.calls[-1][3:5] == [sa.data_ptr(), sb.data_ptr()]
    half = torch.tensor([0.5], dtype=torch.float16)
    b.gemm(x8, w8, out, scale_a=half, scale_b=sb)
    assert rec.calls[-1][3] != half.data_ptr()
    # A constant B (weights) takes the variant's early_b twin; selection alone never does.
    b.gemm(x8, w8, out, scale_a=sa, scale_b=sb, b_constant=True)
    assert rec.name.endswith("_pdl_eb"), rec.name
    assert rec.calls[-1][:5] == [x8.data_ptr(), w8.data_ptr(), out.data_ptr(), sa.data_ptr(), sb.data_ptr()]
    b.gemm(x8, w8, out, scale_a=sa, scale_b=sb)
    assert rec.name.endswith("_pdl"), rec.name
    assert not any(v["config"].get("early_b") for v in
                   rgemm.fitting_variants(b, *(rgemm.rkl_spec(t, "x") for t in (x8, w8, out)), "e4m3", "bf16",
                                          [(sa.data_ptr(), (1,), (1,))] * 2)[0])
    b.gemm(x, w, out, b_constant=True)  # no twin: the variant itself
    assert rec.name == rgemm.select(b, *(rgemm.rkl_spec(t, "x") for t in (x, w, out)), "bf16", "bf16", [])
    b.gemm(x8, w8, out)
    one = b.unit_scales[x8.device]
    assert one.item() == 1.0 and rec.calls[-1][3:5] == [one.data_ptr()] * 2
    b.gemm(x8, w8, out)
    assert rec.calls[-1][3:5] == [one.data_ptr()] * 2  # reused, not remade

    # The capture rule, for a CUDA device (faked: tensors are made on the CPU here).
    from factory.runtime import devmem

    real_ones = torch.ones
    monkeypatch.setattr(torch, "ones", lambda *a, device=None, **k: real_ones(*a, **k))
    monkeypatch.setattr(devmem, "empty", lambda n, dtype, dev: torch.empty(n, dtype=dtype))  # (kept memory)
    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    first = rgemm._unit_scale(b, cuda0)
    assert first.item() == 1.0 and cuda0 not in b.unit_scales
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    synced = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: type("S", (), {"synchronize": lambda self: synced.append(device)})())
    kept = rgemm._unit_scale(b, cuda0)
    assert synced == [cuda0]  # the fill has finished before any stream may read it
    assert kept is not first and rgemm._unit_scale(b, cuda0) is kept


# --- the op modules and the core ----------------------------------------------------------------------
OP_MODULES = ("gemm.py", "packed.py", "attention.py", "blockscaled.py", "kvcache.py", "torch_ops.py", "validate.py",
              "api.py")


def test_op_modules_use_only_the_cores_public_surface():
    """runtime/bundle.py lists what the op modules may use of a BundleCore; none reaches into a
    private field or method of it (``bundle._x``, ``self._x`` in api.Bundle, ``_BUNDLE._x``)."""
    import re

    runtime = ROOT / "factory" / "runtime"
    bad = []
    for name in OP_MODULES:
        for i, line in enumerate((runtime / name).read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\b(bundle|_BUNDLE|core)\._[A-Za-z]", code) or (name == "api.py" and re.search(r"\bself\._[a-z]", code)):
                bad.append(f"{name}:{i}: {line.strip()}")
    assert not bad, "private reach-ins into BundleCore:\n" + "\n".join(bad)


def _module_entries(fn) -> dict:
    """{runtime module: times a function of it was called from a frame of another module} during
    ``fn()`` (Python frames only)."""
    import collections

    counts = collections.Counter()

    def prof(frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            back = frame.f_back.f_code.co_filename if frame.f_back else ""
            if "factory/runtime/" in f.replace("\\", "/") and f != back:
                counts[f.replace("\\", "/").rsplit("/", 1)[1]] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return dict(counts)


def test_a_call_passes_through_each_op_module_once(test_bundle):
    """A GEMM / attention call enters its op module once (from api.Bundle), checked or hot (an
    attention hot call none: ``Bundle.attention`` runs the key's launch plan, code generated by
    the loader): the core and the loader never call back into it; on the hot path every runtime
    module is entered at most once."""
    from conftest import Recorder

    b = Bundle.open(test_bundle, capability=(9, 0), device={"name": "planned H100", "sm_count": 132})
    b.simulate(Recorder())
    a, w = torch.randn(64, 64, dtype=torch.bfloat16), torch.randn(64, 64, dtype=torch.bfloat16)
    q = torch.randn(1, 128, 8, 128, dtype=torch.bfloat16)
    b.gemm(a, w), b.attention(q, q, q, causal=True)  # (imports the op modules)
    b.hot_gemm.clear(), b.hot_attention.clear(), b.selections.clear()
    for op, call in (("gemm.py", lambda: b.gemm(a, w)), ("attention.py", lambda: b.attention(q, q, q, causal=True))):
        cold, hot = _module_entries(call), _module_entries(call)
        assert cold[op] == 1 and hot.get(op, 0) == (op == "gemm.py"), (cold, hot)
        assert all(n == 1 for m, n in hot.items() if m != "loader.py"), hot
        assert hot.get("loader.py", 0) <= 1, hot  # (a thread's first hot launch makes its argument buffer)


def test_kept_memory_outside_torch_pools(monkeypatch):
    """runtime/devmem.py: on a CUDA device (faked here) a kept tensor wraps driver memory through
    ``__cuda_array_interface__`` (no torch pool owns it) and is never made inside a capture; on the
    CPU, or without the driver, torch's allocator; prototypes are cached per (device, dtype)."""
    from factory.runtime import devmem

    cpu = torch.device("cpu")
    t = devmem.full(5, 7, torch.int32, cpu, sync=True)
    assert t.shape == (5,) and int(t.sum()) == 35
    p = devmem.proto(torch.bfloat16, cpu)
    assert p.numel() == 1 and p.dtype == torch.bfloat16 and devmem.proto(torch.bfloat16, cpu) is p
    assert torch.empty_like(p.expand(3, 4)).stride() == (4, 1)
    made = []
    monkeypatch.setattr(devmem, "_driver_alloc", lambda index, nbytes: made.append((index, nbytes)) or 4096)
    monkeypatch.setattr(torch, "as_tensor", lambda obj, device=None: torch.empty(
        obj.__cuda_array_interface__["shape"], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    k = devmem.empty(6, torch.float32, torch.device("cuda", 1))
    assert made == [(1, 24)] and k.dtype == torch.float32 and k.numel() == 6 and devmem._LIVE.pop(4096)[0] == 1
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch, "empty", lambda n, dtype=None, device=None: ("torch's", n))
    assert devmem.empty(6, torch.float32, torch.device("cuda", 1)) == ("torch's", 6) and len(made) == 1


def test_launch_by_name_refuses_a_page_size_the_variant_was_not_built_for(test_bundle):
    """A paged variant that takes its page size at launch finds pages by shifts, so a launch by
    name with any size outside the manifest's ``page_sizes`` (48: a multiple of 16, not a power
    of two) is refused before packing; a built size passes the same check."""
    from factory.runtime.errors import InputError
    from factory.runtime.loader import Binder
    from factory.runtime.manifest import load_manifest

    entries = [e for e in load_manifest(test_bundle)["variants"].values()
               if e.get("page_sizes") and "PS" in json.dumps(e["signature"])]
    if not entries:
        pytest.skip("the test bundle has no variant taking its page size at launch")
    for entry in entries:
        binder = Binder(entry)

        def specs(ps):
            val = lambda d: (ps if d == "PS" else 64) if isinstance(d, str) else d  # noqa: E731
            return [(0x10000 * (i + 1), tuple(val(d) for d in a.shape), tuple(val(d) for d in a.stride))
                    if a.kind == "tensor" else (1.0 if a.dtype == "f32" else 1)
                    for i, a in enumerate(binder.sig.args)]
        binder.check(specs(entry["page_sizes"][-1]))
        with pytest.raises(InputError, match="page size 48 is not one this variant was built for"):
            binder.check(specs(48))
