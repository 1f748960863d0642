"""The selection of the host library (compiler/csrc/fx_select.c) on synthetic manifest entries, on
this GPU-less machine: the tables ``factory.compiler.selection.tables`` generates for the entries
(and a tuning table), fx_select.c and stand-in load/launch functions, compiled into a small shared
library with the system C compiler.  Tests of the selection rules and cost models run the one
implementation the runtime runs, on variant sets a bundle does not hold.

An entry needs what the rules read (``name``, ``op``, ``target``, ``family``, dtypes, layout, tile,
...); its argument contract is generated here, fully symbolic (every problem that has the right
ranks meets it), unless the entry carries its own ``signature``."""

from __future__ import annotations

import ctypes
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

from factory.compiler import link, selection, toolchain
from factory.runtime import selector as rs

_BUILT: dict[str, Path] = {}
_DIR = Path(tempfile.mkdtemp(prefix="fx_selection_lib_"))


def _tensor(name: str, rank: int) -> dict:
    return {"kind": "tensor", "name": name, "dtype": "f32", "shape": [f"{name}_s{i}" for i in range(rank)],
            "stride": [f"{name}_t{i}" for i in range(rank)], "align": 1}


def _scalar(name: str, dtype: str = "i32") -> dict:
    return {"kind": "scalar", "name": name, "dtype": dtype}


def signature(e: dict) -> dict:
    """A fully symbolic argument list of the shape the runtime passes for this kind of entry."""
    op = e.get("op", "gemm")
    if op == "attention":
        if e.get("varlen"):
            args = [_tensor(n, 3) for n in "qkvo"] + [_tensor("lse", 2), _tensor("cu_q", 1), _tensor("cu_k", 1),
                                                      _scalar("scale", "f32"), _scalar("max_seqlen_q")]
        else:
            args = [_tensor(n, 4) for n in "qkvo"] + [_tensor("lse", 3)]
            if int(e.get("splits", 1)) > 1:
                args += [_tensor("o_partial", 5), _tensor("lse_partial", 4)]
            args.append(_scalar("scale", "f32"))
    elif op == "gemm_blockscaled":
        args = [_tensor(n, 3) for n in "abc"] + [_tensor("sfa", 1), _tensor("sfb", 1)]
        if e.get("format") == "nvf4":
            args += [_tensor("global_a", 1), _tensor("global_b", 1)]
        args.append(_scalar("max_clusters"))
    elif e.get("family") == "decode":
        args = [_tensor("a", 2), _tensor("b", 4), _tensor("c", 2), _tensor("scale_a", 1), _tensor("scale_b", 1)]
    else:
        args = [_tensor(n, 3) for n in "abc"]
        if e.get("dtypes", {}).get("a") == "e4m3":
            args += [_tensor("scale_a", 1), _tensor("scale_b", 1)]
        if "workspace" in e:
            args.append(_tensor("workspace", 3))
        if "persistent" in e:
            args.append(_scalar("max_clusters"))
    return {"args": args, "divisibility": {}}


def _entry(e: dict) -> dict:
    e = dict(e)
    e.setdefault("op", "attention" if "head_dim" in e else "gemm")
    e.setdefault("target", "sm_90a" if e.get("family") == "sm90" else "sm_90")
    if e["op"] == "gemm":
        e.setdefault("layout", {"a": "k", "b": "k", "c": "n"})
        e.setdefault("dtypes", {"a": "bf16", "b": "bf16", "c": "bf16", "acc": "f32"})
    sig = e.setdefault("signature", signature(e))
    e.setdefault("abi", {"params": [["void *", "module"]] + [["void *", a["name"]] for a in sig["args"]],
                         "structs": {}})
    return e


def build(entries: list[dict], tuning: dict | None = None) -> Path:
    """The selection library of ``entries`` (manifest order) and ``tuning`` (a tuning.json's
    content: its ``device``, ``buckets`` and ``attention``), built once per content."""
    es = {e["name"]: _entry(e) for e in entries}
    key = hashlib.sha256(json.dumps([es, tuning], sort_keys=True, default=str).encode()).hexdigest()[:16]
    if key in _BUILT:
        return _BUILT[key]
    d = _DIR / key
    d.mkdir(parents=True, exist_ok=True)
    stubs = ['#include <stdint.h>', '#include <cuda_runtime.h>', '#include "fx_select.h"',
             'typedef struct { cudaLibrary_t module; } fx_stub_module;']
    for n in es:
        stubs += [f"static fx_stub_module fx_module_{n};",
                  f"static int32_t fx_load_{n}(void) {{ return 0; }}",
                  f"static int32_t fx_bind_{n}(const fx_value *v, cudaStream_t s) {{ (void)v; (void)s; return 0; }}"]
    (d / "tables.c").write_text("\n".join(stubs) + "\n" + selection.tables(es, tuning))
    (d / "fx_bundle.h").write_text(link.public_header(list(es)))
    cuda = toolchain.cuda_root()
    out = d / "libselection.so"
    cmd = [toolchain.cc(), "-O1", "-fPIC", "-shared", "-ffp-contract=off", f"-I{cuda / 'include'}", f"-I{d}",
           f"-I{link.CSRC}", "-o", str(out), str(d / "tables.c"), str(link.CSRC / "fx_select.c"),
           str(cuda / "lib" / "libcudart_static.a"), "-lm", "-lpthread", "-ldl", "-lrt"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"building the selection library failed:\n{r.stderr[-4000:]}")
    _BUILT[key] = out
    return out


class Lib:
    """fx_*_select of a selection library for one device."""

    def __init__(self, entries: list[dict], cc=(9, 0), sm_count: int = 132, name: str = "",
                 tuning: dict | None = None):
        self.sel = rs.Selector(build(entries, tuning), cc, {"name": name, "sm_count": sm_count})

    def _name(self, op, problem) -> str:
        return self.sel.select(op, problem).name.decode()

    def gemm(self, M, N, K, L=1, ab="bf16", c="bf16", am="k", bm="k", b_constant=False) -> str:
        """The choice for a problem with contiguous operands of this majorness."""
        sa = (K, 1, M * K) if am == "k" else (1, M, M * K)
        sb = (K, 1, N * K) if bm == "k" else (1, N, N * K)
        scales = [(1 << 40, (1,), (1,)), ((1 << 40) + 64, (1,), (1,))] if ab == "e4m3" else []
        p = rs.Selector.gemm_problem((0, (M, K, L), sa), (0, (N, K, L), sb), (0, (M, N, L), (N, 1, M * N)),
                                     ab, c, scales, b_constant)
        return self._name("gemm", p)

    def attention(self, b, hq, hkv, sq, sk, d=128, dtype="bf16", causal=True, varlen=False) -> tuple[str, int]:
        qs, ks = rs._I64x3(sq * hq * d, hq * d, d), rs._I64x3(sk * hkv * d, hkv * d, d)
        p = rs.AttentionProblem(rs.DTYPE[dtype], int(varlen), b, sq, sk, hq, hkv, d, None, None, None, None,
                                qs, ks, ks, rs._I64x3(*qs), None, rs._I64x2(hq * sq, sq), None, None,
                                sq if varlen else 0, int(causal), 0.0)
        s = self.sel.select("attention", p)
        return s.name.decode(), s.splits

    def packed(self, M, N, K, b_constant=False) -> str:
        p = rs.PackedProblem(M, N, K, None, rs._I64x2(K, 1), None, rs._I64x4((K // 64) * 512, 512, 16, 1), None,
                             rs._I64x2(N, 1), 1 << 40, (1 << 40) + 64, int(b_constant))
        return self._name("gemm_packed", p)

    def blockscaled(self, fmt, M, N, K, L=1, c="bf16") -> str:
        nv = fmt == "nvf4"
        p = rs.BlockScaledProblem(rs.FORMAT[fmt], rs.DTYPE[c], M, N, K, L, None, rs._I64x3(K, 1, M * K), None,
                                  rs._I64x3(K, 1, N * K), None, rs._I64x3(N, 1, M * N), None, None,
                                  1 << 40 if nv else None, (1 << 40) + 64 if nv else None)
        return self._name("gemm_blockscaled", p)


def lib_of(entries, **kw) -> Lib:
    return Lib(entries, **kw)


__all__ = ["Lib", "build", "lib_of", "signature", "ctypes"]


def attach(bundle):
    """Make ``bundle`` (a Bundle opened on a manifest whose entries were edited or added without
    being built, e.g. another tier's variants for selection only) select with a library built
    from its manifest's entries; returns the bundle."""
    entries = list(bundle.manifest["variants"].values())
    bundle._selector = rs.Selector(build(entries), bundle.capability, bundle.device_info())
    return bundle
