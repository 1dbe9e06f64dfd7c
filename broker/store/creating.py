"""The create step: new requests written in one Lua call per partition (create.lua).

Why a module of its own: it is the hot path of every create, alone or in bulk. Each distinct
NewRequest is checked and encoded once (a bulk of copies of one object shares that work), its
hash fields become the script's ARGV as they are (no JSON object for Lua to decode; packed by
`broker.store.create_args`), policy rules are matched from the per-process rule set cached by
the rules' version, and that version is carried into the step as a check instead of being read
first (a single Redis). The Requests handed back are built from what was written, never read
back (a rule-decided one too). Nothing here decides a request a rule does not cover
(`broker.domain.rule_decided`), and nothing reads a request.

On a Redis Cluster the rules live in a slot of their own (`Keys.rules`): the version is read
once per call before the step, and the hits of the rules that decided are counted after it, in
the rules' slot. A rule revoked before a create starts is never applied by it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.domain.args_schema import check_schema
from broker.domain.errors import InvalidInput
from broker.domain.models import NewRequest, Request, from_timestamp
from broker.domain.questions import validate_question_metadata
from broker.domain.quorum import quorum_of
from broker.domain.receipts import CallFacts
from broker.domain.rule_decided import RuleVerdict, verdict_for
from broker.domain.rules.models import Rule
from broker.redis.replies import as_str
from broker.store.create_args import Prebuilt, Prepared, pack
from broker.store.create_routing import CreateRouting, RouteVerdict, cell_of
from broker.store.handles import Store
from broker.store.request_hash import decided, encode
from broker.store.rule_store import RuleStore
from broker.store.run_state import RUN_EVENTS_MAXLEN
from broker.store.script_keys import ScriptKeys, create_batch_keys, insight_days
from broker.store.shadow_rules import ShadowRecorder
from broker.tracing import spans as traced

_TRIES = 5
"""Create calls at most while the rules keep changing under us."""
_AGENTS_KEPT = 10_000
_KEYS_KEPT = 1_000


class RulesBusy(RedisConnectionError):
    """The rules changed under every try of a create (nothing was written): like a Redis that
    can't be reached, the API answers 503 and a role retries."""


class Creating:
    """Runs create.lua for one partition's requests (or one round of a run)."""

    def __init__(self, store: Store, rules: RuleStore) -> None:
        self.store = store
        self.rules = rules
        self.cluster = isinstance(store.redis, RedisCluster)
        self._agents: dict[str, str] = {}  # run id -> agent (a run's agent never changes)
        self._keys: dict[tuple[Any, ...], ScriptKeys] = {}
        self._copy = True  # copies of a request written by COPY, until Redis refuses it once
        self.shadow = ShadowRecorder(store, rules)
        self.routing = CreateRouting(store, rules)

    def prepare(
        self, run_id: str | None, round_no: int, news: Iterable[NewRequest]
    ) -> dict[int, Prepared]:
        """Check and encode each distinct NewRequest (by identity); raises InvalidInput for
        one nothing can serve. A bulk split over partitions is checked whole first, so one
        bad request leaves every partition unwritten."""
        news = list(news)
        agent = self._agent(run_id) if any(n.kind == "approval" for n in news) else None
        prepared: dict[int, Prepared] = {}
        for new in news:
            if id(new) not in prepared:
                prepared[id(new)] = self._prepare(new, run_id, round_no, agent)
        return prepared

    def create(
        self,
        run_id: str | None,
        round_no: int,
        ids: Sequence[str],
        news: Sequence[NewRequest],
        prepared: dict[int, Prepared] | None = None,
    ) -> tuple[str, list[Request]]:
        """('ok', the requests), ('exists', []) for a round already registered; raises
        InvalidInput (nothing written) for a request nothing can serve or an id taken.
        `ids[i]` is the id of `news[i]` (two lists, not pairs: no object per request)."""
        if prepared is None:
            prepared = self.prepare(run_id, round_no, news)
        preps = [prepared[id(new)] for new in news]
        version = self.rules.read_version() if self.cluster else self.rules.known_version()
        excluded: set[str] = set()
        shadows: dict[str, Rule] = {}
        asked_news, asked_preps = news, preps
        for _ in range(_TRIES):
            shadows.clear()
            verdicts = self._receipted(
                run_id,
                ids,
                asked_news,
                self._verdicts(ids, asked_news, asked_preps, excluded, version, shadows),
            )
            routes = self.routing.routes(
                run_id, round_no, ids, asked_news, asked_preps, verdicts, excluded, version
            )
            news, preps = self.routing.applied(ids, asked_news, asked_preps, routes)
            result, variant_of = self._run(
                run_id, round_no, ids, news, preps, verdicts, version, routes
            )
            if result[0] == "rules_changed":  # matched with an older rule set: match again
                version = result[1].encode() if result[1] else None
            elif result[0] == "rule_changed":  # revoked or expired meanwhile: without it
                excluded.add(str(result[1]))
            else:
                break
        else:
            raise RulesBusy(f"create kept finding its rules changed: {result!r}")
        if result[0] == "duplicate":
            raise InvalidInput(f"request {result[1]} already exists", code="duplicate")
        if result[0] == "ok_whole":  # COPY refused (an ACL without +copy): whole hashes from now
            self._copy = False
        elif result[0] != "ok":
            return str(result[0]), []
        if (verdicts or routes) and self.cluster:
            self.rules.count_hits([*verdicts.values(), *routes.values()])
        if shadows:
            self.shadow.record(shadows, self.routing.describe_shadows(shadows, ids, asked_news))
        created = from_timestamp(float(result[1]))
        decided_at = datetime.fromisoformat(result[2]) if result[2] else None
        expiries = [from_timestamp(float(expires)) for expires in result[3:]]  # per variant
        made = [
            p.encoded.request(
                rid,
                new.tool_call_id or rid,
                new.created_by,
                created,
                expiries[variant_of[id(p)]],
                new.allowed_roles,
            )
            for rid, new, p in zip(ids, news, preps, strict=True)
        ]
        if decided_at is not None:  # as the step wrote them: decided, with the rule's entry
            made = [decided(r, verdicts[r.id], decided_at) if r.id in verdicts else r for r in made]
            traced.ruled([r for r in made if r.id in verdicts])  # spans, when tracing is on
        if routes:  # as the step wrote them: with the route's history entry
            made = [routes[r.id].noted(r, created) if r.id in routes else r for r in made]
        return "ok", made

    def _prepare(
        self, new: NewRequest, run_id: str | None, round_no: int, agent: str | None
    ) -> Prepared:
        """Refuse a request nothing can serve; else its timeout, quorum, fields and call."""
        config = self.store.config
        self.store.check_queue(new.queue)
        validate_question_metadata(new.metadata, kind=new.kind)
        if new.callback is not None and config.channel_problem(
            config.callback_channel(new.callback)
        ):
            raise InvalidInput(
                f"callback webhook {new.callback!r} is not defined", code="unknown_webhook"
            )
        if new.args_schema is not None:
            check_schema(new.args_schema)
        timeout = new.timeout_s if new.timeout_s is not None else config.timeout_for(new.queue)
        quorum = quorum_of(new, config)
        made = None
        if new.kind == "approval":
            made = (new, run_id, agent, config.queue_roles(new.queue))
        encoded = encode(new, run_id, round_no, quorum, agent)
        return Prepared(repr(float(timeout)), quorum, encoded, made)

    def _verdicts(
        self,
        ids: Sequence[str],
        news: Sequence[NewRequest],
        preps: list[Prepared],
        excluded: set[str],
        version: bytes | None,
        shadows: dict[str, Rule],
    ) -> dict[str, RuleVerdict]:
        """The rule deciding each approval call, if one does (matched once per distinct call;
        not at all for a tool no rule of this version may cover). The shadow rule that would
        decide a call goes to `shadows` (request id -> rule): it decides nothing."""
        out: dict[str, RuleVerdict] = {}
        seen: dict[int, RuleVerdict | None] = {}
        seen_shadow: dict[int, Rule | None] = {}
        covered: dict[str, bool] = {}
        for rid, new, p in zip(ids, news, preps, strict=True):
            if not p.approval:
                continue
            tool = new.tool_name
            if tool not in covered:  # False: `match` would find nothing, so the call isn't made
                covered[tool] = self.rules.may_cover(tool, version)
            if not covered[tool]:
                continue
            if id(p) not in seen:
                found = self.rules.match(p.call, exclude=excluded, quorum=p.quorum, version=version)
                seen[id(p)] = verdict_for(found[1]) if found is not None else None
            verdict = seen[id(p)]
            if verdict is not None:
                out[rid] = verdict
            if id(p) not in seen_shadow:
                shadow = self.rules.shadow_match(p.call, quorum=p.quorum, version=version)
                seen_shadow[id(p)] = shadow[1] if shadow is not None else None
            shadow_rule = seen_shadow[id(p)]
            if shadow_rule is not None:
                shadows[rid] = shadow_rule
        return out

    def _receipted(
        self,
        run_id: str | None,
        ids: Sequence[str],
        news: Sequence[NewRequest],
        verdicts: dict[str, RuleVerdict],
    ) -> dict[str, RuleVerdict]:
        """Each rule's allow with the receipt of the one call it decides (`broker.domain.receipts`)."""
        receipts = self.store.receipts
        if receipts is None or not verdicts:
            return verdicts
        out = dict(verdicts)
        for rid, new in zip(ids, news, strict=True):
            if rid in verdicts:
                call = CallFacts(rid, new.tool_name, new.tool_call_id or rid, run_id, new.args)
                out[rid] = verdicts[rid].receipted(receipts, call)
        return out

    def _run(
        self,
        run_id: str | None,
        round_no: int,
        ids: Sequence[str],
        news: Sequence[NewRequest],
        preps: list[Prepared],
        verdicts: dict[str, RuleVerdict],
        version: bytes | None,
        routes: dict[str, RouteVerdict],
    ) -> tuple[list[Any], dict[int, int]]:
        """The step's reply, and the variant (timeout, queue, creator) of each `Prepared`."""
        keys = self.store.keys
        partition = keys.partition_of_run(run_id) if run_id else keys.partition_of_request(ids[0])
        distinct = {id(p): (p, new) for p, new in zip(preps, news, strict=True)}
        shared = self._shared_keys(
            partition,
            run_id,
            round_no,
            frozenset(new.queue for _, new in distinct.values()),
            frozenset(new.created_by for _, new in distinct.values() if new.created_by),
            frozenset(
                [*(v.rule_id for v in verdicts.values()), *(r.rule_id for r in routes.values())]
            ),
        )
        head = keys.request(ids[0])[: -len(ids[0])]  # one partition: one prefix
        script_keys = [*shared.keys, *[head + rid for rid in ids]]
        argv, variants, variant_of = pack(ids, news, preps, distinct)
        rules: dict[str, Any] = {}
        if verdicts:
            for i, (rid, new, p) in enumerate(zip(ids, news, preps, strict=True), start=1):
                if rid in verdicts:
                    rules[str(i)] = {**verdicts[rid].lua(), "cell": cell_of(new, p)}
        values: dict[str, Any] = {
            "maxlen": str(self.store.maxlen),
            "round": str(round_no),
            "retention": self.store.retention,
            "req_at": len(shared.keys) + 1,
            "cut": len(head.encode()),  # a request's id is its key past this many bytes
            "k": shared.roles,
            "streams": shared.streams,
            "r": {},
            "v": [[float(t), q, c] for t, q, c in variants],
        }
        if rules:
            values["rules"] = rules
        if routes:
            values["routes"] = {
                str(i): {**routes[rid].lua(), "cell": cell_of(new, p)}
                for i, (rid, new, p) in enumerate(zip(ids, news, preps, strict=True), start=1)
                if rid in routes
            }
        values["tally"] = self.routing.tally(news, preps, self._agent(run_id))
        if shared.audit_keep:
            values["audit_keep"] = shared.audit_keep
        values["ins_keep"] = shared.insights_keep
        if self._copy:
            values["copy"] = 1
        if run_id:
            values["run_id"] = run_id
            values["run_events_maxlen"] = RUN_EVENTS_MAXLEN
        if not self.cluster:
            values["version"] = version.decode() if version else ""
        reply = self.store.scripts.run(
            "create",
            Prebuilt(script_keys, orjson.dumps(values).decode()),
            extra_argv=argv,
        )
        return reply, variant_of

    def _shared_keys(
        self,
        partition: int,
        run_id: str | None,
        round_no: int,
        queues: frozenset[str],
        creators: frozenset[str],
        rule_ids: frozenset[str],
    ) -> ScriptKeys:
        """The step's keys but the request hashes; kept for standalone creates, which ask for
        the same few sets again and again."""
        cache_key = (partition, queues, creators, rule_ids, insight_days())  # days: rollups
        found = None if run_id else self._keys.get(cache_key)
        if found is None:
            found, _ = create_batch_keys(
                self.store.keys, partition, run_id, round_no, [], queues, creators, rule_ids
            )
            if not run_id:
                if len(self._keys) >= _KEYS_KEPT:
                    self._keys.clear()
                self._keys[cache_key] = found
        return found

    def know_agent(self, run_id: str, agent: str) -> None:
        """Remember the agent of `run_id` (a run's agent never changes): no read for it."""
        if len(self._agents) >= _AGENTS_KEPT:
            self._agents.clear()
        self._agents[run_id] = agent

    def _agent(self, run_id: str | None) -> str | None:
        """The agent the run runs (rules may be scoped to it); read once per run."""
        if not run_id:
            return None
        agent = self._agents.get(run_id)
        if agent is None:
            raw = self.store.redis.hget(self.store.keys.run(run_id), "agent")
            if not raw:
                return None
            agent = as_str(raw)
            self.know_agent(run_id, agent)
        return agent
