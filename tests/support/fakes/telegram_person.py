"""A person in a Telegram chat who decides the approval cards the bot posts there.

It watches the fake Bot API (`tests.support.fakes.telegram.FakeTelegram`) for the cards the notifiers
send, and for each request seen for the first time a `policy` (the webhook receiver's,
`tests.support.fakes.deciding_receiver.mix_policy`) says what to do: press Approve, press Reject and
answer the bot's ForceReply prompt with the reason, or stay silent. Each update is POSTed to
`/v1/telegram/updates` of one of the API processes with the secret token, as Telegram would:
a connection error or 5xx is sent again, the same update (same `update_id`) to the next API
process after a short back-off, until an API answers 200.

What the person meant is kept in `intents`, how each decision ended in `answered` (the
deciding_receiver's `Intent` and `Answered`, so the fleet checks judge both channels alike):
status 200 when the bot said the decision was taken, 409 when it said someone (the sweeper)
was first, with the status it named. An empty answer means the API had handled this update
before it died (Telegram's redelivery of a handled update); what became of the request is then
read from the broker (`status_of`).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from channels.cards import button_tokens as ids
from tests.support.fakes.deciding_receiver import INTENT_OF, Answered, Intent, Policy
from tests.support.fakes.telegram import FakeTelegram, buttons, dumps

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
TOO_LATE = re.compile(r"already (\w+)")
StatusOf = Callable[[str], tuple[str, str | None]]
"""A request id -> (its status, who decided it), read from the broker."""


ASK_REASON = "Reply to my message with the reason."


class Undelivered(Exception):
    """An update no API took: refused (4xx), or none answered in time (connection errors, 5xx)."""


class TelegramPerson:
    """Clicks the bot's cards by `policy`, through whichever API process answers."""

    def __init__(
        self,
        fake: FakeTelegram,
        api_urls: list[str],
        *,
        secret: str,
        user_id: int,
        policy: Policy,
        status_of: StatusOf,
        threads: int = 4,
        give_up_after_s: float = 120.0,
    ) -> None:
        self.fake = fake
        self.api_urls = list(api_urls)
        self.secret = secret
        self.user_id = user_id
        self.policy = policy
        self.status_of = status_of
        self.give_up_after_s = give_up_after_s
        self.intents: dict[str, Intent] = {}
        self.answered: dict[str, Answered] = {}
        self.failures: list[str] = []
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._next_api = 0
        self._seen_calls = 0
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tg-person")
        self._http = httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0))
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="tg-watch")

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> TelegramPerson:
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()

    # ---- watching the chat -------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            calls = self.fake.calls_from(self._seen_calls)
            self._seen_calls += len(calls)
            for call in calls:
                if call.method == "sendMessage" and call.response.get("ok"):
                    self._saw(call.response["result"])

    def _saw(self, message: dict[str, Any]) -> None:
        """A message the bot sent: a card of a request not seen before gets the policy's say."""
        parsed = [ids.parse(token) for token in buttons(message)]
        rids = {p[2] for p in parsed if p is not None and p[0] == ids.APPROVE}
        if len(rids) != 1:
            return  # not a card (a reason prompt), or one already decided when posted
        [rid] = rids
        with self._lock:
            self.counts["cards seen"] += 1
            if rid in self.intents:
                self.counts["cards seen again (a duplicate post)"] += 1
                return
        reply = self.policy({"id": rid})
        action = "silent" if reply is None else INTENT_OF.get(str(reply.get("outcome")), "?")
        # expires_at is not on the card: the checks take it from the request
        intent = Intent(rid, action, reply, float("nan"), time.time())
        with self._lock:
            self.intents[rid] = intent
            self.counts[f"meant {action}"] += 1
        if reply is not None:
            self._pool.submit(self._decide, rid, message, reply)

    # ---- deciding ----------------------------------------------------------------------

    def _decide(self, rid: str, card: dict[str, Any], reply: dict[str, Any]) -> None:
        outcome = str(reply["outcome"])
        try:
            if outcome == "approved":
                click = self.fake.click(card, self.user_id, ids.token(ids.APPROVE, rid))
                sent_at, body = self._send(click)
                self._settle(rid, outcome, sent_at, body, done="Done: approved.")
                return
            for _ in range(5):  # a prompt the bot could not send is asked for again
                click = self.fake.click(card, self.user_id, ids.token(ids.REJECT, rid))
                sent_at, body = self._send(click)
                text = str(body.get("text", ""))
                if not text.startswith("Could not ask"):
                    break
            prompt = self._prompt_for(card) if text == ASK_REASON or not body else None
            if prompt is None:
                if text == ASK_REASON:
                    self._fail(f"{rid}: the bot asked for a reason, but sent no prompt")
                else:  # too late, or handled before and no prompt sent: see what became of it
                    self._settle(rid, outcome, sent_at, body, done="")
                return
            answer = self.fake.reply(prompt, self.user_id, str(reply.get("reason", "")))
            sent_at, body = self._send(answer)
            self._settle(rid, outcome, sent_at, body, done="Rejected.")
        except Undelivered as exc:
            self._fail(f"{rid}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a thread's failure must reach the checks
            self._fail(f"{rid}: {type(exc).__name__}: {exc}")

    def _prompt_for(self, card: dict[str, Any]) -> dict[str, Any] | None:
        """The bot's newest ForceReply prompt answering this card (a retried click may have
        made more than one; the newest is the one the API remembered last)."""
        prompts = [
            c.response["result"]
            for c in self.fake.calls_to("sendMessage", ok_only=True)
            if (c.params.get("reply_markup") or {}).get("force_reply")
            and (c.params.get("reply_parameters") or {}).get("message_id") == card["message_id"]
        ]
        return prompts[-1] if prompts else None

    def _settle(
        self, rid: str, outcome: str, sent_at: float, body: dict[str, Any], *, done: str
    ) -> None:
        """Record how the decision ended, from the bot's answer (or the broker, if none)."""
        text = str(body.get("text", ""))
        late = TOO_LATE.search(text) if text.startswith("Too late") else None
        if done and text == done:
            answered = Answered(rid, outcome, 200, outcome, 1, sent_at)
        elif late:
            answered = Answered(rid, outcome, 409, late.group(1), 1, sent_at)
        elif not body or text == "Already received.":
            with self._lock:
                self.counts["handled before (status read from the broker)"] += 1
            status, by = self.status_of(rid)
            ours = status == outcome and by is not None and by != "sweeper"
            answered = Answered(rid, outcome, 200 if ours else 409, status, 1, sent_at)
        else:
            self._fail(f"{rid}: the bot answered {body}")
            return
        with self._lock:
            self.answered[rid] = answered
            self.counts[f"answered {answered.status}"] += 1

    def _send(self, update: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        """POST one update until an API answers it; (when that try was sent, its body)."""
        deadline = time.monotonic() + self.give_up_after_s
        delay = 0.05
        while True:
            with self._lock:
                base = self.api_urls[self._next_api % len(self.api_urls)]
                self._next_api += 1
            sent_at = time.time()
            try:
                response = self._http.post(
                    f"{base}/v1/telegram/updates",
                    content=dumps(update),
                    headers={"Content-Type": "application/json", SECRET_HEADER: self.secret},
                )
                status = response.status_code
            except httpx.TransportError:
                status = 0
            if status == 200:
                body = response.json()
                return sent_at, body if isinstance(body, dict) else {}
            if 400 <= status < 500:
                raise Undelivered(f"HTTP {status} {response.text[:200]}")
            with self._lock:
                self.counts["updates sent again (API down or 5xx)"] += 1
            if time.monotonic() > deadline:
                raise Undelivered(f"gave up after {self.give_up_after_s:.0f} s (last {status})")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _fail(self, problem: str) -> None:
        with self._lock:
            self.failures.append(problem)

    # ---- reading -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **dict(sorted(self.counts.items())),
                "requests": len(self.intents),
                "answered": len(self.answered),
                "failures": len(self.failures),
            }
