"""What a run keeps in Redis between attempts of a round: its history and where it stands.

The runner (`broker.runs.agent_runner`) saves a `Pause` before each step that may run tools and
after the tools returned, and when the round pauses on deferred calls; a retried job reads it
back to continue without running a tool twice. This module only says what is kept and how it
is written; it never reads Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from broker.domain.models import NewRequest

WAITING = "waiting"
"""Stage of a pause: the history ends in the round's deferred calls, registered as `calls`."""
TOOLS = "tools"
"""Stage of a round whose tools may be running: nothing to continue from."""
CONTINUE = "continue"
"""Stage of a round whose tools have returned: `messages` is the checkpoint to continue from."""


@dataclass
class Pause:
    """What a run keeps in Redis between attempts: the history so far and where it stands.

    `stage` is WAITING (paused on round `round`'s `calls`), TOOLS (round `round`'s tools may be
    running) or CONTINUE (round `round`'s tools returned; continue from `messages`).
    """

    round: int
    messages: list[Any]
    calls: list[dict[str, Any]] = field(default_factory=list)
    stage: str = WAITING
    worker: str = ""  # TOOLS: the worker process taking the step (`host:pid`), for the error

    def dump(self) -> bytes:
        return json.dumps(
            {
                "round": self.round,
                "stage": self.stage,
                "messages": self.messages,
                "calls": self.calls,
                **({"worker": self.worker} if self.worker else {}),
            }
        ).encode()

    @classmethod
    def load(cls, raw: bytes | None) -> Pause | None:
        if not raw:
            return None
        data = json.loads(raw)
        if not isinstance(data, dict) or "round" not in data:
            return None  # not written by this module
        return cls(
            int(data["round"]),
            data.get("messages") or [],
            data.get("calls") or [],
            str(data.get("stage") or WAITING),
            str(data.get("worker") or ""),
        )

    def history(self) -> list[ModelMessage]:
        return ModelMessagesTypeAdapter.validate_python(self.messages)

    def requests(self) -> list[NewRequest]:
        return [NewRequest.model_validate(c) for c in self.calls]


def json_messages(messages: list[ModelMessage]) -> list[Any]:
    loaded: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
    return loaded
