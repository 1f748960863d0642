"""Ahead-of-time CuTe DSL kernel factory.

``factory.runtime`` loads bundles without the DSL; ``factory.compiler`` (and the kernel families in
``factory.gemm``, ``factory.attention``) need ``nvidia-cutlass-dsl`` and run on machines without a GPU.
"""

__version__ = "0.1.0"
