"""Deprecated: the shipped assets' folder and name resolution live in :mod:`specdec.drafters.store`. Importing this
module warns once and hands the names on."""

from __future__ import annotations

import warnings

from ..drafters.store import ASSETS_DIR, resolve_asset

warnings.warn(
    "specdec.train.store is deprecated: import ASSETS_DIR and resolve_asset from specdec.drafters.store",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ASSETS_DIR", "resolve_asset"]
