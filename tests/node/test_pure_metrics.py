"""Pure: the node's scrape-time histogram exports what prometheus_client's would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.registry import Collector

from streamwal.node.metrics import ScrapedHistogram

BUCKETS = (0.0002, 0.001, 0.25, 1.0)
VALUES = [0.0, 0.0001, 0.0002, 0.00021, 0.001, 0.5, 1.0, 1.5, 7.0, 0.0002]


class _One(Collector):
    def __init__(self, histogram: ScrapedHistogram) -> None:
        self._histogram = histogram

    def collect(self):
        yield self._histogram.metric()


def _lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_exposition_equals_prometheus_clients_histogram_for_the_same_observations() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("x_seconds", "doc", buckets=BUCKETS, registry=theirs)
    scraped = ScrapedHistogram("x_seconds", "doc", BUCKETS)
    ours.register(_One(scraped))
    assert _lines(ours) == _lines(theirs)  # empty
    for v in VALUES:
        reference.observe(v)
        scraped.observe(v)
    assert _lines(ours) == _lines(theirs)
    assert 'x_seconds_bucket{le="0.0002"} 4.0' in _lines(ours)  # bounds are inclusive
