"""What a decoding method is: its :class:`MethodSpec` (verifier, tree builder, parameters, label), the registry of
specs, and :class:`MethodConfig` / :func:`make_method`, a method with its validated tree parameters.

A leaf of the methods wing: it imports no tree builder and no method module. The method modules
(:mod:`specdec.methods`, one per method) register their specs here and name the builders of
:mod:`specdec.methods.builders` they draft with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import specdec_kernels as sk

from ..autotree import AUTO_MAX_DEPTH

#: every method parameter :func:`make_method` knows (each is a field of MethodConfig)
PARAMETERS = frozenset({"draft_length", "branching", "parents", "beam_width", "num_chains"})

#: the values of ``verifier=``: token-level verification (the method's own node verifier), block verification of a
#: chain, or traversal verification of a tree (docs/methods.md, Block verification, Traversal verification)
VERIFIERS = ("token", "block", "traversal")


@dataclass(frozen=True, eq=False)  # one spec object per method: identity is equality (its tables are not hashable)
class MethodSpec:
    """Everything specific to one decoding method.

    * ``verifier``: the node verifier of ``specdec_kernels.verify_tree`` ("sd", "rrs", "rrsw", "kseq", "spechub",
      "gds"); None for a method that drafts nothing (``ar``).
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
    * ``cascade``: the method drafts with a :class:`~specdec.drafters.CascadeDrafter` (the demo loads --cascade).
    * ``hub_pairs``: the verifier reads each node's hub token (SpecHub's pairs), which the loop passes as ``hub=``.
    * ``verifiers``: the values of ``verifier=`` the method takes (:data:`VERIFIERS`): "block" for methods that
      draft one chain token by token, "traversal" for trees of a fixed shape whose children are drawn i.i.d. or
      without replacement (the draft processes whose exactness proofs cover them).
    * ``description``: one paragraph with the paper reference (authors, title, venue, year, arXiv id).
    """

    name: str
    description: str
    verifier: str | None
    builder: Callable[[MethodConfig], Any] | None
    label: Callable[[MethodConfig], str]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    template: Callable[[Mapping[str, Any]], Sequence[int]] | None = None
    check: Callable[[MethodConfig], None] | None = None
    needs_head: bool = False
    cli_params: frozenset[str] | None = None
    auto_builder: Callable[[MethodConfig], Any] | None = None
    cascade: bool = False
    hub_pairs: bool = False
    verifiers: frozenset[str] = frozenset({"token"})

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


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class MethodConfig:
    """A decoding method and its draft-tree parameters (validated by :func:`make_method`).

    ``parents`` is the static tree (level order, node 0 = root, as in docs/kernels.md); None for a method that
    drafts nothing (``ar``) or whose builder grows the tree (``rsd_s``: stochastic beam search of width
    ``beam_width``, ``draft_length`` levels). The method's own facts are in :attr:`spec`.
    """

    method: str
    draft_length: int | None = None
    branching: tuple[int, ...] | None = None
    parents: tuple[int, ...] | None = None
    beam_width: int | None = None
    num_chains: int | None = None
    #: branching="auto": the tree's shape is chosen from the past rounds (the spec's auto_builder, specdec.autotree)
    auto: bool = False
    #: "token" (the method's node verifier), "block" (block verification of the chain) or "traversal" (traversal
    #: verification of the tree): make_method's verifier=
    verification: str = "token"

    @property
    def spec(self) -> MethodSpec:
        """The registered :class:`MethodSpec` of ``method``."""
        return get(self.method)

    @property
    def verifier(self) -> str | None:
        """The ``method`` of specdec_kernels.verify_tree: the spec's node verifier, "block", or "traversal" /
        "traversalw" for trees drawn i.i.d. / without replacement (None for ``ar``)."""
        if self.verification == "block":
            return "block"
        if self.verification == "traversal":
            return "traversalw" if self.spec.verifier == "rrsw" else "traversal"
        return self.spec.verifier

    @property
    def depth(self) -> int:
        """Maximum draft length L (tree depth, root excluded); 0 for ``ar``. A tree grown by its builder (no
        static template) is ``draft_length`` deep; an auto tree at most AUTO_MAX_DEPTH."""
        if self.auto:
            return AUTO_MAX_DEPTH
        if self.parents is None:
            return int(self.draft_length or 0)
        depth = [0] * len(self.parents)
        for n in range(1, len(self.parents)):
            depth[n] = depth[self.parents[n]] + 1
        return max(depth)

    def describe(self) -> str:
        """Short label, e.g. ``sd(L=4)``, ``rsd_c(b=2,2)`` (the method's ``label``) or ``sd(L=4)+block``."""
        label = self.spec.label(self)
        return label if self.verification == "token" else f"{label}+{self.verification}"


def _verification(spec: MethodSpec, verifier: str | None) -> str:
    """``verifier=`` checked against :data:`VERIFIERS` and the values ``spec`` takes ("token" when None)."""
    verification = "token" if verifier is None else verifier
    if verification not in VERIFIERS:
        raise ValueError(f"verifier must be one of {VERIFIERS}, got {verifier!r}")
    if verification not in spec.verifiers:
        takes = sorted(spec.verifiers)
        offering = ", ".join(n for n in available() if verification in get(n).verifiers)
        what = {
            "block": "block verification judges one chain drafted token by token",
            "traversal": "traversal verification judges a tree of fixed shape with children drawn i.i.d. or "
            "without replacement",
        }[verification]
        raise ValueError(
            f"method {spec.name!r} takes verifier={takes} only, got {verifier!r} ({what}: methods {offering})"
        )
    return verification


def make_method(
    method: str,
    *,
    draft_length: int | None = None,
    branching: Sequence[int] | str | None = None,
    parents: Sequence[int] | None = None,
    beam_width: int | None = None,
    num_chains: int | None = None,
    verifier: str | None = None,
) -> MethodConfig:
    """Validate ``method`` and its tree parameters; fill the method's defaults.

    Parameters: ``draft_length`` (chain length L, or the hard cap of an adaptive chain), ``branching`` (children
    per level, or ``"auto"`` where the method's spec has an ``auto_builder``: a shape chosen from the past rounds),
    ``parents`` (a level-order parent list, node 0 = root), ``beam_width`` (W), ``num_chains`` (K), ``verifier``
    ("token", the default; "block": block verification of the drafted chain, for ``sd``, ``specdec_pp`` and
    ``csd``; "traversal": traversal verification of the drafted tree, for ``rrs``, ``rrsw`` and ``rsd_c``; greedy
    decoding is the same either way).
    Which of them a method takes, their defaults and any extra rule (spechub: binary trees) are in the method's
    module of :mod:`specdec.methods` (``specdec.methods.get(method).allowed`` / ``.defaults``).
    """
    spec = get(method)
    verification = _verification(spec, verifier)
    given = {
        k: v
        for k, v in {
            "draft_length": draft_length,
            "branching": branching,
            "parents": parents,
            "beam_width": beam_width,
            "num_chains": num_chains,
        }.items()
        if v is not None
    }
    extra = sorted(set(given) - spec.allowed)
    if extra:
        allowed = sorted(spec.allowed) or "no tree parameters"
        raise ValueError(f"method {method!r} does not take {', '.join(extra)} (it takes: {allowed})")
    if "branching" in given and "parents" in given:
        raise ValueError(f"method {method!r}: pass branching or parents, not both")
    opts = dict(spec.defaults)
    if "parents" in given:
        opts.pop("branching", None)
    opts.update(given)

    if "draft_length" in opts:
        opts["draft_length"] = _positive_int("draft_length", opts["draft_length"])
    if "beam_width" in opts:
        opts["beam_width"] = _positive_int("beam_width", opts["beam_width"])
    if "num_chains" in opts:
        opts["num_chains"] = _positive_int("num_chains", opts["num_chains"])
    tree: list[int] | None = None
    auto = isinstance(opts.get("branching"), str) and opts["branching"] == "auto"
    if auto:
        if spec.auto_builder is None:
            raise ValueError(f"method {method!r} does not take branching='auto' (trees chosen per round)")
        opts.pop("branching")
    if "branching" in opts:
        raw = opts["branching"]
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ValueError(f"branching must be a sequence of ints >= 1 (children per level), got {raw!r}")
        opts["branching"] = tuple(raw)
        try:
            tree = sk.branching_parents(list(raw))
        except ValueError as err:
            raise ValueError(f"branching must be a non-empty sequence of ints >= 1, got {raw!r}") from err
    if "parents" in opts:
        raw = opts["parents"]
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ValueError(f"parents must be a level-order list of parent ids with parents[0] = -1, got {raw!r}")
        if any(isinstance(x, bool) or not isinstance(x, int) for x in raw):
            raise ValueError(f"parents must hold ints, got {raw!r}")
        try:
            tree = sk.check_parents(list(raw))
        except ValueError as err:
            raise ValueError(f"parents is not a valid level-order tree: {err}") from err
        if len(tree) < 2:
            raise ValueError("parents must describe at least one draft node besides the root")
    if spec.template is not None:
        tree = list(spec.template(opts))
    config = MethodConfig(
        method=method,
        draft_length=opts.get("draft_length"),
        branching=opts.get("branching"),
        parents=None if tree is None else tuple(tree),
        beam_width=opts.get("beam_width"),
        num_chains=opts.get("num_chains"),
        auto=auto,
        verification=verification,
    )
    if spec.check is not None:
        spec.check(config)
    return config
