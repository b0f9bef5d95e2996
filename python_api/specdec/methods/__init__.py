"""The decoding methods: one :class:`MethodSpec` per method, each defined and registered by its own module here
(``ar.py``, ``sd.py``, ...). Configuration (:func:`specdec.config.make_method`), the decoding loop, the tree
builders, the CLI, the benchmarks and the tests read this registry; adding a method is one new module (see
docs/development.md, Adding a method).

This package sits below the loop: it imports the tree builders of :mod:`specdec.decoders` and the tree helpers of
``specdec_kernels``, never :mod:`specdec.decoder` or :mod:`specdec.cli`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import MethodConfig
    from ..decoders.base import TreeBuilder

#: every method parameter :func:`specdec.config.make_method` knows (each is a field of MethodConfig)
PARAMETERS = frozenset({"draft_length", "branching", "parents", "beam_width", "num_chains"})


@dataclass(frozen=True, eq=False)  # one spec object per method: identity is equality (its tables are not hashable)
class MethodSpec:
    """Everything specific to one decoding method.

    * ``verifier``: the node verifier of ``specdec_kernels.verify_tree`` ("sd", "rrs", "rrsw", "kseq", "spechub");
      None for a method that drafts nothing (``ar``).
    * ``builder``: the tree-builder class, or any factory ``MethodConfig -> TreeBuilder``; None when nothing is
      drafted.
    * ``label``: the short display label of a config (CLI, benchmarks, statistics), e.g. ``rsd_c(b=2,1)``.
    * ``defaults``, ``allowed``: the parameters (names from :data:`PARAMETERS`) with their default values, and the
      names a caller may pass.
    * ``template``: the static tree (level-order parent list) computed from the validated parameters, for a method
      whose tree shape follows from them (chains, K chains); None when the tree comes from ``branching`` or
      ``parents``, or is grown by the builder.
    * ``check``: extra validation of the finished config (raises ValueError naming the parameter).
    * ``needs_head``: the method runs only with an acceptance head (``head=``).
    * ``auto_builder``: the tree builder of ``branching="auto"`` (trees chosen per round for the machine,
      :mod:`specdec.autotree`); None when the method takes no auto trees.
    * ``cli_params``: the parameters that the demo's shared tree flags (--draft-length, --branching, --beam-width,
      --num-chains) set for this method; None: every allowed one.
    * ``cascade``: the method drafts with a :class:`~specdec.cascade.CascadeDrafter` (the demo loads --cascade).
    * ``description``: one paragraph with the paper reference (authors, title, venue, year, arXiv id).
    """

    name: str
    description: str
    verifier: str | None
    builder: Callable[[MethodConfig], TreeBuilder] | None
    label: Callable[[MethodConfig], str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    template: Callable[[Mapping[str, Any]], Sequence[int]] | None = None
    check: Callable[[MethodConfig], None] | None = None
    needs_head: bool = False
    cli_params: frozenset[str] | None = None
    auto_builder: Callable[[MethodConfig], TreeBuilder] | None = None
    cascade: bool = False

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"method name must be an identifier, got {self.name!r}")
        if (self.verifier is None) != (self.builder is None):
            raise ValueError(f"method {self.name!r}: a verifier and a tree builder go together (both or neither)")
        unknown = sorted((set(self.allowed) | set(self.defaults)) - PARAMETERS)
        if unknown:
            raise ValueError(f"method {self.name!r}: unknown parameters {unknown}; known: {sorted(PARAMETERS)}")
        if not set(self.defaults) <= set(self.allowed):
            raise ValueError(f"method {self.name!r}: defaults {sorted(self.defaults)} must be allowed parameters")
        cli = self.allowed if self.cli_params is None else self.cli_params
        if not set(cli) <= set(self.allowed):
            raise ValueError(f"method {self.name!r}: cli_params must be allowed parameters")
        # frozen: the registry hands out one shared spec, so its tables must not be editable through it
        object.__setattr__(self, "allowed", frozenset(self.allowed))
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        object.__setattr__(self, "cli_params", frozenset(cli))

    @property
    def drafts(self) -> bool:
        """Whether the method drafts (and verifies) tokens at all; ``ar`` does not."""
        return self.builder is not None


_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` under ``spec.name``; returns it. Raises ValueError when another spec holds that name."""
    have = _REGISTRY.get(spec.name)
    if have is not None and have is not spec:
        raise ValueError(f"method {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove the method ``name`` (a method registered for a test); raises ValueError like :func:`get`."""
    get(name)
    del _REGISTRY[name]


def get(name: str) -> MethodSpec:
    """The spec of method ``name``; ValueError naming it and listing the available methods otherwise."""
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"method must be one of {available()}, got {name!r}")
    return spec


def available() -> tuple[str, ...]:
    """Names of the registered methods, in registration order (the built-in ones first)."""
    return tuple(_REGISTRY)


def tree_label(config: MethodConfig) -> str:
    """Label of a method whose tree comes from ``branching`` or ``parents``: ``rsd_c(b=2,2)`` or ``rrs(N=8)``."""
    if config.auto:
        return f"{config.method}(auto)"
    if config.branching is not None:
        return f"{config.method}(b={','.join(map(str, config.branching))})"
    return f"{config.method}(N={len(config.parents or ())})"


# The built-in methods register themselves on import, in the order available() lists them.
from . import ar, sd, rrs, rrsw, rsd_c, rsd_s, spectr, spechub, specdec_pp, csd  # noqa: E402, F401, I001

__all__ = ["PARAMETERS", "MethodSpec", "available", "get", "register", "tree_label", "unregister"]
