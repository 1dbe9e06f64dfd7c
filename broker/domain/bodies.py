"""What a caller sends to decide, checked before it reaches the judge: the decision body
every way in shares (REST, webhook replies), and the check that a JSON body can be stored and
read back (finite numbers, valid Unicode, bounded depth)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from broker.domain.bounded_json import MAX_DEPTH
from broker.domain.models import Decision


def check_json_safe(value: Any, where: str = "body", *, max_depth: int = MAX_DEPTH) -> None:
    """Raise ValueError for a non-finite float, a string that is not valid Unicode, or
    arrays and objects nested deeper than `max_depth` (`bounded_json.MAX_DEPTH`: the body as
    a whole)."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{path}: numbers must be finite")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise ValueError(f"{where}: nested more than {max_depth} deep")
            if isinstance(item, dict):
                for k, v in item.items():
                    _check_text(str(k), path)
                    stack.append((v, f"{path}.{k}", depth + 1))
            else:
                stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{path}: text must be valid Unicode (no lone surrogates)") from None


class DecisionBody(BaseModel):
    """A Decision as a caller gives it; the broker records who decided and when."""

    model_config = ConfigDict(extra="forbid")

    outcome: Literal["approved", "modified", "rejected", "answered", "escalated"]
    reason: str | None = Field(default=None, max_length=10_000)
    args: dict[str, JsonValue] | None = None
    answer: JsonValue = None
    target: str | None = Field(default=None, max_length=200)
    args_hash: str | None = Field(default=None, max_length=128)
    metadata: dict[str, JsonValue] | None = None
    remember: int | dict[str, JsonValue] | None = Field(
        default=None,
        description="keep a policy rule with this decision: the index of one of the request's"
        " `suggested_rules`, or a rule body (approved/rejected only)",
    )

    _decision: Decision | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> DecisionBody:
        check_json_safe(self.model_dump(), "body")
        self._decision = self._build()
        return self

    def to_decision(self) -> Decision:
        """The Decision this body gives (built once, when the body is validated: the same
        object each time, so callers copy it before they change it, as they all do)."""
        return self._decision if self._decision is not None else self._build()

    def _build(self) -> Decision:
        fields = self.model_dump(
            exclude_unset=True, exclude={"request_id", "decided_by", "remember"}
        )
        try:
            return Decision.model_validate(fields)
        except ValidationError as exc:
            msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise ValueError(msg) from None
