"""Mapping between pydantic-ai's deferred calls and broker requests, and the runner's recovery."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from approval_broker_client.results import RoundNotReady, results_for
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    ToolApproved,
    ToolDenied,
    ToolFailed,
)
from pydantic_ai.exceptions import (
    ModelAuthenticationError,
    ModelHTTPError,
    ModelRateLimitError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from redis.exceptions import ClusterDownError, MovedError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.domain.args_hash import args_hash
from broker.domain.config_sections import AgentConfig
from broker.domain.models import Decision, Request, RunStatus, Status
from broker.facade import Broker
from broker.runs.agent_runner import AgentRunner, is_transient
from broker.runs.agents import LocalAgents, register_agent
from broker.runs.pending_calls import BadCallMetadata, new_requests
from broker.runs.starting import start_run
from broker.testing import SyncWorker

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def request(
    kind: str, status: Status, decision: dict[str, Any] | None, call_id: str = "c1"
) -> Request:
    return Request(
        id=f"r-{call_id}",
        tool_call_id=call_id,
        tool_name="t",
        args={"a": 1},
        args_hash=args_hash({"a": 1}),
        kind=kind,  # type: ignore[arg-type]
        created_at=NOW,
        expires_at=NOW,
        status=status,
        decision=Decision.model_validate(decision) if decision else None,
    )


def test_approval_outcomes_map_to_tool_approved_or_denied() -> None:
    results = results_for(
        [
            request(
                "approval", Status.approved, {"outcome": "approved", "decided_by": "ann"}, "a"
            ),  # fmt: skip
            request("approval", Status.modified, {"outcome": "modified", "args": {"a": 2}}, "m"),
            request(
                "approval", Status.rejected, {"outcome": "rejected", "reason": "too much"}, "r"
            ),  # fmt: skip
            request("approval", Status.rejected, {"outcome": "rejected"}, "r2"),
            request(
                "approval",
                Status.timed_out,
                {"outcome": "timed_out", "reason": "No one answered within 600 seconds."},
                "t",
            ),
        ]
    )
    assert results.approvals == {
        "a": ToolApproved(),
        "m": ToolApproved(override_args={"a": 2}),
        "r": ToolDenied("too much"),
        "r2": ToolDenied("The request was rejected."),
        "t": ToolDenied("No one answered within 600 seconds."),
    }
    assert results.calls == {}
    assert results.answered_by == {"a": "ann"}


def test_question_and_external_outcomes_map_to_answers_or_failures() -> None:
    results = results_for(
        [
            request(
                "question",
                Status.answered,
                {
                    "outcome": "answered",
                    "answer": {"size": 44},
                    "decided_by": "bo",
                    "metadata": {"via": "slack"},
                },  # fmt: skip
                "q",
            ),
            request("external", Status.rejected, {"outcome": "rejected", "reason": "no"}, "x"),
            request("question", Status.timed_out, {"outcome": "timed_out", "reason": "late"}, "l"),
        ]
    )
    assert results.calls == {
        "q": {"size": 44},
        "x": ToolFailed("Rejected: no"),
        "l": ToolFailed("late"),
    }
    assert results.approvals == {}
    assert results.answered_by == {"q": "bo"}
    assert results.metadata == {"q": {"via": "slack"}}


def test_a_round_with_a_pending_request_is_not_ready() -> None:
    with pytest.raises(RoundNotReady, match="still pending"):
        results_for([request("approval", Status.pending, None)])


def test_new_requests_follow_kinds_metadata_and_routing() -> None:
    output = DeferredToolRequests(
        approvals=[ToolCallPart("pay", {"amount": 5}, tool_call_id="p")],
        calls=[
            ToolCallPart("ask", {"q": "why?"}, tool_call_id="q"),
            ToolCallPart("fetch", '{"url": "x"}', tool_call_id="f"),
        ],
        metadata={
            "p": {"prompt": "Pay Ann $5?", "timeout_s": 30, "allowed_roles": ["finance", 3]},
            "f": {"queue": "ops", "internal": object()},
        },
        _kinds={"q": "question"},
    )
    history = [ModelResponse(parts=[*output.calls[::-1], *output.approvals])]
    spec = AgentConfig(path="m:a", queue="main", tool_queues={"ask": "helpdesk"})
    fetch, ask, pay = new_requests(output, spec, history)  # in the model's call order

    assert (pay.kind, pay.prompt, pay.queue, pay.timeout_s, pay.allowed_roles) == (
        "approval",
        "Pay Ann $5?",
        "main",
        30,
        ["finance"],
    )
    assert pay.metadata["prompt"] == "Pay Ann $5?"
    assert (ask.kind, ask.prompt, ask.queue, ask.tool_call_id) == ("question", None, "helpdesk", "q")  # fmt: skip
    assert (fetch.kind, fetch.queue, fetch.args) == ("external", "ops", {"url": "x"})
    assert isinstance(fetch.metadata["internal"], str)  # made JSON-safe, never dropped silently


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (ModelHTTPError(503, "m"), True),
        (ModelHTTPError(429, "m"), True),
        (ModelHTTPError(400, "m"), False),
        (ModelRateLimitError("m", "slow down"), True),
        (ModelAuthenticationError("m", "bad key"), False),
        (RedisConnectionError("down"), True),
        (MovedError("3037 127.0.0.1:45875"), True),  # a cluster failing over
        (ClusterDownError("CLUSTERDOWN"), True),
        (TryAgainError("TRYAGAIN"), True),
        (ResponseError("WRONGTYPE"), False),
        (UnexpectedModelBehavior("odd"), False),
        (ValueError("bug"), False),
    ],
)
def test_transient_errors_are_the_ones_worth_retrying(exc: Exception, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_a_job_that_died_between_saving_and_registering_registers_on_retry(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")
    real_create_round = broker.create_round

    def redis_gone(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(broker, "create_round", redis_gone)
    with pytest.raises(RedisConnectionError):
        AgentRunner(broker).advance(run.id, 0, final_attempt=False)
    assert broker.get_run(run.id).status is RunStatus.running
    assert broker.list_requests() == []

    monkeypatch.setattr(broker, "create_round", real_create_round)

    def must_not_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the agent ran again")

    monkeypatch.setattr("broker.runs.agent_runner.load_agent", must_not_run)
    assert AgentRunner(broker).advance(run.id, 0) == "waiting"
    run = broker.get_run(run.id)
    assert (run.status, run.round, len(run.pending)) == (RunStatus.waiting, 1, 1)
    assert AgentRunner(broker).advance(run.id, 0) == "skipped"  # and only once


def test_final_attempt_of_a_transient_error_fails_the_run(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_agent(broker, "refunds", "refunds_demo:agent", deps="refunds_demo:make_deps")
    run = start_run(broker, "refunds", "Refund $120 on order A103 because the floor is torn.")

    def redis_gone(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("connection reset")

    monkeypatch.setattr(broker, "create_round", redis_gone)
    assert AgentRunner(broker).advance(run.id, 0, final_attempt=True) == "failed"
    assert broker.get_run(run.id).error == "ConnectionError: connection reset"


def _one_call(metadata: dict[str, Any]) -> DeferredToolRequests:
    return DeferredToolRequests(
        approvals=[ToolCallPart("pay", {"amount": 5}, tool_call_id="p")], metadata={"p": metadata}
    )


SPEC = AgentConfig(path="m:a", queue="default", tool_queues={"pay": "managers"})


@pytest.mark.parametrize("bad", [True, False, 0, -5, float("nan"), float("inf"), "30", 10**9])
def test_a_bad_timeout_is_ignored_with_a_warning(
    bad: Any, caplog: pytest.LogCaptureFixture
) -> None:
    [call] = new_requests(_one_call({"timeout_s": bad}), SPEC)
    assert call.timeout_s is None  # the queue's timeout applies
    assert f"ignoring timeout_s={bad!r}" in caplog.text


def test_a_good_timeout_and_roles_are_kept() -> None:
    [call] = new_requests(_one_call({"timeout_s": 90, "allowed_roles": ["finance"]}), SPEC)
    assert (call.timeout_s, call.allowed_roles) == (90.0, ["finance"])


@pytest.mark.parametrize("bad", ["finance", 3, {"finance": True}, [3, None], [""]])
def test_roles_that_name_no_role_fail_rather_than_open_the_request(bad: Any) -> None:
    with pytest.raises(BadCallMetadata, match="allowed_roles"):
        new_requests(_one_call({"allowed_roles": bad}), SPEC)


def test_a_queue_that_is_not_defined_fails_and_a_non_name_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queues = {"default", "managers"}
    with pytest.raises(BadCallMetadata, match="queue 'nowhere', which is not defined"):
        new_requests(_one_call({"queue": "nowhere"}), SPEC, queues=queues)
    [call] = new_requests(_one_call({"queue": 7}), SPEC, queues=queues)
    assert call.queue == "managers"  # the agent's queue for this tool
    assert "ignoring queue=7" in caplog.text


def _metadata_agent(metadata: dict[str, Any]) -> Agent[None, str | DeferredToolRequests]:
    def script(messages: list[Any], info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("pay", {"amount": 5})])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(script), output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def pay(amount: int) -> str:
        raise ApprovalRequired(metadata=metadata)

    return agent


def _run_with(broker: Broker, metadata: dict[str, Any]) -> Any:
    local = LocalAgents()
    register_agent(broker, "meta", _metadata_agent(metadata), local=local)
    run = start_run(broker, "meta", "pay")
    SyncWorker(broker, local).work()
    return broker.get_run(run.id)


def test_a_run_whose_tool_asks_for_a_zero_timeout_waits_for_the_queues(broker: Broker) -> None:
    run = _run_with(broker, {"timeout_s": 0})
    assert run.status is RunStatus.waiting, run.error
    [request] = broker.get_requests(run.pending)
    waited = (request.expires_at - request.created_at).total_seconds()
    assert waited == pytest.approx(600, abs=1)  # the `default` queue's timeout


def test_a_run_whose_tool_names_an_unknown_queue_fails_clearly(broker: Broker) -> None:
    run = _run_with(broker, {"queue": "nowhere"})
    assert run.status is RunStatus.failed
    assert run.error == (
        "tool 'pay' routes its request to queue 'nowhere', which is not defined "
        "(known: default, managers)"
    )
    assert broker.list_requests() == []
