"""Prometheus metrics: fleet-wide figures read from Redis at scrape time, plus latency in-process.

Requests by status and queue (counters the Lua steps keep), deliveries and failures by
channel, the dead-letter count and the rule figures (decisions by rule, rule count) are read
from Redis on each scrape (a custom collector), so every API replica reports the same numbers
at the cost of five commands, whatever the volume. The decision latency histogram is per
process: each replica observes the decisions it records, and Prometheus sums them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from broker.domain.models import Request as BrokerRequest
from broker.facade import Broker

# From an automated decision (well under a second) to a person answering a day later.
LATENCY_BUCKETS = (0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 86400)


class BrokerCollector(Collector):
    """Reads request counts, delivery counters and the dead-letter count from Redis."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def describe(self) -> list[Metric]:
        return []  # nothing at registration: a scrape is when Redis is read

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("approval_broker_redis_up", "1 when the broker's Redis answered")
        try:
            counts = self.broker.counts()
            fleet = self.broker.fleet
            stats = fleet.delivery_stats()
            dead = fleet.dead_letter_count()
            rule_hits = fleet.rule_hits()
            rule_count = fleet.rule_count()
        except RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        requests = GaugeMetricFamily(
            "approval_broker_requests",
            "Requests by status and handler queue: pending ones waiting now, other statuses"
            " counted as they happen (kept by the broker's Lua steps, no scan)",
            labels=["status", "queue"],
        )
        receipts = [(f, n) for f, n in counts.items() if f.startswith(RECEIPT_COUNTS)]
        for field, n in sorted(counts.items()):
            if field.startswith(RECEIPT_COUNTS):
                continue
            status, _, queue = field.partition(":")
            requests.add_metric([status, queue], n)
        yield requests
        yield from receipt_metrics(receipts)
        delivered = CounterMetricFamily(
            "approval_broker_deliveries", "Deliveries by channel kind", labels=["channel"]
        )
        failed = CounterMetricFamily(
            "approval_broker_delivery_failures",
            "Failed delivery attempts by channel kind",
            labels=["channel"],
        )
        parked = CounterMetricFamily(
            "approval_broker_parked_deliveries",
            "Deliveries handed to Redis because their channel was slow, by channel kind",
            labels=["channel"],
        )
        for field, text in sorted(stats.items()):
            what, _, channel = field.partition(":")
            try:
                value = float(text)
            except ValueError:
                continue
            if what == "delivered" and channel:
                delivered.add_metric([channel], value)
            elif what == "failed" and channel:
                failed.add_metric([channel], value)
            elif what == "parked" and channel:
                parked.add_metric([channel], value)
        yield delivered
        yield failed
        yield parked
        letters = GaugeMetricFamily(
            "approval_broker_dead_letters", "Entries in the dead-letter stream"
        )
        letters.add_metric([], dead)
        yield letters
        yield from rule_metrics(rule_hits, rule_count)


RECEIPT_COUNTS = "receipt_"
"""Fields of the counts hash kept by receipt.lua: `receipt_spent`, `receipt_refused:REASON`."""


def receipt_metrics(counts: list[tuple[str, int]]) -> Iterator[Metric]:
    """Receipts spent by the tools they let run, and receipts refused, by reason."""
    spent = CounterMetricFamily(
        "approval_broker_receipts_spent", "Approval receipts checked and spent as their tool ran"
    )
    refused = CounterMetricFamily(
        "approval_broker_receipts_refused",
        "Approval receipts refused where the tool was to run (the tool did not run), by reason",
        labels=["reason"],
    )
    spent.add_metric([], sum(n for f, n in counts if f == "receipt_spent"))
    for field, n in sorted(counts):
        what, _, reason = field.partition(":")
        if what == "receipt_refused" and reason:
            refused.add_metric([reason], n)
    yield spent
    yield refused


def rule_metrics(hits: dict[str, str], count: int) -> Iterator[Metric]:
    """Requests decided by each policy rule (at create, or as a remembered rule's sibling), and
    how many rules exist (revoked ones included: they stay listed)."""
    decided = CounterMetricFamily(
        "approval_broker_rule_decisions",
        "Requests decided by a policy rule, by rule id and effect",
        labels=["rule", "effect"],
    )
    shadow = CounterMetricFamily(
        "approval_broker_rule_shadow_matches",
        "Requests a shadow rule would have decided (it decided nothing), by rule id and effect",
        labels=["rule", "effect"],
    )
    for field, text in sorted(hits.items()):
        effect, _, rule_id = field.partition(":")
        if effect == "shadow":
            effect, _, rule_id = rule_id.partition(":")
            shadow.add_metric([rule_id, effect], float(text))
        else:
            decided.add_metric([rule_id, effect], float(text))
    yield decided
    yield shadow
    rules = GaugeMetricFamily(
        "approval_broker_rules", "Policy rules stored (active and revoked; see GET /v1/rules)"
    )
    rules.add_metric([], count)
    yield rules


class ApiMetrics:
    """One registry per app, so several apps in one process (tests) don't collide."""

    def __init__(self, broker: Broker) -> None:
        self.registry = CollectorRegistry()
        self.decision_latency = Histogram(
            "approval_broker_decision_latency_seconds",
            "Time from a request's creation to its decision, by reply channel",
            ["channel"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(BrokerCollector(broker))
        self._by_channel: dict[str, Any] = {}  # `labels(channel)` is a lock and a lookup each

    def observe_decision(self, request: BrokerRequest, channel: str) -> None:
        if request.decision is None or request.decision.decided_at is None:
            return
        seconds = (request.decision.decided_at - request.created_at).total_seconds()
        child = self._by_channel.get(channel)
        if child is None:
            child = self._by_channel[channel] = self.decision_latency.labels(channel)
        child.observe(max(seconds, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


router = APIRouter(tags=["operations"])


def _metrics(request: Request) -> ApiMetrics:
    metrics: ApiMetrics = request.app.state.api.metrics
    return metrics


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
def metrics(api_metrics: Annotated[ApiMetrics, Depends(_metrics)]) -> Response:
    """Prometheus text format."""
    return Response(api_metrics.render(), media_type=CONTENT_TYPE_LATEST)
