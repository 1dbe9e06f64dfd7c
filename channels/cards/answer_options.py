"""Answer buttons of a question on a chat card (Telegram, Discord): which options get a button,
and the answer a click on option N stands for. Shared by the notifiers, which draw the buttons,
and the API, which reads the click, so the two never disagree on what N means.

A question gets one button per option when it has `metadata.options`, or a single structured
question that takes one choice; anything richer (several questions, multi-select, a JSON
Schema) is answered in the inbox or by REST, which the card says.
"""

from __future__ import annotations

from typing import Any

from broker.domain.models import Request
from broker.domain.questions import questions_of

MAX_OPTIONS = 10
MAX_OPTION_CHARS = 80


def options_of(request: Request) -> list[str]:
    """The option labels that get a button, in order; [] when they would not fit as buttons."""
    raw: Any = request.metadata.get("options")
    if not isinstance(raw, list):
        questions = questions_of(request.metadata)
        if questions and len(questions) == 1 and not questions[0].multi_select:
            raw = questions[0].labels()
    if not isinstance(raw, list):
        return []
    opts = [str(o) for o in raw if isinstance(o, str | int | float) and not isinstance(o, bool)]
    if not opts or len(opts) > MAX_OPTIONS or any(len(o) > MAX_OPTION_CHARS for o in opts):
        return []
    return opts


def option_answer(request: Request, index: int) -> Any:
    """The answer a click on option `index` gives (None: no such option)."""
    opts = options_of(request)
    if not 0 <= index < len(opts):
        return None
    if isinstance(request.metadata.get("options"), list):
        return opts[index]
    questions = questions_of(request.metadata)
    assert questions is not None
    [question] = questions
    return {"answers": [{"question": question.question, "selected": [opts[index]], "other": None}]}
