"""A compatibility import path: the names of `broker.runs.agents`, written by users
(`register_agent`, `DepsContext`).
"""

# compatibility import path: re-exports only
from broker.runs.agents import (  # noqa: F401
    IN_PROCESS,
    LOCAL_AGENTS,
    CannotPause,
    DepsContext,
    LocalAgent,
    LocalAgents,
    agent_spec,
    check_import_path,
    declared_output_types,
    pausable_output_type,
    register_agent,
    unregister_agent,
)

__all__ = [
    "IN_PROCESS",
    "LOCAL_AGENTS",
    "CannotPause",
    "DepsContext",
    "LocalAgent",
    "LocalAgents",
    "agent_spec",
    "check_import_path",
    "declared_output_types",
    "pausable_output_type",
    "register_agent",
    "unregister_agent",
]
