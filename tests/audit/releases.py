"""What one stream published, per scenario: the records the audit samples, and which records there were.

Filled from the output topics of real workers (``neighbours.Deployment``) or from a release stage run
in process (``in_process``); the audit reads both the same way.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import orjson

from tests.audit.neighbours import BACKGROUND_UNITS, BACKGROUND_VALUE, TOP_K_SCENARIOS, TOPK_TARGET_GROUPS, Scenario

#: A record as the presence check compares it: its kind, level and group (values and ids left out).
Signature = tuple[str, int | None, bytes]


def release_key(scenario: Scenario, record: dict) -> tuple[int, str] | None:
    """Where a scenario keeps a record: (window start, group), or None for records it does not audit."""
    start = record["window"]["start_ms"]
    if scenario.name in TOP_K_SCENARIOS:
        return (start, "top") if record.get("kind") == "top_k" else None
    if record.get("kind") is not None:  # records of other kinds than the groups' are only compared for presence
        return None
    if scenario.name == "hierarchy" and record.get("level") == 0:
        return start, "region"
    return start, record["group"]["group"]


def signature(record: dict) -> Signature:
    return record.get("kind") or "group", record.get("level"), orjson.dumps(record.get("group"), option=orjson.OPT_SORT_KEYS)


def audited_windows(scenario: Scenario, start_ms: int, windows: int) -> list[int]:
    """Indexes of the windows a scenario reads a sample from (continual: the last of each whole period).

    Periods of two one-second windows start at even seconds of the epoch, so which windows end a
    period depends on ``start_ms``; a period the stream enters halfway is skipped.
    """
    if scenario.name == "continual":
        return [w for w in range(1, windows) if (start_ms // 1000 + w) % 2 == 1]
    return list(range(windows))


def _true_count(group: str) -> int:
    """A window's count of ``group`` on the main topic in D: the background units, all in group "a"."""
    return BACKGROUND_UNITS if group == "a" else 0


def _excess(released: tuple[float, float], true: tuple[float, float], shift: tuple[float, float] = (2, 2)) -> float:
    """How far both of two released values are above their true value in D, in units of what the target
    adds to each (``shift``): the smaller of the two excesses.

    Its threshold 1 is the event "both at least their shift above": for two independent Laplace noises the
    event of the pair's largest likelihood ratio, where a sum of the two would reach it only far in the
    tails. The other thresholds find that event where D's values are not the ones designed here (a
    doctored build that doubles every total doubles D's too)."""
    return min((r - t) / d for r, t, d in zip(released, true, shift))


def _covariance_total(block: dict, clip_norm: float) -> float:
    """S_00 + S_01 + S_11 of a one-field covariance release, from its units, mean and second moment (the
    corner alone when fewer than one noisy unit leaves no mean)."""
    units = float(block["units"])
    corner = units * clip_norm * clip_norm
    if block["mean"] is None:
        return corner
    return corner + float(block["mean"][0]) * clip_norm * units + float(block["second_moment"][0][0]) * units


@dataclass
class Releases:
    """The records of one stream (D or D') of ``windows`` one-second windows from ``start_ms``."""

    start_ms: int
    windows: int
    by_key: dict[str, dict[tuple[int, str], dict]] = field(default_factory=lambda: defaultdict(dict))
    #: scenario -> window start -> the signature of every record of the window, in the order read
    presence: dict[str, dict[int, list[Signature]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))

    def add(self, scenario: Scenario, record: dict) -> None:
        start = record["window"]["start_ms"]
        if self.start_ms <= start < self.start_ms + self.windows * 1000:
            self.presence[scenario.name][start].append(signature(record))
        key = release_key(scenario, record)
        if key is not None:
            self.by_key[scenario.name].setdefault(key, record)

    def expected(self, scenario: Scenario) -> set[tuple[int, str]]:
        groups = ("top",) if scenario.name in TOP_K_SCENARIOS else scenario.groups
        if scenario.name == "hierarchy":
            groups = (*groups, "region")
        windows = audited_windows(scenario, self.start_ms, self.windows)
        if scenario.name == "continual":  # both windows of each sampled period
            windows = sorted({v for w in windows for v in (w - 1, w)})
        return {(self.start_ms + w * 1000, g) for w in windows for g in groups}

    def missing(self, scenarios: tuple[Scenario, ...]) -> dict[str, list[int]]:
        """Per scenario with windows not yet released: the indexes of those windows."""
        out = {}
        for s in scenarios:
            gone = self.expected(s) - self.by_key[s.name].keys()
            if gone:
                out[s.name] = sorted({(start - self.start_ms) // 1000 for start, _ in gone})
        return out

    def samples(self, scenario: Scenario, group: str) -> list[float]:
        releases = self.by_key[scenario.name]
        starts = [self.start_ms + w * 1000 for w in audited_windows(scenario, self.start_ms, self.windows)]
        # (over selected groups a window whose selection released none has no top_k record; on the topksel
        # topic all five groups of TOPKSEL_BACKGROUND units fail it together with probability 4e-10 a window)
        if scenario.statistic == "top1":
            return [float(bool(top := releases[(s, "top")]["top"]) and top[0]["group"]["group"] == group)
                    for s in starts]
        if scenario.statistic == "top2_target":  # the list is the target's two groups (``group`` unused)
            return [float({t["group"]["group"] for t in releases[(s, "top")]["top"]} == set(TOPK_TARGET_GROUPS))
                    for s in starts]
        if scenario.statistic == "sa_value":
            return [float(releases[(s, group)]["sample_aggregate"]["value"]) for s in starts]
        if scenario.name == "continual":  # a period's two running totals, both far above D's
            return [_excess((releases[(s - 1000, group)]["count"], releases[(s, group)]["count"]),
                            (_true_count(group), 2 * _true_count(group))) for s in starts]
        if scenario.statistic == "count_and_sum":  # both far above D's (the target's 2 events clipped to 10)
            return [_excess((releases[(s, group)]["count"], releases[(s, group)]["sum"]),
                            (_true_count(group), BACKGROUND_VALUE * _true_count(group)), (2, 20)) for s in starts]
        if scenario.statistic == "both_levels":  # the region's count and the group's, both far above D's
            return [_excess((releases[(s, "region")]["count"], releases[(s, group)]["count"]),
                            (BACKGROUND_UNITS, _true_count(group))) for s in starts]
        if scenario.statistic == "cov_units":
            return [float(releases[(s, group)]["covariance"]["units"]) for s in starts]
        if scenario.statistic == "cov_second_moment":
            blocks = [releases[(s, group)]["covariance"] for s in starts]
            return [0.0 if b["second_moment"] is None else float(b["second_moment"][0][0]) * b["units"] for b in blocks]
        if scenario.statistic == "vector_sum":  # both coordinates of the augmented sum: (x, C) per unit
            blocks = [releases[(s, group)]["mean_vector"] for s in starts]
            clip_norm = float(releases[(starts[0], group)]["privacy"]["mean_vector"]["clip_norm"])
            return [float(b["sum"][0]) + clip_norm * float(b["units"]) for b in blocks]
        if scenario.statistic == "cov_total":  # the augmented matrix's three entries (x^2, x C, C^2 per unit)
            clip_norm = float(releases[(starts[0], group)]["privacy"]["covariance"]["clip_norm"])
            return [_covariance_total(releases[(s, group)]["covariance"], clip_norm) for s in starts]
        if scenario.statistic == "median":
            return [float(releases[(s, group)]["quantiles"]["0.5"]["value"]) for s in starts]
        return [float(releases[(s, group)][scenario.statistic]) for s in starts]

    def claimed(self, scenario: Scenario) -> tuple[float, float]:
        """(epsilon, delta) that the released records state for what the scenario samples: a median, the
        quantiles' own (stated beside the count's in ``privacy.quantiles``)."""
        if scenario.statistic == "median":
            privacy = {(r["privacy"]["quantiles"]["epsilon"], 0.0) for r in self.by_key[scenario.name].values()}
        else:
            privacy = {(r["privacy"]["epsilon"], r["privacy"]["delta"]) for r in self.by_key[scenario.name].values()}
        if len(privacy) != 1:
            raise AssertionError(f"{scenario.name}: records state different losses {privacy}")
        return privacy.pop()

    def claimed_rho(self, scenario: Scenario) -> float | None:
        """The zCDP rho the records state when they claim Gaussian noise, else None."""
        claims = {(r["privacy"]["mechanism"], r["privacy"]["rho"]) for r in self.by_key[scenario.name].values()}
        if len(claims) != 1:
            raise AssertionError(f"{scenario.name}: records state different mechanisms or rho {claims}")
        mechanism, rho = claims.pop()
        return rho if mechanism == "gaussian" else None

    def window_claim(self, scenario: Scenario) -> tuple[float, float]:
        """(epsilon, delta) of the whole window, which a record of one part (a top-k list) states beside its own."""
        privacy = {(r["privacy"].get("window_epsilon", r["privacy"]["epsilon"]),
                    r["privacy"].get("window_delta", r["privacy"]["delta"])) for r in self.by_key[scenario.name].values()}
        if len(privacy) != 1:
            raise AssertionError(f"{scenario.name}: records state different window losses {privacy}")
        return privacy.pop()

    def published(self, scenario: Scenario) -> list[tuple[Signature, ...]]:
        """Per window, the signatures of its records in a canonical order."""
        windows = self.presence[scenario.name]
        return [tuple(sorted(windows.get(self.start_ms + w * 1000, ()))) for w in range(self.windows)]
