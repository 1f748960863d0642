"""The DSL-free runtime: ``Bundle.open(path)``, then ``bundle.gemm(a, b)`` / ``bundle.attention(q, k, v)``.

Imports only the standard library here; torch is imported when a bundle is used.
"""

from .bundle import Bundle, BundleError, LaunchError, NoVariantError

__all__ = ["Bundle", "BundleError", "LaunchError", "NoVariantError"]
