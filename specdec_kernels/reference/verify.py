"""Backend "torch": node, chain and tree verifiers (docs/methods.md; floating-point rules: docs/exactness.md).

Readable loops over rows; every probability vector is computed in ``cd`` = float64 when an input is float64
(oracle mode) and float32 otherwise. Acceptance tests are division-free and compared in float64:
``U * s(x) < r(x)``. The uniform ``accept_u[b, j]`` belongs to candidate slot ``j`` (its sibling rank).
"""

from __future__ import annotations

import torch

from .._registry import register
from .._rng import ACCEPT, FINAL, noise_or_philox
from .sampling import gumbel

NEG_INF = float("-inf")


def zero_mass_tol(dtype: torch.dtype) -> float:
    """Zero-mass rule (docs/exactness.md): below this residual mass the residual falls back to the current target."""
    return 1e-12 if dtype == torch.float64 else 1e-6


def residual(r: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """res(r, s) = Norm[(r - s)^+], or r itself when the mass is numerically zero (the zero-mass rule)."""
    m = (r - s).clamp_min(0.0)
    tot = m.sum()
    if tot <= zero_mass_tol(r.dtype):
        return r
    return m / tot


def ratio_prob(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """min(1, num/den) as the probability of the division-free test U * den < num, U ~ U[0, 1), in float64 (the
    caller stores it in its compute type)."""
    if den <= 0:
        return torch.ones((), dtype=torch.float64) if num > 0 else torch.zeros((), dtype=torch.float64)
    return torch.clamp(num.double() / den.double(), max=1.0).clamp_min(0.0)


def passes(u: torch.Tensor, den: torch.Tensor, num: torch.Tensor) -> bool:
    return bool(u.double() * den.double() < num.double())


ONE = torch.ones((), dtype=torch.float64)  # the uniform of the greedy lenient test p(x) < l * q(x)


def sample_from(probs: torch.Tensor, noise: torch.Tensor) -> int:
    """Gumbel-max over log(probs); zero entries are -inf and never chosen."""
    return int(torch.argmax(torch.log(probs.double()) + gumbel(noise)))


def hub_rest(p: torch.Tensor, a: int) -> torch.Tensor:
    """Sum of the non-hub draft probabilities, accumulated in float64 (docs/exactness.md, Normalisers).

    The sampler draws the second draft of a pair (a, i) from p restricted to i != a, so this sum, not 1 - p(a), is
    the normaliser of Q(a, i) = p(a) p(i) / rest: a row sums to 1 only within its rounding, and 1 - p(a) loses every
    digit of the difference once p(a) is within a few ulps of 1.
    """
    return torch.cat([p[:a], p[a + 1 :]]).double().sum()


KSEQ_EQUAL_TOL = 1e-12  # sum_v min(p, q) within this of the larger row mass: gamma* = 1 (K-SEQ with p = q)


def kseq_gamma_row(p: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, float]:
    """K-SEQ: smallest g in [1, k] with h(g) >= 0 by 40 fp64 bisection steps (upper bracket)."""
    p64, q64 = p.double(), q.double()

    def beta(g: float) -> float:
        return float(torch.minimum(p64, q64 / g).sum())

    def h(g: float) -> float:
        return float(torch.minimum(g * p64, q64).sum()) - 1.0 + (1.0 - beta(g)) ** k

    # p = q: h(1) = 0 for normalised rows, but an fp32 row sums to 1 only within its rounding, and h(1) = mass - 1
    # < 0 would move gamma to 1 + (1 - mass)^(1/k) (1.01 at k = 4 for a mass of 1 - 1e-8). So equality is judged
    # against the rows' own masses (summed in the same order as beta, hence bitwise equal when p = q).
    mass = max(float(p64.sum()), float(q64.sum()))
    if k <= 1 or beta(1.0) >= mass - KSEQ_EQUAL_TOL or h(1.0) >= 0.0:
        return 1.0, beta(1.0)
    lo, hi = 1.0, float(k)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if h(mid) >= 0.0:
            hi = mid
        else:
            lo = mid
    return hi, beta(hi)


@register("kseq_gamma", "torch")
def kseq_gamma(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = [kseq_gamma_row(p[b], q[b], int(k[b])) for b in range(p.shape[0])]
    gam = torch.tensor([g for g, _ in out], dtype=torch.float64, device=p.device)
    bet = torch.tensor([be for _, be in out], dtype=torch.float64, device=p.device)
    return gam, bet


def node_chain(
    method: str,
    cand: list[int],
    p: torch.Tensor,
    q: torch.Tensor,
    hub: int | None,
) -> tuple[list[tuple[int, torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The test sequence of one node, independent of the uniforms.

    Returns ``tests`` = [(slot, den, num)] in test order (accept slot iff U[slot] * den < num) and the final
    residual (normalized) used when every test fails. ``cand`` lists the valid candidate tokens by slot.
    """
    tests: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    if method in ("sd", "rrs"):
        r = q
        for j, x in enumerate(cand):
            tests.append((j, p[x], r[x]))
            r = residual(r, p)
        return tests, r
    if method == "rrsw":
        r, s = q, p
        for j, x in enumerate(cand):
            tests.append((j, s[x], r[x]))
            r = residual(r, s)
            s = s.clone()
            s[x] = 0.0
            tot = s.sum()
            s = s / tot if tot > 0 else s
        return tests, r
    if method == "kseq":
        g, be = kseq_gamma_row(p, q, len(cand))
        if be <= 0.0:  # disjoint supports: nothing can be accepted; sample q directly
            return [(j, torch.ones((), dtype=p.dtype), torch.zeros((), dtype=p.dtype)) for j in range(len(cand))], q
        for j, x in enumerate(cand):
            tests.append((j, g * p[x], q[x]))
        c = (1.0 - (1.0 - be) ** len(cand)) / be
        num = (q - c * torch.minimum(p, q / g)).clamp_min(0.0)
        tot = num.sum()
        return tests, (q if tot <= zero_mass_tol(q.dtype) else num / tot)
    if method == "spechub":
        if len(cand) == 1:
            return [(0, p[cand[0]], q[cand[0]])], residual(q, p)
        assert hub is not None
        # The plan in float64 whatever the rows' precision: when p(a) ~ 1 the pairs (a, .) carry nearly all of the
        # draft mass, and float32 rounding of their terms (or a float32 zero-mass cut at 1e-6 of a leftover that is
        # real) would become the output law's error. Only the final residual is returned in the rows' precision.
        a = hub
        p64, q64 = p.double(), q.double()
        not_a = torch.ones_like(p64, dtype=torch.bool)
        not_a[a] = False
        zero = torch.zeros_like(p64)
        rest = hub_rest(p, a)
        a1 = torch.where(not_a, torch.minimum(p64, q64), zero)
        q1 = torch.where(not_a, q64 - a1, zero)
        r1 = torch.where(not_a, p64 - a1, zero)
        qai = torch.where(not_a, p64[a] * p64 / rest, zero) if rest > 0 else zero
        a2 = torch.minimum(qai, q1)
        q2 = q1 - a2
        r2 = qai - a2
        s_ai, s_ia = r2.sum(), r1.sum()
        qa = q64[a]
        a3 = torch.minimum(qa, s_ai)
        a4 = torch.minimum(qa - a3, s_ia)
        fin = q2.clone()
        fin[a] = (qa - a3 - a4).clamp_min(0.0)
        tot = fin.sum()
        # a float64 plan's leftover is the rows' own, not float32 round-off: the float64 zero-mass rule applies
        fin = q if tot <= zero_mass_tol(torch.float64) else (fin / tot).to(q.dtype)
        # A hub test whose leftover mass (S_ai or S_ia) is 0 is never reached (every first test accepts surely): its
        # numerator is set to 0 so that its reported probability does not hang on the last bit of a float64 sum.
        zero64 = torch.zeros((), dtype=torch.float64)
        if cand[0] == a:  # pair type (a, i): the non-hub token (slot 1) is tested first
            i = cand[1]
            return [(1, qai[i], q1[i]), (0, s_ai, qa if s_ai > 0 else zero64)], fin
        i = cand[0]  # pair type (i, a)
        return [(0, p64[i], q64[i]), (1, s_ia, qa - a3 if s_ia > 0 else zero64)], fin
    if method == "gds":
        return gds_chain(cand, p, q)
    raise ValueError(f"unknown method {method!r}")


def gds_chain(cand: list[int], p: torch.Tensor, q: torch.Tensor) -> tuple[list, torch.Tensor]:
    """Greedy draft sampling (docs/methods.md, GDS): the last candidate was drawn from p without the others (the
    deterministic set D) and is tested first against that law; the residual then holds q(D) on D, and each token of
    D is accepted with its share of what the residual has left (den = the mass not yet tested); the final residual
    is the residual without D (q when nothing is left there)."""
    *det, x = cand
    s = p.clone()
    s[det] = 0.0
    s = s / s.sum()
    tests: list[tuple[int, torch.Tensor, torch.Tensor]] = [(len(det), s[x], q[x])]
    r = residual(q, s)
    left = torch.ones((), dtype=r.dtype, device=r.device)
    for j, d in enumerate(det):
        tests.append((j, left, r[d]))
        left = left - r[d]
    fin = r.clone()
    fin[det] = 0.0
    tot = fin.sum()
    return tests, (q if tot <= zero_mass_tol(q.dtype) else fin / tot)


@register("verify_node", "torch")
def verify_node(
    method: str,
    cand: torch.Tensor,
    cand_valid: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    accept_u: torch.Tensor,
    final_noise: torch.Tensor,
    hub: torch.Tensor | None,
    analytic: bool,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One node per row. Returns slot (-1 = none), token, and in analytic mode accept_prob, residual."""
    cd = torch.float64 if torch.float64 in (p.dtype, q.dtype) else torch.float32
    batch, k = cand.shape
    accept_u = noise_or_philox(accept_u, seed, ACCEPT, (batch, k), p.device)
    final_noise = noise_or_philox(final_noise, seed, FINAL, p.shape, p.device)
    slot = torch.full((batch,), -1, dtype=torch.long, device=p.device)
    token = torch.empty((batch,), dtype=torch.long, device=p.device)
    accept_prob = torch.zeros((batch, k), dtype=cd, device=p.device) if analytic else None
    final = torch.empty(p.shape, dtype=cd, device=p.device) if analytic else None
    for b in range(batch):
        slots = [j for j in range(k) if cand_valid[b, j]]
        toks = [int(cand[b, j]) for j in slots]
        tests, fin = node_chain(method, toks, p[b].to(cd), q[b].to(cd), None if hub is None else int(hub[b]))
        chosen = -1
        for j, den, num in tests:
            real_slot = slots[j]
            if accept_prob is not None:
                accept_prob[b, real_slot] = ratio_prob(num, den)
            if chosen < 0 and passes(accept_u[b, real_slot], den, num):
                chosen = real_slot
                if not analytic:
                    break
        slot[b] = chosen
        token[b] = int(cand[b, chosen]) if chosen >= 0 else sample_from(fin, final_noise[b])
        if final is not None:
            final[b] = fin
    return slot, token, accept_prob, final


def _compute_dtype(p: torch.Tensor | None, q: torch.Tensor) -> torch.dtype:
    """float64 when any input is float64 (oracle mode), else float32; ``p`` is None in greedy mode."""
    return torch.float64 if torch.float64 in (q.dtype, None if p is None else p.dtype) else torch.float32


@register("verify_chain", "torch")
def verify_chain(
    draft: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    lengths: torch.Tensor,
    accept_u: torch.Tensor,
    final_noise: torch.Tensor,
    greedy: bool,
    eos: torch.Tensor | None,
    seed: int = 0,
    leniency: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chain SD (greedy: accept iff x == argmax q). Row b verifies draft[b, :lengths[b]].

    ``leniency`` l >= 1 (CS Drafting's inner reviews, spec section 6.4): accept iff U * p(x) < l * q(x), the
    correction still from res(q, p); greedy with l > 1: accept iff x == argmax q or p(x) < l * q(x) (the authors'
    greedy rule, on probability rows). l * q(x) is formed in float64."""
    batch = draft.shape[0]
    accept_u = noise_or_philox(accept_u, seed, ACCEPT, draft.shape, q.device)
    final_noise = noise_or_philox(final_noise, seed, FINAL, (batch, q.shape[-1]), q.device)
    n_acc = torch.zeros((batch,), dtype=torch.long, device=draft.device)
    nxt = torch.empty((batch,), dtype=torch.long, device=draft.device)
    eos_set = set() if eos is None else {int(e) for e in eos}
    cd = _compute_dtype(p, q)
    for b in range(batch):
        out: int | None = None
        j = 0
        while j < int(lengths[b]):
            x = int(draft[b, j])
            if greedy:
                ok = x == int(torch.argmax(q[b, j]))
                if not ok and leniency > 1.0:
                    ok = passes(ONE, p[b, j, x], leniency * q[b, j, x].double())
            else:
                ok = passes(accept_u[b, j], p[b, j, x], leniency * q[b, j, x].double())
            if not ok:
                qj = q[b, j].to(cd)
                out = int(torch.argmax(qj)) if greedy else sample_from(residual(qj, p[b, j].to(cd)), final_noise[b])
                break
            j += 1
            if x in eos_set:
                out = -1
                break
        if out is None:
            qb = q[b, j].to(cd)
            out = int(torch.argmax(qb)) if greedy else sample_from(qb, final_noise[b])
        n_acc[b] = j
        nxt[b] = out
    return n_acc, nxt


def block_weights(chain: list[int], tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> list[torch.Tensor]:
    """Block verification's weights w_0 = 1, w_i = min(1, w_{i-1} q_{i-1}(X_i) / p_{i-1}(X_i)) in float64, where
    node ``chain[i]`` holds X_i (chain[0] = root) and rows p[node], q[node] are the laws after it."""
    w = [torch.ones((), dtype=torch.float64)]
    for i in range(1, len(chain)):
        prev, x = chain[i - 1], int(tokens[chain[i]])
        w.append(torch.clamp(w[-1] * q[prev, x].double() / p[prev, x].double(), max=1.0))
    return w


def block_excess(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(w q - p)^+ in float64: the unnormalised residual of block verification at a node of weight w."""
    return (w * q.double() - p.double()).clamp_min(0.0)


def block_walk(
    chain: list[int], tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor, u: torch.Tensor, noise: torch.Tensor
) -> tuple[int, int]:
    """Block verification of one chain (docs/methods.md, Block verification): returns (tau, next token).

    tau is the deepest i whose test U_i * (S_i + 1 - w_i) < S_i passes, S_i = sum (w_i q_i - p_i)^+ (at the last
    node: U_L < w_L), 0 when none does; the next token is drawn from q at the last node when tau = L, else from
    Norm[(w_tau q_tau - p_tau)^+] (q_tau under the zero-mass rule). ``u[node]`` is the uniform of the node's test.
    """
    w = block_weights(chain, tokens, p, q)
    last = len(chain) - 1
    tau = 0
    for i in range(last, 0, -1):
        node = chain[i]
        if i == last:
            ok = passes(u[node], ONE, w[i])
        else:
            s = block_excess(w[i], p[node], q[node]).sum()
            ok = passes(u[node], s + (1.0 - w[i]), s)
        if ok:
            tau = i
            break
    node = chain[tau]
    if tau == last:
        return tau, sample_from(q[node], noise)
    excess = block_excess(w[tau], p[node], q[node])
    tot = excess.sum()
    # the float64 rule whatever the rows: S is formed in float64, and tau < L is drawn with probability ~ S
    law = q[node].double() if tot <= zero_mass_tol(torch.float64) else excess / tot
    return tau, sample_from(law, noise)


def traversal_walk(
    children: list[list[int]],
    parent: list[int],
    tokens: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    u: torch.Tensor,
    noise: torch.Tensor,
    swor: bool,
) -> tuple[int, int]:
    """Traversal verification of one tree (docs/methods.md, Traversal verification): returns (accepted node, next
    token). Every node the walk reaches holds [a, test, R, D]: its acceptance probability, the (den, num) of its test
    once a child of it was rejected (None before), its target law and its draft law, all float64. The walk descends
    to the first child still in the tree until a node has none, tests it (U * den < num), and on a rejection removes
    it and updates its parent; ``u[node]`` is the node's uniform."""
    state = {0: [ONE, None, q[0].double(), p[0].double()]}
    alive = [True] * len(children)
    while True:
        node = 0
        while any(alive[c] for c in children[node]):
            child = next(c for c in children[node] if alive[c])
            if child not in state:
                a, _, r, d = state[node]
                x = int(tokens[child])
                start = torch.clamp(a * r[x] / d[x], max=1.0) if d[x] > 0 else torch.zeros((), dtype=torch.float64)
                state[child] = [start, None, q[child].double(), p[child].double()]
            node = child
        a, test, r, _ = state[node]
        if node == 0:  # every child rejected: the root's token comes from its residual
            return 0, sample_from(r, noise)
        den, num = (ONE, a) if test is None else test
        if passes(u[node], den, num):
            return node, sample_from(r, noise)
        alive[node] = False
        up = state[parent[node]]
        a, _, r, d = up
        excess = (a * r - d).clamp_min(0.0)
        mass = excess.sum()
        den = mass + (1.0 - a)
        up[0] = mass / den if den > 0 else a
        up[1] = (den, mass)
        if mass > zero_mass_tol(torch.float64):
            up[2] = excess / mass
        if swor:  # the rejected token leaves the law the next sibling was drawn from
            d = d.clone()
            d[int(tokens[node])] = 0.0
            tot = d.sum()
            up[3] = d / tot if tot > 0 else d


def _block_path(children, parent, tokens, p, q, u, noise) -> tuple[list[int], int]:
    chain = [0]
    while children[chain[-1]]:
        chain.append(children[chain[-1]][0])
    tau, out = block_walk(chain, tokens, p, q, u, noise)
    return chain[1 : tau + 1], out


def _traversal_path(swor: bool):
    def walk(children, parent, tokens, p, q, u, noise) -> tuple[list[int], int]:
        node, out = traversal_walk(children, parent, tokens, p, q, u, noise, swor)
        path = []
        while node != 0:
            path.append(node)
            node = parent[node]
        return path[::-1], out

    return walk


#: the path verifiers of verify_tree: (children, parent, tokens, p, q, u, noise) -> (accepted path, next token)
PATH_WALKS = {"block": _block_path, "traversal": _traversal_path(False), "traversalw": _traversal_path(True)}


def _walks_paths(method: str, greedy: bool) -> bool:
    """Whether ``method`` runs its path walk; greedy, the path verifiers walk as the node verifiers do."""
    return method in PATH_WALKS and not greedy


def _path_verdict(
    method: str, children: list[list[int]], parent: torch.Tensor, tokens: torch.Tensor, rows: tuple, eos_set: set[int]
) -> tuple[list[int], list[int], int]:
    """One row's (accepted path, sibling ranks, next token) under a path verifier; an accepted EOS ends the row."""
    par = [int(x) for x in parent.tolist()]
    path, out = PATH_WALKS[method](children, par, tokens, *rows)
    hit = next((d for d, m in enumerate(path) if int(tokens[m]) in eos_set), None)
    if hit is not None:
        path, out = path[: hit + 1], -1
    return path, [children[par[m]].index(m) for m in path], out


@register("verify_tree", "torch")
def verify_tree(
    tokens: torch.Tensor,
    parent: torch.Tensor,
    valid: torch.Tensor,
    p_rows: torch.Tensor,
    q_rows: torch.Tensor,
    method: str,
    hub: torch.Tensor | None,
    accept_u: torch.Tensor,
    final_noise: torch.Tensor,
    greedy: bool,
    eos: torch.Tensor | None,
    max_depth: int,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TreeVerify per row. For ``kseq`` (SpecTr) the candidates after an acceptance are the
    children of every alive chain node that carries the accepted token (chains sharing the prefix)."""
    batch, n = tokens.shape
    # a node has at most N - 1 candidates (kseq: chains); Philox elements do not depend on the width
    accept_u = noise_or_philox(accept_u, seed, ACCEPT, (batch, n, max(n - 1, 1)), q_rows.device)
    final_noise = noise_or_philox(final_noise, seed, FINAL, (batch, q_rows.shape[-1]), q_rows.device)
    dev = tokens.device
    acc_nodes = torch.full((batch, max_depth), -1, dtype=torch.long, device=dev)
    acc_rank = torch.full((batch, max_depth), -1, dtype=torch.long, device=dev)
    n_acc = torch.zeros((batch,), dtype=torch.long, device=dev)
    nxt = torch.empty((batch,), dtype=torch.long, device=dev)
    eos_set = set() if eos is None else {int(e) for e in eos}
    cd = _compute_dtype(p_rows, q_rows)
    path_method = _walks_paths(method, greedy)
    for b in range(batch):
        children: list[list[int]] = [[] for _ in range(n)]
        for m in range(1, n):
            if valid[b, m]:
                children[int(parent[b, m])].append(m)
        alive = [0]
        path: list[int] = []
        ranks: list[int] = []
        out: int | None = None
        if path_method:
            rows = (p_rows[b].to(cd), q_rows[b].to(cd), accept_u[b, :, 0], final_noise[b])
            path, ranks, out = _path_verdict(method, children, parent[b], tokens[b], rows, eos_set)
        while out is None:
            rep = alive[0]
            cands = [c for m in alive for c in children[m]] if method == "kseq" else children[rep]
            q = q_rows[b, rep].to(cd)
            if not cands:
                out = int(torch.argmax(q)) if greedy else sample_from(q, final_noise[b])
                break
            toks = [int(tokens[b, c]) for c in cands]
            if greedy:
                target = int(torch.argmax(q))
                chosen = toks.index(target) if target in toks else -1
                if chosen < 0:
                    out = target
            else:
                h = None if hub is None else int(hub[b, rep])
                tests, fin = node_chain(method, toks, p_rows[b, rep].to(cd), q, h)
                chosen = next((j for j, den, num in tests if passes(accept_u[b, rep, j], den, num)), -1)
                if chosen < 0:
                    out = sample_from(fin, final_noise[b])
            if chosen >= 0:
                child = cands[chosen]
                path.append(child)
                ranks.append(chosen)
                if toks[chosen] in eos_set:
                    out = -1
                alive = [c for c in cands if int(tokens[b, c]) == toks[chosen]] if method == "kseq" else [child]
        # Rebuild the accepted path from the last node's ancestors so that it is parent-consistent even when
        # SpecTr accepted a token through a duplicate chain (same tokens, same KV).
        if path:
            node = path[-1]
            for d in range(len(path) - 1, -1, -1):
                path[d] = node
                node = int(parent[b, node])
        m_acc = len(path)
        n_acc[b] = m_acc
        if m_acc:
            acc_nodes[b, :m_acc] = torch.tensor(path, dtype=torch.long)
            acc_rank[b, :m_acc] = torch.tensor(ranks, dtype=torch.long)
        nxt[b] = out
    return acc_nodes, n_acc, nxt, acc_rank


@register("emission_law", "torch")
def emission_law(p: torch.Tensor, q: torch.Tensor, leniency: float) -> torch.Tensor:
    """Law of the token a lenient review emits at one position (CS Drafting, spec section 6.4).

    The candidate x ~ p is kept iff U * p(x) < l * q(x), else the token is drawn from rho = res(q, p) (the
    zero-mass rule: rho = q when the residual mass is numerically zero), so the emitted token follows
    ``E = min(p, l q) + r rho`` with the rejection mass ``r = sum_v (p(v) - l q(v))^+``. With l = 1, E = q.

    Shape: p, q [..., V] -> E [..., V] in the compute dtype (float64 if an input is float64, else float32);
    l is rounded to that dtype, both sums are accumulated in float64.
    """
    cd = _compute_dtype(p, q)
    p, q = p.to(cd), q.to(cd)
    lq = torch.tensor(leniency, dtype=cd) * q
    rejected = (p - lq).clamp_min(0.0).sum(-1, keepdim=True, dtype=torch.float64).to(cd)
    excess = (q - p).clamp_min(0.0)
    mass = excess.sum(-1, keepdim=True, dtype=torch.float64).to(cd)
    rho = torch.where(mass <= zero_mass_tol(cd), q, excess / mass)
    return torch.minimum(p, lq) + rejected * rho
