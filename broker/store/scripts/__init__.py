"""The Lua scripts behind every state change, loaded from the `.lua` files beside this module.

Each script is prefixed with `chain.lua` (the audit chain's append) and `lib.lua`, so the rules
for finishing and moving a request are written once. A call passes its keys in KEYS (built by
`broker.store.keys`) and everything else as one JSON argument; `Scripts.run` does that and hands
back the reply as text.

Scripts are called by SHA (EVALSHA) and loaded once: before the first call, and again on every
new connection (a reconnect may reach a restarted or failed-over Redis with an empty script
cache). A call on its own that still meets `NOSCRIPT` loads and repeats it (nothing ran). A call
queued in a pipeline is sent as is: redis-py's own `Script` objects would send `SCRIPT EXISTS`
before every pipeline, one round trip more on the hot path. Clients without a plain connection
pool (Redis Cluster, test doubles) keep redis-py's `Script` objects. A cluster pipeline refuses
EVALSHA, so a call given one runs at once on the cluster (routed by its keys, all of one slot).

Three steps take their arguments flat (`Scripts.run_flat`), not as one JSON object: the
notifier's batch steps (`commit.lua`, the committer's batch; `take_parked.lua`), whose long lists
would cost a JSON round on each side of every batch, and a live job's claim (`claim.lua`), two
words on its hot path. They are loaded and called like the others.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from importlib.resources import files
from typing import Any, Protocol

from redis import Redis
from redis.client import Pipeline
from redis.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from broker.redis.cluster import wait_for_replicas
from broker.redis.replies import as_str
from broker.store.coalesced import Coalesced
from broker.store.keys import Keys
from broker.store.script_keys import ScriptKeys


class StepArgs(Protocol):
    """What a step is run with: its KEYS and its one JSON argument (`ScriptKeys`, or the
    create step's `Prebuilt`)."""

    keys: list[str]

    def args(self, **values: Any) -> str: ...


NAMES = (
    "create", "decide", "escalate", "due", "sweep", "note", "ack", "remember", "receipt", "audit",
    "commit", "take_parked", "claim",
)  # fmt: skip
FLAT: dict[str, tuple[str, ...]] = {
    "commit": ("chain.lua", "commit.lua"),  # appends audit entries: the chain, without lib.lua
    "take_parked": ("take_parked.lua",),
    "claim": ("claim.lua",),  # a live job's claim of its completed round: no audit, no JSON
}
"""The steps that take flat KEYS and ARGV (`Scripts.run_flat`), with the files each is made of;
every other step is `chain.lua`, `lib.lua` (which decodes the one JSON argument) and its own."""
REPLICATED = ("create", "decide", "escalate", "sweep", "remember", "receipt")
"""On a cluster these steps wait for a replica (WAIT) before returning: a decision, a new round
and the outbox entry of a resume must survive a failover (`broker.redis.cluster.wait_for_replicas`)."""
log = logging.getLogger("broker.store.scripts")


@cache
def source(name: str) -> str:
    here = files(__package__)
    parts = FLAT.get(name) or ("chain.lua", "lib.lua", f"{name}.lua")  # the audit chain first
    return "\n".join((here / part).read_text() for part in parts)


@cache
def seal_source() -> str:
    """`seal.lua`, the step that stores the hashes `broker.audit.sealing` computed."""
    return (files(__package__) / "seal.lua").read_text()


def sha_of(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA1


class Scripts:
    """The scripts of one Redis client, called by SHA and (re)loaded on each new connection."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._sources = {name: source(name) for name in NAMES}
        self._shas = {name: sha_of(text) for name, text in self._sources.items()}
        self._loaded = False
        self._lock = threading.Lock()
        self._fallback: dict[str, Script] | None = None
        self.keys: Keys | None = None  # the Store's, so `note(args=...)` names keys alike
        self.coalesced = Coalesced()  # `arun`'s steps and the async reads beside them
        self._loader = _watch_connections(redis)
        if self._loader is None:
            self._fallback = {n: redis.register_script(t) for n, t in self._sources.items()}

    def run(
        self,
        name: str,
        keys: StepArgs,
        client: Any = None,
        extra_argv: Sequence[str] = (),
        **args: Any,
    ) -> list[Any]:
        """Run script `name` with `keys` and `args` (one JSON object); a list reply as text.

        With a pipeline as `client` the call is queued there and its reply comes from
        `execute()`, undecoded. `extra_argv` follows the JSON object as ARGV[2...] (create.lua's
        request fields, passed as they are rather than decoded from JSON).
        """
        argv = [keys.args(**args), *extra_argv]
        if isinstance(client, ClusterPipeline):
            client = None  # refused in a cluster pipeline: run now (callers read no reply)
        if self._fallback is not None:
            reply = self._fallback[name](keys=keys.keys, args=argv, client=client)
        else:
            reply = self._call(name, keys.keys, argv, client)
        if name in REPLICATED and isinstance(self._redis, RedisCluster) and keys.keys:
            self._replicate(keys.keys[0])
        if not isinstance(reply, list):
            return reply
        return [as_str(x) if isinstance(x, bytes) else x for x in reply]

    def run_flat(
        self, name: str, keys: Sequence[str], argv: Sequence[str | int], client: Any = None
    ) -> Any:
        """Run one of the `FLAT` steps with `keys` as KEYS and `argv` as ARGV, as they are; a
        list reply as text. A pipeline as `client` queues it, as in `run`."""
        if isinstance(client, ClusterPipeline):
            client = None
        if self._fallback is not None:
            reply = self._fallback[name](keys=keys, args=argv, client=client)
        else:
            reply = self._call(name, list(keys), list(argv), client)
        if not isinstance(reply, list):
            return reply
        return [as_str(x) if isinstance(x, bytes) else x for x in reply]

    @property
    def loaded(self) -> bool:
        """Whether the scripts are known loaded on this client (else the next sync call loads
        them first: an asyncio caller queuing one in a MULTI calls `load` off its loop first)."""
        return self._loaded or (self._loader is not None and self._loader.loaded)

    @property
    def runs_async(self) -> bool:
        """Can `arun` run these scripts: a single Redis called by SHA (a cluster's steps wait
        for a replica, a test double keeps redis-py's `Script`s: both only sync)."""
        return self._fallback is None

    async def arun(self, name: str, keys: ScriptKeys, client: Any, **args: Any) -> list[Any]:
        """`run` on `client`, a redis.asyncio client on the same single Redis: the same call,
        awaited. A script cache without it (a restarted Redis) gets it loaded, then the call
        again (nothing ran)."""
        argv = [keys.args(**args)]
        sha = self._shas[name]
        try:  # with the other commands of this pass of the loop (`broker.store.coalesced`)
            reply = await self.coalesced.send(
                client, "evalsha", sha, len(keys.keys), *keys.keys, *argv
            )
        except NoScriptError:
            await client.script_load(self._sources[name])
            reply = await client.evalsha(sha, len(keys.keys), *keys.keys, *argv)
        if not isinstance(reply, list):
            return reply
        return [as_str(x) if isinstance(x, bytes) else x for x in reply]

    def _replicate(self, key: str) -> None:
        """Wait for one replica of `key`'s master. None in time is logged, not raised: the step
        has happened, and refusing it now would only make its caller retry a done step. A master
        that failed over meanwhile raises `FailedOver` (503): the write may be gone."""
        acked = wait_for_replicas(self._redis, key, strict=False)
        if acked < 1:
            log.warning("no replica acknowledged a write beside %s in time", key)

    def _call(self, name: str, keys: list[str], argv: list[Any], client: Any) -> Any:
        if not self._loaded:
            if self._loader is not None and self._loader.loaded:
                self._loaded = True  # another Broker on this client loaded them
            else:
                self.load()
        target = self._redis if client is None else client
        sha = self._shas[name]
        if isinstance(target, Pipeline):  # queued, sent later
            return target.evalsha(sha, len(keys), *keys, *argv)
        try:
            return target.evalsha(sha, len(keys), *keys, *argv)
        except NoScriptError:  # the cache was flushed under a live connection: nothing ran
            self.load()
            return target.evalsha(sha, len(keys), *keys, *argv)

    def load(self) -> None:
        """SCRIPT LOAD every script in one round trip (idempotent: the SHA is the content's)."""
        with self._lock:
            pipe = self._redis.pipeline(transaction=False)
            for text in self._sources.values():
                pipe.script_load(text)
            pipe.execute()
            self._loaded = True
            if self._loader is not None:
                self._loader.loaded = True

    def note(
        self,
        request_id: str | None = None,
        entry: str | None = None,
        *,
        keys: Keys | None = None,
        args: list[str] | None = None,
        client: Any = None,
    ) -> Any:
        """Append a history entry (JSON text) to a request: `broker.add_history` is the way in.

        Also takes the old call form `args=[prefix, request_id, entry]` that notifier code uses.
        """
        if args is not None:
            prefix, request_id, entry = args
            keys = Keys(prefix) if self.keys is None else replace(self.keys, prefix=prefix)
        if keys is None or request_id is None or entry is None:
            raise TypeError("note needs keys, a request id and an entry")
        return self.run("note", keys.note_keys(request_id), client=client, entry=entry)


class _Loader:
    """Sets up each connection of one client as it (re)connects: redis-py's own handshake, then
    every script loaded. One per client, so a Broker made per job on a shared client adds
    nothing; `loaded` says some Broker on the client has loaded them already."""

    def __init__(self) -> None:
        self.loaded = False

    def __call__(self, connection: Any) -> None:
        connection.on_connect()
        try:
            for name in NAMES:
                connection.send_command("SCRIPT", "LOAD", source(name))
            for _ in NAMES:
                connection.read_response()
        except Exception:
            connection.disconnect()  # not half set up: the next command connects again
            raise


_CONNECT_FUNC = "redis_connect_func"


def _watch_connections(redis: Any) -> _Loader | None:
    """Load the scripts on every connection `redis` makes from now on; None if it can't.

    Through redis-py's `redis_connect_func` connection option (what a connection runs instead
    of its handshake, after each (re)connect, before the command that needed it), set in the
    client's connection options as redis-py's own `set_retry` sets its retry. Connections
    already open need nothing: the first call loads the scripts into Redis (`Scripts.load`).
    """
    if type(redis) is not Redis:
        return None
    options: dict[str, Any] = redis.get_connection_kwargs()
    current = options.get(_CONNECT_FUNC)
    if isinstance(current, _Loader):
        return current
    if current is not None:  # someone else's set-up: leave it, use redis-py's `Script`s
        return None
    loader = _Loader()
    options[_CONNECT_FUNC] = loader
    return loader
