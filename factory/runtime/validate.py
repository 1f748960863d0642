"""Checks every op makes before a pointer reaches a kernel: one home for the messages.

The ops (``gemm``, ``packed``, ``attention``) test the cheap conditions inline on every call
(tensor type, dtype, device index, autograd, shape agreement) and call these functions on the
failing path for the full message, or once per new problem (strides, alignment, sizes: the
variant's binder, cached by a key that holds every one of them).  What is checked, and the
exception each gives, is listed in docs/errors.md.
"""

from __future__ import annotations

import os

import torch

from .errors import InputError


def where(t) -> str:
    d = t.get_device()
    return f"cuda:{d}" if d >= 0 else str(t.device)


def tensors(**named) -> None:
    """InputError naming the first argument that is not a torch tensor."""
    for what, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{what} must be a torch.Tensor, got {type(t).__name__}")


def one_device(bundle, **named) -> int:
    """The CUDA device index every given tensor (None skipped) is on; InputError when one is on
    the CPU or they are on different devices.  (A simulated bundle, ``BundleCore.simulate``,
    takes CPU tensors.)"""
    tensors(**{k: t for k, t in named.items() if t is not None})
    devs = {k: t.get_device() for k, t in named.items() if t is not None}
    first = next(iter(devs.values()))
    if any(d != first for d in devs.values()):
        listed = ", ".join(f"{k} on {where(named[k])}" for k in devs)
        raise InputError(f"tensors on different devices ({listed}): every tensor must be on one CUDA device")
    if first < 0 and not bundle.simulated:
        k = next(iter(devs))
        raise InputError(f"{k} is on {where(named[k])}: the kernels need CUDA tensors (move them with .cuda())")
    return first


def no_grad(op: str, **named) -> None:
    """InputError when grad mode is on and an input requires grad: these ops have no backward, and
    a result without a gradient would be silently wrong for training."""
    if torch.is_grad_enabled():
        need = [k for k, t in named.items() if t is not None and t.requires_grad]
        if need:
            raise InputError(f"{op}: {', '.join(need)} require grad, and {op} has no backward: call it under "
                             f"torch.no_grad() / torch.inference_mode(), or pass .detach()ed tensors")


def check_varlen_default() -> bool:
    """``FACTORY_CHECK_VARLEN=1`` turns on the host-side ``cu_seqlens`` checks for every call."""
    return os.environ.get("FACTORY_CHECK_VARLEN", "") not in ("", "0")


def cu_seqlens(cu_q, cu_k, total_q: int, total_k: int, max_seqlen_q: int | None) -> None:
    """The varlen contract, checked on the host (copies both offset tensors to the CPU: a device
    synchronisation).  Each must start at 0, never decrease, and end at its token count; the
    longest query sequence must not exceed ``max_seqlen_q``."""
    for name, cu, total in (("cu_seqlens_q", cu_q, total_q), ("cu_seqlens_k", cu_k, total_k)):
        h = cu.cpu()
        if h.numel() == 0:
            continue
        if int(h[0]) != 0:
            raise InputError(f"{name} must start at 0, starts at {int(h[0])}")
        steps = h[1:] - h[:-1]
        if steps.numel() and int(steps.min()) < 0:
            i = int((steps < 0).nonzero()[0])
            raise InputError(f"{name} must not decrease: {name}[{i + 1}] = {int(h[i + 1])} < {name}[{i}] = {int(h[i])}")
        if int(h[-1]) != total:
            raise InputError(f"{name} must end at the token count {total}, ends at {int(h[-1])}")
        if name == "cu_seqlens_q" and max_seqlen_q is not None and steps.numel():
            longest = int(steps.max())
            if longest > max_seqlen_q:
                raise InputError(f"max_seqlen_q = {max_seqlen_q} is below the longest query sequence ({longest})")


def span(shape, stride) -> int:
    """Elements a tensor of these sizes and strides spans (0 when it has none)."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def distinct(what: str, shape, stride) -> None:
    """InputError unless every element of an output of these sizes and strides has its own
    address (a zero stride, e.g. a tensor made by ``expand``, or rows that overlap would make the
    kernel's CTAs write one address from several places)."""
    if any(n == 0 for n in shape):
        return
    ext = 1
    for n, s in sorted(((n, s) for n, s in zip(shape, stride) if n > 1), key=lambda x: x[1]):
        if s < ext:
            raise InputError(f"{what} has overlapping elements (shape {tuple(shape)}, strides {tuple(stride)}): an "
                             f"output needs its own address per element (not a view made by expand)")
        ext += (n - 1) * s


def disjoint(out_name: str, out, **inputs) -> None:
    """InputError when the output tensor ``out`` shares memory with one of ``inputs`` (tensors or
    None): the kernels read the inputs while they write the output."""
    po = out.data_ptr()
    if out.numel() == 0 or po == 0:  # (meta tensors have no memory)
        return
    eo = po + span(out.shape, out.stride()) * out.element_size()
    for what, t in inputs.items():
        if t is None or t.numel() == 0 or not t.data_ptr():
            continue
        pt = t.data_ptr()
        if po < pt + span(t.shape, t.stride()) * t.element_size() and pt < eo:
            raise InputError(f"{out_name} overlaps {what} in memory: the output must not alias an input")
