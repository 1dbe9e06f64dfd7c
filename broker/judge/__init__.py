"""Where a decision is judged: `Judge`, the one judge every channel decides through.

`deciding` holds its checks (pure: who may decide, as which person, what can apply),
`rule_decisions` what a decision that keeps a rule may keep, `judge` the I/O around them, sync
and async.
"""

from broker.judge.deciding import INBOX, REPLAY_TTL_S, Decided, refusal
from broker.judge.judge import Judge, Observer
from broker.judge.rule_decisions import Remember, run_rule_index

__all__ = [
    "INBOX",
    "REPLAY_TTL_S",
    "Decided",
    "Judge",
    "Observer",
    "Remember",
    "refusal",
    "run_rule_index",
]
