"""The decoding methods: one :class:`MethodSpec` per method, each defined and registered by its own module here
(``ar.py``, ``sd.py``, ...), with the tree builders they draft with in :mod:`specdec.methods.builders`. What a method
is (the spec, the registry, :class:`MethodConfig` and :func:`make_method`) lives in :mod:`specdec.methods.spec`. The
decoding loop, the CLI, the benchmarks and the tests read this registry; adding a method is one new module (see
docs/development.md, Adding a method).

This package sits below the loop: it never imports :mod:`specdec.decoder` or :mod:`specdec.cli`.
"""

from __future__ import annotations

from .spec import (
    PARAMETERS,
    VERIFIERS,
    MethodConfig,
    MethodSpec,
    available,
    get,
    make_method,
    register,
    tree_label,
    unregister,
)

# The built-in methods register themselves on import, in the order available() lists them.
# isort: off
from . import ar, sd, rrs, rrsw, rsd_c, rsd_s, spectr, spechub, gds, specdec_pp, csd  # noqa: E402, F401
# isort: on

__all__ = [
    "PARAMETERS",
    "VERIFIERS",
    "MethodConfig",
    "MethodSpec",
    "available",
    "get",
    "make_method",
    "register",
    "tree_label",
    "unregister",
]
