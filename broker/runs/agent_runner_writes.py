"""The writes of one attempt at a round: each step of the round one MULTI, in order.

Why a module of its own: the runner (`broker.runs.agent_runner`) and the tool guard
(`broker.runs.tool_guard`) write the same run at different moments of one attempt, and every
write must carry what the ones before it left out: the run's `running` status (not written
until the attempt's first write), the log entry of the messages added since the last write
(`broker.runs.pause.RunLog`), and the `Pause` the run now stands at. One object keeps that for
the attempt, so each step is one round trip:

* a tool step's marker (stage TOOLS) goes out with the first tool with effects that starts,
  in the MULTI that counts it as started (and spends its receipt): a step none of whose tools
  has effects writes nothing;
* the checkpoint after a step's tools returned (stage CONTINUE) is sent *ahead*: the model's
  next call starts while Redis commits it, and the next write (or the end of the attempt)
  waits for it first, so writes never overtake one another;
* before a model call, an attempt that has not written yet sends `running` ahead the same way.

Writes from the agent's coroutine go on the loop's own redis.asyncio client
(`broker.runs.agent_loop.loop_client`) on a single Redis, else to a thread
(`broker.runs.agent_loop.off_loop`): never blocking the loop. `write` and `awrite` build their
MULTI with one core (`_begin`, the store's `queue_step`); the run's end goes the same way
(`finish`, on the store's `queue_update`). The pause and its round are written on the job's
thread.

A Redis that restarted or failed over may know no scripts while a connection opened before is
still in use (scripts are not replicated): a step's script (a receipt's spend) then meets
NOSCRIPT inside the MULTI, where the commands before it ran and it did not. The scripts are
loaded and the step is taken again, once: a step taken again writes the same (the log's LTRIM
to what the step stands on, the same stage and fields) and its script runs this time.

A master that failed over before its replica had a step loses that step's log entry, though it
acknowledged it (a run's steps wait for no replica). Each step's MULTI reads the log's length
first; a log shorter than this attempt wrote it is written again whole, as one entry of the
history the attempt holds, with the stage standing on it (`_lost`, `_whole`): else the stage
named entries the log no longer had, and the run could not be read again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pydantic_ai.messages import ModelMessage
from redis.exceptions import NoScriptError

from broker.domain.models import RunStatus
from broker.facade import Broker
from broker.redis.cluster import wait_for_replicas
from broker.runs.agent_loop import loop_client, off_loop
from broker.runs.pause import STAGE_FIELD, Pause, RunLog

logger = logging.getLogger("broker.runs.agent_runner_writes")

Extra = Callable[[Any], Any]
"""Queues more commands on a step's MULTI, after the run's own (a tool counted, a receipt).
On a Redis Cluster it is given the client instead, and runs them at once (its reply counts)."""


class RoundWrites:
    """One attempt's writes of run `run_id`, starting from what its log holds (`log`)."""

    def __init__(self, broker: Broker, run_id: str, log: RunLog, *, running: bool) -> None:
        self.broker = broker
        self.run_id = run_id
        self.log = log
        self.running = running
        """Whether the run's hash already says `running` (else the next write says it)."""
        self._ahead: asyncio.Task[list[Any]] | None = None
        self._lock: asyncio.Lock | None = None

    def _begin(
        self,
        pause: Pause | None,
        messages: list[ModelMessage] | None,
        fields: dict[str, str] | None,
    ) -> tuple[dict[str, str], bytes | None]:
        """What a step writes (the one core of `write` and `awrite`): the run hash's fields
        (`pause`, standing at `messages`; `running` if not yet; `fields`) and the log entry of
        `messages`' new ones (None: none)."""
        entry = None
        mapping: dict[str, str] = dict(fields or {})
        if not self.running:
            mapping["status"] = RunStatus.running.value
        if pause is not None:
            if messages is not None:
                entry = self.log.entry_for(messages)
                pause.messages = len(messages)
            pause.log = self.log.written(entry, pause.messages)
            mapping[STAGE_FIELD] = pause.dump()
        return mapping, entry

    def _end(self, pause: Pause | None) -> None:
        """The step is in: the log now holds what `pause` says, the hash says `running`."""
        if pause is not None:
            self.log = pause.log
        self.running = True

    def write(
        self,
        pause: Pause | None,
        messages: list[ModelMessage] | None = None,
        *,
        extra: Extra | None = None,
        fields: dict[str, str] | None = None,
    ) -> list[Any]:
        """One step, now, on this thread: `pause` (standing at `messages`, whose new ones are
        appended to the log) into the run's hash, `running` if not yet, `fields`, then `extra`'s
        commands, in one MULTI; returns the replies of `extra`'s commands."""
        mapping, entry = self._begin(pause, messages, fields)
        try:
            length, replies = self._send(mapping, entry, extra)
        except NoScriptError:  # Redis forgot its scripts: see the module docstring
            self.broker.store.scripts.load()
            length, replies = self._send(mapping, entry, extra)
        if self._lost(pause, messages, length):
            mapping, entry = self._whole(pause, messages, fields)
            self._send(mapping, entry, None)
        self._end(pause)
        return replies

    def _send(
        self, mapping: dict[str, str], entry: bytes | None, extra: Extra | None
    ) -> tuple[int, list[Any]]:
        """`write`'s MULTI on this thread's client: the log's length before it, and the replies
        of `extra`'s commands."""
        store = self.broker.run_store
        redis = self.broker.redis
        with redis.pipeline(transaction=True) as pipe:
            store.queue_step(pipe, self.run_id, mapping, entry=entry, after=self.log.entries)
            own = len(pipe)
            if self.broker.store.clustered and extra is not None:
                # a cluster runs a step's script at once, not in a MULTI: after the stage
                return int(pipe.execute()[0]), [extra(redis)]
            if extra is not None:
                extra(pipe)
            replies = pipe.execute()
            return int(replies[0]), list(replies[own:])

    def _lost(self, pause: Pause | None, messages: list[ModelMessage] | None, length: int) -> bool:
        """Whether the log held fewer entries than this attempt wrote (`length`, before the
        step): Redis lost writes it had acknowledged, as a master that failed over before its
        replica had them does. The step just written then stands on entries that are gone."""
        if length >= self.log.entries or pause is None or messages is None:
            return False
        logger.warning(
            "run %s: its log had %d entries where %d were written (Redis lost acknowledged "
            "writes); it is written again whole",
            self.run_id, length, self.log.entries,
        )  # fmt: skip
        return True

    def _whole(
        self,
        pause: Pause | None,
        messages: list[ModelMessage] | None,
        fields: dict[str, str] | None,
    ) -> tuple[dict[str, str], bytes | None]:
        """The step again, standing on a log of one entry: the whole history, which the
        attempt holds (`_begin` on an empty log)."""
        self.log = RunLog()
        return self._begin(pause, messages, fields)

    @property
    def on_loop(self) -> bool:
        """Whether steps from the agent's coroutine go on the loop's asyncio client: on a
        single Redis (a cluster's steps, and a test double's, stay sync, in a thread)."""
        store = self.broker.store
        return store.scripts.runs_async and not store.clustered

    async def awrite(
        self,
        pause: Pause | None,
        messages: list[ModelMessage] | None = None,
        *,
        extra: Extra | None = None,
    ) -> list[Any]:
        """`write` on the running loop's asyncio client (`on_loop` only): the same MULTI,
        awaited, so no thread hop. A script among `extra`'s commands must be loaded already
        (`ReceiptChecks.acheck` sees to it): loading is sync."""
        mapping, entry = self._begin(pause, messages, None)
        try:
            length, replies = await self._asend(mapping, entry, extra)
        except NoScriptError:  # Redis forgot its scripts: see the module docstring
            await off_loop(self.broker.store.scripts.load)
            length, replies = await self._asend(mapping, entry, extra)
        if self._lost(pause, messages, length):
            mapping, entry = self._whole(pause, messages, None)
            await self._asend(mapping, entry, None)
        self._end(pause)
        return replies

    async def _asend(
        self, mapping: dict[str, str], entry: bytes | None, extra: Extra | None
    ) -> tuple[int, list[Any]]:
        """`awrite`'s MULTI on the loop's client: as `_send`."""
        client = loop_client(self.broker.redis)
        async with client.pipeline(transaction=True) as pipe:
            self.broker.run_store.queue_step(
                pipe, self.run_id, mapping, entry=entry, after=self.log.entries
            )
            own = len(pipe)
            if extra is not None:
                extra(pipe)
            replies = await pipe.execute()
            return int(replies[0]), list(replies[own:])

    async def step(
        self,
        pause: Pause | None,
        messages: list[ModelMessage] | None = None,
        *,
        extra: Extra | None = None,
        prepare: Callable[[], Extra] | None = None,
    ) -> list[Any]:
        """`write` from the agent's coroutine, after the writes sent ahead: on the loop's
        asyncio client (`on_loop`), else in a thread. `prepare`, when given, runs first in a
        thread and gives `extra` (what it raises, the step does not write): a receipt's check
        and spend (a script) stay sync."""
        await self.drain()
        async with self._locked():
            if prepare is None and self.on_loop:
                return await self.awrite(pause, messages, extra=extra)

            def in_thread() -> list[Any]:
                return self.write(pause, messages, extra=prepare() if prepare else extra)

            return await off_loop(in_thread)

    def ahead(self, pause: Pause | None, messages: list[ModelMessage] | None = None) -> None:
        """Send a step now and let the coroutine go on; the next write waits for it."""
        before = self._ahead

        async def send() -> list[Any]:
            if before is not None:
                await before
            async with self._locked():
                if self.on_loop:
                    return await self.awrite(pause, messages)
                return await off_loop(lambda: self.write(pause, messages))

        self._ahead = asyncio.ensure_future(send())

    async def drain(self, *, quiet: bool = False) -> None:
        """Wait for the writes sent ahead, if any (`quiet`: an error of theirs is dropped, as
        when the attempt already fails for another reason)."""
        if self._ahead is None:
            return
        try:
            await self._ahead
        except Exception:
            if not quiet:
                raise

    async def finish(self, rounds: int, output: str) -> None:
        """The run's end, from the agent's coroutine once the writes sent ahead are in:
        `finished` with `output` (JSON), kept `retention_s`, announced to its long-polls; on the
        loop's client (`on_loop`), else in a thread. The store's `queue_update` is the core."""
        await self.drain()
        fields: dict[str, Any] = {"status": RunStatus.finished, "output": output, "error": ""}
        async with self._locked():
            if not self.on_loop:
                await off_loop(lambda: self._finish_sync(rounds, fields))
                return
            client = loop_client(self.broker.redis)
            async with client.pipeline(transaction=True) as pipe:
                self.broker.run_store.queue_update(pipe, self.run_id, rounds=rounds, **fields)
                await pipe.execute()

    def _finish_sync(self, rounds: int, fields: dict[str, Any]) -> None:
        """`finish` on this thread's client. On a cluster it waits for a replica, as a run's
        start does: the run's end is the last write of its attempt, so no later step would
        find it lost, and a run whose master failed over just after would stay `running`."""
        self.broker.run_store.update_run(self.run_id, rounds=rounds, **fields)
        if self.broker.store.clustered:
            wait_for_replicas(self.broker.redis, self.broker.keys.run(self.run_id), strict=False)

    @property
    def says_running(self) -> bool:
        """Whether the run's hash says `running`, or a write on its way (ahead) will."""
        return self.running or self._ahead is not None

    def _locked(self) -> asyncio.Lock:
        if self._lock is None:  # made on the loop that runs the agent
            self._lock = asyncio.Lock()
        return self._lock
