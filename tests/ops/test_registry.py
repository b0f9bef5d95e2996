"""implementations(): the decode step's table of ops is what implementation() resolves, follows $SPECDEC_BACKEND,
and is resolved again after a backend registers or an op's table is replaced."""

from __future__ import annotations

import torch

import specdec_kernels as sk
from specdec_kernels import _registry

OPS = ("rms_norm", "skinny_linear", "decode_attention")


def test_implementations_match_implementation(monkeypatch) -> None:
    monkeypatch.delenv("SPECDEC_BACKEND", raising=False)
    table = sk.implementations(OPS, "cpu")
    assert table == {op: sk.implementation(op, None, "cpu") for op in OPS}
    assert sk.implementations(OPS, torch.device("cpu")) is table  # kept, not resolved again
    monkeypatch.setenv("SPECDEC_BACKEND", "torch")
    forced = sk.implementations(OPS, "cpu")
    assert forced == {op: sk.implementation(op, "torch", "cpu") for op in OPS}


def test_implementations_follow_registry_changes(monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_BACKEND", "torch")
    before = sk.implementations(OPS, "cpu")

    def swapped(*args, **kwargs):
        raise AssertionError("not called")

    # an op's table replaced (as tests swap one)
    monkeypatch.setitem(_registry._IMPLS, "rms_norm", {"torch": (swapped, _registry._any_device)})
    assert sk.implementations(OPS, "cpu")["rms_norm"] is swapped

    def registered(*args, **kwargs):
        raise AssertionError("not called")

    # a backend registered into the (replaced) table
    _registry.register("rms_norm", "torch")(registered)
    after = sk.implementations(OPS, "cpu")
    assert after["rms_norm"] is registered
    assert after["skinny_linear"] is before["skinny_linear"]
