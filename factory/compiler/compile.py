"""Compile one variant on a machine with no GPU: fake tensors with symbolic sizes -> cute.compile
for the variant's target -> export_to_c (header + object with the cubin inside) -> the cubin, its
resources and the header's struct layouts.

Runs in worker processes: :func:`init_worker` must run before ``cutlass`` is imported in the process
(the DSL reads the trace-time architecture from ``CUTE_DSL_ARCH`` at import on some versions).
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from pathlib import Path

from ..abi import ScalarArg, Signature, StructLayout, TensorArg
from ..variant import Variant
from .cubin import extract_cubins, kernel_resources


def init_worker(target: str) -> None:
    os.environ["CUTE_DSL_ARCH"] = target
    os.environ.setdefault("CUTE_DSL_LOG_LEVEL", "0")
    # Trap 1 of the AOT notes: export_to_c JIT-links against the DSL's runtime, which a process
    # with no CUDA driver does not have loaded: load it globally first.
    from cutlass.base_dsl import env_manager

    for lib in env_manager.get_prefix_dsl_libs("CUTE_DSL").split(":"):
        if lib.endswith("libcute_dsl_runtime.so") and os.path.exists(lib):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            break


def cutlass_dtype(name: str):
    import cutlass

    return {
        "f32": cutlass.Float32, "f16": cutlass.Float16, "bf16": cutlass.BFloat16,
        "e4m3": cutlass.Float8E4M3FN, "e5m2": cutlass.Float8E5M2,
        "i32": cutlass.Int32, "i64": cutlass.Int64,
        "e8m0": cutlass.Float8E8M0FNU, "e2m1": cutlass.Float4E2M1FN,
    }[name]


def fake_args(sig: Signature) -> list:
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    # Widths matter: this DSL version (4.8.1) writes `int64_t dynamic_strides[]` into the exported
    # header whatever the SymInt's width, while the generated code reads strides at the SymInt's
    # width (32 by default).  A 32-bit stride symbol therefore makes the header lie (seen on the
    # H100: every row stride read as 0).  Strides are 64-bit symbols, sizes 32-bit; the loader
    # still reads the layout from the header and checks it against these widths.
    stride_syms = {d for a in sig.args if isinstance(a, TensorArg) for d in a.stride if isinstance(d, str)}
    syms = {
        s: (cute.sym_int64 if s in stride_syms else cute.sym_int32)(divisibility=sig.divisor(s))
        for s in sig.symbols()
    }
    out = []
    for a in sig.args:
        if isinstance(a, TensorArg):
            dim = lambda d: syms[d] if isinstance(d, str) else d  # noqa: E731
            out.append(make_fake_tensor(
                cutlass_dtype(a.dtype), tuple(map(dim, a.shape)), tuple(map(dim, a.stride)),
                assumed_align=a.align,
            ))
        elif isinstance(a, ScalarArg):
            out.append(cutlass_dtype(a.dtype)(0))
        else:
            raise TypeError(a)
    return out


_STRUCT = re.compile(
    r"typedef struct \{\s*void \*data;\s*(?:(\w+) dynamic_shapes\[(\d+)\];)?\s*"
    r"(?:(\w+) dynamic_strides\[(\d+)\];)?\s*\} (\w+);"
)
_WRAPPER = re.compile(r"static inline int32_t (cute_dsl_\w+_wrapper)\(([^)]*)\)")


def parse_header(text: str) -> dict:
    """Struct layouts of the tensor arguments and the wrapper's parameter list, from the header."""
    structs = {}
    for m in _STRUCT.finditer(text):
        structs[m.group(5)] = StructLayout(
            m.group(1) or "int32_t", int(m.group(2) or 0), m.group(3) or "int64_t", int(m.group(4) or 0)
        )
    m = _WRAPPER.search(text)
    if not m:
        raise ValueError("no cute_dsl_*_wrapper in the exported header")
    params = []
    for p in m.group(2).split(","):
        p = p.strip()
        ctype, pname = p.rsplit(" ", 1)
        if pname.startswith("*"):
            ctype, pname = ctype + " *", pname[1:]
        params.append((ctype.strip(), pname))
    return {"wrapper": m.group(1), "params": params, "structs": structs}


def compile_variant(variant: Variant, out_dir: str | Path) -> dict:
    """Compile, export and inspect one variant; writes ``<name>.h``, ``<name>.o``, ``<name>.cubin``."""
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = variant.name
    reason = variant.can_implement()
    if reason:
        raise ValueError(f"{name}: {reason}")
    t0 = time.perf_counter()
    sig = variant.signature()
    kernel = variant.make_kernel()
    compiled = cute.compile(kernel, *fake_args(sig), cuda.CUstream(0), options=f"--gpu-arch {variant.target}")
    t_compile = time.perf_counter() - t0
    compiled.export_to_c(file_path=str(out_dir), file_name=name, function_prefix=name)
    obj = (out_dir / f"{name}.o").read_bytes()
    cubins = extract_cubins(obj)
    if len(cubins) != 1:
        raise RuntimeError(f"{name}: expected one cubin in the exported object, found {len(cubins)}")
    (out_dir / f"{name}.cubin").write_bytes(cubins[0])
    header = parse_header((out_dir / f"{name}.h").read_text())
    return {
        "name": name,
        "compile_seconds": round(t_compile, 2),
        "kernels": kernel_resources(cubins[0]),
        "header": {
            "wrapper": header["wrapper"],
            "params": header["params"],
            "structs": {k: v.__dict__ for k, v in header["structs"].items()},
        },
    }
