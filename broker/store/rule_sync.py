"""The operator's policy loaded into Redis: the config's `[[rules]]`, stored idempotently.

Loading the same config twice changes nothing, and a rule dropped from the file is revoked.
Checking the rules is `broker.domain.rules.config_rules` (no Redis), which every role runs first.
"""

from __future__ import annotations

from typing import Any

from broker.domain.errors import ConfigError
from broker.domain.rules.config_rules import parse_config_rules
from broker.domain.rules.models import CONFIG_CREATOR, Rule, RuleBody
from broker.redis.replies import as_str
from broker.store.rule_records import epoch, to_fields
from broker.store.rule_store import RuleStore


def sync_config_rules(store: RuleStore, rules: list[Rule]) -> bool:
    """Make the store hold exactly the config's rules, in one transaction; True if it changed.

    A config rule keeps its `created_at` and hits across restarts (only its body is rewritten); one the config no longer has
    is revoked (kept and listed, still the config's: putting it back re-activates it). An id already taken by a rule made through the API is refused.
    """
    keys = store.keys
    wanted = {r.id: r for r in rules}
    known = {as_str(x) for x in store.redis.smembers(keys.from_config)}
    existing = {r.id: r for r in store.get_many(sorted(set(wanted) | known))}
    for rule_id in wanted:
        if rule_id in existing and rule_id not in known:
            raise ConfigError(
                f"config: rules: id {rule_id!r} is taken by a rule "
                f"{existing[rule_id].created_by!r} made; pick another id"
            )
    now = store.now()
    changed = False
    pipe = store.redis.pipeline(transaction=True)  # one slot: the rules tag
    for rule_id, rule in wanted.items():
        old = existing.get(rule_id)
        if old is None:
            store.write(pipe, rule.model_copy(update={"created_at": now}))
            store.audit(pipe, "rule_created", rule, CONFIG_CREATOR)
        elif old.revoked_at is not None or not _same_body(old, rule):
            _rewrite_body(pipe, store, old, rule)
        else:
            continue
        pipe.sadd(keys.from_config, rule_id)
        changed = True
    for rule_id in known - set(wanted):
        old = existing.get(rule_id)
        if old is not None and old.revoked_at is None:
            pipe.hset(keys.rule(rule_id), "revoked_at", epoch(now))
            pipe.srem(keys.index(old.tool), rule_id)
            pipe.incr(keys.version)
            store.audit(pipe, "rule_revoked", old, CONFIG_CREATOR)
            changed = True
    pipe.execute()
    return changed


def sync_at_start(store: RuleStore) -> bool:
    """What each role does at start: make Redis hold the rules of its config (`[[rules]]`)."""
    return sync_config_rules(store, parse_config_rules(store.config.rules, store.config))


def _rewrite_body(pipe: Any, store: RuleStore, old: Rule, rule: Rule) -> None:
    """Replace the body fields only, so hits counted meanwhile by another process stay."""
    keys = store.keys
    fields = {k: v for k, v in to_fields(rule).items() if k in RuleBody.model_fields}
    gone = [k for k in RuleBody.model_fields if k not in fields] + ["revoked_at"]
    pipe.hdel(keys.rule(rule.id), *gone)
    pipe.hset(keys.rule(rule.id), mapping=fields)
    pipe.srem(keys.index(old.tool), rule.id)
    pipe.sadd(keys.index(rule.tool), rule.id)
    pipe.incr(keys.version)


def _same_body(a: Rule, b: Rule) -> bool:
    fields = set(RuleBody.model_fields)
    return a.model_dump(include=fields) == b.model_dump(include=fields)
