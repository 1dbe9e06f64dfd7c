"""`approval-broker notifier`: build the channels the config names and run the consumer loop."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING

import typer

from broker.domain.config import Config, Settings
from broker.domain.errors import ConfigError
from broker.facade import Broker
from notifiers.base import Channel
from notifiers.consumer import Notifier, default_name
from notifiers.delivery_state import DeliveryState
from notifiers.discord import DiscordChannel, discord_client
from notifiers.inbox import InboxChannel
from notifiers.mail import EmailChannel, smtp_target
from notifiers.options import NotifierOptions
from notifiers.retry import RetryPolicy
from notifiers.slack import SlackChannel, claim_stale_s, slack_client
from notifiers.telegram import TelegramChannel, telegram_client
from notifiers.webhook import WebhookChannel

if TYPE_CHECKING:  # the Agents SDK takes seconds to import: only a notifier with Teams does
    from notifiers.teams import TeamsCalls

GC_YOUNG = 10_000
"""Young objects before a collection (Python's default: 700). Nearly everything a delivery
makes is freed by refcount; at 700 the young collections and the older ones they fed were 61
ms of CPU per 10,000 deliveries (a `gc.callbacks` hook during `bench_notify.py`), at
10,000 16 ms, each collection a few ms."""


def used_channels(config: Config) -> list[str]:
    """Every channel some queue names, plus every webhook (any may be a request's callback)."""
    names = [c for q in config.queues.values() for c in q.channels]
    names += [f"webhook:{w}" for w in config.webhooks]
    return list(dict.fromkeys(names))


def check_config(config: Config) -> None:
    """What only the notifier uses of the config, checked before it connects anywhere."""
    if config.email is not None:
        try:
            smtp_target(config.email)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def build_channels(
    broker: Broker, config: Config, options: NotifierOptions, consumer: str
) -> dict[str, Channel]:
    """One Channel object per channel name in use, sharing clients where they can."""
    state = DeliveryState(broker)
    policy = RetryPolicy(options.max_attempts, options.backoff_s, options.max_backoff_s)
    slack = slack_client(config.slack, options.slack_timeout_s) if config.slack else None
    teams: TeamsCalls | None = None  # one Teams client, made when a channel needs it
    telegram = telegram_client(config.telegram, options.chat_timeout_s) if config.telegram else None
    discord = discord_client(config.discord, options.chat_timeout_s) if config.discord else None
    check_config(config)
    cards = {  # what every card channel (notifiers.cards) shares
        "broker": broker,
        "config": config,
        "state": state,
        "consumer": consumer,
        "policy": policy,
        "concurrency": min(options.workers, 4),
        "claim_stale_s": claim_stale_s(options.claim_idle_s, options.chat_timeout_s),
    }
    channels: dict[str, Channel] = {}
    for name in used_channels(config):
        kind, _, short = name.partition(":")
        if kind == "inbox":
            channels[name] = InboxChannel()
        elif kind == "webhook":
            channels[name] = WebhookChannel(
                name, config.webhooks[short], state, concurrency=options.workers
            )
        elif kind == "slack":
            assert config.slack is not None and slack is not None
            channels[name] = SlackChannel(
                name,
                config.slack.channels[short].channel,
                client=slack,
                broker=broker,
                config=config,
                state=state,
                consumer=consumer,
                policy=policy,
                concurrency=min(options.workers, 4),
                claim_stale_s=claim_stale_s(options.claim_idle_s, options.slack_timeout_s),
                timeout_s=options.slack_timeout_s,
            )
        elif kind == "teams":
            assert config.teams is not None
            from notifiers.teams import TeamsCalls, TeamsChannel  # the SDK: only where used

            teams = teams or TeamsCalls(config.teams, options.teams_timeout_s)
            channels[name] = TeamsChannel(
                name,
                config.teams.channels[short],
                calls=teams,
                broker=broker,
                config=config,
                state=state,
                consumer=consumer,
                policy=policy,
                concurrency=min(options.workers, 4),
                claim_stale_s=claim_stale_s(options.claim_idle_s, options.teams_timeout_s),
            )
        elif kind == "telegram":
            assert config.telegram is not None and telegram is not None
            chat_id = config.telegram.chats[short].chat_id
            channels[name] = TelegramChannel(name, chat_id, client=telegram, **cards)
        elif kind == "discord":
            assert config.discord is not None and discord is not None
            channel_id = config.discord.channels[short].channel_id
            channels[name] = DiscordChannel(name, channel_id, client=discord, **cards)
        elif kind == "email":
            assert config.email is not None
            channels[name] = EmailChannel(
                name,
                config.email.lists[short].to,
                email=config.email,
                broker=broker,
                config=config,
                state=state,
                policy=policy,
                concurrency=min(options.workers, 4),
                timeout_s=options.smtp_timeout_s,
            )
    return channels


def start_notifier(
    broker: Broker, options: NotifierOptions | None = None, *, name: str | None = None
) -> Notifier:
    """A running notifier on `broker` (for `up`, tests and benchmarks); call `.stop()` after."""
    options = options or NotifierOptions()
    name = name or options.name or default_name()
    channels = build_channels(broker, broker.config, options, name)
    return Notifier(broker, channels, options, name=name).start()


def run_notifier(settings: Settings, config: Config) -> None:
    """Run one notifier until SIGTERM or Ctrl-C, then finish what is in flight (briefly).

    A notifier whose bookkeeping broke stops itself; the process then exits with status 1, so
    a supervisor restarts it (its unacknowledged entries are reclaimed meanwhile).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    check_config(config)
    options = NotifierOptions()
    assert settings.redis_url, "the CLI fills in redis_url"
    broker = Broker.from_settings(settings, config, patient=True)
    broker.redis.ping()
    notifier = start_notifier(broker, options)
    gc.freeze()  # what start-up made lives for ever: full collections need not scan it again
    gc.set_threshold(GC_YOUNG, 10, 10)
    queues = ", ".join(sorted(config.queues))
    typer.echo(f"notifier {notifier.name} reading queues {queues}")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop.wait(0.5) and not notifier.failed.is_set():
            pass
    finally:
        typer.echo(f"notifier {notifier.name} stopping")
        notifier.stop()
        broker.redis.close()
    if notifier.failed.is_set():
        typer.echo(f"notifier {notifier.name} failed: {notifier.error}", err=True)
        raise typer.Exit(1)
