"""A webhook endpoint's URL as the sender reads it: host and port, IPv6 included."""

from __future__ import annotations

import httpx
import pytest

from channels.webhook.http import check_url, env_proxy

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("http://[2001:db8::1]/hook", "2001:db8::1", 80),
        ("https://[2001:db8::1]/hook", "2001:db8::1", 443),
        ("https://[2001:db8::1]:8443/hook", "2001:db8::1", 8443),
        ("http://example.test/hook", "example.test", 80),
    ],
)
def test_a_webhook_connection_names_its_port_so_an_ipv6_host_is_not_split(url, host, port):
    parsed = check_url(url)
    assert (parsed.host, parsed.port or {"http": 80, "https": 443}[parsed.scheme]) == (host, port)


def test_the_proxy_of_an_endpoint_is_the_one_the_environment_names_for_its_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By scheme, else ALL_PROXY; none for a host NO_PROXY lists (read as the stdlib reads it)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert env_proxy(httpx.URL("https://hooks.example.test/x")) is None
    monkeypatch.setenv("ALL_PROXY", "http://all.proxy.test:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain.proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "inside.example.test")
    assert env_proxy(httpx.URL("http://hooks.example.test/x")) == "http://plain.proxy.test:3128"
    assert env_proxy(httpx.URL("https://hooks.example.test/x")) == "http://all.proxy.test:3128"
    assert env_proxy(httpx.URL("https://inside.example.test/x")) is None
