"""Where the build's tools and libraries are, and their versions (they go into the cache key and
the manifest).  Everything comes from pip packages: no system CUDA toolkit is needed."""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
import subprocess
from pathlib import Path


def _pkg_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


@functools.cache
def cuda_root() -> Path:
    """pip's nvidia-cuda-runtime (cuda_runtime.h, libcudart_static.a)."""
    import nvidia.cu13  # type: ignore

    for root in nvidia.cu13.__path__:
        if (Path(root) / "lib" / "libcudart_static.a").exists():
            return Path(root)
    raise FileNotFoundError("libcudart_static.a not found: pip install nvidia-cuda-runtime")


@functools.cache
def dsl_runtime_static() -> Path:
    from cutlass.base_dsl import env_manager

    for lib in env_manager.get_prefix_dsl_libs("CUTE_DSL").split(":"):
        p = Path(lib).parent / "libcuda_dialect_runtime_static.a"
        if p.exists():
            return p
    raise FileNotFoundError("libcuda_dialect_runtime_static.a not found in the DSL package")


@functools.cache
def cuda12_runtime() -> tuple[Path, str]:
    """The CUDA 12 runtime a host library may be linked with instead (``python -m factory link
    --cuda 12``): the folder holding ``include/cuda_runtime.h`` and ``lib/libcudart_static.a`` —
    ``$FACTORY_CUDA12_RUNTIME``, else pip's ``nvidia-cuda-runtime-cu12`` — and its version."""
    env = os.environ.get("FACTORY_CUDA12_RUNTIME")
    roots = [Path(env)] if env else []
    if not env:
        try:
            import nvidia  # type: ignore

            roots += [Path(r) / "cuda_runtime" for r in nvidia.__path__]
        except ImportError:
            pass
    for root in roots:
        if (root / "lib" / "libcudart_static.a").exists() and (root / "include" / "cuda_runtime_api.h").exists():
            text = (root / "include" / "cuda_runtime_api.h").read_text(errors="replace")
            import re

            m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
            ver = f"{int(m.group(1)) // 1000}.{int(m.group(1)) % 1000 // 10}" if m else "12"
            if not ver.startswith("12."):
                raise FileNotFoundError(f"{root}: the runtime there is CUDA {ver}, not 12")
            return root, _pkg_version("nvidia-cuda-runtime-cu12") or ver
    raise FileNotFoundError("the CUDA 12 runtime (libcudart_static.a) was not found: pip install "
                            "'nvidia-cuda-runtime-cu12>=12.4,<13' or set FACTORY_CUDA12_RUNTIME to its folder")


def dsl_runtime_static_for(major: int) -> Path:
    """The DSL's launch runtime for a CUDA major (the DSL ships ``cu12/`` and ``cu13/`` builds)."""
    p = dsl_runtime_static().parents[1].parent / f"cu{major}" / "lib" / "libcuda_dialect_runtime_static.a"
    if not p.exists():
        raise FileNotFoundError(f"{p} not found: install nvidia-cutlass-dsl-libs-cu{major}")
    return p


def cc() -> str:
    return os.environ.get("CC", "gcc")


@functools.cache
def cc_version() -> str:
    out = subprocess.run([cc(), "--version"], capture_output=True, text=True)
    return out.stdout.splitlines()[0].strip() if out.returncode == 0 else "unknown"


@functools.cache
def versions() -> dict[str, str | None]:
    return {
        "nvidia-cutlass-dsl": _pkg_version("nvidia-cutlass-dsl"),
        "nvidia-cuda-runtime": _pkg_version("nvidia-cuda-runtime"),
        "nvidia-cuda-nvdisasm": _pkg_version("nvidia-cuda-nvdisasm"),
        "cc": cc_version(),
    }
