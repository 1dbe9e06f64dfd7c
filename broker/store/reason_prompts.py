"""Reason prompts: a Reject waiting for its reason, on a platform that asks for it in a reply.

Telegram has no dialog: a click on Reject posts a "why?" message (ForceReply), and the clicker's
reply to it gives the reason. Between the two, the prompt (`{chat}:{message}`) is kept here with
the request id and the user who clicked, for a while (`Keys.reason_prompt`). This module only
keeps and reads that record; it never decides (the reply goes to the judge like any other).
"""

from __future__ import annotations

import json
from typing import Any

from broker.store.handles import Store


class ReasonPrompts:
    """The pending reason prompts of every platform (`broker.reason_prompts` on the facade)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def keep(self, platform: str, prompt: str, record: dict[str, Any], ttl_s: int) -> None:
        """Keep `record` (JSON) for the prompt `prompt` of `platform`, `ttl_s` seconds."""
        key = self.store.keys.reason_prompt(platform, prompt)
        self.store.redis.set(key, json.dumps(record), ex=ttl_s)

    def read(self, platform: str, prompt: str) -> dict[str, Any] | None:
        """The record kept for the prompt, or None (never asked, or expired)."""
        raw = self.store.redis.get(self.store.keys.reason_prompt(platform, prompt))
        if raw is None:
            return None
        record = json.loads(raw)
        return record if isinstance(record, dict) else None

    def drop(self, platform: str, prompt: str) -> None:
        """Forget the prompt (its reason was given)."""
        self.store.redis.delete(self.store.keys.reason_prompt(platform, prompt))
