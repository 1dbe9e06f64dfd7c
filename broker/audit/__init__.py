"""The tamper-evident audit trail: one hash chain per partition (docs/audit.md).

`chain` (the entry, its canonical form and hash, verifying a sequence), `actors` (who an actor
is: person, rule, webhook or system), `trail` (reading the chains from Redis, appending an entry
from Python), `export` (JSONL out and back). Entries are appended by the Lua steps that make
each change (broker/scripts/lib.lua, audit()); nothing here decides anything.
"""

from broker.audit.actors import actor_kind
from broker.audit.chain import FIELDS, Entry, Problem, canonical, entry_hash, verify
from broker.audit.trail import AuditTrail, append_entry

__all__ = [
    "FIELDS",
    "AuditTrail",
    "Entry",
    "Problem",
    "actor_kind",
    "append_entry",
    "canonical",
    "entry_hash",
    "verify",
]
