"""`api.webhooks._check` refuses and accepts exactly what `standardwebhooks` does (issue 18).

The lean check replaces the package's verify for timestamps of plain digits; every header
shape here is judged by both and the verdicts compared (accepted, or refused with an error).
"""

from __future__ import annotations

import base64
import random
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from api.webhooks import _check

SECRET = "whsec_" + base64.b64encode(b"hot-verify-secret-0123456789abcd").decode()
OTHER = "whsec_" + base64.b64encode(b"another-secret-0123456789abcdefg").decode()
BODY = b'{"request_id":"run_x.1.abc","outcome":"approved","decided_by":"bot"}'


def verdict(check: object, body: bytes, headers: dict[str, str]) -> str:
    try:
        check(body, headers)  # type: ignore[operator]
    except Exception:  # noqa: BLE001 - any refusal: the API answers each with the same 401
        return "refused"
    return "accepted"


def both(body: bytes, headers: dict[str, str]) -> tuple[str, str]:
    webhook = Webhook(SECRET)
    package = verdict(lambda b, h: webhook.verify(b, h, json_parse=False), body, headers)
    lean = verdict(lambda b, h: _check(webhook, b, h), body, headers)
    return package, lean


def signed(
    body: bytes = BODY, *, at: float | None = None, msg_id: str = "msg_1", secret: str = SECRET
) -> dict[str, str]:
    when = datetime.fromtimestamp(time.time() if at is None else at, UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, body.decode()),
    }


def cases() -> list[tuple[str, bytes, dict[str, str]]]:
    now = time.time()
    good = signed()
    sig = good["webhook-signature"]
    out: list[tuple[str, bytes, dict[str, str]]] = [
        ("good", BODY, good),
        ("other secret", BODY, signed(secret=OTHER)),
        ("tampered body", BODY.replace(b"approved", b"rejected"), good),
        ("other id", BODY, {**good, "webhook-id": "msg_2"}),
        ("no id", BODY, {k: v for k, v in good.items() if k != "webhook-id"}),
        ("empty id", BODY, {**good, "webhook-id": ""}),
        ("no signature", BODY, {k: v for k, v in good.items() if k != "webhook-signature"}),
        ("no timestamp", BODY, {k: v for k, v in good.items() if k != "webhook-timestamp"}),
        ("old", BODY, signed(at=now - 301)),
        ("nearly old", BODY, signed(at=now - 290)),
        ("new", BODY, signed(at=now + 301)),
        ("nearly new", BODY, signed(at=now + 290)),
        ("leading zeros", BODY, {**good, "webhook-timestamp": "00" + good["webhook-timestamp"]}),
        ("fraction", BODY, {**good, "webhook-timestamp": good["webhook-timestamp"] + ".0"}),
        ("fraction .9", BODY, {**good, "webhook-timestamp": good["webhook-timestamp"] + ".9"}),
        ("spaces", BODY, {**good, "webhook-timestamp": " " + good["webhook-timestamp"]}),
        ("arabic digits", BODY, {**good, "webhook-timestamp": "١٧٠٠٠٠٠٠٠٠"}),
        ("huge", BODY, {**good, "webhook-timestamp": "9" * 400}),
        ("negative", BODY, {**good, "webhook-timestamp": "-1"}),
        ("nan", BODY, {**good, "webhook-timestamp": "nan"}),
        ("two, second good", BODY, {**good, "webhook-signature": "v1,AAAA " + sig}),
        ("two, first good", BODY, {**good, "webhook-signature": sig + " v1,AAAA"}),
        ("v2 only", BODY, {**good, "webhook-signature": sig.replace("v1,", "v2,")}),
        ("v2 then good", BODY, {**good, "webhook-signature": "v2,xyz " + sig}),
        ("no comma first", BODY, {**good, "webhook-signature": "v1 " + sig}),
        ("three parts", BODY, {**good, "webhook-signature": sig + ",x"}),
        ("bad base64", BODY, {**good, "webhook-signature": "v1,abc"}),
        ("junk in base64", BODY, {**good, "webhook-signature": sig[:10] + "!" + sig[10:]}),
        ("double space", BODY, {**good, "webhook-signature": sig + "  " + sig}),
        ("not utf-8", b"\xff" + BODY, signed(b"x")),
        ("empty body", b"", signed(b"")),
        ("unicode body", '{"r":"é€😀"}'.encode(), signed('{"r":"é€😀"}'.encode())),
        ("non-ascii id", BODY, signed(msg_id="msg_é")),
    ]
    rng = random.Random(18)
    for i in range(200):  # random corruptions of a good signature
        chars = list(sig)
        position = rng.randrange(3, len(chars))
        chars[position] = rng.choice("ABCabc019+/= ,")
        out.append((f"corrupt {i}", BODY, {**good, "webhook-signature": "".join(chars)}))
    return out


@pytest.mark.parametrize(
    ("name", "body", "headers"), cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_lean_check_judges_as_the_package(name: str, body: bytes, headers: dict[str, str]) -> None:
    package, lean = both(body, headers)
    assert lean == package, name


def test_a_good_signature_is_accepted_and_a_wrong_one_refused() -> None:
    assert both(BODY, signed()) == ("accepted", "accepted")
    assert both(BODY, signed(secret=OTHER)) == ("refused", "refused")
