"""Consumer-group plumbing shared by the outbox (resumers) and the notifier streams."""

from __future__ import annotations

from redis import Redis
from redis.exceptions import ResponseError


def ensure_group(redis: Redis, stream: str, group: str) -> None:
    """Create `group` on `stream` (and the stream) unless it exists."""
    try:
        redis.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def ack_and_delete(redis: Redis, stream: str, group: str, entry_id: str) -> None:
    """Acknowledge an entry and drop it from the stream, in one MULTI/EXEC.

    Dropping only acknowledged entries keeps a stream small without ever trimming an entry a
    consumer still holds.
    """
    pipe = redis.pipeline()
    pipe.xack(stream, group, entry_id)
    pipe.xdel(stream, entry_id)
    pipe.execute()
