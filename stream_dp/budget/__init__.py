"""Per-unit privacy budgets over rolling event-time horizons.

Semantics
=========

**Namespaces.** A namespace is a kind of privacy unit -- ``users`` keyed by
the ``user_id`` field, say. Its policy is a list of rolling horizons with
limits, e.g. *epsilon <= 1.0 per 1 h* **and** *epsilon <= 4.0 per 24 h* (a
short horizon plus a long backstop). A namespace is accounted either in
epsilon (pure DP; losses add up by basic composition) or in rho (zCDP; rho
adds up, Bun & Steinke 2016); the caller converts each query's loss into the
namespace's unit. Rho spend is reported as (epsilon, delta) with
epsilon = rho + 2 sqrt(rho ln(1/delta)) (Bun & Steinke 2016, Prop. 1.3).

**One budget per unit.** Every query that reads a namespace draws on the same
per-unit budget: under adaptive querying a per-query budget is unsound, since
the unit, not the query, is what is protected.

**Charging.** When a window of a query is released, every unit with events in
it is charged the window's loss at the window's event time (its end).
Before the release, a unit whose charge would break any horizon's limit is
*excluded* from the window: all of its events are dropped, never some. This is
a privacy filter with individual accounting (Feldman & Zrnic 2021; Cookie
Monster, Tholoniat et al., SOSP 2024): the decision to exclude a unit depends
only on that unit's own past charges.

*Continual queries* release running totals over a period (the binary tree
mechanism, calibrated for a unit in at most W windows of a period): a unit is
charged the whole period's loss once, at the end of the first window of the
period it contributes to, and its contributions to windows after its W-th
are left out (:mod:`stream_dp.worker.ingest.period_charge`).

**The admission rule.** Charges arrive out of event-time order (several
queries, late windows, replays), so checking only the horizon that ends at
the charge time would be unsound: a later charge at an earlier time could
overfill an interval checked before. Instead, each horizon ``H`` with limit
``L`` is cut into buckets of width ``w = H / B`` (``B`` = ``buckets``), bucket
``j`` covering event times ``[j w, (j+1) w)``. Let ``c_j`` be the total
admitted charge of a unit in bucket ``j``. A charge ``x`` at time ``t``, in
bucket ``b = floor(t / w)``, is admitted only if for every run of ``B + 1``
consecutive buckets containing ``b``::

    max over s in [b - B, b] of  (c_s + ... + c_{s+B})  +  x  <=  L

and then ``c_b += x``; a unit must pass this on every horizon of its namespace.

*Invariant.* Every run of ``B + 1`` consecutive buckets holds at most ``L``.
It holds initially (all zero); an admission changes only ``c_b``, so only the
runs containing ``b`` change, and each of those was checked to stay within
``L``. Forgetting old buckets (below) only removes counters no admissible
charge can read.

*Guarantee.* Any interval of event time of length ``H`` -- closed or open,
``[a, a + H]`` with integer milliseconds -- meets at most ``B + 1``
consecutive buckets, because ``floor((a + H) / w) = floor(a / w) + B``. Hence:

    For every unit, every horizon (H, L) of its namespace and every interval
    I of event time of length H, the sum of the losses of the releases
    charged to the unit at times in I is at most L.

By composition with individual filtering (Feldman & Zrnic 2021, individual
privacy filters for adaptively chosen, individually accounted losses; basic
composition for epsilon, additivity of zCDP for rho), the releases whose
charge times lie in any such interval are L-DP (or L-zCDP) with respect to
that unit. The price of out-of-order soundness is at most one bucket: a run
spans up to ``H + w`` of time, so a unit that spreads its spending evenly can
be held to ``L`` over ``H + w``; more buckets make this slack smaller.

**Forgetting.** Bucket ``j`` of horizon ``H`` is kept until
``(j + 1) w + H + max_delay_ms`` on the store clock (Redis ``TIME``), then
pruned; a unit with nothing left is forgotten (in Redis, states live in
generation hashes that expire as a whole once nothing in them can be read).
Charges whose event time is more than ``max_delay_ms`` behind the store
clock (or ``max_lead_ms`` ahead) are refused as a whole
(``ChargeOutOfRange``). This loses nothing the rule needs: a charge at time
``t >= now - max_delay_ms`` reads buckets down to ``floor(t / w) - B``, whose
end ``> t - H`` keeps them stored until after ``now``. The worker accepts
delays up to the input topics' retention plus an hour
(``StoreOptions.for_input_retention``), so a backlog replayed after an
outage is charged like any late window; the price is that a unit's buckets
are kept that much longer.

**Idempotency.** A charge carries an id (``query/window_start/partition``).
Its outcome is recorded atomically with the charge itself; a retry with the
same id charges nobody and returns the same exclusion decision. The record
lives ``max_delay_ms + max_lead_ms`` (+1 s); a retry after that is refused as
out of range, so no charge is ever applied twice.

**Fixed point.** Amounts are integers of 10^-6 epsilon (or rho); limits are
rounded down and charges up (from the float's shortest decimal form).

**Fail closed.** If the budget cannot be charged -- store unreachable, script
error, out-of-range time, conflicting retry -- ``charge`` raises a
``BudgetError`` and the caller releases nothing.

**Alerts.** Each namespace has alert thresholds (fractions of each limit,
e.g. 0.8 and 1.0). When a unit's spend on a horizon reaches a threshold -- or
a charge is refused on it, which counts as reaching every threshold -- the
charge returns an ``AlertRecord``; a unit alerts at most once per threshold
per horizon length.

**What the guarantee does not cover.** A unit is an id: one person with two
ids has two budgets. ``reset`` forgets a unit's spending, voiding the bound
for intervals that span the reset. The bound holds only as long as the store
keeps what it acknowledged: Redis with ``appendfsync always`` and
``maxmemory-policy noeviction`` (see :mod:`stream_dp.budget.redis_store`); the
in-memory store forgets everything when its process ends.
"""

from stream_dp.budget.memory import MemoryBudgetStore
from stream_dp.budget.policy import BudgetPolicy, HorizonLimit, NamespacePolicy, policy_from_config
from stream_dp.budget.redis_store import RedisBudgetStore
from stream_dp.budget.store import (
    AlertRecord,
    BudgetError,
    BudgetStore,
    BudgetUnavailable,
    ChargeConflict,
    ChargeOutcome,
    ChargeOutOfRange,
    ChargeRejected,
    HorizonSpend,
    StoreLayoutMismatch,
    StoreOptions,
)

__all__ = [
    "AlertRecord",
    "BudgetError",
    "BudgetPolicy",
    "BudgetStore",
    "BudgetUnavailable",
    "ChargeConflict",
    "ChargeOutOfRange",
    "ChargeOutcome",
    "ChargeRejected",
    "HorizonLimit",
    "HorizonSpend",
    "MemoryBudgetStore",
    "NamespacePolicy",
    "RedisBudgetStore",
    "StoreLayoutMismatch",
    "StoreOptions",
    "policy_from_config",
]
