"""broker.testing, used the way the README shows it (the first test is the README's example)."""

from __future__ import annotations

from pydantic_ai import Agent, CallDeferred, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from refunds_demo import Ledger, make_deps, refunds_agent  # your own agent and deps factory here

from broker.testing import InMemoryBroker


def test_big_refund_waits_for_a_person() -> None:
    ab = InMemoryBroker()
    ab.register_agent("refunds", refunds_agent, deps=make_deps)

    run = ab.start_run("refunds", "Refund $120 on order A103 because the floor is torn.")
    assert run.status == "waiting"
    [request] = ab.pending(run.id)
    assert request.tool_name == "issue_refund"
    assert request.args["amount"] == 120.0

    run = ab.approve(request.id, by="alice")
    assert run.status == "finished"
    assert run.output["refunded"] is True


def test_rejection_reason_reaches_the_model_and_nothing_is_paid() -> None:
    ab = InMemoryBroker()
    ab.register_agent("refunds", refunds_agent, deps=make_deps)
    run = ab.start_run("refunds", "Refund $120 on order A103 because the floor is torn.")
    [request] = ab.pending(run.id)

    run = ab.reject(request.id, "Ask for a photo first", by="bob")
    assert run.output["refunded"] is False
    assert "Ask for a photo first" in run.output["message"]
    assert Ledger(ab.redis, ab.keys.prefix).all() == []


def test_expire_times_the_request_out_as_its_queue_says() -> None:
    ab = InMemoryBroker({"queues": {"default": {"timeout_s": 30}}})
    ab.register_agent("refunds", refunds_agent, deps=make_deps)
    run = ab.start_run("refunds", "Refund $120 on order A103 because the floor is torn.")
    [request] = ab.pending(run.id)

    run = ab.expire(request.id)
    assert run is not None and run.status == "finished"
    assert "No one answered within" in run.output["message"]
    assert ab.get_request(request.id).status == "timed_out"


def _ask(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    if len(messages) == 1:
        return ModelResponse(parts=[ToolCallPart("ask_user", {"question": "Size?"})])
    return ModelResponse(parts=[TextPart(f"ordering size {messages[-1].parts[0].content}")])


def test_a_question_answered_in_a_test_with_an_agent_defined_inline() -> None:
    shop = Agent(FunctionModel(_ask), output_type=[str, DeferredToolRequests])

    @shop.tool_plain
    def ask_user(question: str) -> str:
        raise CallDeferred(kind="question")

    ab = InMemoryBroker(autorun=False)
    ab.register_agent("shop", shop)
    run = ab.start_run("shop", "Buy boots")
    assert run.status == "queued"  # nothing runs until you say so
    assert ab.work() == 1
    [request] = ab.pending(run.id)
    assert (request.kind, request.prompt) == ("question", 'The agent wants to call ask_user(question="Size?")')  # fmt: skip

    ab.answer(request.id, "44")
    assert ab.get_run(run.id).status == "queued"
    ab.work()
    assert ab.get_run(run.id).output == "ordering size 44"


def test_each_in_memory_broker_is_separate() -> None:
    one, two = InMemoryBroker(), InMemoryBroker()
    one.register_agent("refunds", refunds_agent, deps=make_deps)
    one.start_run("refunds", "Refund $120 on order A103 because the floor is torn.")
    assert len(one.pending()) == 1
    assert two.pending() == []


def _says(text: str) -> Agent[None, str]:
    return Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart(text)])))


def test_registering_a_name_again_runs_the_new_agent() -> None:
    ab = InMemoryBroker()
    ab.register_agent("greeter", _says("hello"))
    assert ab.start_run("greeter", "hi").output == "hello"
    ab.register_agent("greeter", _says("good morning"))
    assert ab.start_run("greeter", "hi").output == "good morning"
    ab.unregister_agent("greeter")
    assert ab.local_agents.get(ab.keys.prefix, "greeter") is None
