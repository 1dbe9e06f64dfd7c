"""The tools `/mcp` offers, on the same services as REST: an MCP client asks for approval.

`request_approval` and `ask_question` create a request as `POST /v1/requests` does
(`api.requests.checked_new_request`, then the broker's create), `get_request` reads one as
`GET /v1/requests/{id}` does (`visible_request`), and `wait_s` long-polls as `?wait=` does
(`api.waits.wait_for_outcome`). Results are the request as REST returns it. Nothing here
decides, checks visibility or validates a body in a way of its own.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request as HttpRequest
from mcp import types
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.errors import ApiError
from api.requests import ID_PATTERN, checked_new_request, visible_request
from api.schemas import NewRequestBody
from api.state import ApiState
from api.waits import MAX_WAIT_S, wait_for_outcome
from broker.domain.errors import InvalidInput
from broker.domain.models import Request
from broker.domain.principals import REQUESTER, Principal

QUESTION_TOOL = "ask_question"
"""The `tool_name` of a request made by the `ask_question` tool."""

_WAIT = {
    "type": "number",
    "minimum": 0,
    "maximum": MAX_WAIT_S,
    "description": "wait up to this many seconds (at most 60) for the outcome; 0: answer at once",
}
_QUEUE = {"type": "string", "minLength": 1, "maxLength": 200, "description": "the handler queue"}

TOOLS = [
    types.Tool(
        name="request_approval",
        description="Ask a person to approve a tool call before you run it. Returns the request"
        " (status pending, approved, modified, rejected or timed_out); with wait_s, once decided"
        " or after wait_s. On 'modified' run the call with decision.args; on 'rejected' don't.",
        inputSchema={
            "type": "object",
            "properties": {
                "tool_name": {"type": "string", "minLength": 1, "maxLength": 200},
                "args": {"type": "object", "description": "the arguments of the call"},
                "prompt": {"type": "string", "description": "what the person reads"},
                "queue": _QUEUE,
                "timeout_s": {"type": "integer", "exclusiveMinimum": 0},
                "allowed_roles": {"type": "array", "items": {"type": "string"}},
                "wait_s": _WAIT,
            },
            "required": ["tool_name", "args"],
        },
    ),
    types.Tool(
        name="ask_question",
        description="Ask a person a question. `options` (2-4) make it multiple choice,"
        " `answer_schema` (a flat JSON Schema) a form. Returns the request; its answer is"
        " decision.answer once status is 'answered'.",
        inputSchema={
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 1, "maxLength": 20_000},
                "options": {"type": "array", "items": {"type": "string"}},
                "answer_schema": {"type": "object"},
                "queue": _QUEUE,
                "wait_s": _WAIT,
            },
            "required": ["question"],
        },
    ),
    types.Tool(
        name="get_request",
        description="A request by id; with wait_s, once it is no longer pending (or then).",
        inputSchema={
            "type": "object",
            "properties": {"id": {"type": "string", "minLength": 1}, "wait_s": _WAIT},
            "required": ["id"],
        },
    ),
]


def _invalid(exc: ValidationError) -> InvalidInput:
    """`args: Input should be a valid dictionary` without echoing the input, as REST says it."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return InvalidInput("; ".join(parts) or "invalid arguments")


def _wait_s(arguments: dict[str, Any]) -> float:
    value = arguments.get("wait_s") or 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 60:
        raise InvalidInput("wait_s: a number of seconds from 0 to 60")
    return float(value)


def _known(arguments: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(arguments) - allowed)
    if extra:
        raise InvalidInput(f"{extra[0]}: not an argument of this tool")


def _requester(principal: Principal) -> None:
    if not principal.has_role(REQUESTER):
        raise ApiError(403, "forbidden", f"{principal.name!r} does not have the 'requester' role")


def _approval_body(arguments: dict[str, Any]) -> NewRequestBody:
    _known(arguments, {"tool_name", "args", "prompt", "queue", "timeout_s", "allowed_roles",
                       "wait_s"})  # fmt: skip
    fields = {k: v for k, v in arguments.items() if k != "wait_s" and v is not None}
    try:
        return NewRequestBody.model_validate({**fields, "kind": "approval"})
    except ValidationError as exc:
        raise _invalid(exc) from None


def _question_body(arguments: dict[str, Any]) -> NewRequestBody:
    _known(arguments, {"question", "options", "answer_schema", "queue", "wait_s"})
    question, options = arguments.get("question"), arguments.get("options")
    metadata: dict[str, Any] = {}
    if options is not None:
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise InvalidInput("options: a list of 2-4 answers (strings)")
        metadata["questions"] = [
            {
                "question": question,
                "header": "Question",
                "multi_select": False,
                "options": [{"label": o} for o in options],
            }
        ]
    if arguments.get("answer_schema") is not None:
        metadata["answer_schema"] = arguments["answer_schema"]
    fields = {"queue": arguments.get("queue")} if arguments.get("queue") is not None else {}
    try:
        return NewRequestBody.model_validate(
            {
                "tool_name": QUESTION_TOOL,
                "kind": "question",
                "prompt": question,
                "args": {"question": question},
                "metadata": metadata,
                **fields,
            }
        )
    except ValidationError as exc:
        raise _invalid(exc) from None


class McpTools:
    """The tools for one call: the app's state, the HTTP request it came on, the caller."""

    def __init__(self, state: ApiState, http: HttpRequest, principal: Principal) -> None:
        self.state = state
        self.http = http
        self.principal = principal

    async def call(self, name: str, arguments: dict[str, Any]) -> Request:
        tools: dict[str, Callable[[dict[str, Any]], Awaitable[Request]]] = {
            "request_approval": self.request_approval,
            "ask_question": self.ask_question,
            "get_request": self.get_request,
        }
        tool = tools.get(name)
        if tool is None:
            raise InvalidInput(f"no tool named {name!r}", code="unknown_tool")
        return await tool(arguments)

    async def _create(self, body: NewRequestBody, wait_s: float) -> Request:
        _requester(self.principal)
        body = checked_new_request(self.state, self.principal, body)
        request = await run_in_threadpool(self.state.broker.create_request, body)
        if wait_s > 0 and request.is_pending:
            return await self._read(request.id, wait_s)
        return request

    async def _read(self, request_id: str, wait_s: float) -> Request:
        if wait_s > 0:
            await wait_for_outcome(self.http, self.state, self.principal, request_id, wait_s)
        return await run_in_threadpool(visible_request, self.state, self.principal, request_id)

    async def request_approval(self, arguments: dict[str, Any]) -> Request:
        return await self._create(_approval_body(arguments), _wait_s(arguments))

    async def ask_question(self, arguments: dict[str, Any]) -> Request:
        return await self._create(_question_body(arguments), _wait_s(arguments))

    async def get_request(self, arguments: dict[str, Any]) -> Request:
        _known(arguments, {"id", "wait_s"})
        request_id = arguments.get("id")
        if (
            not isinstance(request_id, str)
            or len(request_id) > 200
            or not re.match(ID_PATTERN, request_id)
        ):
            raise InvalidInput("id: a request id")
        return await self._read(request_id, _wait_s(arguments))
