"""A kept pool that recycles its sandboxes (`pool up --recycle`, its steps, `warm_pool(recycle=True)`):
end to end through the simulated cluster with the real kubectl; the reset check's program run
in-process against a folder of its own."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import EPISODE, ROOT, read, start_tool, wait_for, write_tasks

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


def test_a_reset_check_that_never_answers_quarantines_its_sandbox_and_names_the_episode(make_cluster, run_tool,
                                                                                        tmp_path):
    # the first episode's exec says the episode's exit code, then its reset check hangs (the
    # simulated kubelet's fault: the stream stalls there); the step waits out the exec's budget,
    # its --timeout and RESET_TIMEOUT_SECONDS, keeps the episode and quarantines the sandbox
    cluster = make_cluster(dict(AGENT_SANDBOX, execStalls={"words": ["sandbox-reset.py", "/demo/episode.py"], "times": 1,
                                                           "stallAt": "rl-batch-demo reset: check exit"}))
    recycled_pool_up(run_tool, cluster, 2)
    done = step(run_tool, cluster, "step-1", "--count", "2", "--timeout", "20")
    assert done.code == 0, done
    results = read(tmp_path / "step-1" / "results.json")
    [entry] = results["recycled_pool"]["quarantined"]
    [stalled] = [row for row in results["pods"] if row["reset"]["clean"] is False]
    assert (entry["episode"], entry["claim"]) == (stalled["episode"], stalled["claim"])
    assert entry["left"] == ["the reset check did not answer (the exec did not finish within 35 s)"]
    assert [row["reward"] for row in results["pods"]] == [1.0, 1.0]  # the episode's own result was kept
    assert [claim["why"] for claim in results["recycled_pool"]["claims_created"]] == [
        "quarantine of %s after %s" % (stalled["claim"], stalled["episode"])]


def episode_execs(cluster, pod):
    """The episode execs (not the baselines or reset checks) the API carried into `pod`."""
    return [call for call in cluster.execs() if call[1] == pod and any(arg.endswith("/episode.py") for arg in call)]


def test_a_recycled_sandbox_deleted_mid_episode_is_named_and_its_slot_claimed_afresh(sandbox_cluster, run_tool,
                                                                                    tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 1, "--episode", EPISODE)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 60}, {"mode": "ok"}])
    process = start_tool(sandbox_cluster, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--output",
                         "step-1", "--tasks", "tasks.jsonl")
    wait_for("the first episode exec'd", lambda: episode_execs(sandbox_cluster, "episode-slot-0-0"))
    sandbox_cluster.kubectl("-n", namespace, "delete", "sandbox", "episode-slot-0-0", "--wait=false")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 5, stderr  # an infrastructure failure, not a sample
    results = read(tmp_path / "step-1" / "results.json")
    [failure] = results["infrastructure_failures"]
    assert failure["index"] == 0 and failure["reason"].startswith("SandboxDeleted: its Sandbox episode-slot-0-0 was "
                                                                  "deleted while the episode ran"), failure
    [entry] = results["recycled_pool"]["quarantined"]
    assert (entry["slot"], entry["episode"]) == (0, failure["attempts"][0]["pod"])
    assert entry["left"] == ["its sandbox was lost while the episode ran (SandboxDeleted)"]
    assert [claim["claim"] for claim in results["recycled_pool"]["claims_created"]] == ["episode-slot-0-1"]
    assert [(row["sandbox"], row["reward"]) for row in results["pods"]] == [("episode-slot-0-1", 1.0)]
    assert len(episode_execs(sandbox_cluster, "episode-slot-0-0")) == 1  # no episode ran twice


def test_a_recycled_sandbox_evicted_between_steps_is_claimed_afresh_at_the_next_steps_start(
        sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2").code == 0
    (sandbox_cluster.state / "evict-episode-slot-0-0").touch()  # node pressure: the kubelet evicts it
    wait_for("the pod evicted", lambda: sandbox_cluster.get_json("-n", namespace, "pod", "episode-slot-0-0")[
        "status"].get("reason") == "Evicted")
    done = step(run_tool, sandbox_cluster, "step-2", "--count", "2")
    assert done.code == 0, done
    results = read(tmp_path / "step-2" / "results.json")
    # the reason agent-sandbox gives (SandboxReasonPodFailed); its message is the controller's own words
    [(slot, why)] = results["recycled_pool"]["replaced_at_start"].items()
    assert (slot, why.split(":")[0]) == ("0", "its claim episode-slot-0-0 is not Ready (PodFailed")
    assert [claim["claim"] for claim in results["recycled_pool"]["claims_created"]] == ["episode-slot-0-1"]
    assert sorted((row["sandbox"], row["sandbox_use"]) for row in results["pods"]) == [
        ("episode-slot-0-1", "fresh"), ("episode-slot-1-0", "recycled")]


def test_pool_down_of_a_recycled_pool_deletes_its_claims_and_namespace(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2)
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2").code == 0
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    done = run_tool("pool", "down", "pool", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert namespace not in [item["metadata"]["name"] for item in sandbox_cluster.get_json("namespaces")["items"]]


# ---------------------------------------------------------------- from Python


def test_a_recycled_warm_pool_serves_a_twenty_step_loop_from_python_with_no_claim_churn(sandbox_cluster, tmp_path):
    # GRPO-shaped: each step a group of 2 episodes of each of 2 tasks, every reward checked against its task's
    # own (the scripted episode answers the reward its task names); a step's dirtying episode on step 7
    program = """
import json, sys
sys.path.insert(0, %r)
import rl_batch_demo
steps = []
with rl_batch_demo.warm_pool(size=2, output="pool", no_runtime_class=True, episode=%r, recycle=True) as pool:
    namespace = pool.status()["namespace"]
    for number in range(20):
        tasks = [{"id": "t%%d-%%d" %% (number, task), "reward": round(0.05 * (number %% 10) + 0.1 * task, 2)}
                 for task in range(2) for _ in range(2)]
        if number == 7:
            tasks[3]["leave"] = "tmpfile"
        batch = pool.run_batch(tasks=tasks)
        results = batch.results
        steps.append({"rewards": batch.rewards, "expected": [task["reward"] for task in tasks],
                      "exit_code": batch.exit_code, "backend": results["backend"],
                      "created": len(results["recycled_pool"]["claims_created"]),
                      "deleted": len(results["recycled_pool"]["claims_deleted"]),
                      "quarantined": [entry["task"] for entry in results["recycled_pool"]["quarantined"]]})
    print(json.dumps({"steps": steps, "namespace": namespace}))
""" % (str(ROOT), EPISODE)
    done = subprocess.run([sys.executable, "-c", program], cwd=str(tmp_path), env=sandbox_cluster.env(),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    steps = said["steps"]
    assert len(steps) == 20
    assert all(step["rewards"] == step["expected"] and step["exit_code"] == 0 for step in steps)
    assert {step["backend"] for step in steps} == {"recycled-pool"}
    # the one quarantine (step 8's fourth episode) is the only claim made or deleted in twenty steps
    assert [(number, step["quarantined"]) for number, step in enumerate(steps) if step["quarantined"]] == [(7, [3])]
    assert [(step["created"], step["deleted"]) for step in steps] == [(0, 0)] * 7 + [(1, 1)] + [(0, 0)] * 12
    assert sandbox_cluster.kubectl("get", "namespace", said["namespace"], check=False).returncode != 0


def test_pool_status_of_a_recycled_pool_counts_its_claims_and_shows_their_expiry(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2, "--ttl", "600")
    done = run_tool("pool", "status", "pool", "--json", cluster=sandbox_cluster)
    assert done.code == 0, done
    status = json.loads(done.stdout)
    assert (status["recycle"], status["ready"], status["size"]) == (True, 2, 2)
    assert 0 < status["expires_in_seconds"] <= 600
    shown = run_tool("pool", "status", "pool", cluster=sandbox_cluster)
    assert "its claims expire on the server at %s" % status["expires_at"] in shown.stdout + shown.stderr


def test_a_step_extends_claims_that_would_expire_before_its_deadline(sandbox_cluster, run_tool, tmp_path):
    recycled_pool_up(run_tool, sandbox_cluster, 2, "--ttl", "10")
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2", "--timeout", "120").code == 0
    # the step's start made them outlive its deadline (120 s, its last check and a margin) and 10 s more
    for claim in claims_of(sandbox_cluster, namespace):
        left = rl_batch_demo.parse_k8s_time(claim["spec"]["lifecycle"]["shutdownTime"]) - time.time()
        assert 120 < left <= 120 + 15 + 30 + 10
    assert read(tmp_path / "step-1" / "warm-pool.json")["expiry_extended"] == 2


# ---------------------------------------------------------------- the over-creation guard, in-process


def owned(kind, name, uid, owner_uid, **status):
    return {"kind": kind, "metadata": {"name": name, "uid": uid, "ownerReferences": [
        {"uid": owner_uid, "controller": True}]}, "status": status}


SLOTS = [{"claim": "episode-slot-0-0", "claim_uid": "c0"}, {"claim": "episode-slot-1-0", "claim_uid": "c1"}]
SANDBOXES = [owned("Sandbox", "s0", "s0", "c0"), owned("Sandbox", "s1", "s1", "c1")]


def test_one_sandbox_and_one_pod_per_claim_is_not_over_creation(tool):
    pods = [owned("Pod", "p0", "p0", "s0", phase="Running"), owned("Pod", "p1", "p1", "s1", phase="Running")]
    assert tool.over_creation(SLOTS, SANDBOXES, pods) is None


def test_two_live_pods_of_one_sandbox_are_over_creation_naming_both_and_the_claim(tool):
    pods = [owned("Pod", "p0", "p0", "s0", phase="Running"), owned("Pod", "p0-extra", "px", "s0", phase="Pending")]
    assert tool.over_creation(SLOTS, SANDBOXES, pods) == (
        "Sandbox s0 (claim episode-slot-0-0) controls 2 pods (p0, p0-extra), one asked for", ["episode-slot-0-0"])


def test_a_pod_being_deleted_or_ended_beside_its_replacement_is_not_over_creation(tool):
    going = owned("Pod", "old", "old", "s0", phase="Running")
    going["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    pods = [going, owned("Pod", "ended", "ended", "s0", phase="Failed"), owned("Pod", "p0", "p0", "s0", phase="Running")]
    assert tool.over_creation(SLOTS, SANDBOXES, pods) is None


def test_two_sandboxes_of_one_claim_are_over_creation(tool):
    sandboxes = SANDBOXES + [owned("Sandbox", "s1-again", "s2", "c1")]
    assert tool.over_creation(SLOTS, sandboxes, []) == (
        "claim episode-slot-1-0 controls 2 Sandboxes (s1, s1-again), one asked for", ["episode-slot-1-0"])


def test_objects_of_claims_the_pool_does_not_hold_are_not_counted(tool):
    sandboxes = [owned("Sandbox", "a", "a", "someone-else"), owned("Sandbox", "b", "b", "someone-else")]
    assert tool.over_creation(SLOTS, sandboxes, []) is None


# ---------------------------------------------------------------- one exec per episode: its reset check's answer, in-process


def test_an_exec_that_ran_the_episode_and_its_check_splits_into_both(tool):
    stderr = (b"episode's own\n\n" + tool.RESET_MARK.encode() + b"episode exit 3\n" + tool.RESET_MARK.encode() +
              b'check exit 0\n{"clean": true, "left": [], "seconds": 0.2}\n')
    episode, check = tool.split_reset_answer(tool.ExecResult(3, b"events\n", stderr))
    assert (episode.code, episode.stdout, episode.stderr) == (3, b"events\n", b"episode's own\n")
    assert tool.reset_answer(check) == (True, [], 0.2)


def test_an_exec_whose_check_hung_keeps_the_episodes_exit_code_and_names_the_check(tool):
    stderr = b"\n" + tool.RESET_MARK.encode() + b"episode exit 0\n"
    timed_out = tool.ExecResult(None, b"events\n", stderr, error="the exec did not finish within 35 s",
                                reason="ExecTimedOut")
    episode, check = tool.split_reset_answer(timed_out)
    assert (episode.code, episode.error, episode.stderr) == (0, None, b"")
    assert tool.reset_answer(check) == (False, ["the reset check did not answer (the exec did not finish within "
                                                "35 s)"], None)


def test_an_exec_that_never_reached_the_episodes_end_has_no_check(tool):
    cut = tool.ExecResult(None, b"half", b"", error="the exec stream was cut", cut=True)
    assert tool.split_reset_answer(cut) == (cut, None)
