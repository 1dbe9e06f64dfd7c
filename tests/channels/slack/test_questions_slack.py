"""Slack for structured questions: the Answer… button, the modal, reading and refusing its submission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker.domain.args_hash import args_hash
from broker.domain.config import parse_config
from broker.domain.models import Decision, Outcome, Request, Status
from broker.domain.questions import InvalidAnswer, validate_answer
from channels.slack.blocks import render
from channels.slack.question_modal import (
    ANSWER_FORM,
    ANSWER_FORM_CALLBACK,
    answer_from_view_state,
    answer_modal,
    errors_for,
)

pytestmark = pytest.mark.unit  # no Redis, no server: tests/conftest.py runs these last

NOW = datetime(2030, 1, 1, tzinfo=UTC)
CONFIG = parse_config(
    {
        "queues": {
            "default": {"channels": ["slack:approvals"], "escalate_to": "managers"},
            "managers": {"channels": ["slack:approvals"]},
        },
        "slack": {
            "bot_token": "x",
            "signing_secret": "y",
            "channels": {"approvals": {"channel": "C1"}},
        },
    }
)
QUESTIONS = [
    {
        "question": "Which auth method?",
        "header": "Auth",
        "context": "Public API <!channel>",
        "multi_select": False,
        "options": [
            {
                "label": "OAuth 2.0",
                "description": "Tokens from the IdP",
                "preview": "Authorization: Bearer <t>",
            },
            {"label": "API key"},
        ],
    },
    {
        "question": "Which scopes?",
        "header": "Scopes",
        "multi_select": True,
        "options": [{"label": "read"}, {"label": "write"}, {"label": "admin"}],
    },
]
SCHEMA = {
    "type": "object",
    "title": "Ticket",
    "description": "File a ticket",
    "properties": {
        "title": {
            "type": "string",
            "title": "Title",
            "description": "One line",
            "maxLength": 80,
            "default": "Bug",
        },
        "hours": {"type": "number", "minimum": 0, "maximum": 40, "default": 1.5},
        "count": {"type": "integer"},
        "priority": {"enum": ["low", "high"], "default": "high"},
        "labels": {"type": "array", "items": {"enum": ["ui", "api"]}, "default": ["api"]},
        "areas": {"type": "array", "items": {"enum": [f"area{n}" for n in range(12)]}},
        "urgent": {"type": "boolean", "default": False},
    },
    "required": ["title", "count"],
}


def make_request(metadata: dict[str, Any], **fields: Any) -> Request:
    base: dict[str, Any] = {
        "id": "req_1",
        "tool_call_id": "call_1",
        "tool_name": "choose",
        "args_hash": args_hash({}),
        "kind": "question",
        "prompt": "Set up <@U1> auth",
        "metadata": metadata,
        "created_at": NOW,
        "expires_at": NOW + timedelta(minutes=10),
    }
    return Request.model_validate(base | fields)


ASKED = make_request({"questions": QUESTIONS})
FORM = make_request({"answer_schema": SCHEMA})


def elements(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def inputs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in view["blocks"] if b["type"] == "input"}


# --- the message ----------------------------------------------------------------------------


@pytest.mark.parametrize("request_", [ASKED, FORM])
def test_a_structured_question_gets_one_answer_button_instead_of_options(request_: Request) -> None:
    _, blocks = render(request_, CONFIG, "slack:approvals")
    buttons = elements(blocks)
    assert [(b["action_id"], b["text"]["text"]) for b in buttons] == [
        (ANSWER_FORM, "Answer…"),
        ("reject", "Reject"),
        ("escalate", "Escalate"),
    ]
    assert all(b["value"] == "req_1" for b in buttons)
    assert not [b for b in blocks if b["type"] == "input"]  # no free-text box on the message


def test_the_message_lists_the_questions_escaped() -> None:
    _, blocks = render(ASKED, CONFIG, "slack:approvals")
    text = "\n".join(b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b)
    assert "*Auth*  Which auth method?" in text
    assert "•  OAuth 2.0 _Tokens from the IdP_" in text
    assert "*Scopes*  Which scopes?" in text


def test_plain_and_malformed_questions_keep_the_old_controls() -> None:
    plain = make_request({"options": ["yes", "no"]})
    assert [b["action_id"] for b in elements(render(plain, CONFIG, "slack:approvals")[1])][:2] == [
        "answer:yes",
        "answer:no",
    ]
    broken = make_request({"questions": [{"question": "Q?", "header": "x" * 20, "options": []}]})
    _, blocks = render(broken, CONFIG, "slack:approvals")
    assert ANSWER_FORM not in [b["action_id"] for b in elements(blocks)]
    assert [b["block_id"] for b in blocks if b["type"] == "input"] == ["answer_input"]


def test_the_answered_message_shows_the_answer_as_text() -> None:
    answer = {
        "answers": [
            {"question": "Which auth method?", "selected": ["API key"], "other": None},
            {"question": "Which scopes?", "selected": ["read"], "other": "<!here>"},
        ]
    }
    done = ASKED.model_copy(
        update={
            "status": Status.answered,
            "decision": Decision(
                outcome=Outcome.answered, answer=answer, decided_by="ann", decided_at=NOW
            ),
        }
    )
    _, blocks = render(done, CONFIG, "slack:approvals")
    texts = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    outcome = next(t for t in texts if "*Answered*" in t)
    assert (
        "*Answer*\n>Which auth method? API key\n>Which scopes? read, Other: &lt;!here&gt;"
        in outcome
    )
    assert not elements(blocks)


# --- the modal: questions -------------------------------------------------------------------


def test_the_modal_has_radios_checkboxes_and_an_other_field_per_question() -> None:
    view = answer_modal(ASKED)
    assert view["type"] == "modal"
    assert view["callback_id"] == ANSWER_FORM_CALLBACK
    assert view["private_metadata"] == "req_1"
    assert all(len(view[k]["text"]) <= 24 for k in ("title", "submit", "close"))
    found = inputs(view)
    assert list(found) == ["q0", "q0_other", "q1", "q1_other"]
    radio = found["q0"]["element"]
    assert radio["type"] == "radio_buttons"
    assert radio["options"] == [
        {
            "text": {"type": "plain_text", "text": "OAuth 2.0"},
            "value": "0",
            "description": {"type": "plain_text", "text": "Tokens from the IdP"},
        },
        {"text": {"type": "plain_text", "text": "API key"}, "value": "1"},
    ]
    assert found["q0"]["label"]["text"] == "Which auth method?"
    assert found["q1"]["element"]["type"] == "checkboxes"
    assert [o["value"] for o in found["q1"]["element"]["options"]] == ["0", "1", "2"]
    assert found["q1_other"]["element"]["type"] == "plain_text_input"
    assert all(b["optional"] for b in found.values())
    sections = [b["text"]["text"] for b in view["blocks"] if b["type"] == "section"]
    assert sections[0] == "Set up &lt;@U1&gt; auth"  # the prompt, escaped
    assert "*Auth*  Which auth method?\nPublic API &lt;!channel&gt;" in sections
    assert "_OAuth 2.0_\n```Authorization: Bearer &lt;t&gt;```" in sections  # the preview


def test_long_labels_are_clipped_to_slacks_limits_but_values_stay_indices() -> None:
    long = [
        {
            **QUESTIONS[0],
            "options": [{"label": "L" * 200, "description": "D" * 300}, {"label": "b"}],
        }
    ]
    view = answer_modal(make_request({"questions": long}))
    [option, _] = inputs(view)["q0"]["element"]["options"]
    assert len(option["text"]["text"]) == 75 and len(option["description"]["text"]) == 75
    assert option["value"] == "0"


def slack_state(*pairs: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for block, action, entry in pairs:
        values.setdefault(block, {})[action] = entry
    return values


def radio(value: str | None) -> dict[str, Any]:
    option = (
        None if value is None else {"text": {"type": "plain_text", "text": "x"}, "value": value}
    )
    return {"type": "radio_buttons", "selected_option": option}


def checks(*values: str) -> dict[str, Any]:
    return {
        "type": "checkboxes",
        "selected_options": [
            {"text": {"type": "plain_text", "text": v}, "value": v} for v in values
        ],
    }


def text(value: str | None) -> dict[str, Any]:
    return {"type": "plain_text_input", "value": value}


def test_a_submitted_modal_reads_back_as_a_contract_answer() -> None:
    state = slack_state(
        ("q0", "choice", radio("1")),
        ("q0_other", "other", text(None)),
        ("q1", "choice", checks("2", "0")),
        ("q1_other", "other", text("billing")),
    )
    answer = answer_from_view_state(ASKED, state)
    assert validate_answer(ASKED.metadata, answer) == {
        "answers": [
            {"question": "Which auth method?", "selected": ["API key"], "other": None},
            {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
        ]
    }


def test_a_modal_answer_that_does_not_fit_shows_the_error_beside_its_question() -> None:
    state = slack_state(
        ("q0", "choice", radio("0")),
        ("q0_other", "other", text("SAML")),
        ("q1", "choice", checks()),
        ("q1_other", "other", text("  ")),
    )
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(ASKED.metadata, answer_from_view_state(ASKED, state))
    assert errors_for(caught.value, ASKED) == {
        "response_action": "errors",
        "errors": {"q0": "'Which auth method?' takes one choice (an option or 'other'), not 2"},
    }
    state["q0_other"]["other"]["value"] = None
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(ASKED.metadata, answer_from_view_state(ASKED, state))
    assert errors_for(caught.value, ASKED)["errors"] == {
        "q1": "'Which scopes?' is not answered (choose an option or write 'other')"
    }


@pytest.mark.parametrize("value", ["7", "-1", "²", "API key", "None"])
def test_a_tampered_option_value_is_refused(value: str) -> None:
    state = slack_state(("q0", "choice", radio(value)))
    with pytest.raises(InvalidAnswer) as caught:
        answer_from_view_state(ASKED, state)
    assert errors_for(caught.value)["errors"] == {"q0": "not an option"}


# --- the modal: a schema --------------------------------------------------------------------


def test_schema_fields_become_typed_inputs_with_defaults_and_descriptions() -> None:
    view = answer_modal(FORM)
    found = inputs(view)
    assert list(found) == [f"field:{n}" for n in SCHEMA["properties"]]
    title = found["field:title"]
    assert title["label"]["text"] == "Title" and title["hint"]["text"] == "One line"
    assert title["optional"] is False
    assert title["element"] == {
        "type": "plain_text_input",
        "action_id": "value",
        "max_length": 80,
        "multiline": False,
        "initial_value": "Bug",
    }
    assert found["field:hours"]["element"] == {
        "type": "number_input",
        "action_id": "value",
        "is_decimal_allowed": True,
        "min_value": "0",
        "max_value": "40",
        "initial_value": "1.5",
    }
    assert found["field:hours"]["optional"] is True
    assert found["field:count"]["element"]["is_decimal_allowed"] is False
    priority = found["field:priority"]["element"]
    assert priority["type"] == "static_select"
    assert priority["initial_option"] == {
        "text": {"type": "plain_text", "text": "high"},
        "value": "1",
    }
    labels = found["field:labels"]["element"]
    assert labels["type"] == "checkboxes"
    assert labels["initial_options"] == [
        {"text": {"type": "plain_text", "text": "api"}, "value": "1"}
    ]
    assert found["field:areas"]["element"]["type"] == "multi_static_select"  # 12 > 10 choices
    urgent = found["field:urgent"]["element"]
    assert urgent["type"] == "radio_buttons"
    assert urgent["initial_option"]["value"] == "false"
    assert view["blocks"][1]["text"]["text"] == "File a ticket"


def test_a_submitted_schema_modal_reads_back_typed() -> None:
    state = slack_state(
        ("field:title", "value", text("Login fails")),
        ("field:hours", "value", {"type": "number_input", "value": "2.5"}),
        ("field:count", "value", {"type": "number_input", "value": "3"}),
        ("field:priority", "value", {"type": "static_select", "selected_option": {"value": "0"}}),
        ("field:labels", "value", checks("0", "1")),
        ("field:areas", "value", {"type": "multi_static_select", "selected_options": []}),
        ("field:urgent", "value", radio("true")),
    )
    answer = answer_from_view_state(FORM, state)
    assert answer == {
        "title": "Login fails",
        "hours": 2.5,
        "count": 3,
        "priority": "low",
        "labels": ["ui", "api"],
        "areas": [],
        "urgent": True,
    }
    assert validate_answer(FORM.metadata, answer) == answer


def test_empty_schema_inputs_are_left_out_so_defaults_apply() -> None:
    state = slack_state(
        ("field:title", "value", text("x")),
        ("field:hours", "value", {"type": "number_input", "value": None}),
        ("field:count", "value", {"type": "number_input", "value": "1"}),
        ("field:priority", "value", {"type": "static_select", "selected_option": None}),
        ("field:urgent", "value", radio(None)),
    )
    answer = answer_from_view_state(FORM, state)
    assert answer == {"title": "x", "count": 1}
    assert validate_answer(FORM.metadata, answer) == {
        "title": "x",
        "count": 1,
        "hours": 1.5,
        "priority": "high",
        "labels": ["api"],
        "urgent": False,
    }


def test_schema_errors_are_shown_beside_each_field() -> None:
    state = slack_state(("field:hours", "value", {"type": "number_input", "value": "99"}))
    with pytest.raises(InvalidAnswer) as caught:
        validate_answer(FORM.metadata, answer_from_view_state(FORM, state))
    assert errors_for(caught.value, FORM)["errors"] == {
        "field:count": "required",
        "field:hours": "99 is greater than the maximum of 40",
    }  # the title is left out too, but its default applies


@pytest.mark.parametrize(
    ("block", "entry", "error"),
    [
        ("field:count", {"type": "number_input", "value": "2.5"}, "must be a whole number"),
        ("field:hours", {"type": "number_input", "value": "lots"}, "'lots' is not a number"),
        ("field:hours", {"type": "number_input", "value": "inf"}, "'inf' is not a number"),
        (
            "field:priority",
            {"type": "static_select", "selected_option": {"value": "9"}},
            "not one of the choices",
        ),
        ("field:urgent", radio("maybe"), "not one of the choices"),
    ],
)
def test_values_no_form_of_ours_sends_are_refused(
    block: str, entry: dict[str, Any], error: str
) -> None:
    with pytest.raises(InvalidAnswer) as caught:
        answer_from_view_state(FORM, slack_state((block, "value", entry)))
    assert errors_for(caught.value, FORM)["errors"] == {block: error}


def test_an_error_about_the_answer_as_a_whole_goes_to_the_first_input() -> None:
    whole = InvalidAnswer("answer: must be an object")
    assert errors_for(whole, FORM)["errors"] == {"field:title": "answer: must be an object"}
    assert errors_for(whole, ASKED)["errors"] == {"q0": "answer: must be an object"}


def test_every_view_stays_within_slacks_limits() -> None:
    for request in (ASKED, FORM):
        view = answer_modal(request)
        assert len(view["blocks"]) <= 100
        ids = [b["block_id"] for b in view["blocks"] if "block_id" in b]
        assert len(ids) == len(set(ids)) and all(len(i) <= 255 for i in ids)
        for block in inputs(view).values():
            element = block["element"]
            options = element.get("options", [])
            if element["type"] in ("radio_buttons", "checkboxes"):
                assert len(options) <= 10
            for option in options:
                assert len(option["text"]["text"]) <= 75 and len(option["value"]) <= 150
