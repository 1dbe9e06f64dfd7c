"""The commands of one pass of an event loop, sent to Redis as one pipeline.

A busy API reads the request of each decision it is asked for (`Decisions.aread`, one HGETALL),
then runs its decide step (one EVALSHA). A redis.asyncio command alone costs about a tenth of a
webhook reply's CPU (the pool's connection, the timeout around the send, the reply's parse),
and the replies of a burst arrive together: each command was its own round trip. Here the
commands the loop's tasks ask for before it next looks at its sockets go out together
(`pipeline(transaction=False)`: each command is atomic on its own, a read or one Lua step, and
none needs another's), and each caller gets its own reply or its own error (a NOSCRIPT too:
`Scripts.arun` loads the script and calls again). A command alone goes out as a plain command.
Nothing waits for company: the batch is sent as soon as the tasks that were ready have run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

Pending = list[tuple[str, tuple[Any, ...], asyncio.Future[Any]]]


class Coalesced:
    """Commands on redis.asyncio clients, coalesced per client and pass of its loop."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[Any, Pending]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def hgetall(self, client: Any, key: str) -> Any:
        """The hash at `key`."""
        return await self.send(client, "hgetall", key)

    async def send(self, client: Any, command: str, *args: Any) -> Any:
        """`client.<command>(*args)`, sent with whatever else this pass of the loop sends on
        `client`; its reply, or its error raised."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._batch(client, loop).append((command, args, done))
        return await done

    async def send_all(
        self, client: Any, commands: Sequence[tuple[str, tuple[Any, ...]]]
    ) -> list[Any]:
        """Several commands of one caller (a run's hash and its pending set), in the same
        pipeline as the rest of this pass of the loop; their replies in order, or the first
        error raised."""
        loop = asyncio.get_running_loop()
        batch = self._batch(client, loop)
        futures: list[asyncio.Future[Any]] = []
        for command, args in commands:
            futures.append(loop.create_future())
            batch.append((command, args, futures[-1]))
        try:
            await asyncio.wait(futures)
        finally:
            for done in futures:  # the caller went away: `_run` leaves them alone
                done.cancel()
        errors = [done.exception() for done in futures]  # each looked at, so none is logged
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [done.result() for done in futures]

    def _batch(self, client: Any, loop: asyncio.AbstractEventLoop) -> Pending:
        """This pass's commands on `client`, sent once the tasks ready now have run."""
        found = self._pending.get(id(client))
        if found is None:
            found = self._pending[id(client)] = (client, [])
            loop.call_soon(self._send, id(client), loop)
        return found[1]

    def _send(self, ident: int, loop: asyncio.AbstractEventLoop) -> None:
        client, batch = self._pending.pop(ident)
        task = loop.create_task(_run(client, batch))  # not a caller's: it may go away
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)


async def _run(client: Any, batch: Pending) -> None:
    replies: list[Any]
    try:
        if len(batch) == 1:
            command, args, _ = batch[0]
            replies = [await getattr(client, command)(*args)]
        else:
            pipe = client.pipeline(transaction=False)
            for command, args, _ in batch:
                getattr(pipe, command)(*args)
            replies = await pipe.execute(raise_on_error=False)
    except Exception as exc:  # noqa: BLE001 - every caller gets the error of its command
        replies = [exc] * len(batch)
    for (_, _, done), reply in zip(batch, replies, strict=True):
        if done.done():  # its caller went away
            continue
        if isinstance(reply, BaseException):
            done.set_exception(reply)
        else:
            done.set_result(reply)
