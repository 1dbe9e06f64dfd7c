"""The Slack modal for a structured question: the view, reading its submission, showing errors.

The notifier puts an "Answer…" button (`ANSWER_FORM`) on the message; the API opens
`answer_modal(request)` with the click's trigger_id (views.open), reads the `view_submission`
with `answer_from_view_state`, checks it with `broker.domain.questions.validate_answer`, and answers
a refusal with `errors_for(exc)` (`response_action: "errors"`), so the modal stays open showing
what is wrong. Plain data only, like `channels.slack.action_ids`: nothing here imports slack_sdk, and
nothing here decides.

Block ids are the input names of `channels.answer_forms` (`q0`, `q0_other`, `field:NAME`), and
option values are indices, never labels (a label may be longer than the 150 characters Slack
allows in a value); reading a submission is `answer_forms.read_answer` over `state.values`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.domain.answer_schema import FormField, check_schema
from broker.domain.models import Request
from broker.domain.printable import lines, one_line
from broker.domain.questions import InvalidAnswer, Question, questions_of
from channels.answer_forms import (
    error_inputs,
    field_input,
    other_input,
    question_input,
    read_answer,
)

ANSWER_FORM = "answer_form"  # action_id of the "Answer…" button; its value is the request id
ANSWER_FORM_CALLBACK = "answer_form"  # callback_id of the modal; private_metadata: request id
CHOICE = "choice"  # action_id of a question's radio buttons / checkboxes
OTHER = "other"  # action_id of a question's "Other" text input
VALUE = "value"  # action_id of a schema field's input

MAX_TEXT = 75  # Slack: option text and description
MAX_LABEL = 2000  # Slack: input label and hint
MAX_SECTION = 2900
MAX_CHECKBOXES = 10  # Slack: radio_buttons and checkboxes hold at most 10 options
Block = dict[str, Any]


def _escape(text: str) -> str:
    """mrkdwn-escaped requester text, without control or bidi characters (as in every channel)."""
    return lines(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(text: str, limit: int = MAX_TEXT) -> dict[str, str]:
    return {"type": "plain_text", "text": _clip(one_line(text), limit) or " "}


def _option(text: str, value: str, description: str | None = None) -> Block:
    option: Block = {"text": _plain(text), "value": value}
    if description:
        option["description"] = _plain(description)
    return option


def _question_blocks(i: int, q: Question) -> list[Block]:
    intro = f"*{_escape(q.header)}*  {_escape(q.question)}"
    if q.context:
        intro += f"\n{_escape(q.context)}"
    blocks: list[Block] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _clip(intro, MAX_SECTION)}}
    ]
    for option in q.options:
        if option.preview:
            shown = _clip(_escape(option.preview), MAX_SECTION - 100)
            text = f"_{_escape(_clip(option.label, 75))}_\n```{shown}```"
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    choices = [_option(o.label, str(n), o.description) for n, o in enumerate(q.options)]
    element = {
        "type": "checkboxes" if q.multi_select else "radio_buttons",
        "action_id": CHOICE,
        "options": choices,
    }
    blocks.append(
        {
            "type": "input",
            "block_id": question_input(i),
            "optional": True,
            "label": _plain(q.question, MAX_LABEL),
            "hint": _plain("Choose any that apply" if q.multi_select else "Choose one", 100),
            "element": element,
        }
    )
    blocks.append(
        {
            "type": "input",
            "block_id": other_input(i),
            "optional": True,
            "label": _plain("Other"),
            "hint": _plain(
                "Your own answer, besides any options chosen"
                if q.multi_select
                else "Your own answer, instead of an option",
                100,
            ),
            "element": {"type": "plain_text_input", "action_id": OTHER, "max_length": 2000},
        }
    )
    return blocks


def _initial(field: FormField) -> list[int]:
    """Indices of the field's default among its choices (for preselected options)."""
    wanted = field.default if isinstance(field.default, list) else [field.default]
    return [n for n, c in enumerate(field.choices) if field.has_default and c in wanted]


def _field_element(field: FormField, prop: dict[str, Any]) -> Block:
    if field.kind in ("number", "integer"):
        element: Block = {
            "type": "number_input",
            "action_id": VALUE,
            "is_decimal_allowed": field.kind == "number",
        }
        for key, slack_key in (("minimum", "min_value"), ("maximum", "max_value")):
            if isinstance(prop.get(key), int | float):
                element[slack_key] = str(prop[key])
        if field.has_default and isinstance(field.default, int | float):
            element["initial_value"] = str(field.default)
        return element
    if field.kind == "boolean":
        options = [_option("Yes", "true"), _option("No", "false")]
        element = {"type": "radio_buttons", "action_id": VALUE, "options": options}
        if field.has_default and isinstance(field.default, bool):
            element["initial_option"] = options[0 if field.default else 1]
        return element
    if field.kind in ("enum", "multi_enum"):
        options = [_option(str(c), str(n)) for n, c in enumerate(field.choices)]
        initial = [options[n] for n in _initial(field)]
        if field.kind == "enum":
            element = {
                "type": "static_select",
                "action_id": VALUE,
                "placeholder": _plain("Choose…"),
                "options": options,
            }
            if initial:
                element["initial_option"] = initial[0]
            return element
        many = len(options) > MAX_CHECKBOXES
        element = {
            "type": "multi_static_select" if many else "checkboxes",
            "action_id": VALUE,
            "options": options,
        }
        if many:
            element["placeholder"] = _plain("Choose…")
        if initial:
            element["initial_options"] = initial
        return element
    element = {"type": "plain_text_input", "action_id": VALUE}
    if isinstance(prop.get("maxLength"), int) and prop["maxLength"] <= 3000:
        element["max_length"] = prop["maxLength"]
        element["multiline"] = prop["maxLength"] > 150
    if field.has_default and isinstance(field.default, str) and field.default:
        element["initial_value"] = field.default
    return element


def _field_blocks(schema: dict[str, Any]) -> list[Block]:
    blocks: list[Block] = []
    for field in check_schema(schema):
        block: Block = {
            "type": "input",
            "block_id": field_input(field.name),
            # checkboxes may be left empty (an empty list); Slack can't say "required" for them
            "optional": not field.required or field.kind == "multi_enum",
            "label": _plain(field.label, MAX_LABEL),
            "element": _field_element(field, schema["properties"][field.name]),
        }
        if field.description:
            block["hint"] = _plain(field.description, MAX_LABEL)
        blocks.append(block)
    return blocks


def answer_modal(request: Request) -> dict[str, Any]:
    """The view the API opens (views.open) when "Answer…" is clicked."""
    blocks: list[Block] = []
    if request.prompt:
        text = _clip(_escape(request.prompt), MAX_SECTION)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    questions = questions_of(request.metadata)
    if questions is not None:
        for i, q in enumerate(questions):
            if i:
                blocks.append({"type": "divider"})
            blocks += _question_blocks(i, q)
    else:
        schema = request.metadata["answer_schema"]
        if not isinstance(schema, dict):  # checked at create: a stored answer_schema is an object
            raise TypeError(f"{request.id}: metadata.answer_schema is not an object")
        description = schema.get("description")
        if isinstance(description, str) and description:
            text = _clip(_escape(description), MAX_SECTION)
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
        blocks += _field_blocks(schema)
    return {
        "type": "modal",
        "callback_id": ANSWER_FORM_CALLBACK,
        "private_metadata": request.id,
        "title": _plain("Answer", 24),
        "submit": _plain("Answer", 24),
        "close": _plain("Cancel", 24),
        "blocks": blocks[:100],
    }


def _slack_values(values: dict[str, Any]) -> Callable[[str], list[str] | None]:
    """`state.values` as `read_answer` reads forms: block id -> the submitted strings.

    Each input block holds one element: chosen options (`selected_options`, or
    `selected_option`, null when none) or typed text (`value`, null when empty).
    """

    def get(block_id: str) -> list[str] | None:
        block = values.get(block_id)
        if not isinstance(block, dict) or not block:
            return None
        entry = next(iter(block.values()))
        if not isinstance(entry, dict):
            return None
        if isinstance(entry.get("selected_options"), list):
            return [str(o.get("value")) for o in entry["selected_options"] if isinstance(o, dict)]
        if "selected_option" in entry:
            option = entry["selected_option"]
            return [str(option.get("value"))] if isinstance(option, dict) else []
        value = entry.get("value")
        return [value] if isinstance(value, str) else []

    return get


def answer_from_view_state(request: Request, state_values: dict[str, Any]) -> Any:
    """The answer a `view_submission` holds (pass `view.state.values`), in the contract's shape.

    Raises InvalidAnswer for values no form of ours could send (an option index out of range,
    a number that isn't one); whether the answer fits is left to `validate_answer`.
    """
    values = state_values if isinstance(state_values, dict) else {}
    return read_answer(request.metadata, _slack_values(values))


def errors_for(exc: InvalidAnswer, request: Request | None = None) -> dict[str, Any]:
    """The response to a `view_submission` that doesn't fit: each error beside its input."""
    errors = error_inputs(exc, request.metadata if request is not None else {})
    return {
        "response_action": "errors",
        "errors": {block: _clip(text, 500) for block, text in errors.items()},
    }
