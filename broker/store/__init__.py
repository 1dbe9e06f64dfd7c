"""Where a request is kept: the key schema, the Lua steps (`scripts/`) and the services that run
them (requests, creating, decisions, listing, sweeping, runs' state, rules in Redis, streams,
dead letters). State changes only; who may decide is the judge's.
"""
