"""A bundle on disk is untrusted input: every tampered manifest or file below is refused by the
loader with a BundleError that names the field or the file, and ``verify`` and ``doctor`` report
the same problem in the same words (one implementation: runtime/manifest.py).  GPU-less: the
loader runs simulated (``BundleCore.simulate``) for a planned H100, on a one-variant copy of the
test bundle."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, Recorder
from factory.__main__ import main as factory_main
from factory.runtime import Bundle, BundleError
from factory.runtime import manifest as manifest_mod
from tampering import flip_byte, pick, small_copy, write_manifest

H100 = {"name": "planned H100", "sm_count": 132}


@pytest.fixture
def small(test_bundle, tmp_path):
    """(bundle path, its manifest, the variant's name): one sm_90 GEMM variant."""
    src = json.loads((test_bundle / "manifest.json").read_text())
    name = pick(src)[0]
    dst = tmp_path / "b"
    return dst, small_copy(test_bundle, dst, [name]), name


def open_and_load(path: Path) -> None:
    """What a server does: open the bundle, load every variant it may run (simulated)."""
    b = Bundle.open(path, capability=(9, 0), device=H100)
    b.simulate(Recorder())
    assert b.preload(("gemm",)) >= 1


def cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = factory_main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_all_refuse(capsys, path: Path, pattern: str) -> str:
    """The loader, ``verify``, ``doctor`` and ``list`` refuse the bundle, each naming the same
    problem (``pattern``, a regex); returns the loader's message."""
    with pytest.raises(BundleError, match=pattern) as e:
        open_and_load(path)
    msg = str(e.value)
    problem = re.search(pattern, msg).group(0)
    rc, out, err = cli(capsys, "verify", str(path))
    assert rc == 1 and problem in err and "verify: OK" not in out, (out, err)
    rc, out, _ = cli(capsys, "doctor", str(path), "--json")
    rep = json.loads(out)
    assert rc == 1, rep
    if "bundle error" not in rep:  # a file problem: listed as verify lists it
        assert any(problem in p for p in rep["files"]), rep["files"]
        rc, out, _ = cli(capsys, "list", str(path))
        assert rc == 0 and "1 variants" in out
    else:
        assert problem in rep["bundle error"], rep
        rc, out, err = cli(capsys, "list", str(path))
        assert rc == 1 and problem in err and out == ""
    return msg


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the manifest's schema ------------------------------------------------------------------------
def test_the_untouched_copy_passes_everywhere(small, capsys):
    path, _m, name = small
    open_and_load(path)
    rc, out, err = cli(capsys, "verify", str(path))
    assert rc == 0 and "verify: OK" in out and name in out, err
    rc, out, _ = cli(capsys, "doctor", str(path), "--json")
    assert rc == 0 and json.loads(out)["files"].startswith("4 files"), out


@pytest.mark.parametrize("edit, pattern", [
    (lambda m, v: v.pop("files"), r"field variants\.\w+\.files is missing"),
    (lambda m, v: v.update(files={}), r"field variants\.\w+\.files\.cubin is missing"),
    (lambda m, v: v["files"].pop("object"), r"field variants\.\w+\.files\.object is missing"),
    (lambda m, v: v["files"]["cubin"].pop("sha256"), r"field variants\.\w+\.files\.cubin\.sha256 is missing"),
    (lambda m, v: v["files"]["cubin"].update(sha256="00" * 31), r"field variants\.\w+\.files\.cubin\.sha256 '0+' is not a sha256"),
    (lambda m, v: v["files"]["cubin"].update(bytes=-1), r"field variants\.\w+\.files\.cubin\.bytes -1 is outside"),
    (lambda m, v: v["files"]["cubin"].update(bytes=True), r"field variants\.\w+\.files\.cubin\.bytes must be an integer"),
    (lambda m, v: m.update(variants=[]), r"field variants must be a JSON object of variant name -> entry, got list"),
    (lambda m, v: m.update(variants=None), r"field variants must be a JSON object"),
    (lambda m, v: m.pop("host_library"), r"field host_library is missing"),
    (lambda m, v: v["resources"].update(registers="230"), r"field variants\.\w+\.resources\.registers must be an integer"),
    (lambda m, v: v["abi"]["params"].pop(), r"field variants\.\w+\.abi\.params must list the module"),
    (lambda m, v: v["abi"].update(wrapper="w(); system(\"id\")"), r"field variants\.\w+\.abi\.wrapper .* is not an identifier"),
    (lambda m, v: v["signature"]["args"][0].update(align=3), r"field variants\.\w+\.signature\.args\[0\]\.align 3 does not divide 16"),
    (lambda m, v: v["signature"]["args"][0].update(shape=["M", "K"]), r"field variants\.\w+\.signature\.args\[0\]\.stride rank 3 differs"),
    (lambda m, v: v.update(tile="128"), r"field variants\.\w+\.tile must be a list"),
    (lambda m, v: v.update(proof="trust me"), r"field variants\.\w+\.proof 'trust me' is not one of"),
    (lambda m, v: v["sass_requirements"].append("(unclosed"), r"field variants\.\w+\.sass_requirements\[\d+\] is not a regular expression"),
], ids=["no-files", "empty-files", "no-object", "no-sha256", "short-sha256", "negative-bytes", "bool-bytes",
        "variants-list", "variants-null", "no-host-library", "string-registers", "abi-params", "wrapper-injection",
        "align", "rank", "tile-string", "proof", "bad-regex"])
def test_a_schema_violation_names_the_field(small, capsys, edit, pattern):
    path, m, name = small
    edit(m, m["variants"][name])
    write_manifest(path, m)
    assert_all_refuse(capsys, path, pattern)


def test_a_variant_name_that_is_not_an_identifier(small, capsys):
    path, m, name = small
    bad = 'x"); system("id'
    m["variants"] = {bad: {**m["variants"][name], "name": bad}}
    write_manifest(path, m)
    assert_all_refuse(capsys, path, r"field variants\.x.*\.name .* is not an identifier")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, None], ids=["recursion", "depth"])
def test_deep_nesting_is_a_bundle_error(small, capsys, text):
    path, m, name = small
    if text is None:  # within the parser's recursion limit, past the manifest's depth bound
        deep: list = []
        for _ in range(60):
            deep = [deep]
        m["variants"][name]["config"]["extra"] = deep
        text = json.dumps(m)
    write_manifest(path, text)
    assert_all_refuse(capsys, path, rf"nested deeper than {manifest_mod.MAX_DEPTH} levels")


def test_an_oversized_manifest_is_refused_before_parsing(small, capsys, monkeypatch):
    path, m, _ = small
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 4096)
    assert_all_refuse(capsys, path, r"larger than 4096 bytes, more than any bundle's manifest")


# --- file paths -----------------------------------------------------------------------------------
def test_a_path_climbing_out_of_the_bundle(small, capsys):
    path, m, name = small
    rec = m["variants"][name]["files"]["cubin"]
    outside = path.parent / "outside.cubin"
    outside.write_bytes((path / rec["path"]).read_bytes())
    rec["path"] = "../outside.cubin"  # size and sha256 are the real file's
    write_manifest(path, m)
    assert_all_refuse(capsys, path, r"field variants\.\w+\.files\.cubin\.path '\.\./outside\.cubin' climbs out")
    rec["path"] = "cubin/../../outside.cubin"
    write_manifest(path, m)
    assert_all_refuse(capsys, path, r"field variants\.\w+\.files\.cubin\.path .* climbs out")


@pytest.mark.parametrize("which", ["cubin", "host_library"])
def test_an_absolute_path_with_its_real_hash(small, capsys, which):
    path, m, name = small
    target = Path(sys.executable).resolve()  # a file outside the bundle on every machine
    data = target.read_bytes()
    rec = {"path": str(target), "sha256": sha256(data), "bytes": len(data)}
    if which == "cubin":
        m["variants"][name]["files"]["cubin"] = rec
        field = rf"variants\.\w+\.files\.cubin\.path"
    else:
        m["host_library"] = rec
        field = "host_library.path"
    write_manifest(path, m)
    assert_all_refuse(capsys, path, rf"field {field} '{re.escape(str(target))}' is absolute")


@pytest.mark.parametrize("which", ["cubin", "host_library"])
def test_a_symlink_out_of_the_bundle(small, capsys, which):
    path, m, name = small
    rec = m["variants"][name]["files"]["cubin"] if which == "cubin" else m["host_library"]
    p = path / rec["path"]
    outside = path.parent / "outside"
    outside.write_bytes(p.read_bytes())  # the same bytes: only the place is wrong
    p.unlink()
    p.symlink_to(outside)
    owner = f"{name}'s cubin" if which == "cubin" else "host library"
    assert_all_refuse(capsys, path, rf"{re.escape(str(p))}: {re.escape(owner)} lies outside the bundle "
                                    rf"\(it resolves to {re.escape(str(outside.resolve()))}\)")


def test_a_symlink_inside_the_bundle_is_followed(small, capsys):
    path, m, name = small
    p = path / m["variants"][name]["files"]["cubin"]["path"]
    real = path / "shared" / "kernel.cubin"
    real.parent.mkdir()
    os.replace(p, real)
    p.symlink_to(os.path.relpath(real, p.parent))
    open_and_load(path)
    rc, out, err = cli(capsys, "verify", str(path))
    assert rc == 0 and "verify: OK" in out, err


def test_a_directory_where_a_file_should_be(small, capsys):
    path, m, name = small
    m["variants"][name]["files"]["header"]["path"] = "cubin"
    write_manifest(path, m)
    assert_all_refuse(capsys, path, rf"{re.escape(str(path / 'cubin'))}: {name}'s header is not a regular file")


# --- file contents --------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["cubin", "header", "object"])
def test_a_flipped_byte_is_reported_by_all(small, capsys, kind):
    path, m, name = small
    p = path / m["variants"][name]["files"][kind]["path"]
    flip_byte(p)
    msg = assert_all_refuse(capsys, path, rf"{re.escape(str(p))}: {name}'s {kind} is altered "
                                          rf"\(its sha256 differs from the manifest's\)")
    assert msg.endswith("; nothing was loaded")
    rc, _, err = cli(capsys, "link", str(path))  # no new library from a tampered object or header
    assert rc == 1 and "not relinked: 1 file problem(s)" in err and f"{name}'s {kind} is altered" in err, err


@pytest.mark.parametrize("data", [b"", b"\x7fELF" + bytes(range(256)) * 8, bytes(range(256)) * 20],
                         ids=["empty", "bad-elf", "not-elf"])
def test_a_cubin_that_is_no_cubin_with_its_hash_restamped(small, capsys, data):
    """The manifest is not signed: whoever rewrites a file can rewrite its hash.  The loader never
    reads the cubin file (the host library embeds its own copy); ``verify`` reports it."""
    path, m, name = small
    rec = m["variants"][name]["files"]["cubin"]
    (path / rec["path"]).unlink()
    (path / rec["path"]).write_bytes(data)
    rec.update(sha256=sha256(data), bytes=len(data))
    write_manifest(path, m)
    open_and_load(path)
    rc, out, err = cli(capsys, "verify", str(path))
    assert rc == 1 and f"{name}'s cubin is not a cubin nvdisasm and the ELF reader take" in err, (out, err)


@pytest.mark.parametrize("body", [
    [], "[" * 100_000, {"device": []}, {"device": "H100"}, {"buckets": []}, {"buckets": {"k": 5}},
    {"buckets": {"k": {"winner": "x", "b_constant": 7}}}, {"buckets": {"k": {"packed": "x"}}}, {"attention": [1]},
], ids=["list", "deep", "device-list", "device-str", "buckets-list", "bucket-int", "b-constant-int", "packed-str",
        "attention-list"])
def test_a_tuning_table_of_another_shape_falls_back_to_the_cost_model(small, body):
    """tuning.json is a bundle file too: one that is not what tune.py writes (but names this
    manifest) is set aside with the reason, and selection runs on the cost model."""
    from factory.runtime import tuning

    path, _m, name = small
    from factory.compiler.link import relink

    relink(path)  # the selection is the host library's: link it with this one-variant manifest
    if isinstance(body, dict):
        body = {"schema": tuning.SCHEMA, "manifest_sha256": tuning.manifest_sha256(path),
                "device": {**H100, "capability": [9, 0]}, **body}
    (path / "tuning.json").write_text(body if isinstance(body, str) else json.dumps(body))
    b = Bundle.open(path, capability=(9, 0), device=H100)
    rec = Recorder()
    b.simulate(rec)
    assert b.tuning is None
    assert tuning.load(path, H100)[1].startswith("tuning.json unreadable")
    import torch

    b.gemm(torch.randn(128, 256, dtype=torch.bfloat16), torch.randn(256, 256, dtype=torch.bfloat16))
    assert rec.launched == [name]


def test_the_command_line_prints_one_line_not_a_traceback(small):
    path, m, name = small
    m["variants"] = []
    write_manifest(path, m)
    for cmd in ("verify", "list", "link"):  # (doctor: in-process above; its torch import is slow)
        r = subprocess.run([sys.executable, "-m", "factory", cmd, str(path)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, (cmd, r.stderr)
        assert "field variants must be a JSON object" in r.stderr + r.stdout, (cmd, r.stderr, r.stdout)


def test_a_host_library_of_another_manifest_is_refused(small):
    """The host library holds the selection tables: one linked from other variants than the
    manifest lists (here: the full test bundle's library under a one-variant manifest) would choose
    variants this bundle does not describe; the first selection says so."""
    path, _m, _name = small
    b = Bundle.open(path, capability=(9, 0), device=H100)
    b.simulate(Recorder())
    import torch

    with pytest.raises(BundleError, match="host library's variants are not the manifest's: relink"):
        b.gemm(torch.randn(128, 256, dtype=torch.bfloat16), torch.randn(256, 256, dtype=torch.bfloat16))
