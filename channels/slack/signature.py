"""The Slack v0 signature check and its replay marker.

The signature is checked over the raw body (slack_sdk's SignatureVerifier, 5-minute window)
before anything is parsed, and a signature is accepted once: its marker (`seen:slack:{sha256}`)
is spent in the same atomic step as the decision it carries (`once`), or by the route when the
interaction decides nothing. This module never parses a payload or decides.
"""

from __future__ import annotations

import hashlib
import re

from slack_sdk.signature import SignatureVerifier

from broker.facade import Once
from broker.judge.deciding import REPLAY_TTL_S
from channels.errors import Refused
from channels.inbound import InboundHost
from channels.slack.config import SlackConfig

TIMESTAMP_HEADER = "x-slack-request-timestamp"
SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP = re.compile(r"[0-9]{1,12}", re.ASCII)
"""Seconds since the epoch in ASCII digits: 12 reach past the year 30000."""
MAX_SIGNATURE = 128  # `v0=` and 64 hex digits


def verify(slack: SlackConfig, body: bytes, headers: dict[str, str]) -> str:
    """The request's signature, once it is known to be Slack's and recent; else 401.

    The headers are bounded first: slack_sdk reads the timestamp with `int()` and subtracts it
    from a float, so 400 digits were an OverflowError (a 500)."""
    stamp = headers.get(TIMESTAMP_HEADER, "")
    signature = headers.get(SIGNATURE_HEADER, "")
    if not TIMESTAMP.fullmatch(stamp) or not 0 < len(signature) <= MAX_SIGNATURE:
        raise bad_signature()
    try:
        valid = SignatureVerifier(slack.signing_secret).is_valid_request(body, headers)
    except (ValueError, TypeError):  # a timestamp that is not a number, a body not UTF-8
        valid = False
    if not valid:
        raise bad_signature()
    return signature


def bad_signature() -> Refused:
    return Refused(401, "bad_signature", "the Slack signature is missing, wrong or too old")


def signature_once(host: InboundHost, signature: str) -> Once:
    """The one-time marker of one signature (hashed: a key never holds the signature itself)."""
    digest = hashlib.sha256(signature.encode()).hexdigest()
    return host.broker.once.marker("slack", digest, REPLAY_TTL_S)


def replayed() -> Refused:
    """The answer to a signature already spent."""
    return Refused(409, "replayed", "this Slack request was already received")
