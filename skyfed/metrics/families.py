"""One scrape's metric families, built from the catalog so every name and help line agrees."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from skyfed.metrics.catalog import COUNTER, GAUGE, of_role
from skyfed.metrics.catalog import Metric as Spec


class Families:
    """Every family of ``role``, empty until samples are added; all are served, so a
    dashboard's query finds its metric even before the first round."""

    def __init__(self, role: str) -> None:
        self._families: dict[str, Metric] = {m.name: _family(m) for m in of_role(role)}

    def add(self, name: str, value: float, *labels: str) -> None:
        family = self._families[name]
        assert isinstance(family, CounterMetricFamily | GaugeMetricFamily), name
        family.add_metric(list(labels), value)

    def histogram(
        self, name: str, buckets: Sequence[tuple[str, float]], sum_s: float, *labels: str
    ) -> None:
        """Cumulative ``(upper bound, count)`` pairs ending with ``("+Inf", total)``."""
        family = self._families[name]
        assert isinstance(family, HistogramMetricFamily), name
        family.add_metric(list(labels), list(buckets), sum_s)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def _family(spec: Spec) -> Metric:
    labels = list(spec.labels)
    if spec.kind == COUNTER:
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=labels)
    if spec.kind == GAUGE:
        return GaugeMetricFamily(spec.name, spec.help, labels=labels)
    return HistogramMetricFamily(spec.name, spec.help, labels=labels)


class Monotone:
    """Counters that survive their source restarting from zero (a reconnect's new session):
    a drop in a raw value adds what was counted before to a base."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], float] = {}
        self._base: dict[tuple[str, ...], float] = {}

    def __call__(self, key: tuple[str, ...], raw: float) -> float:
        last = self._last.get(key, 0.0)
        if raw < last:
            self._base[key] = self._base.get(key, 0.0) + last
        self._last[key] = raw
        return self._base.get(key, 0.0) + raw
