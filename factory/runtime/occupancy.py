"""Resident thread-block clusters of a persistent variant on the current GPU.

A persistent sm90 variant takes its grid cap (``max_clusters``) at launch.  SMs // CTAs per
cluster is only an upper bound: a cluster's CTAs must share a GPC, so a GPC whose free SMs are not
a multiple of the cluster size strands some (H100 SXM, 132 SMs: 66 clusters of 2 fit, but 30 of 4,
not 33 — notes/results/probe_clusters_h100.txt).  A grid larger than what fits runs its last
clusters as a second wave.  The driver knows: ``cuOccupancyMaxActiveClusters`` on the variant's
own kernel (its cubin is in the bundle), with the launch's block size, shared memory and cluster
shape, on the current device.  Asked once per variant and device per process; any failure (no
cuda-python, no context, an old driver) falls back to the upper bound.
"""

from __future__ import annotations

from pathlib import Path


def current_device() -> int | None:
    """torch's current CUDA device index, or None without a usable CUDA device."""
    try:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - no CUDA build, no driver
        return None


def capturing() -> bool:
    """Whether torch's current CUDA stream is capturing a graph (module loads and occupancy
    questions do not belong in a capture)."""
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001
        return False


def max_active_clusters(bundle_path: Path, entry: dict, cluster_ctas: int | None = None) -> int | None:
    """Clusters of ``cluster_ctas`` (default ``entry["persistent"]["cluster_ctas"]``) CTAs of this
    variant's kernel that the current device holds at once, or None when the driver cannot be asked."""
    try:
        return _ask_driver(bundle_path, entry, cluster_ctas or int(entry["persistent"]["cluster_ctas"]))
    except Exception:  # noqa: BLE001 - no driver library, no context, an old cuda-python: the bound
        return None


def _ask_driver(bundle_path: Path, entry: dict, ctas: int) -> int | None:
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return None
    ok = cu.CUresult.CUDA_SUCCESS
    err, ctx = cu.cuCtxGetCurrent()
    if err != ok or not int(ctx):
        return None
    try:
        kernels = entry["resources"]["kernels"]
        name = max(kernels, key=lambda k: kernels[k].get("code_bytes", 0))
        smem = int(entry["resources"]["dynamic_smem_bytes"])
        data = (Path(bundle_path) / entry["files"]["cubin"]["path"]).read_bytes()
    except (KeyError, OSError, ValueError):
        return None
    err, mod = cu.cuModuleLoadData(data)
    if err != ok:
        return None
    try:
        err, fn = cu.cuModuleGetFunction(mod, name.encode())
        if err != ok:
            return None
        attr = cu.CUfunction_attribute
        cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
        cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = ctas, 1, 1
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = int(entry["threads"]), 1, 1
        cfg.sharedMemBytes = smem
        la = cu.CUlaunchAttribute()
        la.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        la.value.clusterDim.x, la.value.clusterDim.y, la.value.clusterDim.z = ctas, 1, 1
        cfg.attrs = [la]
        cfg.numAttrs = 1
        err, n = cu.cuOccupancyMaxActiveClusters(fn, cfg)
        return int(n) if err == ok and n > 0 else None
    finally:
        cu.cuModuleUnload(mod)
