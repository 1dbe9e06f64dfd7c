"""Claim a run's round as the live job or the resumer does, for tests that race the two.

The worker's live job claims in `broker.runs.live_wait.wait_and_claim` (the store's
`claim_round`: a complete round's claim and the reads it goes on with, in one step); this is
that claim for either side, answering only whether it is now (or already) `who`'s.
"""

from __future__ import annotations

from broker.facade import Broker
from broker.runs.live_wait import claim_field
from broker.store.run_state import RoundClaim


def claim_round(broker: Broker, run_id: str, round_no: int, who: str) -> RoundClaim:
    """The store's claim of the complete round `round_no` of the run for `who`, as it answers."""
    return broker.run_store.claim_round(run_id, round_no, claim_field(round_no), who)


def claim(broker: Broker, run_id: str, round_no: int, who: str) -> bool:
    """Claim the complete round `round_no` of the run for `who`; True if it is (now or
    already) `who`'s (False too while one of its calls still waits for an outcome)."""
    return claim_round(broker, run_id, round_no, who).state == "mine"
