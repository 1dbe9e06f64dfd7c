"""The operator's policy as written: `[[rules]]` in the config, checked when the config loads.

A bad rule stops the broker with a message naming the key (`rules[2].args.amount: ...`). Why
apart from the loading (`broker.store.rule_sync`): the config checks its rules while it is
being built, so this module must not need the config module, Redis or the rule store; it reads
only the queue and agent names it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from broker.domain.config_errors import keys_of, not_defined, unknown_key
from broker.domain.errors import ConfigError, InvalidInput
from broker.domain.rules.models import CONFIG_CREATOR, Rule, RuleBody, parse_body
from broker.domain.rules.routing import route_problem


class QueuesAndAgents(Protocol):
    """What a rule's check reads of the config: which queues and agents exist."""

    @property
    def queues(self) -> Mapping[str, Any]: ...
    @property
    def agents(self) -> Mapping[str, Any]: ...


def parse_config_rules(raw: Any, config: QueuesAndAgents, source: str = "config") -> list[Rule]:
    """The config's rules, or ConfigError naming the first bad key."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: rules: must be an array of tables ([[rules]])")
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        where = f"rules[{i}]"
        unknown = (
            [k for k in entry if k not in keys_of(RuleBody)] if isinstance(entry, dict) else []
        )
        if unknown:
            raise ConfigError(
                f"{source}: {where}.{unknown[0]}: {unknown_key(unknown[0], keys_of(RuleBody))}"
            )
        try:
            body = parse_body(entry, where)
        except InvalidInput as exc:
            raise ConfigError(f"{source}: {exc.detail}") from None
        problem = _problem(body, config, seen)
        if problem:
            raise ConfigError(f"{source}: {where}.{problem}")
        assert body.id is not None
        seen.add(body.id)
        rules.append(
            Rule.model_validate(
                {**body.model_dump(), "created_by": CONFIG_CREATOR, "created_at": _EPOCH}
            )
        )
    return rules


_EPOCH = "1970-01-01T00:00:00Z"  # replaced by the load time when the rule is first stored


def _problem(body: RuleBody, config: QueuesAndAgents, seen: set[str]) -> str | None:
    if body.id is None:
        return "id: required in the config, so a restart finds the same rule"
    if body.id in seen:
        return f"id: {body.id!r} is used by an earlier rule"
    if body.run_id is not None:
        return "run_id: a config rule can't name a run (runs come and go)"
    if body.queue is not None and body.queue not in config.queues:
        return f"queue: {not_defined('queue', body.queue, sorted(config.queues))}"
    if body.agent is not None and body.agent not in config.agents:
        return f"agent: {not_defined('agent', body.agent, sorted(config.agents))}"
    return route_problem(body, config.queues)
