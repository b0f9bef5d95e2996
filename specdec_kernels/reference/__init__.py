"""Backend "torch": the readable reference every other backend is checked against."""

from . import linear, sampling, tree, verify

__all__ = ["linear", "sampling", "tree", "verify"]
