"""Child processes for tests that start other programs (torchrun, a fresh interpreter): each runs in
its own process group under a hard limit; past it the whole group is killed and the test fails, so
a hung child can neither stall the run nor outlive it (and hold its port)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT

# NVLink multicast (NVLS) stays off in every child: on shared hosts a program that uses it can put
# the GPUs out of service.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_child(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository root in a new session; past ``timeout`` seconds kill its
    whole process group (SIGTERM, then SIGKILL) and fail the test with what it printed."""
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = err = ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = p.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        pytest.fail(f"{' '.join(cmd)} ran past {timeout:.0f} s and was killed with its process group\n"
                    f"stdout:\n{out}\nstderr:\n{err[-4000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def python(timeout: float, source: str) -> subprocess.CompletedProcess:
    """``source`` (dedented) in a fresh interpreter with the repository importable."""
    return run_child([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + textwrap.dedent(source)],
                     timeout)
