"""Several processes' Prometheus pages made into one: parse, label by origin, merge, render.

The router and the gateway build the stack's page from the texts the other services return
(`turnout.v1.Metrics/Scrape`). Every sample of a service gets labels saying where it came from
(`engine="10.0.0.7:50051"`); families of the same name from several services become one family
(the text format allows each name once, with one TYPE line). A label the service already set
under the same name is kept as `exported_<name>`, as Prometheus does for a target's labels.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

SCRAPE_UP = "turnout_scrape_up"


def parse(text: str, labels: Mapping[str, str] | None = None) -> list[Metric]:
    """The families of a text page, every sample with `labels` added. A malformed page raises ValueError."""
    families = list(text_string_to_metric_families(text))
    if labels:
        for family in families:
            family.samples = [_with_labels(sample, labels) for sample in family.samples]
    return families


def _with_labels(sample: Sample, labels: Mapping[str, str]) -> Sample:
    own = dict(sample.labels)
    for name in labels.keys() & own.keys():
        own[f"exported_{name}"] = own.pop(name)
    return sample._replace(labels={**own, **labels})


def merge(parts: Iterable[Iterable[Metric]]) -> list[Metric]:
    """One family per name, with the samples of every part in order. A family whose type differs
    from the first of its name is dropped: a page where one name has two types is refused whole."""
    merged: dict[str, Metric] = {}
    for part in parts:
        for family in part:
            first = merged.get(family.name)
            if first is None:
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = list(family.samples)
                merged[family.name] = copy
            elif first.type == family.type:
                first.samples.extend(family.samples)
    return list(merged.values())


def scrape_up(service: str, results: Mapping[str, bool]) -> GaugeMetricFamily:
    """`turnout_scrape_up{service, address}`: 1 when the service at each address answered its scrape in time."""
    family = GaugeMetricFamily(
        SCRAPE_UP, "1 when the service answered the last scrape in time, else 0", labels=["service", "address"]
    )
    for address, up in results.items():
        family.add_metric([service, address], 1.0 if up else 0.0)
    return family


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def render(families: list[Metric]) -> bytes:
    """The text exposition format (what `generate_latest` writes for a registry)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
