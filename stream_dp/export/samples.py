"""Release records (docs/reference/output-records.md) as Prometheus samples. Pure logic, no I/O.

Every number a record carries about its group becomes one sample labelled by ``query`` and ``group`` (the
group's values joined by ``,``; a hierarchy's coarser levels hold fewer values): the noisy count, sum and mean
and their 95% half-widths (running totals for a continual query), quantiles and their intervals, mean vectors,
covariance matrices, a sample-and-aggregate statistic, a local-DP query's number of reports; a ``top_k``
record gives each ranked group its rank. Released values are DP outputs: showing them costs no privacy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Every metric family an exporter serves: name -> (help, label names besides ``query``).
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "stream_dp_release_value": ("Noisy count, sum or mean (statistic) of a group in its query's latest window",
                                ("group", "statistic")),
    "stream_dp_release_value_ci95": ("Half-width of the 95% confidence interval of stream_dp_release_value",
                                     ("group", "statistic")),
    "stream_dp_release_running_total": ("Continual query: noisy running count, sum or mean of a group from the "
                                        "start of the period through its latest window", ("group", "statistic")),
    "stream_dp_release_running_total_ci95": ("Half-width of the 95% confidence interval of "
                                             "stream_dp_release_running_total", ("group", "statistic")),
    "stream_dp_release_top_k_rank": ("Rank (1 = first) of a group in its query's latest top-k list", ("group",)),
    "stream_dp_release_quantile": ("Quantile q of a group's values in its query's latest window", ("group", "q")),
    "stream_dp_release_quantile_lower": ("Lower end of the 95% interval of the true quantile, in the field's "
                                         "units (value_interval: true)", ("group", "q")),
    "stream_dp_release_quantile_upper": ("Upper end of the 95% interval of the true quantile, in the field's "
                                         "units (value_interval: true)", ("group", "q")),
    "stream_dp_release_vector_mean": ("Mean of one field of a mean-vector or covariance query", ("group", "field")),
    "stream_dp_release_vector_mean_ci95": ("Half-width of the 95% interval of a mean-vector query's mean",
                                           ("group", "field")),
    "stream_dp_release_covariance": ("Entry (field, other) of a covariance query's matrix", ("group", "field", "other")),
    "stream_dp_release_sample_aggregate": ("A sample-and-aggregate query's noisy statistic", ("group",)),
    "stream_dp_release_sample_aggregate_ci95": ("Half-width of the 95% interval of a sample-and-aggregate mean",
                                                ("group",)),
    "stream_dp_release_local_dp_reports": ("Local-DP query: reports in its latest window", ("group",)),
    "stream_dp_release_window_end_seconds": ("End of the latest window of the query the exporter read", ()),
    "stream_dp_release_epsilon": ("Epsilon the query's latest window spent per unit (privacy.epsilon; a top_k "
                                  "record's privacy.window_epsilon)", ()),
    "stream_dp_release_as_if_empty": ("1 when the query's latest window was released as if empty (noise only)", ()),
    "stream_dp_release_groups": ("Groups of the query's latest window the exporter shows", ()),
}

STATISTICS = ("count", "sum", "mean")


@dataclass(frozen=True)
class Sample:
    metric: str
    labels: tuple[tuple[str, str], ...]  # besides query
    value: float


def group_label(group: Mapping[str, Any]) -> str:
    return ",".join(str(value) for value in group.values())


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _q_label(q: str) -> str:
    return repr(float(q))  # "0.5", whatever the record's text ("0.50")


def group_samples(record: Mapping[str, Any]) -> Iterator[Sample]:
    """Samples of one group record (not ``top_k``)."""
    group = group_label(record["group"])
    continual = "continual" in record
    value_metric = "stream_dp_release_running_total" if continual else "stream_dp_release_value"
    ci95 = record.get("ci95") or {}
    for statistic in STATISTICS:
        value = _number(record.get(statistic))
        if value is None:
            continue
        labels = (("group", group), ("statistic", statistic))
        yield Sample(value_metric, labels, value)
        half_width = _number(ci95.get(statistic))
        if half_width is not None:
            yield Sample(f"{value_metric}_ci95", labels, half_width)
    for q, answer in (record.get("quantiles") or {}).items():
        labels = (("group", group), ("q", _q_label(q)))
        yield Sample("stream_dp_release_quantile", labels, float(answer["value"]))
        interval = answer.get("value_ci95")
        if interval is not None:
            yield Sample("stream_dp_release_quantile_lower", labels, float(interval[0]))
            yield Sample("stream_dp_release_quantile_upper", labels, float(interval[1]))
    yield from _vector_samples(record, group)
    aggregate = record.get("sample_aggregate")
    if aggregate is not None:
        yield Sample("stream_dp_release_sample_aggregate", (("group", group),), float(aggregate["value"]))
        if _number(aggregate.get("ci95")) is not None:
            yield Sample("stream_dp_release_sample_aggregate_ci95", (("group", group),), float(aggregate["ci95"]))
    local = record.get("local_dp")
    if local is not None:
        yield Sample("stream_dp_release_local_dp_reports", (("group", group),), float(local["reports"]))


def _vector_samples(record: Mapping[str, Any], group: str) -> Iterator[Sample]:
    vector = record.get("mean_vector")
    if vector is not None and vector.get("mean") is not None:
        for name, mean, half_width in zip(vector["fields"], vector["mean"], vector["mean_ci95"] or (), strict=False):
            labels = (("group", group), ("field", name))
            yield Sample("stream_dp_release_vector_mean", labels, float(mean))
            yield Sample("stream_dp_release_vector_mean_ci95", labels, float(half_width))
    covariance = record.get("covariance")
    if covariance is not None and covariance.get("covariance") is not None:
        fields = covariance["fields"]
        for name, mean in zip(fields, covariance.get("mean") or (), strict=False):
            yield Sample("stream_dp_release_vector_mean", (("group", group), ("field", name)), float(mean))
        for name, row in zip(fields, covariance["covariance"], strict=True):
            for other, entry in zip(fields, row, strict=True):
                yield Sample("stream_dp_release_covariance", (("group", group), ("field", name), ("other", other)),
                             float(entry))


def top_k_samples(record: Mapping[str, Any]) -> Iterator[Sample]:
    for entry in record["top"]:
        yield Sample("stream_dp_release_top_k_rank", (("group", group_label(entry["group"])),), float(entry["rank"]))
