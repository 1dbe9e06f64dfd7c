"""The key schema split (keys, partitions, script_keys) names every key as before.

A renamed key would orphan data written by the previous release, so the names are pinned
here for one Redis and for a Redis Cluster's partitions.
"""

from __future__ import annotations

import json

from broker.store.keys import Keys
from broker.store.partitions import CLUSTER_PARTITIONS, partition_of
from broker.store.script_keys import DONE_STATUSES, ScriptKeys


def test_single_redis_names_carry_no_tag() -> None:
    keys = Keys("t:")
    assert keys.request("req_1") == "t:req:req_1"
    assert keys.run_round("run_1", 2) == "t:run:run_1:round:2"
    assert keys.done_in("approved", "ops") == "t:ix:done:approved:ops"
    assert keys.parked("slack:x") == "t:parked:slack:x"
    assert keys.rules.index("pay*") == "t:rules:glob"
    assert keys.rules.index("pay") == "t:rules:tool:pay"
    assert list(keys.parts()) == [keys] and keys.of_run("run_1") is keys


def test_cluster_names_put_a_run_and_its_requests_in_one_partition() -> None:
    keys = Keys("t:", CLUSTER_PARTITIONS)
    part = partition_of("run_7", CLUSTER_PARTITIONS)
    tag = "{t:p" + str(part) + "}:"
    assert keys.run("run_7") == f"{tag}run:run_7"
    assert keys.of_run("run_7").expiry == f"{tag}expiry"
    assert isinstance(keys.of_run("run_7"), Keys)  # a view keeps every name
    assert keys.in_partition(keys.seen("webhook", "m"), part) == f"{tag}seen:webhook:m"
    assert len(list(keys.parts())) == CLUSTER_PARTITIONS
    assert keys.parked("slack:x") == "{t:parked:slack:x}:parked:slack:x"


def test_step_keys_list_each_key_once_with_its_role() -> None:
    keys = Keys("t:")
    step = keys.decide_keys("req_1", "run_1", ["ops"], keys.seen("email", "n"))
    assert isinstance(step, ScriptKeys)
    assert step.keys[step.roles["req"] - 1] == "t:req:req_1"
    assert step.keys[step.roles["once"] - 1] == "t:seen:email:n"
    assert step.keys[step.streams["ops"] - 1] == "t:stream:ops"
    assert len(step.keys) == len(set(step.keys))
    assert {f"done:{s}:ops" for s in DONE_STATUSES} <= set(step.roles)
    args = json.loads(step.args(by="w"))
    assert args["by"] == "w" and args["k"] == step.roles
