"""The inbox's structured-question form in headless Chromium against `up --demo`.

Pick options, type an "Other", fill a schema form: what the page posts is the contract's JSON,
an answer that doesn't fit is refused on the page (and by the API) and the request stays
pending, and the demo's own question (order A105: card or store credit?, which `up --demo`
starts) resumes its run.
Chromium and its set-up come from tests/support/browser.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.browser import demo_pending, signed_in
from tests.support.up import ADMIN, stop_up
from tests.support.waiting import wait_for

pytestmark = pytest.mark.system  # processes and browsers: tests/conftest.py spreads these

QUESTIONS = [
    {
        "question": "Which auth method?",
        "header": "Auth",
        "options": [
            {"label": "OAuth 2.0", "description": "users sign in", "preview": "Authorization: Bearer …"},
            {"label": "API key", "preview": "X-Api-Key: …"},
        ],
    },
    {
        "question": "Which scopes?",
        "header": "Scopes",
        "multi_select": True,
        "options": [{"label": "read"}, {"label": "write"}, {"label": "admin"}],
    },
]  # fmt: skip
TICKET = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "title": "Title", "description": "One line", "maxLength": 80},
        "hours": {"type": "number", "title": "Hours", "minimum": 0},
        "priority": {"enum": ["low", "high"], "default": "low", "title": "Priority"},
        "urgent": {"type": "boolean", "title": "Urgent"},
    },
    "required": ["title"],
}


def create(http: httpx.Client, metadata: dict[str, Any], prompt: str) -> str:
    body = {"tool_name": "choose", "kind": "question", "prompt": prompt, "metadata": metadata}
    resp = http.post("/v1/requests", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def test_inbox_form_answers_questions_refuses_a_bad_answer_and_resumes_the_demo(
    chromium: str,  # noqa: F811 - the fixture
    demo: tuple[Any, str],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    proc, url = demo
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    _, asked = demo_pending(http)  # up --demo started the A105 run: its question waits
    run_id = asked["run_id"]
    auth_id = create(http, {"questions": QUESTIONS}, "Set up the API")
    ticket_id = create(http, {"answer_schema": TICKET}, "File a ticket")

    with signed_in(chromium, url, ADMIN, viewport={"width": 1100, "height": 1400}) as page:
        cards = page.locator("article[data-request-id]")
        expect(cards).to_have_count(5, timeout=20_000)

        auth = page.locator(f"article[data-request-id='{auth_id}']")
        auth.locator("[data-action=answer-open]").click()
        form = auth.locator(".questions-form")
        expect(form).to_be_visible()
        expect(form.locator("fieldset.question")).to_have_count(2)
        expect(form.locator("fieldset[data-input=q0] input[type=radio]")).to_have_count(2)
        expect(form.locator("fieldset[data-input=q1] input[type=checkbox]")).to_have_count(3)
        expect(form.locator(".choice .preview").first).to_contain_text("Authorization: Bearer")
        expect(form.locator(".choice .description").first).to_contain_text("users sign in")

        # an option and own words on a single-choice question: refused, shown on the page
        form.get_by_label("OAuth 2.0").check()
        form.get_by_label("Other: Which auth method?").fill("SAML")
        form.get_by_label("read").check()
        auth.locator(".confirm-questions").click()
        expect(auth.locator(":scope > .error")).to_contain_text("takes one choice")
        expect(form.locator("fieldset[data-input=q0][data-invalid]")).to_have_count(1)
        page.screenshot(path=str(tmp_path / "inbox-questions.png"), full_page=True)
        assert http.get(f"/v1/requests/{auth_id}").json()["status"] == "pending"
        same = {
            "answers": [
                {"question": "Which auth method?", "selected": ["OAuth 2.0"], "other": "SAML"},
                {"question": "Which scopes?", "selected": ["read"], "other": None},
            ]
        }
        refused = http.post(
            f"/v1/requests/{auth_id}/decision", json={"outcome": "answered", "answer": same}
        )
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_answer"

        form.get_by_label("Other: Which auth method?").fill("")
        form.get_by_label("admin").check()
        form.get_by_label("Other: Which scopes?").fill("billing")
        auth.locator(".confirm-questions").click()
        expect(cards).to_have_count(4)
        decided = http.get(f"/v1/requests/{auth_id}").json()["decision"]
        assert decided["answer"] == {
            "answers": [
                {"question": "Which auth method?", "selected": ["OAuth 2.0"], "other": None},
                {"question": "Which scopes?", "selected": ["read", "admin"], "other": "billing"},
            ]
        }

        ticket = page.locator(f"article[data-request-id='{ticket_id}']")
        ticket.locator("[data-action=answer-open]").click()
        tform = ticket.locator(".questions-form")
        expect(tform.locator(".schema-field")).to_have_count(4)
        expect(tform.locator("[data-input='field:title']")).to_contain_text("One line")
        expect(tform.get_by_label("Priority")).to_have_value("0")  # the default, preselected
        tform.get_by_label("Hours").fill("-1")
        ticket.locator(".confirm-questions").click()  # no title, hours below the minimum
        expect(ticket.locator(":scope > .error")).to_contain_text("'title' is a required property")
        expect(tform.locator("[data-input='field:hours'][data-invalid]")).to_have_count(1)
        tform.get_by_label("Title").fill("Login fails")
        tform.get_by_label("Hours").fill("2.5")
        tform.get_by_label("Yes").check()
        ticket.locator(".confirm-questions").click()
        expect(cards).to_have_count(3)
        answer = http.get(f"/v1/requests/{ticket_id}").json()["decision"]["answer"]
        assert answer == {"title": "Login fails", "hours": 2.5, "urgent": True, "priority": "low"}

        refund = page.locator(f"article[data-request-id='{asked['id']}']")
        refund.locator("[data-action=answer-open]").click()
        expect(refund.locator("legend")).to_contain_text("card or as store credit?")
        refund.get_by_label("Store credit", exact=True).check()
        refund.locator(".confirm-questions").click()
        expect(cards).to_have_count(2)

    finished = wait_for(
        lambda: (r := http.get(f"/v1/runs/{run_id}").json())["status"] == "finished" and r,
        timeout=60,
    )
    assert finished["output"]["refunded"] is True and finished["output"]["amount"] == 45
    http.close()
    out = stop_up(proc)
    assert proc.returncode == 0, out
