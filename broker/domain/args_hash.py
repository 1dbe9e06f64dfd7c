"""The one definition of `args_hash`: sha256 of the canonical JSON of a tool call's args.

Requests, decisions, receipts and the audit trail all bind to args through this hash, so it is
defined once here (and passed into the Lua steps as a value, never computed there).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form `args_hash` is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_hash(args: Any) -> str:
    """sha256 of the canonical JSON of a tool call's args: what binds a decision to what was seen."""
    return hashlib.sha256(canonical_json(args).encode()).hexdigest()
