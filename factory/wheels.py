"""Kernel wheels: a built bundle as an installable Python package.

``build_kernels_wheel(bundle, out_dir)`` writes ``kernel_factory_kernels_<set>-<version>-py3-none-<platform>.whl``
holding the package ``kernel_factory_kernels_<set>``: its ``bundle/`` directory (the manifest,
the host library, and every file the manifest lists, so that the loader's checks and ``verify``
work on the installed copy), an ``__init__.py`` naming ``BUNDLE`` and ``TARGETS``, and the entry
point ``kernel_factory.bundles`` that ``Bundle.default()`` finds (runtime/installed.py).  The
wheel needs ``kernel-factory`` of the same major.minor version.  Standard library only: no build
backend, no network.

The platform tag comes from the host library itself: its ELF machine and the newest glibc symbol
version it needs (``manylinux_2_<minor>_<arch>``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

from . import __version__
from .runtime.installed import GROUP, PACKAGE_FOR_TARGET

_ARCH = {62: "x86_64", 183: "aarch64"}


def target_set(targets) -> str:
    """The kernels package suffix for a bundle's targets: ``sm90`` for sm_90 + sm_90a, the sets
    joined by ``_`` when a bundle spans several (``sm80_sm90``)."""
    sets = sorted({PACKAGE_FOR_TARGET.get(t, t.replace("_", "")) for t in targets}, key=lambda s: (len(s), s))
    return "_".join(sets)


def platform_tag(library: Path) -> str:
    """``manylinux_2_<N>_<arch>`` for a host library: the newest ``GLIBC_2.N`` symbol version it
    names, and its ELF machine."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{library} is not an ELF shared library")
    arch = _ARCH.get(int.from_bytes(data[18:20], "little"))
    if arch is None:
        raise ValueError(f"{library}: ELF machine {int.from_bytes(data[18:20], 'little')} has no wheel tag here")
    minors = [int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", data)]
    return f"manylinux_2_{max(minors, default=17)}_{arch}"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def bundle_files(bundle: Path, manifest: dict) -> list[str]:
    """The bundle's files a package carries: the manifest, the host library, tuning.json when
    present, and every variant's files (relative paths, sorted)."""
    files = {"manifest.json", manifest["host_library"]["path"]}
    if (bundle / "tuning.json").is_file():
        files.add("tuning.json")
    for v in manifest["variants"].values():
        files.update(rec["path"] for rec in v["files"].values())
    return sorted(files)


def build_kernels_wheel(bundle: str | Path, out_dir: str | Path, *, version: str | None = None,
                        compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """Write the kernels wheel of ``bundle`` into ``out_dir``; returns its path.  The bundle is
    checked first (manifest schema, every file's size and sha256) so that a wheel never ships a
    bundle the loader would refuse."""
    from .runtime.manifest import bundle_problems, load_manifest

    bundle, out_dir = Path(bundle), Path(out_dir)
    m = load_manifest(bundle)
    problems = bundle_problems(bundle, m)
    if problems:
        raise ValueError(f"{bundle} is not intact ({len(problems)} problem(s)): {problems[0]}")
    targets = sorted({v["target"] for v in m["variants"].values()})
    tset = target_set(targets)
    version = version or __version__
    dist = f"kernel-factory-kernels-{tset.replace('_', '-')}"
    pkg = f"kernel_factory_kernels_{tset}"
    wheel_name = dist.replace("-", "_")
    tag = f"py3-none-{platform_tag(bundle / m['host_library']['path'])}"
    major_minor = ".".join(__version__.split(".")[:2])
    info = f"{wheel_name}-{version}.dist-info"
    init = (f'"""Kernels of kernel-factory for {", ".join(targets)}: a bundle built with '
            f'nvidia-cutlass-dsl {m.get("versions", {}).get("nvidia-cutlass-dsl", "?")}, found by '
            f'factory.runtime.Bundle.default()."""\n\n'
            f"from pathlib import Path\n\nBUNDLE = Path(__file__).parent / \"bundle\"\n"
            f"TARGETS = {tuple(targets)!r}\nVARIANTS = {len(m['variants'])}\n")
    meta = (f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
            f"Summary: kernel-factory bundle for {', '.join(targets)}: {len(m['variants'])} variants "
            f"(cubins, host library, manifest)\nLicense: Apache-2.0 (see kernel-factory); the host library "
            f"statically links NVIDIA's CUDA runtime and CuTe DSL runtime, under NVIDIA's terms\n"
            f"Requires-Python: >=3.10\nRequires-Dist: kernel-factory=={major_minor}.*\n")
    wheel = f"Wheel-Version: 1.0\nGenerator: factory.wheels\nRoot-Is-Purelib: false\nTag: {tag}\n"
    entry = f"[{GROUP}]\n{tset} = {pkg}\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{wheel_name}-{version}-{tag}.whl"
    tmp = path.with_suffix(".tmp")
    record = []
    with zipfile.ZipFile(tmp, "w", compression) as z:
        def put(name: str, data: bytes, mode: int = 0o644):
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o100000 | mode) << 16
            zi.compress_type = compression
            z.writestr(zi, data)
            record.append(_record_line(name, data))

        put(f"{pkg}/__init__.py", init.encode())
        for rel in bundle_files(bundle, m):
            put(f"{pkg}/bundle/{rel}", (bundle / rel).read_bytes(), 0o755 if rel.endswith(".so") else 0o644)
        put(f"{info}/METADATA", meta.encode())
        put(f"{info}/WHEEL", wheel.encode())
        put(f"{info}/entry_points.txt", entry.encode())
        put(f"{info}/top_level.txt", f"{pkg}\n".encode())
        record.append(f"{info}/RECORD,,")
        zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = (0o100644) << 16
        z.writestr(zi, "\n".join(record) + "\n")
    tmp.replace(path)
    return path


def describe(path: Path) -> dict:
    """A wheel's name, size and file count (for the build script's report)."""
    with zipfile.ZipFile(path) as z:
        n, raw = len(z.infolist()), sum(i.file_size for i in z.infolist())
    return {"wheel": path.name, "bytes": path.stat().st_size, "files": n, "unpacked_bytes": raw}


if __name__ == "__main__":  # pragma: no cover - scripts/build_wheels.py is the entry point
    import sys

    print(json.dumps(describe(build_kernels_wheel(sys.argv[1], sys.argv[2]))))
