"""Statistical checks with a stated false-alarm rate (docs/exactness.md, Monte Carlo).

``law_check`` compares observed counts of a discrete outcome with an exact law: Pearson chi-square (bins with
expected count < 5 merged) must have p-value >= ``alpha`` (the per-test false-alarm rate) and the empirical total
variation must stay below ``max_tv``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

DEFAULT_ALPHA = 1e-4  # per-test false-alarm rate


@dataclass(frozen=True)
class LawCheck:
    p_value: float
    tv: float
    n: int
    bins: int
    alpha: float
    max_tv: float

    @property
    def ok(self) -> bool:
        return self.p_value >= self.alpha and self.tv <= self.max_tv

    def __str__(self) -> str:
        return (
            f"chi-square p={self.p_value:.3g} (need >= {self.alpha:g}), TV={self.tv:.4f} (need <= {self.max_tv:g}), "
            f"N={self.n}, bins={self.bins}"
        )


def empirical_tv(counts: np.ndarray, law: np.ndarray) -> float:
    counts = np.asarray(counts, dtype=np.float64).ravel()
    law = np.asarray(law, dtype=np.float64).ravel()
    return 0.5 * float(np.abs(counts / counts.sum() - law).sum())


def chi_square_p(counts: np.ndarray, law: np.ndarray, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson chi-square p-value after merging the smallest-expectation bins until each has >= min_expected.

    Observations in bins of zero probability give p = 0 (an impossible outcome happened)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    law = np.asarray(law, dtype=np.float64).ravel()
    if counts.shape != law.shape:
        raise ValueError(f"counts and law must have the same size, got {counts.shape} and {law.shape}")
    n = counts.sum()
    if np.any((law <= 0) & (counts > 0)):
        return 0.0, int(law.size)
    keep = law > 0
    obs, exp = counts[keep], law[keep] * n
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order], exp[order]
    merged_obs, merged_exp = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(obs, exp, strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= min_expected:
            merged_obs.append(acc_o)
            merged_exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        if merged_exp:
            merged_obs[-1] += acc_o
            merged_exp[-1] += acc_e
        else:
            merged_obs.append(acc_o)
            merged_exp.append(acc_e)
    if len(merged_exp) < 2:
        return 1.0, len(merged_exp)
    o, e = np.array(merged_obs), np.array(merged_exp)
    stat = float(((o - e) ** 2 / e).sum())
    return float(stats.chi2.sf(stat, len(e) - 1)), len(e)


def law_check(counts: np.ndarray, law: np.ndarray, *, alpha: float = DEFAULT_ALPHA, max_tv: float) -> LawCheck:
    """Goodness of fit of observed ``counts`` against the exact ``law`` (same shape, any dims)."""
    p, bins = chi_square_p(counts, law)
    return LawCheck(p, empirical_tv(counts, law), int(np.asarray(counts).sum()), bins, alpha, max_tv)


def rate_tolerance(rate: float, n: int, floor: float = 0.005, sigmas: float = 5.0) -> float:
    """Tolerance for an empirical acceptance rate around its closed form."""
    return max(floor, sigmas * float(np.sqrt(max(rate * (1 - rate), 0.0) / n)))
