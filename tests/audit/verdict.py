"""The audit's two checks of a scenario, on what D and D' published (``releases.Releases``).

* ``epsilon_bound``: the largest simultaneous lower bound on the privacy loss over the scenario's
  groups (``stats.epsilon_lower_bound``), to compare with the epsilon the records claim; for records
  that claim Gaussian noise, also a lower bound on the zCDP rho (``stats.rho_lower_bound``) to
  compare with the rho they state.
* ``presence``: whether which records a window has depends on the target. With public groups it
  must not at all: every window of D and D' has the same records (kind, level, group), a difference
  in one window is a leak. With selected groups the records are the selection's noisy outcome, and
  with local DP any function of the randomized reports: the number of records of a window is a
  mechanism output like any other, audited as ``epsilon_bound`` audits values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.audit.neighbours import Scenario
from tests.audit.releases import Releases
from tests.audit.stats import DEFAULT_ALPHA, EpsilonBound, RhoBound, epsilon_lower_bound, grid, rho_lower_bound

#: Statistics read as real numbers (thresholds on a grid of quantiles); the others are whole numbers.
REAL_STATISTICS = ("sum", "median", "vector_sum", "cov_units", "cov_second_moment", "sa_value", "count_and_sum", "cov_total",
                   "both_levels")
#: For the rho check, which splits alpha over fewer thresholds: the (epsilon, delta) grid's are wasted on it.
RHO_THRESHOLDS = 12


@dataclass(frozen=True)
class Verdict:
    scenario: str
    windows: int
    epsilon: float  # claimed by the records
    delta: float
    group: str
    bound: EpsilonBound
    rho: float | None = None  # claimed by records of Gaussian noise
    rho_group: str = ""
    rho_bound: RhoBound | None = None

    @property
    def caught(self) -> bool:
        """Whether the samples show more loss than the records claim."""
        return self.bound.epsilon > self.epsilon or (
            self.rho is not None and self.rho_bound is not None and self.rho_bound.rho > self.rho)

    def __str__(self) -> str:
        b = self.bound
        text = (f"{self.scenario}: {self.windows} windows, claimed epsilon {self.epsilon:.3f} (delta {self.delta}), "
                f"lower bound {b.epsilon:.3f} (group {self.group!r}, {b.tail} {b.threshold}, {b.direction}, "
                f"{b.tests} tests per group)")
        if self.rho is not None and self.rho_bound is not None:
            r = self.rho_bound
            text += (f"; claimed rho {self.rho:.4f}, lower bound {r.rho:.4f} (group {self.rho_group!r}, {r.tail} "
                     f"{r.threshold}, {r.direction}, order {r.order})")
        return text


def _thresholds(scenario: Scenario, a: np.ndarray, b: np.ndarray) -> list[float]:
    if scenario.statistic in REAL_STATISTICS or scenario.name.startswith(("local_dp", "continual")):
        return grid(a, b)
    return [float(t) for t in range(int(min(a.min(), b.min())), int(max(a.max(), b.max())) + 1)]


def epsilon_bound(scenario: Scenario, d: Releases, d_prime: Releases, alpha: float = DEFAULT_ALPHA) -> Verdict:
    epsilon, delta = d_prime.claimed(scenario)
    assert d.claimed(scenario) == (epsilon, delta), f"{scenario.name}: D and D' claim different losses"
    rho = d_prime.claimed_rho(scenario)
    assert d.claimed_rho(scenario) == rho, f"{scenario.name}: D and D' claim different rho"
    best, best_rho = None, None
    # alpha split over the groups, and over the two checks when both are made
    share = alpha / len(scenario.groups) / (1 if rho is None else 2)
    for group in scenario.groups:
        a, b = np.array(d.samples(scenario, group)), np.array(d_prime.samples(scenario, group))
        bound = epsilon_lower_bound(a, b, _thresholds(scenario, a, b), delta=delta, alpha=share)
        if best is None or bound.epsilon > best[1].epsilon:
            best = (group, bound)
        if rho is not None:
            found = rho_lower_bound(a, b, grid(a, b, RHO_THRESHOLDS), alpha=share)
            if best_rho is None or found.rho > best_rho[1].rho:
                best_rho = (group, found)
    assert best is not None
    if best_rho is None:
        return Verdict(scenario.name, d.windows, epsilon, delta, best[0], best[1])
    return Verdict(scenario.name, d.windows, epsilon, delta, best[0], best[1], rho, best_rho[0], best_rho[1])


@dataclass(frozen=True)
class Presence:
    scenario: str
    #: Public groups: indexes of the windows whose records differ between D and D' (none for a sound release).
    differing: list[int]
    example: str  # the first difference, for the failure message
    #: Selected groups: the bound on the loss that the number of records per window shows; else None.
    bound: Verdict | None

    @property
    def leaks(self) -> bool:
        return bool(self.differing) or (self.bound is not None and self.bound.caught)

    def __str__(self) -> str:
        if self.bound is not None:
            return f"{self.scenario} presence: records per window, {self.bound}"
        if not self.differing:
            return f"{self.scenario} presence: every window has the same records in D and D'"
        return (f"{self.scenario} presence: {len(self.differing)} windows publish other records in D' than in D, "
                f"e.g. {self.example}")


def presence(scenario: Scenario, d: Releases, d_prime: Releases, alpha: float = DEFAULT_ALPHA) -> Presence:
    mine, theirs = d.published(scenario), d_prime.published(scenario)
    if "select" in scenario.settings.get("groups", {}) or "local_dp" in scenario.settings:
        epsilon, delta = d_prime.window_claim(scenario)
        a, b = np.array([len(r) for r in mine], float), np.array([len(r) for r in theirs], float)
        thresholds = [float(t) for t in range(int(min(a.min(), b.min())), int(max(a.max(), b.max())) + 1)]
        bound = epsilon_lower_bound(a, b, thresholds, delta=delta, alpha=alpha)
        return Presence(scenario.name, [], "", Verdict(scenario.name, d.windows, epsilon, delta, "*", bound))
    differing = [w for w, (x, y) in enumerate(zip(mine, theirs)) if x != y]
    example = ""
    if differing:
        w = differing[0]
        only_d, only_d_prime = set(mine[w]) - set(theirs[w]), set(theirs[w]) - set(mine[w])
        example = (f"window {w}: only in D {sorted(only_d)[:3]}, only in D' {sorted(only_d_prime)[:3]} "
                   f"({len(mine[w])} and {len(theirs[w])} records)")
    return Presence(scenario.name, differing, example, None)
