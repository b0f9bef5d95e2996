"""The package's exception classes. Each also derives from the built-in exception a caller would catch for the same
fault (``ValueError``, ``TypeError``, ``OSError``), so ``except ValueError`` keeps working; ``except
specdec.errors.SpecDecError`` catches every error the package raises on purpose."""

from __future__ import annotations


class SpecDecError(Exception):
    """Base of the errors specdec raises on purpose."""


class UnsupportedSettingError(SpecDecError, ValueError):
    """A generation setting or ``generate`` argument the speculative loop does not implement (it names the setting)."""


class UnsupportedModelError(SpecDecError, ValueError):
    """A model whose architecture, attention implementation or layout the adapter cannot run tree passes on."""


class DraftMismatchError(SpecDecError, ValueError):
    """A draft trained for another target: another vocabulary or another input embedding."""


class CacheDirError(SpecDecError, OSError):
    """The cache directory (``$SPECDEC_CACHE``, default ``~/.cache/specdec``) cannot be written."""


class RankDivergenceError(SpecDecError, RuntimeError):
    """The ranks of a tensor-parallel run decided differently (:mod:`specdec.distributed`): different inputs, seeds
    or generators, or ranks whose draft computes different bits (another CPU variant or package build)."""
