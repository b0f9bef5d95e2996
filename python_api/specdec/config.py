"""Deprecated: the method configuration lives in :mod:`specdec.methods` (``MethodConfig``, ``make_method``, also on
:mod:`specdec` itself) and the sampling controls in :mod:`specdec.sampling` (``SamplingConfig``, ``RunContext``).
Importing this module warns once and hands those names on."""

from __future__ import annotations

import warnings

from .methods import MethodConfig, make_method
from .sampling import RunContext, SamplingConfig

warnings.warn(
    "specdec.config is deprecated: import MethodConfig and make_method from specdec.methods (or specdec), "
    "SamplingConfig and RunContext from specdec.sampling",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["MethodConfig", "RunContext", "SamplingConfig", "make_method"]
