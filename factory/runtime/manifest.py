"""Reading a bundle's manifest (standard library only)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

SUPPORTED_SCHEMA = 1


class BundleError(RuntimeError):
    pass


def load_manifest(bundle: str | Path) -> dict:
    p = Path(bundle) / "manifest.json"
    if not p.exists():
        raise BundleError(f"{bundle}: no manifest.json (is this a bundle? build one with "
                          f"`python -m factory build` or scripts/build_bundle.py)")
    m = json.loads(p.read_text())
    if m.get("schema_version") != SUPPORTED_SCHEMA:
        raise BundleError(f"{bundle}: manifest schema {m.get('schema_version')}, this loader reads "
                          f"{SUPPORTED_SCHEMA}: rebuild the bundle")
    return m


def sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_ok(bundle: Path, rec: dict) -> bool:
    p = Path(bundle) / rec["path"]
    return p.is_file() and p.stat().st_size == rec["bytes"] and sha256_file(p) == rec["sha256"]
