"""`approval-broker channels test KIND:NAME`: a sample card through the real channel code.

Setting up a chat app takes ids, scopes and secrets in several places; this command shows the
wiring works before any agent asks. It makes up a request, clearly marked as a test, and hands
its `approval.requested` event to the channel's own sender (the one the notifier builds from
the kind's plugin): a Slack, Teams, Telegram or Discord card, a mail, or a signed Standard
Webhooks event. It prints where it went (the sender's own note), or the one-line error.

The request lives only in a throwaway embedded Redis (a temporary folder, removed after):
the broker that runs is never touched, and nobody can decide the request (its buttons and
links answer "not found"). One attempt, no retries: a setup error should show at once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from approval_broker.cli_common import clear_errors, fail, load_settings
from broker.domain.config import Config
from broker.domain.config_sections import QueueConfig
from broker.domain.events import REQUESTED, Event, parse_entry
from broker.domain.models import NewRequest, Request
from broker.domain.printable import one_line
from broker.domain.settings import Settings
from broker.facade import Broker
from broker.launcher import EmbeddedRedis
from channels import check_installed, plugin, prepare

channels_app = typer.Typer(help="The channels a config defines.", no_args_is_help=True)

TEST_QUEUE = "channels-test"
"""The made-up request's queue (the config's queues are left as they are)."""
TEST_TOOL = "approval_broker_channel_test"
TEST_PROMPT = (
    "Test message from `approval-broker channels test`: the channel is wired up."
    " Nothing waits on this request and nobody needs to decide it."
)

T = TypeVar("T")


@dataclass
class TestDelivery:
    """One delivery of the made-up event (the notifier's `Task`, for one attempt)."""

    event: Event
    request: Request
    scratch: dict[str, Any] = field(default_factory=dict)

    def memo(self, key: str, make: Callable[[], T]) -> T:
        if key not in self.scratch:
            self.scratch[key] = make()
        value: T = self.scratch[key]
        return value

    def request_json(self) -> bytes | None:
        return None  # the sender builds it from `request`


@channels_app.command("test")
def channels_test(
    channel: Annotated[
        str, typer.Argument(metavar="KIND:NAME", help="The channel, as a queue names it.")
    ],
) -> None:
    """Post a sample card (a made-up request marked as a test, decided by nobody) to one
    channel through its real code, and print where it went or why it could not."""
    _, config = load_settings()
    problem = config.channel_problem(channel)
    if problem is not None:
        fail(f"{config.source}: {problem}")
    kind = channel.partition(":")[0]
    with clear_errors():
        check_installed(config)
    found = plugin(kind)
    if found.always_on:
        fail(f"{channel}: nothing to send (requests show in the web inbox, at /)")
    with tempfile.TemporaryDirectory(prefix="approval-broker-channels-test-") as scratch:
        with clear_errors():
            note = send_test(config, channel, Path(scratch))
    section = config.section(kind)
    where = section.describe(channel.partition(":")[2]) if section is not None else ""
    done = (note or "delivered").removeprefix(f"{REQUESTED}: ").removeprefix(REQUESTED).strip()
    if done.startswith("-> "):  # a webhook's note: what the endpoint answered
        done = "answered " + done.removeprefix("-> ")
    typer.echo(f"sent a test message to {channel}" + (f" ({where})" if where else "") + f": {done}")


def send_test(config: Config, channel: str, scratch: Path) -> str | None:
    """Deliver the made-up request's event to `channel`, on a throwaway Redis in `scratch`;
    the sender's note. Exits with the sender's one-line error when it can't."""
    from channels.retry import Defer, GiveUp, Retry
    from notifiers.host import NotifierHost
    from notifiers.options import NotifierOptions

    test_config = config.model_copy(
        update={"queues": {**config.queues, TEST_QUEUE: QueueConfig(channels=[channel])}}
    )
    redis = EmbeddedRedis(scratch / "redis", fsync="everysec").start()
    sender = None
    try:
        settings = Settings(redis_url=redis.local_url, data_dir=scratch, redis_cluster=False)
        prepare(settings, test_config)  # what the kinds make at a role's start (link secrets)
        broker = Broker.from_settings(settings, test_config)
        request = broker.create_request(
            NewRequest(
                tool_name=TEST_TOOL,
                args={"test": True, "sent_by": "approval-broker channels test"},
                prompt=TEST_PROMPT,
                queue=TEST_QUEUE,
            )
        )
        stamp = f"{int(time.time() * 1000)}-0"
        event = parse_entry(
            f"channels-test:{TEST_QUEUE}",
            TEST_QUEUE,
            stamp,
            {"type": REQUESTED, "request_id": request.id},
        )
        host = NotifierHost(broker, test_config, NotifierOptions(), "channels-test")
        sender = plugin(channel.partition(":")[0]).sender(channel, host)
        if not sender.wants(event):
            fail(f"{channel} takes no {REQUESTED} events (see its `events`)")
        try:
            return sender.deliver(TestDelivery(event, request))
        except (Retry, GiveUp, Defer) as exc:
            fail(f"{channel}: {one_line(str(exc))}")
    finally:
        if sender is not None:
            sender.close()
        redis.close()
