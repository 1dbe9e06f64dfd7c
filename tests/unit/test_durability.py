"""broker/redis/durability.py: which Redis settings keep less than the chosen fsync policy."""

from __future__ import annotations

import pytest

from broker.redis.durability import Durability, durability_warning


@pytest.mark.parametrize(
    ("aof", "fsync", "chosen", "warned"),
    [
        (True, "always", "always", None),
        (True, "everysec", "always", "appendfsync everysec: a crash can lose up to about 2 s"),
        (True, "everysec", "everysec", None),  # the operator's choice
        (True, "no", "everysec", "appendfsync no: a crash of the machine can lose"),
        (True, "always", "everysec", None),  # more than asked
        (False, "always", "always", "without an AOF (appendonly no)"),
        (False, None, "everysec", "without an AOF (appendonly no)"),  # INFO says so: enough
        (True, None, "always", None),  # CONFIG GET refused: nothing to say
        (None, None, "always", None),  # not reachable
    ],
)
def test_a_warning_names_what_keeps_less_than_the_chosen_policy(
    aof: bool | None, fsync: str | None, chosen: str, warned: str | None
) -> None:
    warning = durability_warning(Durability(aof, fsync), chosen)  # type: ignore[arg-type]
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and warned in warning
