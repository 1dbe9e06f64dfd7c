"""From the outcomes of a round's requests to the `DeferredToolResults` a run resumes with.

The mapping lives once, in the client package (`approval_broker_client.results`), so the fleet
and an agent outside it resume alike; see its docstring for the outcomes.
"""

from approval_broker_client.results import (
    REJECTED,
    TIMED_OUT,
    RoundNotReady,
    answered,
    results_for,
)

__all__ = ["REJECTED", "TIMED_OUT", "RoundNotReady", "answered", "results_for"]
