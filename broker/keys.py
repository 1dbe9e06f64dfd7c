"""The Redis key schema, in one place. Every key the broker touches is named here.

Lua scripts build the same names from the prefix they are given; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass

NOTIFIER_GROUP = "notifiers"
RESUMER_GROUP = "resumers"


@dataclass(frozen=True)
class Keys:
    prefix: str = "ab:"

    def request(self, request_id: str) -> str:
        """Hash: one request's fields (JSON for structured ones)."""
        return f"{self.prefix}req:{request_id}"

    @property
    def expiry(self) -> str:
        """ZSET: pending request ids scored by when they expire; also the index of pending ones."""
        return f"{self.prefix}expiry"

    @property
    def requests(self) -> str:
        """ZSET: request ids scored by their last change (creation or outcome), for listings."""
        return f"{self.prefix}requests"

    def stream(self, queue: str) -> str:
        """Stream: events of one handler queue, read by the notifier consumer group."""
        return f"{self.prefix}stream:{queue}"

    @property
    def resumes(self) -> str:
        """Stream: the outbox of runs whose round is fully answered, read by resumers."""
        return f"{self.prefix}resumes"

    @property
    def dead_letters(self) -> str:
        """Stream: deliveries or entries that could not be handled, with their error."""
        return f"{self.prefix}dead-letters"

    def run(self, run_id: str) -> str:
        """Hash: a run's status, round, agent, output or error."""
        return f"{self.prefix}run:{run_id}"

    def run_pending(self, run_id: str) -> str:
        """Set: request ids of the run's current round that still wait for an outcome."""
        return f"{self.prefix}run:{run_id}:pending"

    def run_round(self, run_id: str, round_no: int) -> str:
        """List: request ids created in one round of a run, in call order."""
        return f"{self.prefix}run:{run_id}:round:{round_no}"

    def run_messages(self, run_id: str) -> str:
        """String: the run's message history (pydantic-ai JSON), kept to resume it."""
        return f"{self.prefix}run:{run_id}:messages"

    def delivery(self, request_id: str) -> str:
        """Hash: per-channel delivery state of a request (posted Slack message, etc.)."""
        return f"{self.prefix}delivery:{request_id}"

    def seen(self, namespace: str, ident: str) -> str:
        """String with TTL: a one-time marker (replayed webhook ids, used email links)."""
        return f"{self.prefix}seen:{namespace}:{ident}"

    def idempotency(self, scope: str, digest: str) -> str:
        """String with TTL: an Idempotency-Key's body hash and the id it created (`HASH|ID`)."""
        return f"{self.prefix}idem:{scope}:{digest}"

    @property
    def counts(self) -> str:
        """Hash: request counts kept by the Lua steps, `pending:QUEUE` and `STATUS:QUEUE`."""
        return f"{self.prefix}counts"

    @property
    def stats(self) -> str:
        """Hash: fleet-wide counters (HINCRBY), e.g. `delivered:slack`, `failed:webhook`."""
        return f"{self.prefix}stats"

    @property
    def agents(self) -> str:
        """Set: names of agents registered at run time through the Python API."""
        return f"{self.prefix}agents"

    def agent(self, name: str) -> str:
        """String: the spec (AgentConfig JSON) of an agent registered through the Python API."""
        return f"{self.prefix}agent:{name}"

    @property
    def secret(self) -> str:
        """String: a fleet-wide random secret, created once (email link signing)."""
        return f"{self.prefix}secret"

    @property
    def disabled(self) -> str:
        """Hash: delivery channels switched off (a webhook that answered 410) -> why, as JSON."""
        return f"{self.prefix}disabled"

    def parked(self, channel: str) -> str:
        """ZSET: a channel's parked deliveries, task id -> when one may next take it (epoch s).

        A notifier working on one keeps pushing its score ahead (a lease); a dead one's lapses.
        """
        return f"{self.prefix}parked:{channel}"

    def parked_tasks(self, channel: str) -> str:
        """Hash: a channel's parked deliveries, task id -> JSON (the event, attempts so far)."""
        return f"{self.prefix}parked-tasks:{channel}"
