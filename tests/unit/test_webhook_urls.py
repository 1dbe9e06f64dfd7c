"""Small fixes found in review: each pins one behaviour that was wrong before it."""

from __future__ import annotations

import json

import pytest
from redis.exceptions import ClusterDownError, SlotNotCoveredError

from api.errors import ApiError, known_error_response
from api.event_reads import decode_position
from notifiers.webhook_http import check_url


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


@pytest.mark.parametrize("error", [ClusterDownError("down"), SlotNotCoveredError("moving")])
def test_a_cluster_failing_over_is_503_not_500(error: Exception):
    response = known_error_response(error)
    assert response is not None and response.status_code == 503
    assert json.loads(response.body)["error"] == "unavailable"


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_last_event_id_past_64_bits_is_400(partitions: int):
    big = str(2**64)
    value = ".".join([f"{big}-0"] * partitions)
    with pytest.raises(ApiError) as caught:
        decode_position(f"default={value}", partitions)
    assert caught.value.status == 400 and caught.value.code == "bad_last_event_id"
    assert decode_position(f"default={'.'.join(['1-0'] * partitions)}", partitions)
