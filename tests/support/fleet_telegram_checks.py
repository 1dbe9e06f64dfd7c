"""The fleet test's checks of the requests decided in Telegram (the queue whose channel is
`telegram:NAME`), beside the webhook's (`tests.fleet_checks`).

Each request has one outcome event, and it is what the Telegram person meant (the same `judge`
as the webhook's, with the approver's name as the decider and the same one exception, a click
that landed after the request expired); and the card in the chat shows that outcome, with no
buttons left: edited to it (`editMessageText`), or posted already showing it when the request
was decided before its card went out (a card posted only after its request timed out has no
buttons to click, and is counted). A duplicate card (a notifier SIGKILLed between
sendMessage and recording it; `channels.cards.sender`) is counted, not a failure, as long as one
card of the request follows it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any

from broker.domain.models import Request, Status
from broker.facade import Broker
from tests.support.fakes.telegram import FakeTelegram, buttons
from tests.support.fakes.telegram_person import TelegramPerson
from tests.support.fleet_checks import LATE, REJECT_REASON, Findings, judge, outcome_events

OUTCOME_TEXT = {
    Status.approved: "Approved by {who}",
    Status.rejected: "Rejected by {who}",
    Status.timed_out: "Timed out",
}
"""What a card says once its request has this outcome (`channels.cards.render`)."""


def card_text(request: Request) -> str:
    """The outcome line a card of `request` must show."""
    who = request.decision.decided_by if request.decision else "?"
    return OUTCOME_TEXT.get(request.status, request.status.value).format(who=who)


def shows_outcome(fake: FakeTelegram, request: Request) -> bool:
    """A card of the request, as it stands, shows its outcome and has no buttons left."""
    if request.is_pending:
        return False
    line = card_text(request)
    return any(line in m["text"] and not buttons(m) for m in fake.cards_for(request.id))


def check_telegram(
    found: Findings,
    broker: Broker,
    fake: FakeTelegram,
    person: TelegramPerson,
    *,
    queue: str,
    approver: str,
) -> None:
    """The Telegram queue's requests: one outcome each, the one the person meant, on the card."""
    requests = {rid: r for rid, r in found.requests.items() if r.queue == queue}
    events = outcome_events(broker, queue)
    found.bad(
        "Telegram requests without exactly one outcome event",
        [f"{rid} x{events[rid]}" for rid in requests if events[rid] != 1],
    )
    # a card posted only after its request timed out has no buttons: nobody could click it
    unseen = [rid for rid in requests if rid not in person.intents]
    expired_first = [
        rid
        for rid in unseen
        if requests[rid].status is Status.timed_out and shows_outcome(fake, requests[rid])
    ]
    found.bad(
        "Telegram requests whose card never reached the chat with its buttons",
        [rid for rid in unseen if rid not in expired_first],
    )
    verdicts: Counter[str] = Counter()
    mismatched = []
    for rid, request in requests.items():
        intent = person.intents.get(rid)
        if intent is None or request.is_pending:
            continue
        intent = dataclasses.replace(intent, expires_at=request.expires_at.timestamp())
        problem = judge(request, intent, person.answered.get(rid), approver)
        if problem is None:
            verdicts[f"{intent.action} -> {request.status.value}"] += 1
        elif problem in LATE:
            verdicts[f"{intent.action} -> timed_out ({problem})"] += 1
        else:
            mismatched.append(f"{rid}: {problem}")
    found.bad("Telegram requests whose outcome is not what the person meant", mismatched)
    found.bad("Telegram clicks that went wrong", person.failures)
    cards = card_counts(fake, requests)
    found.bad("Telegram requests whose card does not show the outcome", cards.pop("missing"))
    found.counts["telegram"] = {
        **person.stats(),
        "meant -> outcome": dict(sorted(verdicts.items())),
        "cards posted only after the request timed out (nothing to click)": len(expired_first),
        **cards,
    }


def card_counts(fake: FakeTelegram, requests: dict[str, Request]) -> dict[str, Any]:
    """How each request's card came to show its outcome; `missing` lists those whose didn't."""
    edits: dict[tuple[str, int], list[str]] = defaultdict(list)
    for call in fake.calls_to("editMessageText", ok_only=True):
        key = (str(call.params.get("chat_id")), int(call.params.get("message_id") or 0))
        edits[key].append(str(call.params.get("text")))
    edited = posted_decided = duplicates = 0
    missing = []
    for rid, request in requests.items():
        cards = fake.cards_for(rid)
        duplicates += max(0, len(cards) - 1)
        line = card_text(request)
        reason_ok = request.status is not Status.rejected or any(
            f"Reason: {REJECT_REASON}" in m["text"] for m in cards
        )
        by_edit = any(
            line in text for m in cards for text in edits[(str(m["chat"]["id"]), m["message_id"])]
        )
        if not shows_outcome(fake, request) or not reason_ok:
            missing.append(f"{rid} {request.status.value}: {[m['text'][-80:] for m in cards]}")
        elif by_edit:
            edited += 1
        else:
            posted_decided += 1
    return {
        "cards edited to the outcome (editMessageText)": edited,
        "cards posted already decided": posted_decided,
        "duplicate cards (a notifier killed mid-post)": duplicates,
        "missing": missing,
    }
