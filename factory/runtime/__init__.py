"""The DSL-free runtime: ``Bundle.open(path)``, then ``bundle.gemm(a, b)`` / ``bundle.attention(q, k, v)``.

Layers, each importing only those below it (tests/test_imports.py checks there is no cycle):

    api         Bundle: the user's entry points, dispatching to the ops
    gemm, packed, attention, blockscaled
                the ops: argument checks, the selection's answer (cached), launch  (packed and blockscaled use gemm)
    validate    the checks every op makes before a pointer reaches a kernel
    bundle      BundleCore: manifest, files, device, binders, launch
    loader      the host library (ctypes) and the argument binders
    selector    the variant selection: the host library's fx_*_select (ctypes)
    manifest, open_cache, tuning, cost_sm100, occupancy, errors
                reading files (and what an earlier open found), the tuning table and the cost
                models' constants, the driver's cluster occupancy, exceptions

Imports only the standard library here; torch is imported when an op is first used.
"""

from .api import Bundle
from .errors import BundleError, InputError, LaunchError, NoVariantError

__all__ = ["Bundle", "BundleError", "InputError", "LaunchError", "NoVariantError"]
