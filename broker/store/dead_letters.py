"""Dead letters: what could not be handled, with its cause, kept for people to see and redrive.

A letter that came from a stream entry keeps that entry's fields (`f.NAME`) and the stream's
name, so `redrive` can put exactly that entry back.
"""

from __future__ import annotations

from broker.domain.errors import InvalidInput, NotFound
from broker.domain.models import utcnow
from broker.redis.replies import as_fields, as_str, as_str_dict
from broker.store.handles import Store


class DeadLetters:
    def __init__(self, store: Store) -> None:
        self.store = store

    def dead_letter(
        self,
        source: str,
        error: str,
        *,
        stream: str | None = None,
        entry: dict[str, str] | None = None,
        extra: dict[str, str] | None = None,
    ) -> str:
        """Record something that could not be handled, with its cause; returns the letter's id.

        `stream` and `entry` name the stream entry it came from, so `redrive` can put it back.
        """
        fields = {
            "source": source,
            "error": error[:2000],
            "at": utcnow().isoformat(),
            **(extra or {}),
        }
        if stream:
            fields["stream"] = stream
        for k, v in (entry or {}).items():
            fields[f"f.{k}"] = v
        letter = self.store.redis.xadd(
            self.store.keys.dead_letters,
            as_fields(fields),
            maxlen=self.store.maxlen,
            approximate=True,
        )
        return as_str(letter)

    def redrive(self, entry_id: str) -> bool:
        """Put a dead letter that came from a stream back on that stream, and drop the letter."""
        key = self.store.keys.dead_letters
        rows = self.store.redis.xrange(key, entry_id, entry_id)
        if not rows:
            raise NotFound(f"no dead letter {entry_id!r}")
        fields = as_str_dict(rows[0][1])
        stream = fields.pop("stream", None)
        if not stream:
            raise InvalidInput(
                f"dead letter {entry_id} did not come from a stream; it can't be re-driven"
            )
        original = {k.removeprefix("f."): v for k, v in fields.items() if k.startswith("f.")}
        pipe = self.store.redis.pipeline()
        pipe.xadd(stream, as_fields(original))
        pipe.xdel(key, entry_id)
        pipe.execute()
        return True

    def dead_letters(self, count: int = 100) -> list[tuple[str, dict[str, str]]]:
        """The oldest `count` letters, as (id, fields)."""
        rows = self.store.redis.xrange(self.store.keys.dead_letters, count=count)
        return [(as_str(eid), as_str_dict(f)) for eid, f in rows or [] if eid is not None]
