"""Block verification from its definition, in float64 NumPy and independent of ``specdec_kernels.reference``.

Block verification (docs/methods.md, Block verification) judges a drafted chain X_1..X_L as a whole. With the
weights ``w_0 = 1``, ``w_i = min(1, w_{i-1} q(X_i | X_<i) / p(X_i | X_<i))`` and the excess mass
``S_i = sum_x (w_i q(x | X_<=i) - p(x | X_<=i))^+``, level i < L stops the walk with probability
``h_i = S_i / (S_i + 1 - w_i)`` (0 when both vanish), the last level with ``h_L = w_L``; tau is the deepest level
that stops (0 when none does), X_1..X_tau are kept and one more token is drawn from q after X_L when tau = L, else from
``Norm[(w_tau q - p)^+]`` after X_tau.

* :func:`block_chain` / :func:`block_tree_walk`: the verdict under injected uniforms, the oracle of
  ``verify_tree(..., method="block")`` (``weighted=False`` is the negative control: the token-level residual
  ``(q - p)^+`` in place of the block residual, the bug class of vllm-ascend #7807).
* :func:`round_law`: the exact law of one round's output (X^tau, Y) by enumeration of every draft chain, for laws
  given per prefix; :func:`extended_law` continues it with the target to a fixed number of tokens, which for an exact
  verifier is the target's own joint law. ``stop`` makes the chain length a stopping time of the drafted prefix (the
  adaptive drafts of SpecDec++).
* :func:`expected_accepted`: the mean number of drafted tokens kept per round, by the same enumeration, for block and
  token-level verification of the same drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .oracles_tree import sample_gumbel_max

ZERO_MASS = 1e-12  # the float64 zero-mass rule (docs/exactness.md)

#: the law after a prefix of tokens (a context-dependent model of any order)
Laws = Callable[[tuple[int, ...]], np.ndarray]


def weights(tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray) -> list[float]:
    """w_0..w_L for the chain ``tokens`` (X_1..X_L); row i of p_rows / q_rows is the law after X_1..X_i."""
    w = [1.0]
    for i, x in enumerate(tokens):
        w.append(min(1.0, w[-1] * float(q_rows[i][x]) / float(p_rows[i][x])))
    return w


def excess(w: float, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.maximum(w * np.asarray(q, dtype=np.float64) - np.asarray(p, dtype=np.float64), 0.0)


def prefix_ratios(tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray) -> list[float]:
    """r_0 = 1, r_i = prod_{j <= i} q(X_j | X_<j) / p(X_j | X_<j): the target's over the draft's prefix probability."""
    r = [1.0]
    for i, x in enumerate(tokens):
        r.append(r[-1] * float(q_rows[i][x]) / float(p_rows[i][x]))
    return r


def hsd_capped_ratios(tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray) -> list[float]:
    """Hierarchical Speculative Decoding's capped prefix ratios r_i / max(1, r_1, ..., r_i) (arXiv 2601.05724), from
    their definition: equal to the block weights w_i, of which they are the closed form."""
    r = prefix_ratios(tokens, p_rows, q_rows)
    return [r[i] / max([1.0, *r[1 : i + 1]]) for i in range(len(r))]


def stop_tests(
    tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray, *, uncapped_final: bool = False
) -> list[tuple[float, float]]:
    """(den, num) of each level 1..L: level i stops iff U_i * den < num. ``uncapped_final``: the last level stops
    with min(1, r_L) (the uncapped prefix ratio) instead of w_L, as the public code of Hierarchical Speculative
    Decoding does; not exact (a negative control)."""
    w = weights(tokens, p_rows, q_rows)
    last = len(tokens)
    tests = []
    for i in range(1, last + 1):
        if i == last:
            final = min(1.0, prefix_ratios(tokens, p_rows, q_rows)[i]) if uncapped_final else w[i]
            tests.append((1.0, final))
        else:
            s = float(excess(w[i], p_rows[i], q_rows[i]).sum())
            tests.append((s + (1.0 - w[i]), s))
    return tests


def stop_probs(
    tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray, *, uncapped_final: bool = False
) -> np.ndarray:
    """P(tau = i | X) for i = 0..L: h_i times the probability that every deeper level passes on."""
    tests = stop_tests(tokens, p_rows, q_rows, uncapped_final=uncapped_final)
    h = [1.0] + [num / den if den > 0 else 0.0 for den, num in tests]
    out = np.zeros(len(h))
    carry = 1.0
    for i in range(len(h) - 1, -1, -1):
        out[i] = carry * h[i]
        carry *= 1.0 - h[i]
    return out


def next_law(
    tau: int, tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray, weighted: bool = True
) -> np.ndarray:
    """The law of the token drawn after X_tau."""
    q = np.asarray(q_rows[tau], dtype=np.float64)
    if tau == len(tokens):
        return q
    w = weights(tokens, p_rows, q_rows)[tau] if weighted else 1.0
    m = excess(w, p_rows[tau], q)
    tot = m.sum()
    return q if tot <= ZERO_MASS else m / tot


def block_chain(
    tokens: Sequence[int],
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    u: Sequence[float],
    noise: np.ndarray,
    *,
    weighted: bool = True,
) -> tuple[int, int]:
    """(tau, next token) of one chain: ``u[i - 1]`` is level i's uniform, ``noise`` [V] the final sample's."""
    tau = 0
    for i, (den, num) in reversed(list(enumerate(stop_tests(tokens, p_rows, q_rows), start=1))):
        if u[i - 1] * den < num:
            tau = i
            break
    return tau, sample_gumbel_max(next_law(tau, tokens, p_rows, q_rows, weighted), noise)


def block_tree_walk(
    tokens: np.ndarray,
    parent: np.ndarray,
    valid: np.ndarray,
    p_rows: np.ndarray,
    q_rows: np.ndarray,
    accept_u: np.ndarray,
    final_noise: np.ndarray,
    *,
    eos: Sequence[int] = (),
    weighted: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """verify_tree's outputs for chains (shapes as there): the node at depth i reads accept_u[b, node, 0]; an
    accepted EOS ends the row after it (next token -1)."""
    batch, n = tokens.shape
    rows = []
    for b in range(batch):
        chain = [0]
        while True:
            kids = [m for m in range(1, n) if valid[b, m] and parent[b, m] == chain[-1]]
            if not kids:
                break
            chain.append(kids[0])
        toks = [int(tokens[b, m]) for m in chain[1:]]
        u = [float(accept_u[b, m, 0]) for m in chain[1:]]
        tau, nxt = block_chain(toks, p_rows[b, chain], q_rows[b, chain], u, final_noise[b], weighted=weighted)
        path = chain[1 : tau + 1]
        for d, m in enumerate(path):
            if int(tokens[b, m]) in set(eos):
                path, nxt = path[: d + 1], -1
                break
        rows.append((path, nxt))
    depth = max(1, max((int(valid[b].sum()) - 1 for b in range(batch)), default=1))
    nodes = np.full((batch, depth), -1, dtype=np.int64)
    ranks = np.full((batch, depth), -1, dtype=np.int64)
    for b, (path, _) in enumerate(rows):
        nodes[b, : len(path)] = path
        ranks[b, : len(path)] = 0
    n_acc = np.array([len(path) for path, _ in rows], dtype=np.int64)
    nxt = np.array([t for _, t in rows], dtype=np.int64)
    return nodes, n_acc, nxt, ranks


def _drafts(
    p_of: Laws, length: int, vocab: int, stop: Callable[[tuple[int, ...]], bool] | None
) -> list[tuple[tuple[int, ...], float]]:
    """Every draft chain with its probability: ``length`` tokens, or fewer where ``stop(prefix)`` ends the chain."""
    out: list[tuple[tuple[int, ...], float]] = []

    def grow(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length or (prefix and stop is not None and stop(prefix)):
            out.append((prefix, prob))
            return
        p = p_of(prefix)
        for x in range(vocab):
            if p[x] > 0:
                grow((*prefix, x), prob * float(p[x]))

    grow((), 1.0)
    return out


def _rows(laws: Laws, prefix: tuple[int, ...]) -> np.ndarray:
    return np.stack([laws(prefix[:i]) for i in range(len(prefix) + 1)])


def round_law(
    p_of: Laws,
    q_of: Laws,
    length: int,
    vocab: int,
    *,
    weighted: bool = True,
    stop: Callable[[tuple[int, ...]], bool] | None = None,
    uncapped_final: bool = False,
) -> dict[tuple[int, ...], float]:
    """Exact law of one round's output X_1..X_tau, Y over every draft chain (``p_of``/``q_of``: the draft's and the
    target's law after a prefix, the round starting from the empty prefix). ``weighted=False`` and
    ``uncapped_final=True`` are the negative controls of :func:`block_chain` and :func:`stop_tests`."""
    law: dict[tuple[int, ...], float] = {}
    for chain, prob in _drafts(p_of, length, vocab, stop):
        p_rows, q_rows = _rows(p_of, chain), _rows(q_of, chain)
        for tau, pt in enumerate(stop_probs(chain, p_rows, q_rows, uncapped_final=uncapped_final)):
            if pt <= 0:
                continue
            y_law = next_law(tau, chain, p_rows, q_rows, weighted)
            for y in np.flatnonzero(y_law > 0):
                key = (*chain[:tau], int(y))
                law[key] = law.get(key, 0.0) + prob * pt * float(y_law[y])
    return law


def extended_law(law: dict[tuple[int, ...], float], q_of: Laws, n_tokens: int, vocab: int) -> np.ndarray:
    """The law of the first ``n_tokens`` tokens when each output of ``law`` (at most n_tokens long) is continued by
    sampling the target: shape [V] * n_tokens."""
    out = np.zeros((vocab,) * n_tokens)

    def cont(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == n_tokens:
            out[prefix] += prob
            return
        q = q_of(prefix)
        for v in np.flatnonzero(q > 0):
            cont((*prefix, int(v)), prob * float(q[v]))

    for seq, prob in law.items():
        if len(seq) > n_tokens:
            raise ValueError(f"an output of {len(seq)} tokens does not fit n_tokens={n_tokens}")
        cont(seq, prob)
    return out


def target_law(q_of: Laws, n_tokens: int, vocab: int) -> np.ndarray:
    """The target's joint law of its first ``n_tokens`` tokens, shape [V] * n_tokens."""
    return extended_law({(): 1.0}, q_of, n_tokens, vocab)


def kept_given_chain(tokens: Sequence[int], p_rows: np.ndarray, q_rows: np.ndarray, rule: str = "block") -> float:
    """The mean number of the drafted tokens ``tokens`` a round keeps, given the chain (rows as in :func:`weights`):
    ``rule`` "block" (E[tau]), "token" (token-level SD: X_i is kept with probability min(1, q/p) once X_<i are) or
    "uncapped" (the inexact uncapped final acceptance of :func:`stop_tests`)."""
    if rule in ("block", "uncapped"):
        probs = stop_probs(tokens, p_rows, q_rows, uncapped_final=rule == "uncapped")
        return float(np.dot(np.arange(len(tokens) + 1), probs))
    if rule == "token":
        keep, mean = 1.0, 0.0
        for i, x in enumerate(tokens):
            keep *= min(1.0, float(q_rows[i][x]) / float(p_rows[i][x]))
            mean += keep
        return mean
    raise ValueError(f"rule must be 'block', 'token' or 'uncapped', got {rule!r}")


def expected_accepted(
    p_of: Laws, q_of: Laws, length: int, vocab: int, *, rule: str = "block", stop: Callable | None = None
) -> float:
    """Mean drafted tokens kept per round over every draft chain (:func:`kept_given_chain`)."""
    total = 0.0
    for chain, prob in _drafts(p_of, length, vocab, stop):
        total += prob * kept_given_chain(chain, _rows(p_of, chain), _rows(q_of, chain), rule)
    return total


def random_laws(vocab: int, seed: int, concentration: float = 0.7) -> tuple[Laws, Laws]:
    """A draft and a target whose law after every prefix is its own Dirichlet draw (laws of any order, drawn lazily
    and kept), seeded."""
    rng = np.random.default_rng(seed)
    tables: tuple[dict, dict] = ({}, {})

    def make(table: dict) -> Laws:
        def law(prefix: tuple[int, ...]) -> np.ndarray:
            if prefix not in table:
                table[prefix] = rng.dirichlet(np.full(vocab, concentration))
            return table[prefix]

        return law

    return make(tables[0]), make(tables[1])


__all__ = [
    "ZERO_MASS",
    "block_chain",
    "block_tree_walk",
    "excess",
    "expected_accepted",
    "extended_law",
    "hsd_capped_ratios",
    "kept_given_chain",
    "next_law",
    "prefix_ratios",
    "random_laws",
    "round_law",
    "stop_probs",
    "stop_tests",
    "target_law",
    "weights",
]
