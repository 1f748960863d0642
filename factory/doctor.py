"""``python -m factory doctor [BUNDLE]``: what a bug report needs — this machine's GPU, driver and
torch, the bundle's build versions, which of its targets and families this device runs, and
whether its tuning table applies here.  Imports torch (if installed) and the runtime; never the DSL."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

from .atoms.targets import targets_for_capability
from .runtime import tuning
from .runtime.errors import BundleError
from .runtime.manifest import bundle_problems, host_library_problem, load_manifest


def _gpu() -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": "not installed"}
    r = {"torch": torch.__version__, "torch CUDA": torch.version.cuda}
    if not torch.cuda.is_available():
        return {**r, "GPU": "none visible"}
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    r.update({"GPU": f"cuda:{i} {p.name}", "GPUs visible": torch.cuda.device_count(),
              "compute capability": f"{p.major}.{p.minor}", "SMs": p.multi_processor_count,
              "memory GiB": round(p.total_memory / 2**30, 1)})
    try:
        from cuda.bindings import driver as cu

        err, v = cu.cuDriverGetVersion()
        if err == cu.CUresult.CUDA_SUCCESS:
            r["driver CUDA version"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:  # noqa: BLE001 - cuda-python missing or too old: leave it out
        pass
    return r


def driver_version() -> str:
    """The CUDA version the installed NVIDIA driver supports, asked of libcuda.so.1 itself (no
    cuda-python, no CUDA runtime), or why there is none."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no driver (libcuda.so.1 not found)"
    v = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return "libcuda.so.1 does not answer cuDriverGetVersion"
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def _packages() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    r = {"kernel-factory": __version__}
    for dist in ("cuda-python", "cuda-bindings"):
        try:
            r[dist] = version(dist)
        except PackageNotFoundError:
            r[dist] = "not installed" + (" (the persistent GEMMs' grid is then bounded by the SM count, not "
                                         "asked of the driver)" if dist == "cuda-python" else "")
    return r


def default_bundle() -> str:
    """What ``doctor`` reports on without a bundle argument: artifacts/default when present, else
    the installed kernels package for this GPU (or why there is none)."""
    if Path("artifacts/default/manifest.json").is_file():
        return "artifacts/default"
    from .runtime.errors import NoVariantError
    from .runtime.installed import default_path

    try:
        return str(default_path(None))
    except (BundleError, NoVariantError, ImportError) as e:
        return f"(none: {e})"


def healthy(r: dict) -> bool:
    """Whether a report found the bundle usable: its manifest readable and every file intact."""
    return "bundle error" not in r and isinstance(r.get("files"), str)


def report(bundle: str | Path | None = None) -> dict:
    bundle = default_bundle() if bundle is None else bundle
    r = {**_packages(), "python": sys.version.split()[0], "platform": platform.platform(), **_gpu(),
         "CUDA driver (libcuda.so.1)": driver_version(), "bundle": str(bundle)}
    try:
        m = load_manifest(bundle)
    except BundleError as e:  # the report says why
        return {**r, "bundle error": str(e)}
    r["built with"] = m.get("versions", {})
    rt = str(m.get("versions", {}).get("nvidia-cuda-runtime") or "")
    if rt[:2].isdigit():
        r["host library CUDA runtime"] = (f"{rt} (statically linked): needs a driver for CUDA "
                                          f"{int(rt.split('.')[0])}.0 or newer")
    r["host library"] = ("ok" if host_library_problem(bundle, m) is None
                         else "MISSING, TRUNCATED OR ALTERED") + f" ({m['host_library']['path']})"
    problems = bundle_problems(bundle, m)  # as verify and the loader word them
    n_files = 1 + sum(len(v["files"]) for v in m["variants"].values())
    r["files"] = f"{n_files} files, sizes and sha256 as the manifest says" if not problems else problems
    have: dict[str, dict[str, int]] = {}
    for v in m["variants"].values():
        have.setdefault(v["target"], {}).setdefault(f"{v['op']}/{v['family']}", 0)
        have[v["target"]][f"{v['op']}/{v['family']}"] += 1
    r["variants by target"] = have
    cc = r.get("compute capability")
    if cc:
        runs = [t.name for t in targets_for_capability(tuple(int(x) for x in cc.split(".")))]
        r["targets this GPU runs (best first)"] = [t for t in runs if t in have] or "none of the bundle's"
        r["families selectable here"] = sorted({f for t in runs for f in have.get(t, {})})
        r["tuning.json"] = tuning.load(bundle, {"name": r["GPU"].split(" ", 1)[1], "sm_count": r["SMs"]})[1]
    return r
