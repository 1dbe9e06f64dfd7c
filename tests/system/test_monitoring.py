"""deploy/grafana and deploy/prometheus: the dashboard is a Grafana model, the alert rules pass
promtool, and every metric a panel or an alert reads is one a real API process exports.

The exported names come from scraping `approval-broker api` on a real Redis after it has
done some work (a request approved, a receipt refused and one spent, a rule deciding), so a
family's labels show in its samples. Families no sample shows here (deliveries: no notifier
runs) are checked by name only. PromQL is read by promql-parser (names and matchers) and by
promtool (Prometheus' own parser); the Grafana model is read by Grafana's foundation SDK.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from broker.redis.embedded import EmbeddedRedis
from tests.support.api_process import ADMIN, api_env, start_api, stop
from tests.support.debian import debian_program
from tests.support.receipts import key_file

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "approval-broker.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"

PROMETHEUS_MADE = {"up": {"job", "instance"}}
"""Series Prometheus writes itself for every scrape target (the API exports none of them)."""
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every scraped series."""
GRAFANA_RANGES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
"""Grafana's range variables, as Grafana fills them in before Prometheus reads a query."""

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}

CONFIG = """
[queues.default]
channels = ["inbox"]

[receipts]
key_file = "{key}"

[[rules]]
id = "small-wires"
effect = "allow"
tool = "wire"
args = {{ amount = {{ le = 10 }} }}

[[rules]]
id = "wires-trial"
effect = "allow"
tool = "wire"
mode = "shadow"
args = {{ amount = {{ le = 1000 }} }}
"""


# ---- what the files hold -------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target, with Grafana's range variables filled in."""
    found = []
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_RANGES.items():
                expr = expr.replace(variable, value)
            found.append((f"panel {panel['title']!r} {target['refId']}", expr))
    return found


def variable_queries() -> list[tuple[str, str]]:
    """(where, selector) of every `label_values(SELECTOR, label)` template variable."""
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, f"variable {variable['name']}: {query}"
        found.append((f"variable {variable['name']!r}", m.group(1)))
    return found


def alert_queries() -> list[tuple[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [(f"alert {rule['alert']}", rule["expr"]) for g in groups for rule in g["rules"]]


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


# ---- what the API exports -------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(
    tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis
) -> dict[str, set[str]]:
    """Series name -> the labels seen on it, from a real API process's /metrics after some work
    (on database 0 of the session's Redis, which the per-test databases never use); a family
    with no sample yet has its names with no labels."""
    home = tmp_path_factory.mktemp("monitoring")
    redis_url = redis_server.url_for(0)
    with Redis.from_url(redis_url) as client:
        client.flushdb()
    proc, url = start_api(api_env(redis_url, home, CONFIG.format(key=key_file(home))))
    try:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            work(http)
            text = http.get("/metrics").text
    finally:
        stop(proc)
    return series_of(text)


def work(http: httpx.Client) -> None:
    """A request approved by a person, its receipt refused once (other args) then spent; a
    wire a rule allows at once, and one only the shadow rule would have."""
    made = http.post("/v1/requests", json={"tool_name": "refund", "args": {"amount": 120}})
    assert made.status_code == 201, made.text
    request_id = made.json()["id"]
    decided = http.post(f"/v1/requests/{request_id}/decision", json={"outcome": "approved"})
    assert decided.status_code == 200, decided.text
    spend = f"/v1/requests/{request_id}/receipt/spend"
    refused = http.post(spend, json={"tool_name": "refund", "args": {"amount": 9000}})
    assert refused.status_code == 409 and refused.json()["reason"] == "args_changed"
    assert http.post(spend, json={"tool_name": "refund", "args": {"amount": 120}}).is_success
    ruled = http.post("/v1/requests", json={"tool_name": "wire", "args": {"amount": 5}})
    assert ruled.json()["status"] == "approved", ruled.text
    shadowed = http.post("/v1/requests", json={"tool_name": "wire", "args": {"amount": 500}})
    assert shadowed.json()["status"] == "pending", shadowed.text


def series_of(text: str) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


# ---- the tests -------------------------------------------------------------------------------


def test_the_alert_rules_pass_promtool_check() -> None:
    promtool = debian_program("promtool", "prometheus")
    done = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alerts_fire_as_their_unit_tests_expect() -> None:
    """`promtool test rules`: each alert fires on the series that should raise it, with its
    labels and text, and none fires on a healthy broker."""
    promtool = debian_program("promtool", "prometheus")
    done = subprocess.run(
        [promtool, "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    assert tested == {where.removeprefix("alert ") for where, _ in alert_queries()}


def test_the_dashboard_queries_are_promql_prometheus_reads(tmp_path: Path) -> None:
    """Each panel's query, its Grafana variables filled in, as a recording rule promtool checks."""
    promtool = debian_program("promtool", "prometheus")
    rules = [
        {"record": f"dashboard:query_{n}", "expr": expr}
        for n, (_, expr) in enumerate(panel_queries())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_a_grafana_model_that_drops_nothing() -> None:
    """Read by Grafana's own model and written back: a key Grafana does not know is dropped
    there, a value of the wrong shape changed, so the round trip must keep every key and value."""
    plugins.register_default_plugins()
    board = dashboard()
    again = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    assert lost(board, again) == []
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "two panels share an id"
    assert board["uid"] == "approval-broker" and board["schemaVersion"] >= 36
    for panel in panels(board):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert cogruntime.panelcfg_config(panel["type"]) is not None, panel["type"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])


def lost(before: Any, after: Any, path: str = "") -> list[str]:
    """Where `after` lacks a key of `before` or holds another value (keys it adds are defaults)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key, value in before.items():
            where = f"{path}/{key}"
            found += lost(value, after[key], where) if key in after else [f"{where}: dropped"]
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            p
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for p in lost(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [f"{path}: {before!r} became {after!r}"]


def test_every_metric_a_panel_or_alert_reads_is_one_the_api_exports(
    exported: dict[str, set[str]],
) -> None:
    known = {**exported, **PROMETHEUS_MADE}
    missing = []
    wrong_labels = []
    for where, expr in [*panel_queries(), *variable_queries(), *alert_queries()]:
        for selector in selectors(expr):
            if selector.name not in known:
                missing.append(f"{where}: {selector.name}")
                continue
            seen = known[selector.name]
            labels = {m.name for m in selector.matchers.matchers} - TARGET_LABELS
            if seen and not labels <= seen | {"le"}:
                wrong_labels.append(f"{where}: {selector.name} has no {labels - seen}")
    assert missing == [], "metrics the API does not export"
    assert wrong_labels == [], "labels the API does not put on the metric"


def test_every_exported_metric_has_a_panel(exported: dict[str, set[str]]) -> None:
    """A metric added to /metrics is put on the dashboard too (or this test says which)."""
    used = {s.name for _, expr in panel_queries() for s in selectors(expr)}
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", name) for name in exported}
    unused = sorted(f for f in families if not any(u.startswith(f) for u in used))
    assert unused == []
