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


def default_cache_dir() -> Path:
    """The compile cache (compiled variants, the host library's objects): $FACTORY_CACHE, else
    ~/.cache/kernel-factory."""
    env = os.environ.get("FACTORY_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernel-factory"


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
