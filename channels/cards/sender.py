"""Chat cards: one message per request and channel, posted once and then edited in place as the
request moves (Telegram, Discord, Teams). The platform modules say how to post and edit; this module
says when, with the same bookkeeping as Slack's messages (`channels.slack.sender`):

- the copy is recorded in the request's delivery hash as soon as it is posted, so a
  redelivered event edits it instead of posting again, and later events of the request reach
  it wherever they happen (`channels.copies`);
- posting is claimed first (`DeliveryState.claim_post`), so two notifiers handling two events
  of one request never both post;
- no such platform can look a message up by its content, so a post whose answer was lost (a
  timeout after sending) is posted again on the next try: a duplicate is then possible, and
  logged; every copy recorded is the one kept up to date.

Platform calls go through `channels.platform_http`: 429 pauses the whole channel for the
platform's `retry_after`, 5xx and connection errors are retried with the notifier's back-off,
other refusals dead-letter the delivery.
"""

from __future__ import annotations

import logging
import secrets
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from broker.domain.config import Config
from broker.domain.models import Request
from broker.facade import Broker, DeliveryState, PostState
from channels.cards.render import fingerprint, serves
from channels.copies import claim_stale_s
from channels.retry import Defer, Retry, RetryPolicy
from channels.sender import Delivery, Sender

if TYPE_CHECKING:
    from channels.outbound import OutboundHost

log = logging.getLogger("notifiers")


class CardSender(Sender):
    """A channel that posts a card per request and keeps it in sync (`CopyUpdater`)."""

    def __init__(
        self,
        name: str,
        *,
        broker: Broker,
        config: Config,
        state: DeliveryState,
        consumer: str,
        policy: RetryPolicy,
        concurrency: int,
        claim_stale_s: float,
    ) -> None:
        super().__init__(name, policy=policy, concurrency=concurrency)
        self.broker = broker
        self.config = config
        self.state = state
        self.consumer = consumer
        self.claim_stale_s = claim_stale_s

    @abstractmethod
    def post(self, request: Request) -> PostState:
        """Post the card for `request`; the platform's (chat id, message id) as a PostState."""

    @abstractmethod
    def update_copy(self, copy: PostState, request: Request, what: str) -> str:
        """Edit the posted card to show `request` as it stands."""

    def deliver(self, delivery: Delivery) -> str | None:
        event = delivery.event
        request = self.broker.get_request(event.request_id)
        found = self.state.post_state(request.id, self.name)
        if found.posted:
            return self.update_copy(found, request, event.type)
        if event.moved_away or not serves(self.config, self.name, event.queue):
            return None  # no card here, and not this channel's queue: nothing to update
        claimant = delivery.memo("claimant", lambda: f"{self.consumer}:{secrets.token_hex(4)}")
        claimed, found = self.state.claim_post(request.id, self.name, claimant, self.claim_stale_s)
        if not claimed:
            if found.posted:
                return self.update_copy(found, request, event.type)
            raise Defer("another notifier is posting this card", delay=0.5)
        if found.claimed_at is not None:
            log.warning(
                "%s: an earlier post of %s may have gone out; posting again (maybe twice)",
                self.name,
                request.id,
            )
        try:
            posted = self.post(request)
        except Retry as exc:
            self.state.release_claim(request.id, self.name, claimant)
            if exc.unclear:
                log.warning("%s: post of %s may have gone out: %s", self.name, request.id, exc)
            raise
        except BaseException:
            self.state.release_claim(request.id, self.name, claimant)
            raise
        self.state.record_post(request.id, self.name, posted.channel or "", posted.ts or "")
        latest = self.broker.get_request(request.id)
        if fingerprint(latest) != fingerprint(request):
            self.update_copy(posted, latest, event.type)
        return f"{event.type}: posted {posted.ts}"


def card_settings(host: OutboundHost, timeout_s: float) -> dict[str, Any]:
    """What every card sender takes from the notifier (`CardSender.__init__`'s keywords)."""
    return {
        "broker": host.broker,
        "config": host.config,
        "state": host.deliveries,
        "consumer": host.consumer,
        "policy": host.policy,
        "concurrency": min(host.threads, 4),
        "claim_stale_s": claim_stale_s(host.claim_idle_s, timeout_s),
    }
