"""The Lua scripts behind every state change, loaded from the `.lua` files beside this module.

Scripts that change a request's state are prefixed with `lib.lua`, so the rules for finishing
and moving a request are written once.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from redis import Redis
from redis.commands.core import Script

_WITH_LIB = ("decide", "escalate", "sweep", "note")


@cache
def source(name: str) -> str:
    here = files(__package__)
    text = (here / f"{name}.lua").read_text()
    if name in _WITH_LIB:
        text = (here / "lib.lua").read_text() + "\n" + text
    return text


class Scripts:
    """The registered scripts of one Redis client (EVALSHA, falling back to EVAL on a restart)."""

    def __init__(self, redis: Redis) -> None:
        self.create: Script = redis.register_script(source("create"))
        self.decide: Script = redis.register_script(source("decide"))
        self.escalate: Script = redis.register_script(source("escalate"))
        self.sweep: Script = redis.register_script(source("sweep"))
        self.note: Script = redis.register_script(source("note"))
