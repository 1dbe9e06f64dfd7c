"""`[mcp_gateways.NAME]` is checked when the config loads, and `approval-broker mcp-gateway`
refuses a bad one with one line before it starts anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.domain.config import parse_config
from broker.domain.errors import ConfigError


def gateway(**fields: Any) -> dict[str, Any]:
    return {"mcp_gateways": {"files": fields}}


def test_a_gateway_defaults_to_gating_every_tool_in_the_default_queue() -> None:
    spec = parse_config(gateway(upstream=["python", "-m", "notes"])).mcp_gateways["files"]
    assert spec.gate == ["*"] and spec.queue == "default" and spec.broker_url is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "mcp_gateways.files: give exactly one of upstream (a command) and upstream_url"),
        ({"upstream": ["x"], "upstream_url": "http://h/mcp"}, "give exactly one of"),
        ({"upstream": []}, "mcp_gateways.files.upstream"),
        ({"upstream_url": "ftp://h"}, "mcp_gateways.files.upstream_url"),
        ({"upstream": ["x"], "queue": "nowhere"},
         "mcp_gateways.files.queue: queue 'nowhere' is not defined"),
        ({"upstream": ["x"], "gates": ["*"]}, "mcp_gateways.files.gates"),
    ],
)  # fmt: skip
def test_a_bad_gateway_is_refused_naming_the_key(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(gateway(**fields))
    assert message in str(refused.value)


def test_the_gateways_token_is_not_read_by_the_brokers_other_roles() -> None:
    raw = gateway(upstream=["x"], token="env:SURELY_UNSET_GATEWAY_TOKEN")
    assert parse_config(raw).mcp_gateways["files"].token == "env:SURELY_UNSET_GATEWAY_TOKEN"


@pytest.mark.parametrize(
    ("name", "toml", "line"),
    [
        ("nope", "", "error: no [mcp_gateways.nope] in the config (defined: none)"),
        ("files", '[mcp_gateways.files]\nupstream = ["x"]\ntoken = "env:SURELY_UNSET_GW"\n',
         "error: config {config}: mcp_gateways.files.token names environment variable SURELY_UNSET_GW,"
         " which is not set"),
        ("files", '[mcp_gateways.files]\nupstream = ["x"]\n',
         "error: mcp_gateways.files.token: a token with the role 'requester' is needed"),
    ],
)  # fmt: skip
def test_the_command_refuses_a_bad_gateway_in_one_line(
    tmp_path: Path, name: str, toml: str, line: str
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(toml)
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPROVAL_BROKER_")}
    env["APPROVAL_BROKER_CONFIG"] = str(config)
    done = subprocess.run(
        [sys.executable, "-m", "approval_broker", "mcp-gateway", name],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip() == line.format(config=config)  # the file named
