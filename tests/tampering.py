"""Small copies of a built bundle to tamper with: a manifest of a few variants, and their files
and the host library hard-linked (copied where links cannot be made).  A tampering helper replaces
a file rather than writing through its link, so the source bundle is never touched."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def pick(manifest: dict, target: str = "sm_90", op: str = "gemm", n: int = 1) -> list[str]:
    """The first ``n`` variant names of ``op`` for ``target`` (sorted, so stable)."""
    names = sorted(k for k, v in manifest["variants"].items() if v["target"] == target and v["op"] == op)
    assert len(names) >= n, f"the bundle has {len(names)} {op} variants for {target}"
    return names[:n]


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def small_copy(src: Path, dst: Path, names: list[str]) -> dict:
    """A bundle at ``dst`` holding the variants ``names`` of the bundle ``src``; returns its manifest."""
    m = json.loads((src / "manifest.json").read_text())
    m["variants"] = {k: m["variants"][k] for k in names}
    for rec in [m["host_library"]] + [f for v in m["variants"].values() for f in v["files"].values()]:
        link_or_copy(src / rec["path"], dst / rec["path"])
    write_manifest(dst, m)
    return m


def write_manifest(bundle: Path, m) -> None:
    (bundle / "manifest.json").write_text(m if isinstance(m, str) else json.dumps(m, indent=1))


def replace(p: Path, data: bytes) -> None:
    """Give ``p`` new contents without writing through a hard link."""
    p.unlink()
    p.write_bytes(data)


def flip_byte(p: Path, at: int | None = None) -> None:
    data = bytearray(p.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0xFF
    replace(p, bytes(data))
