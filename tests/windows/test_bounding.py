from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stream_dp.windows.bounding import ContributionRows, prune, prune_order


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12)


def rows(unit, group, pair_rank, event_hash, value=None, partition=None) -> ContributionRows:
    n = len(unit)
    return ContributionRows(
        unit=np.asarray(unit, dtype=np.uint64),
        group=np.asarray(group, dtype=np.uint32),
        pair_rank=np.asarray(pair_rank, dtype=np.uint32),
        partition=np.zeros(n, np.int32) if partition is None else np.asarray(partition, np.int32),
        event_hash=np.asarray(event_hash, dtype=np.uint64),
        value=np.arange(n, dtype=np.float64) if value is None else np.asarray(value, np.float64),
    )


def random_rows(
    rng: np.random.Generator, n: int, units: int, groups: int, collide: bool = False
) -> tuple[ContributionRows, np.ndarray]:
    """Rows whose pair ranks and event hashes look like the real keyed hashes.

    With ``collide``, units share their top 32 bits in clusters and pair ranks
    take only a few values, to drive every tie-breaking path.
    """
    unit_hash = rng.integers(0, 2**64 - 1, units, dtype=np.uint64, endpoint=True)
    group_hash = rng.integers(0, 2**64 - 1, groups, dtype=np.uint64, endpoint=True)
    if collide:
        unit_hash = (unit_hash & np.uint64(0xFFFFFFFF)) | (np.uint64(0x1234) << np.uint64(32)) * (
            unit_hash % np.uint64(5)
        )
    u = rng.integers(0, units, n)
    g = rng.integers(0, groups, n)
    pair_rank = ((unit_hash[u] * np.uint64(0x9E3779B97F4A7C15)) ^ group_hash[g]) >> np.uint64(32)
    if collide:
        pair_rank %= np.uint64(4)
    return rows(unit_hash[u], g, pair_rank, rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)), group_hash


def as_set(r: ContributionRows) -> set[tuple]:
    return set(zip(r.unit.tolist(), r.group.tolist(), r.event_hash.tolist(), r.value.tolist()))


def check_bounds(r: ContributionRows, max_groups: int, max_events: int) -> None:
    pairs: dict[tuple[int, int], int] = {}
    for u, g in zip(r.unit.tolist(), r.group.tolist()):
        pairs[(u, g)] = pairs.get((u, g), 0) + 1
    assert max(pairs.values(), default=0) <= max_events
    groups_per_unit: dict[int, int] = {}
    for u, _ in pairs:
        groups_per_unit[u] = groups_per_unit.get(u, 0) + 1
    assert max(groups_per_unit.values(), default=0) <= max_groups


def test_keeps_lowest_hashes_per_pair_and_lowest_ranks_per_unit():
    r = rows(
        unit=[1, 1, 1, 1, 1, 2],
        group=[10, 10, 10, 11, 12, 10],
        pair_rank=[5, 5, 5, 3, 9, 1],
        event_hash=[30, 10, 20, 99, 7, 1],
    )
    kept = prune(r, max_groups=2, max_events=2, group_hashes=np.zeros(13, np.uint64))
    # unit 1 keeps groups 11 (rank 3) and 10 (rank 5); in group 10 the events hashed 10 and 20
    assert list(zip(kept.unit.tolist(), kept.group.tolist(), kept.event_hash.tolist())) == [
        (1, 11, 99),
        (1, 10, 10),
        (1, 10, 20),
        (2, 10, 1),
    ]


def test_the_same_event_twice_is_kept_once():
    r = rows(unit=[1, 1, 1], group=[4, 4, 4], pair_rank=[0, 0, 0], event_hash=[8, 8, 9], value=[1.0, 1.0, 2.0])
    kept = prune(r, max_groups=1, max_events=5, group_hashes=np.zeros(5, np.uint64))
    assert kept.event_hash.tolist() == [8, 9] and kept.value.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize(("max_groups", "max_events"), [(1, 1), (3, 2), (50, 50)])
def test_bounds_hold_and_prune_is_idempotent(rng, max_groups, max_events, collide):
    r, group_hash = random_rows(rng, 5_000, 300, 40, collide)
    kept = prune(r, max_groups, max_events, group_hash)
    check_bounds(kept, max_groups, max_events)
    again = prune(kept, max_groups, max_events, group_hash)
    assert as_set(again) == as_set(kept)
    assert np.array_equal(again.event_hash, kept.event_hash)


@pytest.mark.parametrize("collide", [False, True])
def test_prune_commutes_with_concatenation_in_any_split(rng, collide):
    r, group_hash = random_rows(rng, 6_000, 200, 30, collide)
    whole = prune(r, 3, 2, group_hash)
    cut = rng.permutation(len(r))
    parts = [r.take(np.sort(cut[i::3])) for i in range(3)]
    folded = prune(ContributionRows.concat([prune(p, 3, 2, group_hash) for p in parts]), 3, 2, group_hash)
    assert as_set(folded) == as_set(whole)
    for name in ("unit", "group", "event_hash", "value", "partition", "pair_rank"):
        assert np.array_equal(getattr(folded, name), getattr(whole, name)), name


@pytest.mark.parametrize("collide", [False, True])
def test_order_of_input_rows_does_not_matter(rng, collide):
    r, group_hash = random_rows(rng, 3_000, 100, 20, collide)
    shuffled = r.take(rng.permutation(len(r)))
    a, b = prune(r, 2, 1, group_hash), prune(shuffled, 2, 1, group_hash)
    assert np.array_equal(a.unit, b.unit) and np.array_equal(a.event_hash, b.event_hash)


def test_units_sharing_their_top_32_bits_are_kept_apart():
    top = np.uint64(0xABCD_0000_0000_0000)
    r = rows(
        unit=[top | np.uint64(1), top | np.uint64(2), top | np.uint64(1), top | np.uint64(2), top | np.uint64(1)],
        group=[1, 1, 2, 2, 3],
        pair_rank=[1, 2, 3, 4, 5],
        event_hash=[1, 2, 3, 4, 5],
    )
    kept = prune(r, max_groups=2, max_events=1, group_hashes=np.arange(4, dtype=np.uint64))
    check_bounds(kept, 2, 1)
    assert sorted(zip(kept.unit.tolist(), kept.group.tolist())) == sorted(
        [
            (int(top | np.uint64(1)), 1),
            (int(top | np.uint64(1)), 2),
            (int(top | np.uint64(2)), 1),
            (int(top | np.uint64(2)), 2),
        ]
    )
    assert np.all(np.diff(kept.unit.astype(np.float64)) >= 0)  # sorted by unit hash


def test_groups_sharing_a_rank_are_ordered_by_group_hash():
    r = rows(unit=[5, 5, 5, 5], group=[1, 2, 1, 3], pair_rank=[7, 7, 7, 8], event_hash=[2, 1, 3, 4])
    group_hash = np.array([0, 900, 100, 0], dtype=np.uint64)  # group 2 sorts before group 1
    kept = prune(r, max_groups=1, max_events=5, group_hashes=group_hash)
    assert kept.group.tolist() == [2]
    kept = prune(r, max_groups=2, max_events=5, group_hashes=group_hash)
    assert kept.group.tolist() == [2, 1, 1] and kept.event_hash.tolist() == [1, 2, 3]


def test_empty_input():
    assert len(prune(ContributionRows.empty(), 1, 1, np.zeros(0, np.uint64))) == 0
    assert prune_order(ContributionRows.empty(), 1, 1, np.zeros(0, np.uint64)).shape == (0,)


def test_event_choice_is_uniform(rng):
    """Each of a pair's 10 events is kept with probability 2/10, whichever position it arrived in.

    Over 3000 pairs with fresh random hashes, the kept positions should be
    uniform; a chi-square test flags p < 1e-4 -- loose on purpose, so that it
    fails about once in 10 000 runs by chance but catches any real bias such as
    keeping the first or last events.
    """
    pairs, per_pair, keep = 3_000, 10, 2
    unit = np.repeat(np.arange(pairs, dtype=np.uint64), per_pair)
    event_hash = rng.integers(0, 2**64 - 1, pairs * per_pair, dtype=np.uint64, endpoint=True)
    position = np.tile(np.arange(per_pair, dtype=np.float64), pairs)
    r = rows(unit, np.zeros(len(unit)), np.zeros(len(unit)), event_hash, value=position)
    kept = prune(r, 1, keep, np.zeros(1, np.uint64))
    counts = np.bincount(kept.value.astype(np.int64), minlength=per_pair)
    assert counts.sum() == pairs * keep
    assert stats.chisquare(counts).pvalue > 1e-4


def test_group_choice_is_uniform(rng):
    """With 8 groups and max_groups 3, each group is kept with probability 3/8 (chi-square, p < 1e-4 fails)."""
    units, groups, keep = 3_000, 8, 3
    unit = np.repeat(np.arange(units, dtype=np.uint64), groups)
    group = np.tile(np.arange(groups), units)
    pair_rank = rng.integers(0, 2**32 - 1, units * groups, dtype=np.uint64, endpoint=True)
    r = rows(unit, group, pair_rank, np.zeros(len(unit)))
    kept = prune(r, keep, 1, np.arange(groups, dtype=np.uint64))
    counts = np.bincount(kept.group.astype(np.int64), minlength=groups)
    assert counts.sum() == units * keep
    assert stats.chisquare(counts).pvalue > 1e-4


def reference_prune(r: ContributionRows, max_groups: int, max_events: int, group_hash: np.ndarray) -> set[tuple]:
    """The definition, one row at a time."""
    by_pair: dict[tuple[int, int], dict[int, tuple]] = {}
    rank: dict[tuple[int, int], int] = {}
    for u, g, pr, e, v in zip(
        r.unit.tolist(), r.group.tolist(), r.pair_rank.tolist(), r.event_hash.tolist(), r.value.tolist()
    ):
        by_pair.setdefault((u, g), {}).setdefault(e, (u, g, e, v))
        rank[(u, g)] = pr
    kept: set[tuple] = set()
    for unit in {u for u, _ in by_pair}:
        pairs = sorted((p for p in by_pair if p[0] == unit), key=lambda p: (rank[p], int(group_hash[p[1]]), p[1]))
        for pair in pairs[:max_groups]:
            events = by_pair[pair]
            kept.update(events[e] for e in sorted(events)[:max_events])
    return kept


@pytest.mark.parametrize("collide", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_matches_the_row_by_row_definition(rng, seed, collide):
    r, group_hash = random_rows(rng, 800, 40, 12, collide)
    duplicates = r.take(rng.integers(0, len(r), 100))  # the same messages delivered twice
    r = ContributionRows.concat([r, duplicates])
    max_groups, max_events = 1 + seed, 1 + seed % 3
    assert as_set(prune(r, max_groups, max_events, group_hash)) == reference_prune(
        r, max_groups, max_events, group_hash
    )
    assert len(prune(r, max_groups, max_events, group_hash)) == len(
        reference_prune(r, max_groups, max_events, group_hash)
    )
