"""From the outcomes of a round's requests to the `DeferredToolResults` a run resumes with.

approved -> ToolApproved(); modified -> ToolApproved(override_args=...); rejected or timed out
-> ToolDenied(reason) for an approval, a ToolFailed telling the model why for a question or
external call; answered -> the answer as the call's result. A structured answer (the request
has `metadata.questions` or `answer_schema`) becomes a `ToolReturn`: the model reads its text,
and the structured answer is the part's `metadata`, which the program sees and the model never
does. Who answered and the reply's metadata are passed along for every call.

The one mapping for the fleet (`broker.runs.agent_runner` imports it) and for agents outside it;
it reads any request-shaped object (the client's `Request` or the broker's), comparing statuses
by value. Needs the `pydantic-ai` extra.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied, ToolFailed, ToolReturn

from approval_broker_client.answers import answer_text, is_structured

REJECTED = "The request was rejected."
TIMED_OUT = "No one answered in time."


class RoundNotReady(Exception):
    """A request of the round has no outcome yet, so the round can't resume."""


def answered(request: Any, answer: Any) -> Any:
    """A call's result for `answer`: the value as is, or text + metadata for a structured one."""
    if is_structured(request.metadata):
        return ToolReturn(return_value=answer_text(request.metadata, answer), metadata=answer)
    return answer


def results_for(requests: Iterable[Any]) -> DeferredToolResults:
    """The results of a round whose requests all have an outcome (else `RoundNotReady`)."""
    results = DeferredToolResults()
    for request in requests:
        decision = request.decision
        status = str(request.status)
        if status == "pending" or decision is None:
            raise RoundNotReady(f"request {request.id} is still {status}")
        call_id = request.tool_call_id
        reason = decision.reason
        if request.kind == "approval":
            if status == "approved":
                results.approvals[call_id] = ToolApproved()
            elif status == "modified":
                results.approvals[call_id] = ToolApproved(override_args=decision.args)
            elif status == "rejected":
                results.approvals[call_id] = ToolDenied(reason or REJECTED)
            elif status == "timed_out":
                results.approvals[call_id] = ToolDenied(reason or TIMED_OUT)
            else:
                raise ValueError(f"request {request.id}: an approval can't be {status}")
        else:
            if status == "answered":
                results.calls[call_id] = answered(request, decision.answer)
            elif status == "rejected":
                results.calls[call_id] = ToolFailed(f"Rejected: {reason or REJECTED}")
            elif status == "timed_out":
                results.calls[call_id] = ToolFailed(reason or TIMED_OUT)
            else:
                raise ValueError(f"request {request.id}: a {request.kind} can't be {status}")
        if decision.decided_by:
            results.answered_by[call_id] = decision.decided_by
        if decision.metadata:
            results.metadata[call_id] = dict(decision.metadata)
    return results
