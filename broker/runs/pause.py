"""What a run keeps in Redis between attempts of a round: where it stands, and its history.

The runner (`broker.runs.agent_runner`) writes a `Pause` in the run's hash (field `stage`)
before the first tool with effects of a step starts, after a step's tools returned, and when
the round pauses on deferred calls; a retried job reads it back to continue without running a
tool twice. The history itself is the run's log (`broker.store.run_state`): each write appends
only the messages added since the last one (one JSON array per write), so a step costs what it
added, not the whole conversation again. `RunLog` says what the log holds and builds the
write's new entry. This module never reads Redis.

A run paused before the log existed kept its whole history in one string
(`Keys.run_messages`, with the stage inside it): `Pause.load` reads that too, and the next
write of such a run puts its whole history in the log.
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
"""Stage of a round whose tools have returned: the history is the checkpoint to continue from."""
STAGE_FIELD = "stage"
"""The run-hash field holding the `Pause` (JSON, without the history)."""


@dataclass
class RunLog:
    """What of a run's history its log holds: its first `entries` entries, `messages` messages.

    A write appends the messages past `messages` as one entry, after cutting the log to its
    first `entries` (so a write taken again, or after an attempt that died, appends the same).
    """

    entries: int = 0
    messages: int = 0

    def entry_for(self, messages: list[ModelMessage]) -> bytes | None:
        """The log entry holding `messages` past those the log has (None: nothing new)."""
        if len(messages) <= self.messages:
            return None
        return ModelMessagesTypeAdapter.dump_json(messages[self.messages :])

    def written(self, entry: bytes | None, messages: int) -> RunLog:
        """The log once a write appending `entry` (if any) stood at `messages` messages."""
        return RunLog(self.entries + (entry is not None), max(messages, self.messages))


@dataclass
class Pause:
    """Where a run stands between attempts, and the history it stands on.

    `stage` is WAITING (paused on round `round`'s `calls`), TOOLS (round `round`'s tools may be
    running; `applies`: that step applies the round's outcomes) or CONTINUE (round `round`'s
    tools returned; continue from the history). `messages`: how many messages that history has, in
    the first `log.entries` entries of the log (`history_json`: them, as one JSON array, once
    read).
    """

    round: int
    stage: str = WAITING
    calls: list[dict[str, Any]] = field(default_factory=list)
    worker: str = ""  # TOOLS: the worker process taking the step (`host:pid`), for the error
    applies: bool = False
    messages: int = 0
    log: RunLog = field(default_factory=RunLog)
    history_json: bytes = b"[]"
    kept: list[ModelMessage] | None = field(default=None, repr=False, compare=False)
    """The history as this process still has it (a live job going on with the messages it
    paused on): `history` gives them without a trip through JSON."""

    def dump(self) -> str:
        """The `stage` field: everything but the history."""
        return json.dumps(
            {
                "round": self.round,
                "stage": self.stage,
                "messages": self.messages,
                "entries": self.log.entries,
                **({"calls": self.calls} if self.calls else {}),
                **({"worker": self.worker} if self.worker else {}),
                **({"applies": True} if self.applies else {}),
            }
        )

    @classmethod
    def read(cls, fields: dict[str, str], log: list[bytes], legacy: bytes | None) -> Pause | None:
        """The pause a run's hash names, with its history from the log; else one kept the old
        way (`legacy`, the whole history in one string); None when the run has neither."""
        raw = fields.get(STAGE_FIELD)
        if not raw:
            return cls.load(legacy)
        data = json.loads(raw)
        entries = int(data.get("entries") or 0)
        if entries > len(log):
            raise ValueError(f"the run's log has {len(log)} entries, its stage needs {entries}")
        parts = [e[1:-1] for e in log[:entries] if len(e) > 2]
        messages = int(data.get("messages") or 0)
        return cls(
            int(data["round"]),
            str(data.get("stage") or WAITING),
            data.get("calls") or [],
            str(data.get("worker") or ""),
            bool(data.get("applies")),
            messages,
            RunLog(entries, messages),
            b"[" + b",".join(parts) + b"]",
        )

    @classmethod
    def load(cls, raw: bytes | None) -> Pause | None:
        """A pause kept the old way: one JSON object holding the whole history. The log holds
        none of it (`log` is empty), so the next write puts all of it there."""
        if not raw:
            return None
        data = json.loads(raw)
        if not isinstance(data, dict) or "round" not in data:
            return None  # not written by this module
        messages = data.get("messages") or []
        calls = data.get("calls") or []
        return cls(
            int(data["round"]),
            str(data.get("stage") or WAITING),
            calls,
            str(data.get("worker") or ""),
            bool(calls) and data.get("stage") == TOOLS,  # its marker kept the calls it applied
            len(messages),
            RunLog(),
            json.dumps(messages).encode(),
        )

    def history(self) -> list[ModelMessage]:
        if self.kept is not None:
            return list(self.kept)
        return ModelMessagesTypeAdapter.validate_json(self.history_json)

    def requests(self) -> list[NewRequest]:
        return [NewRequest.model_validate(c) for c in self.calls]
