"""A kept pool that recycles its sandboxes (`pool up --recycle`, its steps, `warm_pool(recycle=True)`):
end to end through the simulated cluster with the real kubectl; the reset check's program run
in-process against a folder of its own."""

import json
import os
import subprocess
import sys

import pytest

from conftest import EPISODE, read, start_tool, wait_for, write_tasks

import rl_batch_demo

AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}


@pytest.fixture
def sandbox_cluster(make_cluster):
    return make_cluster(AGENT_SANDBOX)


def recycled_pool_up(run_tool, cluster, size, *args, output="pool"):
    done = run_tool("pool", "up", "--recycle", "--size", str(size), "--no-runtime-class", "--output", output, *args,
                    cluster=cluster)
    assert done.code == 0, done
    return done


def step(run_tool, cluster, output, *args, pool="pool"):
    return run_tool("run", "--backend", "warm-pool", "--pool", pool, "--output", output, *args, cluster=cluster)


def claims_of(cluster, namespace):
    return cluster.get_json("-n", namespace, "sandboxclaims")["items"]


def claim_uids(cluster, namespace):
    return sorted(claim["metadata"]["uid"] for claim in claims_of(cluster, namespace))


# ---------------------------------------------------------------- pool up --recycle


def test_pool_up_recycle_claims_every_sandbox_and_takes_its_baseline(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    record = read(tmp_path / "pool" / "pool.json")
    slots = read(tmp_path / "pool" / "sandboxes.json")["slots"]
    assert record["recycle"] is True and record["warm_pool_replicas"] == 0
    assert [slot["claim"] for slot in slots] == ["episode-slot-0-0", "episode-slot-1-0"]
    assert all(json.loads(slot["baseline"])["processes"] for slot in slots)  # the keep-alive at least
    assert sorted(claim["metadata"]["name"] for claim in claims_of(sandbox_cluster, record["namespace"])) == [
        "episode-slot-0-0", "episode-slot-1-0"]


# ---------------------------------------------------------------- steps


def test_three_steps_of_a_recycled_pool_make_and_delete_no_claim(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    before = claim_uids(sandbox_cluster, namespace)
    for number in (1, 2, 3):
        done = step(run_tool, sandbox_cluster, "step-%d" % number, "--count", "2")
        assert done.code == 0, done
    assert claim_uids(sandbox_cluster, namespace) == before
    results = read(tmp_path / "step-3" / "results.json")
    assert results["backend"] == "recycled-pool"
    assert results["successful_episodes"] == 2
    assert results["recycled_pool"]["claims_created"] == results["recycled_pool"]["claims_deleted"] == []
    assert [(row["sandbox_use"], row["episodes_before"]) for row in results["pods"]] == [("recycled", 2)] * 2


def test_the_first_step_of_a_recycled_pool_runs_in_fresh_sandboxes(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2").code == 0
    results = read(tmp_path / "step-1" / "results.json")
    assert [(row["sandbox_use"], row["episodes_before"]) for row in results["pods"]] == [("fresh", 0)] * 2
    assert all(row["reset"]["clean"] for row in results["pods"])


def test_a_step_larger_than_the_recycled_pool_runs_its_episodes_in_turn(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    done = step(run_tool, sandbox_cluster, "step-1", "--count", "5")
    assert done.code == 0, done
    assert "5 episodes on the pool's 2 sandboxes: each serves up to 3 in turn" in done.stderr
    results = read(tmp_path / "step-1" / "results.json")
    assert results["successful_episodes"] == 5
    assert sorted(row["episodes_before"] for row in results["pods"]) == [0, 0, 1, 1, 2]
    assert results["recycled_pool"]["claims_created"] == []


@pytest.mark.parametrize("leave, said", [
    ("daemon", "left running"),
    ("tmpfile", "left-behind left (33 bytes)"),
    ("chmod_workspace", "changed from"),
])
def test_an_episode_that_dirties_its_sandbox_has_it_quarantined_and_is_named(sandbox_cluster, run_tool, tmp_path,
                                                                             leave, said):
    recycled_pool_up(run_tool, sandbox_cluster, 2, "--episode", EPISODE)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "clean"}, {"id": "dirty", "leave": leave}])
    done = step(run_tool, sandbox_cluster, "step-1", "--tasks", tasks)
    assert done.code == 0, done
    results = read(tmp_path / "step-1" / "results.json")
    quarantined = results["recycled_pool"]["quarantined"]
    assert [entry["episode"] for entry in quarantined] == ["episode-%s-1" % read(
        tmp_path / "step-1" / "receipt.json")["run_id"][:8]]
    assert said in " ".join(quarantined[0]["left"])
    assert [row["reward"] for row in results["pods"]] == [1.0, 1.0]  # the episode itself succeeded
    assert quarantined[0]["claim"] not in [claim["metadata"]["name"] for claim in claims_of(sandbox_cluster,
                                                                                             namespace)]
    assert "quarantined the sandbox of slot" in done.stderr
    again = step(run_tool, sandbox_cluster, "step-2", "--tasks", write_tasks(tmp_path / "clean.jsonl", [{}, {}]))
    assert again.code == 0, again
    rows = read(tmp_path / "step-2" / "results.json")["pods"]
    assert sorted(row["sandbox_use"] for row in rows) == ["fresh", "recycled"]  # the new sandbox, the kept one


def test_an_episode_that_kills_its_sandboxs_keep_alive_fails_and_its_slot_is_claimed_afresh(
        sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2, "--episode", EPISODE)
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "clean"}, {"id": "killer", "leave": "kill_keepalive"}])
    done = step(run_tool, sandbox_cluster, "step-1", "--tasks", tasks)
    assert done.code == 5, done  # its exec died with its container: an infrastructure failure, not a sample
    results = read(tmp_path / "step-1" / "results.json")
    assert [failure["index"] for failure in results["infrastructure_failures"]] == [1]
    assert [entry["slot"] for entry in results["recycled_pool"]["quarantined"]] == [1]
    assert [claim["claim"] for claim in results["recycled_pool"]["claims_created"]] == ["episode-slot-1-1"]
    again = step(run_tool, sandbox_cluster, "step-2", "--tasks", write_tasks(tmp_path / "clean.jsonl", [{}, {}]))
    assert again.code == 0, again


def test_pool_down_of_a_recycled_pool_deletes_its_claims_and_namespace(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2").code == 0
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    done = run_tool("pool", "down", "pool", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert namespace not in [item["metadata"]["name"] for item in sandbox_cluster.get_json("namespaces")["items"]]
