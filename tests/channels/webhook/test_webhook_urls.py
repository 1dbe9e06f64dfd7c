"""A webhook endpoint's URL as the sender reads it: host and port, IPv6 included."""

from __future__ import annotations

import pytest

from channels.webhook.http import check_url

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
