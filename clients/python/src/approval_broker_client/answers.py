"""The text a model reads for a structured answer: `Which auth method? OAuth 2.0`.

Kept here so an agent outside the fleet and the fleet's own resume read answers the same way
(`broker.domain.questions` re-exports `answer_text`).
"""

from __future__ import annotations

import json
from typing import Any


def is_structured(metadata: dict[str, Any]) -> bool:
    """Whether answers to this request are checked against questions or a schema."""
    return "questions" in metadata or "answer_schema" in metadata


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def render_schema_answer(schema: dict[str, Any], answer: dict[str, Any]) -> str:
    """One line per field, `Label: value`, in the schema's order; fields left empty are omitted."""
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    lines = []
    for name in [*props, *(k for k in answer if k not in props)]:
        if name not in answer or answer[name] is None:
            continue
        prop = props.get(name) if isinstance(props.get(name), dict) else {}
        label = str(prop.get("title") or name)
        value = answer[name]
        text = ", ".join(map(_scalar, value)) if isinstance(value, list) else _scalar(value)
        lines.append(f"{label}: {text}")
    return "\n".join(lines)


def _line(question: str, choices: list[str]) -> str:
    joiner = " " if question.rstrip().endswith(("?", ":")) else ": "
    return f"{question.rstrip()}{joiner}{', '.join(choices)}"


def answer_text(metadata: dict[str, Any], answer: Any) -> str:
    """What the model reads: `Which auth method? OAuth 2.0`, one line per question.

    Own text shows as `Other: ...`; a schema answer is one `Label: value` line per field.
    Never raises: an answer that doesn't fit (recorded before it was checked) is shown as JSON.
    """
    try:
        if "questions" in metadata and isinstance(answer, dict):
            lines = []
            for item in answer.get("answers", []):
                choices = [str(s) for s in item.get("selected") or []]
                if item.get("other"):
                    choices.append(f"Other: {item['other']}")
                lines.append(_line(str(item.get("question", "")), choices))
            if lines:
                return "\n".join(lines)
        if "answer_schema" in metadata and isinstance(answer, dict):
            text = render_schema_answer(metadata["answer_schema"], answer)
            if text:
                return text
    except (AttributeError, TypeError):
        pass
    return answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
