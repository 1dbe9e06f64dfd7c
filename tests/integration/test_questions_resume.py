"""A structured answer resumes the run as text the model reads, with the answer as metadata.

The agent runs on the real broker (Redis from conftest) with the synchronous worker, and the
model is a FunctionModel that records what it was sent: the tool-return part's content is the
text, its metadata the structured answer, and nothing of the metadata reaches the model.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from approval_broker_client.results import results_for
from pydantic import BaseModel, Field
from pydantic_ai import Agent, DeferredToolRequests, ToolReturn
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from broker.ask import ask, ask_for, parse_answer, question
from broker.domain.args_hash import args_hash
from broker.domain.models import Decision, Outcome, Request, RunStatus, Status
from broker.domain.questions import validate_answer
from broker.facade import Broker
from broker.runs.agents import LocalAgents, register_agent
from broker.runs.starting import start_run
from broker.testing import SyncWorker

NOW = datetime(2030, 1, 1, tzinfo=UTC)
AUTH = question("Which auth method?", "Auth", ["OAuth 2.0", "API key"])
SCOPES = question("Which scopes?", "Scopes", ["read", "write", "admin"], multi_select=True)
ANSWER = {
    "answers": [
        {"question": "Which auth method?", "selected": ["OAuth 2.0"], "other": None},
        {"question": "Which scopes?", "selected": ["read", "write"], "other": "billing"},
    ]
}
TEXT = "Which auth method? OAuth 2.0\nWhich scopes? read, write, Other: billing"


class Priority(StrEnum):
    low = "low"
    high = "high"


class Ticket(BaseModel):
    title: str = Field(description="One line")
    priority: Priority = Priority.low
    hours: float | None = None


def stored(metadata: dict[str, Any], answer: Any) -> Request:
    return Request(
        id="r1",
        tool_call_id="c1",
        tool_name="choose",
        args_hash=args_hash({}),
        kind="question",
        metadata=metadata,
        created_at=NOW,
        expires_at=NOW,
        status=Status.answered,
        decision=Decision(outcome=Outcome.answered, answer=answer, decided_by="ann"),
    )


def test_a_structured_answer_becomes_a_tool_return_with_the_answer_as_metadata() -> None:
    results = results_for([stored({"questions": [AUTH, SCOPES]}, ANSWER)])
    assert results.calls == {"c1": ToolReturn(return_value=TEXT, metadata=ANSWER)}
    assert results.answered_by == {"c1": "ann"}


def test_a_plain_answer_is_still_the_value_itself() -> None:
    results = results_for([stored({"prompt": "size?"}, {"size": 44})])
    assert results.calls == {"c1": {"size": 44}}


class Recorder:
    """A scripted model: call `tool` once, then answer with the text of its return."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.sent: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.sent.append(list(messages))
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"Noted: {returns[0].model_response_str()}")])
        return ModelResponse(parts=[ToolCallPart(self.tool, {}, tool_call_id="call-1")])

    def last_return(self) -> ToolReturnPart:
        request = self.sent[-1][-1]
        assert isinstance(request, ModelRequest)
        [part] = [p for p in request.parts if isinstance(p, ToolReturnPart)]
        return part


def question_agent(model: Recorder) -> Agent[None, str | DeferredToolRequests]:
    agent = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def choose_auth() -> str:
        ask([AUTH, SCOPES], queue="default")

    @agent.tool_plain
    def file_ticket() -> str:
        ask_for(Ticket, prompt="Describe the ticket")

    @agent.tool_plain
    def bad_question() -> str:
        ask([question("Which?", "A header too long", ["a", "b"])])

    return agent


def run_agent(broker: Broker, model: Recorder) -> tuple[LocalAgents, str]:
    local = LocalAgents()
    register_agent(broker, "asker", question_agent(model), local=local)
    run = start_run(broker, "asker", "go")
    SyncWorker(broker, local).work()
    return local, run.id


def answer_and_resume(broker: Broker, local: LocalAgents, request: Request, value: Any) -> None:
    value = validate_answer(request.metadata, value)  # what every channel does first
    broker.decide(request.id, Decision(outcome=Outcome.answered, answer=value), decided_by="ann")
    SyncWorker(broker, local).work()


def test_the_model_reads_the_text_and_the_program_gets_the_structured_answer(
    broker: Broker,
) -> None:
    model = Recorder("choose_auth")
    local, run_id = run_agent(broker, model)
    run = broker.get_run(run_id)
    assert run.status is RunStatus.waiting, run.error
    [request] = broker.get_requests(run.pending)
    assert request.kind == "question"
    assert [q["header"] for q in request.metadata["questions"]] == ["Auth", "Scopes"]
    assert request.prompt == "Which auth method?\nWhich scopes?"

    answer_and_resume(broker, local, request, ANSWER)

    run = broker.get_run(run_id)
    assert run.status is RunStatus.finished, run.error
    assert run.output == f"Noted: {TEXT}"
    part = model.last_return()
    assert part.content == TEXT
    assert part.metadata == ANSWER
    # what a provider sends for this part: the text only, none of the metadata
    assert part.model_response_str() == TEXT
    assert "selected" not in part.model_response_str()
    assert "selected" not in json.dumps(
        [p.content for p in model.sent[-1][-1].parts if hasattr(p, "content")]
    )


def test_a_schema_answer_resumes_as_text_and_parses_back_into_the_model(broker: Broker) -> None:
    model = Recorder("file_ticket")
    local, run_id = run_agent(broker, model)
    [request] = broker.get_requests(broker.get_run(run_id).pending)
    assert request.metadata["answer_schema"]["properties"]["priority"]["enum"] == ["low", "high"]
    assert request.prompt == "Describe the ticket"

    answer_and_resume(broker, local, request, {"title": "Login fails", "hours": 2.5})

    assert broker.get_run(run_id).status is RunStatus.finished
    part = model.last_return()
    assert part.content == "Title: Login fails\nPriority: low\nHours: 2.5"
    ticket = parse_answer(Ticket, part)
    assert ticket == Ticket(title="Login fails", priority=Priority.low, hours=2.5)


def test_a_malformed_question_fails_the_run_at_the_call_and_makes_no_request(
    broker: Broker,
) -> None:
    _, run_id = run_agent(broker, Recorder("bad_question"))
    run = broker.get_run(run_id)
    assert run.status is RunStatus.failed
    assert run.error == "questions[0].header: at most 12 characters"
    assert broker.list_requests() == []
