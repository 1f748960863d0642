"""Opening a bundle checks each variant's manifest entry on first use, and remembers between
processes (runtime/open_cache.py) where the entries of an unchanged manifest lie and that an
unchanged host library's sha256 was checked.  What is remembered never lets a changed file
through: a host library written in place (its mtime set back) is hashed again and refused, a
hostile cache file is ignored or refused, never trusted.  GPU-less: a simulated planned H100 on
a two-variant copy of the test bundle."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import Recorder
from factory.runtime import Bundle, BundleError
from factory.runtime import manifest as manifest_mod
from factory.runtime import open_cache
from tampering import pick, small_copy, write_manifest

H100 = {"name": "planned H100", "sm_count": 132}


@pytest.fixture
def copy(test_bundle, tmp_path, monkeypatch):
    """(bundle path, manifest, variant names): two sm_90 GEMM variants, the host library a copy of
    its own (written in place below), files older than the racy window, a cache folder of its own."""
    src = json.loads((test_bundle / "manifest.json").read_text())
    names = pick(src, n=2)
    dst = tmp_path / "b"
    m = small_copy(test_bundle, dst, names)
    lib = dst / m["host_library"]["path"]
    data = lib.read_bytes()
    lib.unlink()
    lib.write_bytes(data)
    monkeypatch.setattr(open_cache, "RACY_S", 0.0)
    cache = tmp_path / "open-cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("KERNEL_FACTORY_OPEN_CACHE", str(cache))
    return dst, m, names


def hashes(monkeypatch) -> list:
    """Record every sha256 of a bundle file the loader computes from now on."""
    seen = []
    real = manifest_mod.sha256_file
    monkeypatch.setattr(manifest_mod, "sha256_file", lambda p: seen.append(p.name) or real(p))
    return seen


def test_a_second_open_reads_the_remembered_index_and_skips_the_library_hash(copy, monkeypatch):
    path, m, names = copy
    seen = hashes(monkeypatch)
    first = Bundle.open(path, capability=(9, 0), device=H100)
    lib_name = os.path.basename(m["host_library"]["path"])
    assert seen == [lib_name]
    assert len(list((path.parent / "open-cache").glob("*.json"))) == 1
    seen.clear()
    b = Bundle.open(path, capability=(9, 0), device=H100)
    assert seen == []  # remembered: the library was not hashed again
    assert isinstance(b.manifest["variants"], manifest_mod.LazyVariants)
    assert sorted(b.manifest["variants"]) == sorted(names)
    for n in names:  # the entries read from their remembered places are the manifest's
        assert b.manifest["variants"][n] == m["variants"][n] == first.manifest["variants"][n]
    b.simulate(Recorder())
    assert b.preload(("gemm",)) == 2


def test_a_library_written_in_place_with_its_mtime_set_back_is_hashed_and_refused(copy):
    path, m, _names = copy
    Bundle.open(path, capability=(9, 0), device=H100)  # remembered
    lib = path / m["host_library"]["path"]
    st = os.stat(lib)
    with open(lib, "r+b") as f:  # same size, same inode, one byte flipped
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))  # (the ctime cannot be set back)
    with pytest.raises(BundleError, match=r"host library is altered \(its sha256 differs"):
        Bundle.open(path, capability=(9, 0), device=H100)


def test_a_broken_entry_is_refused_at_its_first_use_and_the_others_run(copy):
    """Each entry is checked when first read: a bundle whose one entry breaks the schema opens,
    runs its other variant, and refuses the broken one naming the field (``verify`` refuses the
    whole bundle: tests/test_untrusted_bundle.py)."""
    path, m, names = copy
    m["variants"][names[1]]["abi"]["wrapper"] = 'w(); system("id")'
    write_manifest(path, m)
    b = Bundle.open(path, capability=(9, 0), device=H100)
    b.simulate(Recorder())
    assert b.manifest["variants"][names[0]]["name"] == names[0]
    with pytest.raises(BundleError, match=rf"field variants\.{names[1]}\.abi\.wrapper .* is not an identifier"):
        b.manifest["variants"][names[1]]
    with pytest.raises(BundleError, match=r"abi\.wrapper"):
        b.preload(("gemm",))


@pytest.mark.parametrize("edit", ["swap-spans", "op", "garbage", "other-checks", "top-span"])
def test_a_hostile_cache_file_is_ignored_or_refused(copy, edit):
    path, m, names = copy
    Bundle.open(path, capability=(9, 0), device=H100)
    (f,) = (path.parent / "open-cache").glob("*.json")
    c = json.loads(f.read_text())
    if edit == "swap-spans":  # each name points at the other's entry: its name differs from the key
        a, b = names
        c["variants"][a][2:], c["variants"][b][2:] = c["variants"][b][2:], c["variants"][a][2:]
        want = r"name .* differs from its key"
    elif edit == "op":
        c["variants"][names[0]][0] = "attention"
        want = "differs from what was read at open"
    elif edit == "garbage":
        c["variants"][names[0]] = [None, None, -5, 10**12]
        want = None
    elif edit == "top-span":  # host_library read from another member's bytes: its schema check refuses
        c["top"]["host_library"] = c["top"]["schema_version"]
        want = "field host_library must be a JSON object"
    else:
        c["checks"] = "0" * 64
        want = None
    f.write_text(json.dumps(c))
    if edit == "top-span":
        with pytest.raises(BundleError, match=want):
            Bundle.open(path, capability=(9, 0), device=H100)
        return
    b = Bundle.open(path, capability=(9, 0), device=H100)
    b.simulate(Recorder())
    if want is None:  # ignored: opened as without a cache
        assert b.preload(("gemm",)) == 2
    else:  # the entry read from where the cache says is checked against its key and the index
        with pytest.raises(BundleError, match=want):
            b.manifest["variants"][names[0]]


def test_a_cache_folder_others_can_write_is_not_used(copy, monkeypatch, tmp_path):
    path, _m, _names = copy
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("KERNEL_FACTORY_OPEN_CACHE", str(shared))
    Bundle.open(path, capability=(9, 0), device=H100)
    assert list(shared.iterdir()) == []
    monkeypatch.setenv("KERNEL_FACTORY_OPEN_CACHE", "off")
    assert open_cache.default() is None


def test_the_split_parse_equals_json_loads():
    """The manifest reader that finds each entry's place gives json.loads's document (duplicate
    keys: the last), or declines where the text is not one object holding a variants object."""
    doc = {"a": [1, {"b": "x\"}"}], "variants": {"v1": {"op": "gemm", "s": "{\\"}, "v2": {}}, "z": None}
    for text in (json.dumps(doc), json.dumps(doc, indent=3), " \n" + json.dumps(doc) + "\n\t",
                 '{"variants": {"v": {"op": 1}, "v": {"op": 2}}, "variants": {"w": []}}'):
        got = manifest_mod._split(text)
        assert got is not None and got[0] == json.loads(text), text
        spans = dict(got[1])
        for k, (s, e) in spans.pop(None).items():  # the other members
            assert json.loads(text[s:e]) == got[0][k]
        for k, (s, e) in spans.items():
            assert json.loads(text[s:e]) == got[0]["variants"][k]
    for text in ("[]", '{"variants": []}', '{"a": 1}', '{"variants": {}} x', '{"variants": {"a" 1}}', ""):
        assert manifest_mod._split(text) is None, text
