"""Insights (`GET /v1/stats`, `approval-broker stats`): the summary of a window, from rollups.

The Lua steps keep counters per UTC day and hour (lib.lua `rollup`; the fields are read by
`broker.store.insights`). This module turns the counters of a window into the contract's shape,
counting only the cells the caller may see, and never touches Redis. A cell is what visibility
is judged by: the queue, the request's `allowed_roles` and its creator, so a principal's
figures are exactly those of the requests it may read (docs/insights.md).

What counts in a window (every figure is of events in it, on Redis's clock):
- `requests.total`, `by_queue`, `by_tool`, `by_agent`: requests created in it (in the queue they
  were created in, after any routing rule);
- `requests.by_outcome`, `decided_by`: outcomes reached in it (`person` is anyone not a rule
  nor the sweeper: an approver, an email address, a webhook endpoint);
- `time_to_decision_s`: creation to a person's decision, estimated from a fixed histogram
  (`BOUNDS`) as Prometheus's `histogram_quantile` does; null when nobody decided;
- `escalations`, `rule_hits` (allow, deny and route rules), `reject_reasons` (the most common);
- `by_approver` (answers and votes per person) for those who see everything, else null.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.domain.errors import InvalidInput

US = "\x1f"
HOUR_S = 3600
DEFAULT_WINDOW = timedelta(hours=24)
MAX_WINDOW = timedelta(days=366)
"""The longest window: a year (a leap year's 366 days); the rollups are kept 400 days."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 12, 31, tzinfo=UTC)
"""Times a window may name: whole hours around them stay representable."""
TOP_REASONS = 10
OTHER_REASONS = "(other reasons)"
BOUNDS: tuple[float, ...] = (
    1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, 604800,
)  # fmt: skip
"""The time-to-decision histogram's upper bounds in seconds (lib.lua's TTD_BOUNDS), then +Inf."""
DECIDERS = ("person", "rule", "timeout")


class InvalidWindow(InvalidInput):
    code = "invalid_window"


@dataclass(frozen=True)
class Cell:
    """What visibility is judged by: the queue, the request's allowed_roles, its creator."""

    queue: str
    allowed_roles: tuple[str, ...]
    creator: str | None


@dataclass(frozen=True)
class Counter:
    """One rollup counter: its kind letter, its cell (None for `p`), the rest of its parts."""

    kind: str
    cell: Cell | None
    rest: tuple[str, ...]


def parse_time(text: str, name: str) -> datetime:
    """An ISO 8601 time (a date alone is its midnight; no zone is UTC), or InvalidWindow."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidWindow(
            f"{name}: {text[:40]!r} is not an ISO 8601 time (as in 2026-12-01T09:00:00Z)"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def window(since: str | None, until: str | None, now: datetime) -> tuple[datetime, datetime]:
    """The window asked for, checked: default the last 24 hours before `now`; `since` before
    `until`; at most a year (InvalidWindow, a 422, naming the limit)."""
    end = parse_time(until, "until") if until else now
    start = parse_time(since, "since") if since else end - DEFAULT_WINDOW
    for name, when in (("since", start), ("until", end)):
        if not EARLIEST <= when <= LATEST:
            raise InvalidWindow(f"{name}: must be between 1970 and 9998")
    if start >= end:
        raise InvalidWindow("since: must be before until")
    if end - start > MAX_WINDOW:
        raise InvalidWindow(f"the window is {(end - start).days} days: at most 366 days (a year)")
    return start, end


def hours_of(start: datetime, end: datetime) -> tuple[int, int]:
    """The whole hours (since the epoch) a window covers: `start` down, `end` up to the hour."""
    first = int(start.timestamp() // HOUR_S)
    last = -int(-end.timestamp() // HOUR_S)
    return first, max(last, first + 1)


def parse_counter(field: str) -> Counter | None:
    """A rollup field (without its hour), or None for one this broker does not write."""
    parts = field.split(US)
    kind = parts[0]
    if kind == "p" and len(parts) >= 2:
        return Counter("p", None, (US.join(parts[1:]),))
    if len(parts) < 4 or kind not in "notrxe" or len(kind) != 1:
        return None
    try:
        roles = tuple(json.loads(parts[2])) if parts[2] else ()
    except ValueError:
        return None
    return Counter(kind, Cell(parts[1], roles, parts[3] or None), tuple(parts[4:]))


def percentile(buckets: Mapping[float, int], q: float) -> float | None:
    """The q-quantile of a histogram (upper bound -> count, +Inf as `inf`), interpolated within
    its bucket as Prometheus's `histogram_quantile`; in the +Inf bucket, the largest bound."""
    total = sum(buckets.values())
    if total == 0:
        return None
    rank = q * total
    seen, lower = 0, 0.0
    for bound in (*BOUNDS, float("inf")):  # every bound, so a bucket's lower edge is its own
        count = buckets.get(bound, 0)
        if count and seen + count >= rank:
            if bound == float("inf"):
                return lower
            return round(lower + (bound - lower) * (rank - seen) / count, 3)
        seen += count
        lower = bound if bound != float("inf") else lower
    return lower


def _bound(text: str) -> float | None:
    if text == "inf":
        return float("inf")
    try:
        return float(text)
    except ValueError:
        return None


def _add(table: dict[str, int], key: str, n: int) -> None:
    table[key] = table.get(key, 0) + n


def summarize(
    counters: Iterable[tuple[Counter, int]],
    sees: Callable[[Cell], bool],
    *,
    people: bool,
    since: datetime,
    until: datetime,
) -> dict[str, Any]:
    """The stats of a window (the contract's shape), counting the cells `sees` allows;
    `people`: the per-approver counts too (admin and auditor)."""
    total = 0
    by: dict[str, dict[str, int]] = {k: {} for k in ("outcome", "queue", "tool", "agent")}
    decided = dict.fromkeys(DECIDERS, 0)
    histogram: dict[str, dict[float, int]] = {}
    escalations = 0
    hits: dict[str, int] = {}
    reasons: dict[str, int] = {}
    approvers: dict[str, int] = {}
    seen: dict[Cell, bool] = {}
    for c, n in counters:
        if c.cell is None:
            if people:
                _add(approvers, c.rest[0], n)
            continue
        visible = seen.get(c.cell)
        if visible is None:
            visible = seen[c.cell] = sees(c.cell)
        if not visible or not c.rest and c.kind != "e":
            continue
        queue = c.cell.queue
        if c.kind == "n" and len(c.rest) >= 2:
            total += n
            _add(by["queue"], queue, n)
            _add(by["tool"], US.join(c.rest[1:]), n)
            if c.rest[0]:
                _add(by["agent"], c.rest[0], n)
        elif c.kind == "o":
            _add(by["outcome"], c.rest[0], n)
            if len(c.rest) > 1 and c.rest[1] in decided:
                decided[c.rest[1]] += n
        elif c.kind == "t" and (bound := _bound(c.rest[0])) is not None:
            per = histogram.setdefault(queue, {})
            per[bound] = per.get(bound, 0) + n
        elif c.kind == "r":
            _add(hits, c.rest[0], n)
        elif c.kind == "x":
            _add(reasons, US.join(c.rest) or OTHER_REASONS, n)
        elif c.kind == "e":
            escalations += n
    overall: dict[float, int] = {}
    for per in histogram.values():
        for bound, n in per.items():
            overall[bound] = overall.get(bound, 0) + n
    top = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    return {
        "since": _iso(since),
        "until": _iso(until),
        "requests": {
            "total": total,
            "by_outcome": _sorted(by["outcome"]),
            "by_queue": _sorted(by["queue"]),
            "by_tool": _sorted(by["tool"]),
            "by_agent": _sorted(by["agent"]),
        },
        "decided_by": decided,
        "time_to_decision_s": {
            "p50": percentile(overall, 0.5),
            "p90": percentile(overall, 0.9),
            "by_queue": {
                q: {"p50": percentile(h, 0.5), "p90": percentile(h, 0.9)}
                for q, h in sorted(histogram.items())
            },
        },
        "escalations": escalations,
        "rule_hits": _sorted(hits),
        "reject_reasons": [{"reason": r, "count": n} for r, n in top],
        "by_approver": _sorted(approvers) if people else None,
    }


def _sorted(table: dict[str, int]) -> dict[str, int]:
    """Largest first, then by name: what a reader looks at first comes first."""
    return dict(sorted(table.items(), key=lambda kv: (-kv[1], kv[0])))


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
