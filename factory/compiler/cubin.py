"""Reading cubins without a GPU: pull the cubin out of an exported object, read its resources,
disassemble it with nvdisasm (pip ``nvidia-cuda-nvdisasm``)."""

from __future__ import annotations

import functools
import re
import shutil
import struct
import subprocess
from pathlib import Path

_ELF_MAGIC = b"\x7fELF"
_SHT_NOBITS = 8


def _elf_extent(d: bytes, at: int) -> int:
    """Byte length of the 64-bit little-endian ELF image starting at ``at``."""
    e_phoff, e_shoff = struct.unpack_from("<QQ", d, at + 0x20)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", d, at + 0x36)
    end = max(e_shoff + e_shentsize * e_shnum, e_phoff + e_phentsize * e_phnum)
    for k in range(e_shnum):
        sh = at + e_shoff + k * e_shentsize
        (typ,) = struct.unpack_from("<I", d, sh + 4)
        off, size = struct.unpack_from("<QQ", d, sh + 0x18)
        if typ != _SHT_NOBITS:
            end = max(end, off + size)
    for k in range(e_phnum):
        ph = at + e_phoff + k * e_phentsize
        (off,) = struct.unpack_from("<Q", d, ph + 8)
        (filesz,) = struct.unpack_from("<Q", d, ph + 0x20)
        end = max(end, off + filesz)
    return end


def extract_cubins(obj: bytes) -> list[bytes]:
    """Every CUDA ELF (e_machine 190) embedded in a host object file."""
    found = []
    at = obj.find(_ELF_MAGIC, 1)
    while at != -1:
        (machine,) = struct.unpack_from("<H", obj, at + 0x12)
        if obj[at + 4] == 2 and machine == 190:  # ELFCLASS64, EM_CUDA
            n = _elf_extent(obj, at)
            found.append(obj[at : at + n])
            at = obj.find(_ELF_MAGIC, at + n)
        else:
            at = obj.find(_ELF_MAGIC, at + 1)
    return found


def _sections(cubin: bytes):
    e_shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = []
    for k in range(e_shnum):
        sh = e_shoff + k * e_shentsize
        name, typ = struct.unpack_from("<II", cubin, sh)
        off, size = struct.unpack_from("<QQ", cubin, sh + 0x18)
        (info,) = struct.unpack_from("<I", cubin, sh + 0x2C)
        raw.append((name, typ, off, size, info))
    stroff = raw[e_shstrndx][2]
    out = {}
    for name, typ, off, size, info in raw:
        end = cubin.index(b"\0", stroff + name)
        out[cubin[stroff + name : end].decode()] = (typ, off, size, info)
    return out


# EIATTR codes (CUDA ELF .nv.info attributes) we read.
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MAX_THREADS = 0x05
_EIATTR_REGCOUNT = 0x2F


def _nv_info(cubin: bytes, off: int, size: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    p, end = off, off + size
    while p + 2 <= end:
        fmt, attr = cubin[p], cubin[p + 1]
        p += 2
        if fmt == 0x01:  # EIFMT_NVAL
            val = b""
        elif fmt == 0x02:  # EIFMT_BVAL
            val, p = cubin[p : p + 1], p + 1
        elif fmt == 0x03:  # EIFMT_HVAL
            val, p = cubin[p : p + 2], p + 2
        elif fmt == 0x04:  # EIFMT_SVAL
            (n,) = struct.unpack_from("<H", cubin, p)
            val, p = cubin[p + 2 : p + 2 + n], p + 2 + n
        else:
            break
        out.setdefault(attr, []).append(val)
    return out


def _per_symbol(attrs: dict[int, list[bytes]], code: int) -> dict[int, int]:
    """(symbol index, u32 value) pairs of one EIATTR."""
    out = {}
    for v in attrs.get(code, []):
        if len(v) >= 8:
            sym, val = struct.unpack_from("<II", v)
            out[sym] = val
    return out


def kernel_resources(cubin: bytes) -> dict[str, dict]:
    """Per kernel: registers, static shared memory, stack frame (spill) bytes.

    Register counts live in EIATTR_REGCOUNT records keyed by the kernel's symbol index, in the
    global ``.nv.info`` (newer ptxas) or the kernel's own ``.nv.info.<k>``; older cubins also put
    them in the top byte of the ``.text.<k>`` section's sh_info (whose low bits are the symbol).
    """
    secs = _sections(cubin)
    glob = {}
    if ".nv.info" in secs:
        _, o, s, _ = secs[".nv.info"]
        glob = _nv_info(cubin, o, s)
    res = {}
    for sname, (_typ, _off, size, info) in secs.items():
        if not sname.startswith(".text."):
            continue
        k = sname[len(".text.") :]
        sym = info & 0xFFFFFF
        regs = _per_symbol(glob, _EIATTR_REGCOUNT).get(sym, info >> 24)
        frame = _per_symbol(glob, _EIATTR_FRAME_SIZE).get(sym, 0)
        if ".nv.info." + k in secs:
            _, o, s, _ = secs[".nv.info." + k]
            attrs = _nv_info(cubin, o, s)
            regs = _per_symbol(attrs, _EIATTR_REGCOUNT).get(sym, regs)
            frame = max(frame, _per_symbol(attrs, _EIATTR_FRAME_SIZE).get(sym, 0))
        static_smem = secs.get(".nv.shared." + k, (0, 0, 0, 0))[2]
        res[k] = {"registers": regs, "static_smem_bytes": static_smem, "stack_frame_bytes": frame,
                  "code_bytes": size}
    return res


@functools.cache
def nvdisasm_path() -> str:
    try:
        import nvidia.cu13  # type: ignore  # namespace package from nvidia-cuda-nvdisasm

        for root in nvidia.cu13.__path__:
            p = Path(root) / "bin" / "nvdisasm"
            if p.exists():
                return str(p)
    except ImportError:
        pass
    found = shutil.which("nvdisasm")
    if not found:
        raise FileNotFoundError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    return found


def disassemble(cubin_path: str | Path) -> str:
    out = subprocess.run([nvdisasm_path(), "-c", str(cubin_path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"nvdisasm failed on {cubin_path}: {out.stderr.strip()}")
    return out.stdout


_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)")


def opcode_histogram(sass: str) -> dict[str, int]:
    hist: dict[str, int] = {}
    for m in _OPCODE.finditer(sass):
        hist[m.group(1)] = hist.get(m.group(1), 0) + 1
    return hist


def sass_target(sass: str) -> str | None:
    m = re.search(r"\.target\s+(sm_\w+)", sass)
    return m.group(1) if m else None


def ptxas_arch(cubin: bytes) -> str | None:
    """The ``-arch`` ptxas was given for this cubin (its ``.note.nv.tkinfo`` records the command
    line): ``sm_100f`` where nvdisasm's ``.target`` says only ``sm_100``.  None if absent."""
    try:
        secs = _sections(cubin)
    except (struct.error, ValueError, IndexError):
        return None
    note = secs.get(".note.nv.tkinfo")
    if note is None:
        return None
    m = re.search(rb"-arch (sm_\w+)", cubin[note[1] : note[1] + note[2]])
    return m.group(1).decode() if m else None


def cubin_target(cubin: bytes, sass: str) -> str | None:
    """The target a cubin was built for: ptxas's ``-arch`` where the cubin records it, else the
    disassembly's ``.target`` (which prints a family-specific ``sm_100f`` as ``sm_100``)."""
    return ptxas_arch(cubin) or sass_target(sass)

