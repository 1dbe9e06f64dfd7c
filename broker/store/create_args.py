"""How a create call's requests are packed into create.lua's ARGV.

Why a module of its own: the packing is what keeps a bulk create cheap for Redis. The hash
fields every request of the call has alike are sent once; each distinct NewRequest's own fields
are sent by shape (its field names, once) and values (once per request made from it); requests
share a variant (timeout, queue, creator) where they can. Nothing here checks or decides a
request: `broker.store.creating` does, and runs the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from broker.domain.models import NewRequest
from broker.domain.rules.matching import Call
from broker.store.request_hash import Encoded


class Prebuilt:
    """A step's KEYS and its JSON argument, made by the create step rather than by
    `ScriptKeys.args`."""

    def __init__(self, keys: list[str], argument: str) -> None:
        self.keys = keys
        self._argument = argument

    def args(self, **_: Any) -> str:
        return self._argument


class Prepared:
    """One distinct NewRequest, checked and encoded; its `Call` (what rules are matched
    against, approvals only) is made when a rule of its tool exists."""

    __slots__ = ("timeout_s", "quorum", "encoded", "approval", "_made", "_call")

    def __init__(
        self, timeout_s: str, quorum: int, encoded: Encoded, made: tuple[Any, ...] | None
    ) -> None:
        self.timeout_s = timeout_s
        self.quorum = quorum
        self.encoded = encoded
        self.approval = made is not None
        self._made = made  # (new, run_id, agent, queue_roles)
        self._call: Call | None = None

    @property
    def call(self) -> Call:
        if self._call is None:
            assert self._made is not None, "a call is made for an approval only"
            new, run_id, agent, queue_roles = self._made
            self._call = Call(
                tool_name=new.tool_name,
                args=new.args,
                run_id=run_id,
                agent=agent,
                queue=new.queue,
                kind=new.kind,
                allowed_roles=tuple(new.allowed_roles),
                queue_roles=tuple(queue_roles),
                created_by=new.created_by,
            )
        return self._call


Variant = tuple[str, str, str]
"""(timeout, queue, creator): what the step's reply gives one expiry for."""


def pack(
    ids: Sequence[str],
    news: Sequence[NewRequest],
    preps: list[Prepared],
    distinct: dict[int, tuple[Prepared, NewRequest]],
) -> tuple[list[str], dict[Variant, int], dict[int, int]]:
    """create.lua's ARGV for these requests (`ids[i]` made from `news[i]`, prepared as
    `preps[i]`; `distinct`: each distinct `Prepared` by `id`, with its NewRequest), the
    variants in the order the step numbers them, and each distinct `Prepared`'s variant."""
    shared_fields, own = columns([p for p, _ in distinct.values()])
    variants: dict[Variant, int] = {}
    variant_of: dict[int, int] = {}
    for key, (p, new) in distinct.items():
        variant = (p.timeout_s, new.queue, new.created_by or "")
        variant_of[key] = variants.setdefault(variant, len(variants))
    shapes: dict[tuple[int, tuple[str, ...]], int] = {}
    rows: list[tuple[int, tuple[str, ...]]] = []  # each request's shape and own values
    row_of: dict[int, tuple[int, tuple[str, ...]]] = {}
    for rid, new, p in zip(ids, news, preps, strict=True):
        tool_call_id = new.tool_call_id
        if tool_call_id and tool_call_id != rid:  # a shape of its own: one field more
            names, values = own[id(p)]
            shape = (variant_of[id(p)], (*names, "tool_call_id"))
            rows.append((shapes.setdefault(shape, len(shapes) + 1), (*values, tool_call_id)))
            continue
        row = row_of.get(id(p))
        if row is None:
            names, values = own[id(p)]
            shape = (variant_of[id(p)], names)
            row = row_of[id(p)] = (shapes.setdefault(shape, len(shapes) + 1), values)
        rows.append(row)
    argv: list[str] = [str(len(shared_fields)), *shared_fields, str(len(shapes))]
    for variant_no, names in shapes:
        argv += (str(variant_no + 1), str(len(names)), *names)
    if len(shapes) == 1:  # one shape: each request sends only its own values
        for _, values in rows:
            argv += values
    else:
        for shape_no, values in rows:
            argv += (str(shape_no), *values)
    return argv, variants, variant_of


def columns(
    distinct: list[Prepared],
) -> tuple[list[str], dict[int, tuple[tuple[str, ...], tuple[str, ...]]]]:
    """The hash fields sent once for the whole call (those every request has alike), and each
    distinct request's own (by `id`) as its field names and their values: what differs between
    them (args, their hash, the prompt...), sent again with every request made from it (copies
    of one request share nothing more than the call's common fields)."""
    first = distinct[0].encoded.named
    if len(distinct) == 1:
        return [x for kv in first.items() for x in kv], {id(distinct[0]): ((), ())}
    alike = set(first.items())
    for p in distinct[1:]:
        alike &= p.encoded.named.items()
    common = [kv for kv in first.items() if kv in alike]
    shared = {k for k, _ in common}
    own: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    getters: dict[tuple[str, ...], tuple[tuple[str, ...], Callable[[Any], Any]]] = {}
    for p in distinct:
        named = p.encoded.named
        order = tuple(named)
        found = getters.get(order)
        if found is None:  # requests with the same fields (in the same order) alike
            names = tuple(k for k in order if k not in shared)
            get = itemgetter(*names) if len(names) > 1 else _one_getter(names)
            found = getters[order] = (names, get)
        names, get = found
        own[id(p)] = (names, get(named))
    return [x for kv in common for x in kv], own


def _one_getter(names: tuple[str, ...]) -> Callable[[Any], tuple[str, ...]]:
    """`itemgetter` for no name or one (which it would give as a value, not a tuple)."""
    return lambda named: tuple(named[k] for k in names)
