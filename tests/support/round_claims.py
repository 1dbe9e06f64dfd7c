"""Claim a run's round as the live job or the resumer does, for tests that race the two.

The worker's live job claims with `broker.runs.live_wait.claim_and_read` (the store's
`claim_round`: the claim and the reads it goes on with, in one round trip); this is that claim
for either side, answering only whether it is now (or already) `who`'s.
"""

from __future__ import annotations

from broker.facade import Broker
from broker.runs.live_wait import claim_field


def claim(broker: Broker, run_id: str, round_no: int, who: str) -> bool:
    """Claim round `round_no` of the run for `who`; True if it is (now or already) `who`'s."""
    return broker.run_store.claim_round(run_id, round_no, claim_field(round_no), who) is not None
