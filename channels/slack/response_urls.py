"""Which `response_url`s the API may follow: Slack's own, or the configured Slack API host.

A `response_url` comes inside a signed Slack payload, but the API then POSTs to it from inside
the network: a URL pointing anywhere else (an internal service, a metadata endpoint) would turn
a leaked signing secret or a Slack-side bug into a request forgery. Only https on slack.com
(and its subdomains, e.g. hooks.slack.com) passes, or exactly the scheme, host and port of
`api_base_url` (tests and on-premises stand-ins point that at a local fake).
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

SLACK_DOMAIN = "slack.com"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(parts: SplitResult) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL without credentials; None otherwise."""
    try:
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower().rstrip(".")
    if scheme not in _DEFAULT_PORTS or not host or "@" in parts.netloc:
        return None
    return scheme, host, port or _DEFAULT_PORTS[scheme]


def response_url_allowed(url: str, api_base_url: str) -> bool:
    """True when the API may POST to `url` (a Slack interaction's `response_url`)."""
    if not isinstance(url, str) or any(c in url for c in "\r\n\t\\ "):
        return False
    origin = _origin(urlsplit(url))
    if origin is None:
        return False
    scheme, host, port = origin
    if scheme == "https" and port == 443:
        if host == SLACK_DOMAIN or host.endswith("." + SLACK_DOMAIN):
            return True
    return origin == _origin(urlsplit(api_base_url))
