"""Backend "torch": the readable reference every other backend is checked against."""

from . import sampling, tree, verify

__all__ = ["sampling", "tree", "verify"]
