"""Policy rules, under the import path users and the CLI write: re-exports.

Rules as data and matching are `broker.domain.rules`; keeping them in Redis is
`broker.store.rule_store`, `broker.store.rule_records` and `broker.store.rule_sync`. Rules
decide only `approval` requests; questions and external calls always go to a person.
"""

# compatibility import path: re-exports only

from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.rules.matching import (
    Call,
    creator_channel_for,
    creator_roles_for,
    evaluate,
    matches,
    may_remember,
    suggested_rules,
)
from broker.domain.rules.models import Rule, RuleBody, parse_body
from broker.store.rule_records import RuleKeys
from broker.store.rule_store import RuleExists, RuleStore, active_match
from broker.store.rule_sync import sync_at_start, sync_config_rules

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
