"""Policy rules: "always allow / always deny this tool call", decided without a person.

`models` (Rule, RuleBody, matcher checks), `matching` (matches, evaluate, suggested rules,
who may remember), `records` (Redis keys and fields), `store` (RuleStore), `config_rules`
(checking `[[rules]]`), `from_config` (loading them). Rules decide only `approval` requests;
questions and external calls always go to a person.
"""

from broker.rules.config_rules import parse_config_rules
from broker.rules.from_config import sync_at_start, sync_config_rules
from broker.rules.matching import (
    Call,
    creator_channel_for,
    creator_roles_for,
    evaluate,
    matches,
    may_remember,
    suggested_rules,
)
from broker.rules.models import Rule, RuleBody, parse_body
from broker.rules.records import RuleKeys
from broker.rules.store import RuleExists, RuleStore, active_match

__all__ = [
    "Call",
    "Rule",
    "RuleBody",
    "RuleExists",
    "RuleKeys",
    "RuleStore",
    "active_match",
    "creator_channel_for",
    "creator_roles_for",
    "evaluate",
    "matches",
    "may_remember",
    "parse_body",
    "parse_config_rules",
    "suggested_rules",
    "sync_at_start",
    "sync_config_rules",
]
