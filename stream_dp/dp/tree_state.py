"""The shape of the binary tree over a period, the state carried between windows, and its storable form.

A period of ``T`` windows has ``floor(log2 T) + 1`` levels; the running total
at ``t`` is made of the nodes of the set bits of ``t`` (:func:`set_bits`).

After window ``t`` the state holds, for every set bit ``j`` of ``t``, the true
p-sum ``alpha_j`` and its noisy release ``alpha^_j`` (one vector per group;
Chan, Shi & Song 2011, Algorithm 2); nothing else is needed to go on, so a
state stored after every window lets a restarted worker resume the period
with exactly the releases it would have made without the restart.

The true p-sums are sums of raw window aggregates: store them like those,
never publish them.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

COMPONENTS = ("count", "sum")
_KINDS = ("true", "noisy")
_DTYPES = {"count": np.dtype(np.int64), "sum": np.dtype(np.float64)}
_INT64 = np.iinfo(np.int64)

Levels = Mapping[int, NDArray[Any]]


def set_bits(t: int) -> tuple[int, ...]:
    """Positions of the set bits of ``t``, ascending: the levels whose nodes make up the running total at ``t``."""
    return tuple(j for j in range(int(t).bit_length()) if t >> j & 1)


def tree_depth(windows_per_period: int) -> int:
    """Number of levels of the tree over ``T`` windows: ``floor(log2 T) + 1``."""
    positive_int("windows_per_period", windows_per_period, "e.g. windows_per_period=1440 for minutes of a day")
    return int(windows_per_period).bit_length()


def max_popcount(t: int) -> int:
    """Most set bits of any ``s`` in ``1..t``: ``floor(log2(t + 1))``, reached at ``2^k - 1 <= t``."""
    return (int(t) + 1).bit_length() - 1


def saturating_total(nodes: list[NDArray[np.int64]], n_groups: int) -> NDArray[np.int64]:
    """The elementwise sum of int64 node releases, saturating at the int64 bounds as each node's noise does.

    A node drawn at a huge scale may itself sit at a bound; numpy would wrap two of them around to a
    wrong sign. Columns where a partial sum could leave int64 are added exactly on Python ints.
    """
    total = np.zeros(n_groups, dtype=np.int64)
    if not nodes:
        return total
    stacked = np.stack(nodes)
    safe = _INT64.max // len(nodes)
    risky = ((stacked > safe) | (stacked < -safe)).any(axis=0)
    total[~risky] = stacked[:, ~risky].sum(axis=0)
    for column in np.flatnonzero(risky).tolist():
        exact = sum(int(v) for v in stacked[:, column].tolist())
        total[column] = min(max(exact, _INT64.min), _INT64.max)
    return total


def positive_int(name: str, value: object, hint: str) -> int:
    """``value`` as an int ``>= 1``, or an error that ends with ``hint`` on how to fix it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}; {hint}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}; {hint}")
    return int(value)


def _frozen(array: NDArray[Any]) -> NDArray[Any]:
    """A read-only array no one else can write to (copied unless it already is one)."""
    if array.flags.writeable or not array.flags.owndata:
        array = array.copy()
        array.setflags(write=False)
    return array


def _column_name(component: str, kind: str, level: int) -> str:
    return f"{component}_{kind}_{level}"


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"the stored state's {name} must be a non-negative int, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True, eq=False)
class TreeState:
    """The p-sums after window ``t`` of a period (``t = 0``: nothing released yet).

    Each mapping goes from level ``j`` (every set bit of ``t``) to a read-only
    vector of ``n_groups`` entries: ``int64`` for counts, ``float64`` for sums.
    A component the plan does not release is ``None``.
    """

    t: int
    n_groups: int
    count_true: Levels | None = None
    count_noisy: Levels | None = None
    sum_true: Levels | None = None
    sum_noisy: Levels | None = None

    def __post_init__(self) -> None:
        t = _non_negative_int("t", self.t)
        n_groups = _non_negative_int("n_groups", self.n_groups)
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "n_groups", n_groups)
        levels = set(set_bits(t))
        for component in COMPONENTS:
            present = [getattr(self, f"{component}_{kind}") is not None for kind in _KINDS]
            if any(present) and not all(present):
                raise ValueError(f"a tree state holds both the true and the noisy {component} p-sums, or neither")
            if t == 0 and any(present):
                raise ValueError("the state before the first window (t=0) holds no p-sums")
            for kind in _KINDS if all(present) else ():
                name = f"{component}_{kind}"
                stored: Levels = getattr(self, name)
                if set(stored) != levels:
                    raise ValueError(
                        f"{name} holds levels {sorted(stored)} but after window {t} the tree holds levels "
                        f"{sorted(levels)} (the set bits of t)"
                    )
                checked = {}
                for level in sorted(stored):
                    array = np.asarray(stored[level])
                    if array.dtype != _DTYPES[component] or array.shape != (n_groups,):
                        raise ValueError(
                            f"{name} level {level} must be a {_DTYPES[component]} vector of {n_groups} groups, "
                            f"got {array.dtype} of shape {array.shape}"
                        )
                    checked[level] = _frozen(array)
                object.__setattr__(self, name, MappingProxyType(checked))

    def __eq__(self, other: object) -> bool:
        """Equal ``t``, groups and p-sums, bit for bit."""
        if not isinstance(other, TreeState):
            return NotImplemented
        (ints, arrays), (other_ints, other_arrays) = self.to_columns(), other.to_columns()
        return ints == other_ints and arrays.keys() == other_arrays.keys() and all(
            arrays[name].dtype == other_arrays[name].dtype and arrays[name].tobytes() == other_arrays[name].tobytes()
            for name in arrays
        )

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def initial(cls) -> TreeState:
        """The state before the first window of a period."""
        return cls(0, 0)

    def components(self) -> frozenset[str]:
        """The components (``count``, ``sum``) whose p-sums the state holds."""
        return frozenset(c for c in COMPONENTS if getattr(self, f"{c}_true") is not None)

    def check_components(self, count: bool, sum_: bool) -> None:
        """Refuse a state made by a plan that releases other components."""
        wanted = frozenset(c for c, on in (("count", count), ("sum", sum_)) if on)
        if self.t > 0 and self.components() != wanted:
            raise ValueError(
                f"the state holds p-sums of {sorted(self.components())} but this plan releases {sorted(wanted)}; "
                "resume a period only with the plan that started it (same aggregations)"
            )

    @staticmethod
    def with_level(stored: Levels | None, level: int, node: NDArray[Any]) -> dict[int, NDArray[Any]]:
        """The levels after a window of ``level`` trailing zeros: the lower p-sums are dropped, ``node`` added."""
        kept = {j: values for j, values in (stored or {}).items() if j > level}
        kept[level] = node
        return kept

    def to_columns(self) -> tuple[dict[str, int], dict[str, NDArray[Any]]]:
        """``({"t", "n_groups"}, {"<component>_<true|noisy>_<level>": vector})``, for a ledger.

        :meth:`from_columns` rebuilds an equal state with bit-identical vectors.
        """
        arrays: dict[str, NDArray[Any]] = {}
        for component in sorted(self.components()):
            for kind in _KINDS:
                for level, values in getattr(self, f"{component}_{kind}").items():
                    arrays[_column_name(component, kind, level)] = values
        return {"t": self.t, "n_groups": self.n_groups}, arrays

    @classmethod
    def from_columns(cls, ints: Mapping[str, Any], arrays: Mapping[str, Any]) -> TreeState:
        """The state stored by :meth:`to_columns` (vectors are copied; counts must be integers, sums float64)."""
        if not isinstance(ints, Mapping) or set(ints) != {"t", "n_groups"}:
            keys = sorted(ints) if isinstance(ints, Mapping) else ints
            raise ValueError(f"the stored state's ints must be exactly {{'t', 'n_groups'}}, got {keys!r}")
        t = _non_negative_int("t", ints["t"])
        n_groups = _non_negative_int("n_groups", ints["n_groups"])
        if not isinstance(arrays, Mapping):
            raise TypeError(
                f"the stored state's arrays must be a mapping of names to vectors, got {type(arrays).__name__}"
            )
        present = sorted({c for c in COMPONENTS for name in arrays if str(name).startswith(f"{c}_")})
        expected = {_column_name(c, k, j) for c in present for k in _KINDS for j in set_bits(t)}
        unknown, missing = sorted(set(map(str, arrays)) - expected), sorted(expected - set(map(str, arrays)))
        if unknown or missing:
            raise ValueError(
                f"the stored state after window {t} must have the vectors {sorted(expected)}; unexpected {unknown}, "
                f"missing {missing}. Store and restore exactly what TreeState.to_columns() returns"
            )
        fields: dict[str, dict[int, NDArray[Any]]] = {}
        for component in present:
            for kind in _KINDS:
                fields[f"{component}_{kind}"] = {
                    j: _restored(component, np.asarray(arrays[_column_name(component, kind, j)])) for j in set_bits(t)
                }
        return cls(t, n_groups, **fields)


def _restored(component: str, array: NDArray[Any]) -> NDArray[Any]:
    if component == "count":
        if array.dtype.kind not in "iu":
            raise ValueError(f"stored count p-sums must be integers, got dtype {array.dtype}; store them as int64")
        if array.size and (int(array.max()) > _INT64.max or int(array.min()) < _INT64.min):
            raise ValueError("stored count p-sums exceed the int64 range; the state is corrupt")
        return array.astype(np.int64)
    if array.dtype != np.float64:
        raise ValueError(
            f"stored sum p-sums must be float64, got dtype {array.dtype}; store them as float64 so the resumed "
            "releases are bit-identical"
        )
    return array.copy()
