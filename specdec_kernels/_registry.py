"""Backend registry: one implementation per (op, backend), resolved per call.

Backends: ``torch`` (the reference, always present), ``cpu`` (C++/OpenMP extension), ``triton`` and ``cuda``.
``backend="auto"`` walks a preference list chosen by the device of the first tensor argument; an explicitly
requested backend that cannot serve the call raises :class:`BackendUnavailableError` naming the op, the backend,
the reason and the backends that would work (docs/kernels.md, Backends and dispatch).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "available_backends",
    "implementation",
    "implementations",
    "register",
    "resolve",
]

log = logging.getLogger("specdec_kernels")

BACKENDS = ("torch", "cpu", "triton", "cuda")
_PREFERENCE = {"cpu": ("cpu", "torch"), "cuda": ("cuda", "triton", "torch")}

# op -> backend -> (impl, supports(device) predicate)
_IMPLS: dict[str, dict[str, tuple[Callable[..., Any], Callable[[torch.device], bool]]]] = {}
_MISSING_REASON: dict[str, str] = {}
# (op, device) -> implementation picked by "auto"; cleared whenever a backend registers (the supports() predicates
# only look at the device). A decode step resolves tens of ops, so the preference walk is done once.
_AUTO: dict[tuple[str, torch.device], tuple[dict[str, Any], Callable[..., Any]]] = {}
# bumped whenever a backend registers: the tables of implementations() are resolved again after it
_GENERATION = 0
# (ops, device, backend) -> (generation, the ops' tables when resolved, {op: implementation})
_TABLES: dict[tuple[tuple[str, ...], torch.device, str], tuple[int, tuple[Any, ...], dict[str, Any]]] = {}


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run this op on these tensors."""


def _any_device(device: torch.device) -> bool:
    return True


def register(
    op: str, backend: str, *, supports: Callable[[torch.device], bool] = _any_device
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the ``backend`` implementation of ``op``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        global _GENERATION
        _IMPLS.setdefault(op, {})[backend] = (fn, supports)
        _AUTO.clear()
        _GENERATION += 1
        return fn

    return deco


def mark_missing(backend: str, reason: str) -> None:
    """Record why an optional backend failed to load (shown in error messages)."""
    _MISSING_REASON[backend] = reason


def available_backends(op: str | None = None) -> list[str]:
    """Backends that registered ``op`` (or any op when ``op`` is None), in canonical order."""
    if op is None:
        have = {b for impls in _IMPLS.values() for b in impls}
    else:
        have = set(_IMPLS.get(op, {}))
    return [b for b in BACKENDS if b in have]


def implementation(op: str, backend: str | None = "auto", device: torch.device | str = "cpu") -> Callable[..., Any]:
    """The function registered for ``op`` on ``backend`` ("auto": the one ``auto`` dispatch picks on ``device``;
    None: the ops' default, ``$SPECDEC_BACKEND`` or "auto"), called as is: no argument validation and no noise
    resolution, which the public op does first (benchmarks time the kernel alone; a model's layers call it many
    times per step). Raises KeyError for an unknown op and :class:`BackendUnavailableError` like the ops do."""
    return resolve(op, backend, torch.device(device))


def implementations(ops: tuple[str, ...], device: torch.device | str = "cpu") -> dict[str, Callable[..., Any]]:
    """``{op: implementation(op, None, device)}`` for every op of ``ops``, in one call: a model's decode step asks
    for the same few ops at every forward, and resolving each costs a few microseconds. The dict is kept per (ops,
    device, ``$SPECDEC_BACKEND``) and resolved again once a backend registers or an op's table is replaced; it is
    shared, so read it and do not edit it. Raises like :func:`implementation`."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    key = (ops, dev, default_backend())
    tables = tuple(_IMPLS.get(op) for op in ops)
    hit = _TABLES.get(key)
    if hit is not None and hit[0] == _GENERATION and all(a is b for a, b in zip(hit[1], tables, strict=True)):
        return hit[2]
    found = {op: resolve(op, key[2], dev) for op in ops}
    _TABLES[key] = (_GENERATION, tables, found)
    return found


def default_backend() -> str:
    return os.environ.get("SPECDEC_BACKEND", "auto")


def resolve(op: str, backend: str | None, device: torch.device) -> Callable[..., Any]:
    """Return the implementation of ``op`` for ``backend`` ("auto", None = env default) on ``device``."""
    backend = backend or default_backend()
    impls = _IMPLS.get(op)
    if backend == "auto":
        hit = _AUTO.get((op, device))
        if hit is not None and hit[0] is impls:  # the op's table was not swapped since (tests do that)
            return hit[1]
    if not impls:
        raise KeyError(f"unknown op {op!r}")
    if backend == "auto":
        for cand in _PREFERENCE.get(device.type, ("torch",)):
            entry = impls.get(cand)
            if entry is not None and entry[1](device):
                log.debug("op %s: auto-selected backend %s on %s", op, cand, device)
                _AUTO[(op, device)] = (impls, entry[0])
                return entry[0]
            log.debug("op %s: backend %s skipped on %s", op, cand, device)
        _AUTO[(op, device)] = (impls, impls["torch"][0])
        return impls["torch"][0]
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
    entry = impls.get(backend)
    working = [b for b, (_, ok) in impls.items() if ok(device)]
    if entry is None:
        reason = _MISSING_REASON.get(backend, "it has no implementation of this op")
        raise BackendUnavailableError(
            f"op {op!r}: backend {backend!r} is unavailable ({reason}); backends that would work on "
            f"{device.type}: {working}"
        )
    if not entry[1](device):
        raise BackendUnavailableError(
            f"op {op!r}: backend {backend!r} does not support tensors on {device}; backends that would work: {working}"
        )
    return entry[0]
