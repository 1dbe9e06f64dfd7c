"""The Lua scripts behind every state change, loaded from the `.lua` files beside this module.

Each script is prefixed with `lib.lua`, so the rules for finishing and moving a request are
written once. A call passes its keys in KEYS (built by `broker.keys`) and everything else as one
JSON argument; `Scripts.run` does that and hands back the reply as text.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

from redis import Redis
from redis.commands.core import Script

from broker.keys import Keys, ScriptKeys
from broker.text import as_str

NAMES = ("create", "decide", "escalate", "due", "sweep", "note", "ack", "remember")


@cache
def source(name: str) -> str:
    here = files(__package__)
    return (here / "lib.lua").read_text() + "\n" + (here / f"{name}.lua").read_text()


class Scripts:
    """The registered scripts of one Redis client (EVALSHA, falling back to EVAL on a restart)."""

    def __init__(self, redis: Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: redis.register_script(source(name)) for name in NAMES
        }

    def run(self, name: str, keys: ScriptKeys, client: Any = None, **args: Any) -> list[Any]:
        """Run script `name` with `keys` and `args` (one JSON object); a list reply as text.

        With a pipeline as `client` the call is queued there and its reply comes from
        `execute()`, undecoded.
        """
        reply = self._scripts[name](keys=keys.keys, args=[keys.args(**args)], client=client)
        if not isinstance(reply, list):
            return reply
        return [as_str(x) if isinstance(x, bytes) else x for x in reply]

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
            keys = Keys(prefix)
        if keys is None or request_id is None or entry is None:
            raise TypeError("note needs keys, a request id and an entry")
        return self.run("note", keys.note_keys(request_id), client=client, entry=entry)
