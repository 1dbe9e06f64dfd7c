"""A Slack `response_url` is followed only on Slack's hosts or the configured API host."""

from __future__ import annotations

import pytest

from channels.slack.response_urls import response_url_allowed

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

SLACK_API = "https://slack.com/api/"
FAKE_API = "http://127.0.0.1:5123/api"


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.slack.com/actions/T1/123/abc",
        "https://slack.com/x",
        "https://HOOKS.Slack.com:443/actions/T1/1/a",
        "https://hooks.slack.com./actions/T1/1/a",
    ],
)
def test_slack_hosts_over_https_are_followed(url: str) -> None:
    assert response_url_allowed(url, SLACK_API)
    assert response_url_allowed(url, FAKE_API)  # Slack's own hosts whatever the config says


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.slack.com/actions/T1/1/a",  # not https
        "https://hooks.slack.com:8443/actions",  # another port
        "https://evilslack.com/actions",  # not a subdomain
        "https://hooks.slack.com.evil.example/actions",
        "https://hooks.slack.com@evil.example/actions",  # credentials trick
        "https://evil.example/?u=https://hooks.slack.com/",
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:5123/hook",  # the fake's host, but the config names Slack
        "file:///etc/passwd",
        "//hooks.slack.com/actions",
        "https://hooks.slack.com:99999/",
        "https://hooks.slack.com/a b",
        "",
    ],
)
def test_anything_else_is_refused(url: str) -> None:
    assert not response_url_allowed(url, SLACK_API)


def test_the_configured_api_host_is_followed_with_its_scheme_and_port() -> None:
    assert response_url_allowed("http://127.0.0.1:5123/hook/1", FAKE_API)
    assert not response_url_allowed("http://127.0.0.1:5124/hook/1", FAKE_API)
    assert not response_url_allowed("https://127.0.0.1:5123/hook/1", FAKE_API)
    assert not response_url_allowed("http://localhost:5123/hook/1", FAKE_API)
    assert response_url_allowed("https://slack.example/r", "https://slack.example:443/api/")
