"""The runtime's exceptions (standard library only).  A server can map them to responses:

- ``InputError`` (a ``ValueError``): the caller's arguments are wrong — device, dtype, shape,
  strides, alignment, sizes, ``out``, scales, ``cu_seqlens``, autograd.  Nothing was launched.
- ``NoVariantError`` (a ``LookupError``): the arguments are valid, but this bundle has no kernel for
  them on this device (the message says what it has).  Nothing was launched.
- ``BundleError``: the bundle on disk is unusable (missing, tampered or truncated file, a manifest
  schema this loader does not read).  Raised before the file in question is loaded.
- ``LaunchError``: the host library or the CUDA driver refused a load or a launch.
"""

from __future__ import annotations


class InputError(ValueError):
    pass


class NoVariantError(LookupError):
    pass


class BundleError(RuntimeError):
    pass


class LaunchError(RuntimeError):
    pass
