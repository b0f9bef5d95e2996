"""Backend "torch": the readable reference every other backend is checked against."""

from . import decode, sampling, tree, verify

__all__ = ["decode", "sampling", "tree", "verify"]
