"""The query configuration file: namespaces (budget policies) and queries.

Validated with pydantic when loaded; ``load_config`` turns every validation
problem into one ``ConfigError`` line naming the file, the query, the field,
what is wrong and how to fix it.
"""

from __future__ import annotations

import collections
import re
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    field_validator,
    model_validator,
)

from stream_dp.config.release_time import check_release_time_together
from stream_dp.config.aggregations import Aggregations
from stream_dp.config.durations import DurationMs, InstantMs
from stream_dp.config.examples import refuse_empty_options
from stream_dp.config.implied import implied_settings
from stream_dp.config.namespaces import NamespaceConfig, StrictModel as _Strict
from stream_dp.config.query_checks import check_query_options
from stream_dp.config.query_options import (
    BoundsConfig,
    ContinualConfig,
    ExpectedConfig,
    Groups,
    HierarchyConfig,
    check_groups_form,
    LocalDPConfig,
    PublicGroups,
)
from stream_dp.config.shared_topics import check_shared_topics
from stream_dp.config.topic_roles import chain_problems

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _check_name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{kind} {value!r} is not allowed; use letters, digits, '_', '.' or '-' (at most 128, not starting with a symbol)"
        )
    return value


class PrivacyUnit(_Strict):
    """Whom the guarantee protects: the event field holding the unit's id, and the budget it draws on."""

    namespace: str = Field(description="The namespace (a key of namespaces) whose per-unit budget the query's "
                                       "windows are charged to.")
    field: str = Field(min_length=1, examples=["user_id"],
                       description="The event field holding the privacy unit's id, a string or an integer; events "
                                   "are keyed by it on the input topic.")


class WindowConfig(_Strict):
    """Tumbling event-time windows: an event's own time decides its window, Kafka record timestamps when it closes."""

    size_ms: DurationMs = Field(alias="size", examples=["1m"],
                                description="The windows' length (at least 1s).")
    allowed_lateness_ms: DurationMs = Field(
        0, alias="allowed_lateness",
        description="How far a partition's watermark trails its newest record timestamp: a window closes once the "
                    "watermark passes its end, and its events arriving later are dead-lettered as late.")
    offset_ms: DurationMs = Field(
        0, alias="offset",
        description="Where windows start, after the epoch's multiples of size (smaller than size): 1h windows with "
                    "offset 30m run from :30 to :30.")
    idle_timeout_ms: DurationMs = Field(
        30_000, alias="idle_timeout",
        description="A partition read to its end and silent this long (wall clock) stops holding windows open; keep "
                    "it above the producers' reconnect backoff.")
    publish_from_ms: InstantMs | None = Field(
        None, alias="publish_from", examples=["2026-01-01T00:00:00Z"],
        description="Public groups only: the instant publication starts at (an ISO-8601 time with its zone). The "
                    "first window published is the one holding it, and every window from there on is, data or not. "
                    "Without it, the start is Redis's clock when a worker first ran the query, less allowed_lateness; "
                    "set it to publish a backlog older than that (a backfill).")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> WindowConfig:
        if self.size_ms < 1000:
            raise ValueError(f"window size {self.size_ms} ms is below 1s; use e.g. 1m")
        if self.offset_ms >= self.size_ms:
            raise ValueError(f"window offset {self.offset_ms} ms is not smaller than the size {self.size_ms} ms")
        return self


class QueryConfig(_Strict):
    """One release: what it reads, whom it protects, how it windows, groups, bounds and aggregates, and what a
    window costs a unit."""

    name: str = Field(description="The query's name, unique in the file (letters, digits, '_', '.' or '-'); "
                                  "records and release ids carry it.")
    input_topic: str = Field(description="The Kafka topic of JSON events the query reads, keyed by the privacy "
                                         "unit's id and placed by the producers' partitioner.")
    output_topic: str = Field(description="The Kafka topic the query's release records go to: its own, never an "
                                          "input topic. The only topic safe to share.")
    privacy_unit: PrivacyUnit = Field(description="Whose contributions are bounded and protected.")
    timestamp_field: str = Field(min_length=1, examples=["ts"], description="The event field holding the event "
                                                                            "time.")
    timestamp_format: Literal["auto", "epoch_s", "epoch_ms", "iso8601"] = Field(
        "auto",
        description="How the event time is written: epoch seconds, epoch milliseconds, an ISO-8601 string with a "
                    "zone, or auto (an ISO-8601 string, or a number: epoch seconds below 1e11, else milliseconds).")
    window: WindowConfig = Field(description="The tumbling event-time windows the query releases.")
    group_by: list[str] = Field(min_length=1, examples=[["page"]],
                                description="The event fields whose values make up a group's key, coarsest first "
                                            "(one record per group and window).")
    groups: Groups = Field(description="Which groups a window releases: a public list, released every window "
                                       "even when empty, or the groups that pass noisy partition selection.")
    bounds: BoundsConfig = Field(description="How much one unit may contribute to a window.")
    aggregations: Aggregations = Field(description="What each group's record releases.")
    # geometric names the discrete Laplace that laplace uses for counts; it is read as laplace.
    mechanism: Literal["laplace", "gaussian", "staircase", "geometric"] = Field(
        "laplace",
        description="The noise of counts and sums: laplace (discrete Laplace, epsilon-DP; geometric is the same), "
                    "gaussian (discrete Gaussian, zCDP, needs delta), or staircase (epsilon-DP).")
    epsilon: float = Field(
        gt=0, le=10, allow_inf_nan=False, examples=[0.5],
        description="What one window costs a unit, all components together (each takes an equal share); for a "
                    "continual query, what one period costs. Taken from local_dp.epsilon when left out.")
    delta: float = Field(
        0.0, ge=0, lt=1e-3, allow_inf_nan=False, examples=[1e-7],
        description="The delta of a Gaussian query's window (above 0 with gaussian, 0 otherwise); selected groups "
                    "spend theirs from groups.select.delta.")
    max_future_skew_ms: DurationMs = Field(
        300_000, alias="max_future_skew",
        description="Events dated further than this ahead of their record timestamp or of the wall clock are "
                    "dead-lettered.")
    # How producers choose the partition of a key: Kafka's Java client, kafka-python and librdkafka's
    # murmur2_random use murmur2; librdkafka's default (consistent_random) uses CRC32.
    partitioner: Literal["murmur2", "crc32"] = Field(
        "murmur2",
        description="How the producers place a key: murmur2 (Kafka's Java client, kafka-python, librdkafka's "
                    "murmur2_random) or crc32 (librdkafka's default, consistent_random). Events in another "
                    "partition are dead-lettered.")
    max_message_bytes: int = Field(
        65_536, ge=64, le=10_485_760,
        description="The largest input event, in bytes; larger ones are dead-lettered. It also bounds a release "
                    "record's size (a top_k record lists k groups).")
    release_timeout_ms: DurationMs = Field(
        60_000, alias="release_timeout",
        description="How long a window waits for every input partition's partial or progress (wall clock, from "
                    "its first partial) before the release stage asks the broker about the missing ones: a partition "
                    "whose records show nothing more for the window is left out, one that may still hold its events "
                    "is waited for and alerted on (docs/privacy/partitions.md); also how long the rest of a partial "
                    "cut off mid-way is waited for.")
    trust_producer_timestamps: bool = Field(
        False,
        description="Whether the input topic's CreateTime record timestamps, set by its producers, may close "
                    "windows: true only for a backfill whose producers stamp each record with its event's time. "
                    "Even then a time counts once records of 16 distinct keys (units) are stamped at it or later. "
                    "By default only the "
                    "broker's LogAppendTime stamps do, and the worker refuses a CreateTime input topic "
                    "(docs/privacy/clock.md).")
    continual: ContinualConfig | None = Field(
        None, description="Running totals since the start of each period, released after every window.")
    hierarchy: bool | HierarchyConfig = Field(
        False, description="true, or {split: [...]}: release every prefix level of group_by, made consistent "
                           "(children add up to their parent).")
    local_dp: LocalDPConfig | None = Field(
        None, description="Count reports randomized by their producers (local differential privacy) instead of "
                          "true values.")
    expected: ExpectedConfig | None = Field(
        None, description="What a typical group holds per window, so that plan and check-config set each 95% error "
                          "beside the value it qualifies and warn when the error exceeds it (a planning hint: "
                          "nothing released depends on it).")
    # the word the file wrote for mechanism when it differs from the one it is read as (geometric)
    _mechanism_written: str | None = PrivateAttr(None)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="wrap")
    @classmethod
    def _implied(cls, data: Any, handler: ModelWrapValidatorHandler[QueryConfig]) -> QueryConfig:
        # a setting the query implies is filled in as if written (stream_dp.config.implied)
        query = handler(implied_settings(data)[0])
        if isinstance(data, dict) and data.get("mechanism") == "geometric":
            query._mechanism_written = "geometric"
        return query

    @field_validator("name", "input_topic", "output_topic")
    @classmethod
    def _names(cls, value: str, info: Any) -> str:
        return _check_name(info.field_name.replace("_", " "), value)

    @field_validator("mechanism")
    @classmethod
    def _alias(cls, value: str) -> str:
        return "laplace" if value == "geometric" else value

    @field_validator("groups", mode="before")
    @classmethod
    def _groups_form(cls, value: Any) -> Any:
        return check_groups_form(value)

    @field_validator("continual", "local_dp", "expected", mode="before")
    @classmethod
    def _no_empty_option(cls, value: Any, info: Any) -> Any:
        return refuse_empty_options(cls, value, info.field_name)

    @field_validator("hierarchy", mode="before")
    @classmethod
    def _hierarchy_form(cls, value: Any) -> Any:
        # pydantic would read "yes" or 1 as true; a typo must not turn on a release of every level
        if not isinstance(value, (bool, dict, HierarchyConfig)):
            raise ValueError(f"hierarchy must be true, false or {{split: [w, ...]}} (one weight per group_by "
                             f"level, coarsest first), got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> QueryConfig:
        vector = self.aggregations.vector_kind
        # A vector's noise is Gaussian only (stream_dp.dp.vectors): pointing such a query at laplace, or at
        # delta 0, leads to the next refusal; its one fix is gaussian with a delta.
        if vector is not None and self.mechanism == "gaussian" and self.delta <= 0:
            raise ValueError(f"mechanism gaussian needs delta > 0; {vector} has no pure-DP form: keep mechanism: "
                             "gaussian and set delta > 0 (e.g. delta: 1.0e-7)")
        if vector is not None and self.mechanism != "gaussian" and self.delta > 0:
            raise ValueError(f"{vector} needs mechanism: gaussian (its noise is scaled to the l2 norm of the clipped "
                             f"vectors), not {self.mechanism}: write mechanism: gaussian and keep delta: {self.delta:g}")
        if self.mechanism == "gaussian" and self.delta <= 0:
            raise ValueError("mechanism gaussian needs delta > 0 (e.g. delta: 1.0e-7); or use mechanism: laplace")
        if self.mechanism != "gaussian" and self.delta > 0:
            raise ValueError(
                f"mechanism {self.mechanism} is pure DP and spends no delta, got delta {self.delta:g}; set delta: 0 "
                "(selected groups take theirs from groups.select.delta) or use mechanism: gaussian"
            )
        roles = [self.privacy_unit.field, self.timestamp_field, *self.group_by]
        if self.aggregations.value_field is not None:
            roles.append(self.aggregations.value_field)
        if self.aggregations.vector is not None:
            roles.extend(self.aggregations.vector.fields)
        repeated = sorted({name for name in roles if roles.count(name) > 1})
        if repeated:
            raise ValueError(
                f"event field(s) {repeated} serve more than one role (privacy_unit.field, timestamp_field, group_by, "
                "aggregations.sum.field, quantiles.field, sample_aggregate.field or a vector's fields) or appear twice "
                "in group_by; give each "
                "role its own field"
            )
        check_query_options(self)
        if self.input_topic == self.output_topic:
            raise ValueError("output_topic equals input_topic; releases must go to their own topic")
        if isinstance(self.groups, PublicGroups):
            width = len(self.group_by)
            for key in self.groups.public:
                parts = key if isinstance(key, list) else [key]
                if len(parts) != width or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in parts):
                    raise ValueError(
                        f"public group {key!r} does not match group_by {self.group_by}: give "
                        + ("one string or integer per group" if width == 1 else f"a list of {width} strings or integers per group")
                    )
            # A group listed twice would be released twice (twice the noise-only row, twice in a top_k) and, as
            # a k-RR domain, split its reports' estimate between the twins. "1" and 1 stay two groups, as in events.
            keys = self.public_group_keys() or []
            times = collections.Counter(keys)
            repeated = next((k for k in keys if times[k] > 1), None)
            if repeated is not None:
                n = times[repeated]
                raise ValueError(f"public group {list(repeated)!r} is listed "
                                 f"{'twice' if n == 2 else f'{n} times'} in groups.public; list each group once")
        return self

    @property
    def mechanism_written(self) -> str:
        """``mechanism`` as the file wrote it: ``geometric`` stays geometric here, though read as laplace."""
        return self._mechanism_written or self.mechanism

    @property
    def hierarchy_split(self) -> list[float] | None:
        """Per level (coarsest first) share of the count and sum budgets; None without hierarchy."""
        if not self.hierarchy:
            return None
        split = self.hierarchy.split if isinstance(self.hierarchy, HierarchyConfig) else None
        weights = split or [1.0] * len(self.group_by)
        total = sum(weights)
        return [w / total for w in weights]

    def public_group_keys(self) -> list[tuple[str | int, ...]] | None:
        """Public group keys as tuples, or None when groups are selected privately."""
        if not isinstance(self.groups, PublicGroups):
            return None
        return [tuple(k) if isinstance(k, list) else (k,) for k in self.groups.public]


class PipelineConfig(_Strict):
    """A query file: the namespaces (kinds of privacy unit and their budgets) and the queries."""

    namespaces: dict[str, NamespaceConfig] = Field(
        min_length=1, description="Kinds of privacy unit by name (letters, digits, '_', '.' or '-'), each with its "
                                  "per-unit budget.")
    queries: list[QueryConfig] = Field(min_length=1, description="The queries the workers run.")
    # per query name: the settings the query left out and was given (stream_dp.config.implied)
    _implied: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _note_implied(cls, data: Any, handler: ModelWrapValidatorHandler[PipelineConfig]) -> PipelineConfig:
        config = handler(data)
        queries = data.get("queries") if isinstance(data, dict) else None
        if isinstance(queries, list):
            # names are unique and valid once the file is (else validation has already raised)
            config._implied = {query["name"]: lines for query in queries if (lines := implied_settings(query)[1])}
        return config

    @field_validator("namespaces")
    @classmethod
    def _namespace_names(cls, value: dict[str, NamespaceConfig]) -> dict[str, NamespaceConfig]:
        for name in value:
            _check_name("namespace", name)
        return value

    @field_validator("queries")
    @classmethod
    def _release_time(cls, value: list[QueryConfig]) -> list[QueryConfig]:
        check_release_time_together(value)
        check_shared_topics(value)
        return value

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        names = [q.name for q in self.queries]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"query names {duplicates} are used more than once; give each query its own name")
        outputs = [q.output_topic for q in self.queries]
        if len(set(outputs)) != len(outputs):
            raise ValueError("two queries write the same output_topic; give each query its own output topic")
        chains = chain_problems(self.queries)
        if chains:
            raise ValueError("; and ".join(chains))
        for query in self.queries:
            if query.privacy_unit.namespace not in self.namespaces:
                raise ValueError(
                    f"query {query.name!r} uses namespace {query.privacy_unit.namespace!r}, which is not defined; "
                    f"define it under namespaces (defined: {sorted(self.namespaces)})"
                )
        return self

    def implied(self, name: str) -> list[str]:
        """One line per setting query ``name`` left out and was given as if written."""
        return self._implied.get(name, [])

    def query(self, name: str) -> QueryConfig:
        for query in self.queries:
            if query.name == name:
                return query
        raise KeyError(f"no query named {name!r}; queries: {', '.join(q.name for q in self.queries)}")
