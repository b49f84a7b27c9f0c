"""A warm pool kept across a training loop's steps (`pool up/status/down`, `run --pool`, and
`warm_pool()` from Python): end to end through the simulated cluster with the real kubectl, and
the refill's definition in-process."""

import json
import os
import signal
import sys

import pytest

from conftest import EPISODE, ROOT, read, start_tool, wait_for, write_tasks


AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}
# One node with room for exactly two sandbox pods (100m CPU each): a claimed sandbox that is
# still running holds the room its pool's refill would need.
TWO_PODS_ROOM = dict(AGENT_SANDBOX, nodes=[{"name": "kind-worker", "cpu": "200m", "memory": "16Gi"}])


@pytest.fixture
def sandbox_cluster(make_cluster):
    return make_cluster(AGENT_SANDBOX)


def pool_up(run_tool, cluster, size, *args, output="pool"):
    done = run_tool("pool", "up", "--size", str(size), "--no-runtime-class", "--output", output, *args,
                    cluster=cluster)
    assert done.code == 0, done
    return done


def step(run_tool, cluster, output, *args, pool="pool"):
    return run_tool("run", "--backend", "warm-pool", "--pool", pool, "--output", output, *args, cluster=cluster)


def live_pool(cluster, record):
    return cluster.get_json("-n", record["namespace"], "sandboxwarmpools", "episodes")


def claims_of(cluster, namespace, run_id=None):
    selector = ["-l", "agc-demo-run=%s" % run_id] if run_id else []
    return cluster.get_json("-n", namespace, "sandboxclaims", *selector)["items"]


def held_step(cluster, tmp_path, name, marker):
    """A step of one episode held under way until `marker` exists (its claim Ready, its sandbox
    taken from the pool), started in the background in a process group of its own."""
    tasks = write_tasks(tmp_path / (name + ".jsonl"), [{"wait_for": str(marker)}])
    process = start_tool(cluster, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--episode", EPISODE,
                         "--tasks", tasks, "--output", name, own_group=True)
    receipt = tmp_path / name / "receipt.json"
    wait_for("the held step's receipt", receipt.exists)
    run_id = read(receipt)["run_id"]
    namespace = read(receipt)["namespace"]
    wait_for("the held step's episode to run", lambda: (tmp_path / name / "claims-submitted.json").exists() and [
        claim for claim in claims_of(cluster, namespace, run_id) if any(
            c["type"] == "Ready" and c["status"] == "True" for c in (claim.get("status") or {}).get("conditions", []))])
    return process, run_id


# ---------------------------------------------------------------- pool up and status


def test_pool_up_waits_for_the_pool_to_fill_and_writes_its_record(sandbox_cluster, run_tool, tmp_path):
    done = pool_up(run_tool, sandbox_cluster, 3)
    said = json.loads(done.stdout)
    assert (said["size"], said["ready"]) == (3, 3)
    record, receipt = read(tmp_path / "pool" / "pool.json"), read(tmp_path / "pool" / "receipt.json")
    assert record["namespace"] == receipt["namespace"] == said["namespace"]
    assert (record["pool_uid"], record["template_uid"]) == (receipt["pool_uid"], receipt["template_uid"])
    assert live_pool(sandbox_cluster, record)["status"]["readyReplicas"] == 3
    assert claims_of(sandbox_cluster, record["namespace"]) == []  # nothing claimed by `pool up`
    assert "bring it down with: " in done.stderr and "pool down pool" in done.stderr


def test_pool_status_shows_ready_sandboxes_steps_served_and_the_idle_cost(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 2)
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "1").code == 0
    done = run_tool("pool", "status", "pool", "--json", cluster=sandbox_cluster)
    assert done.code == 0, done
    status = json.loads(done.stdout)
    assert (status["state"], status["size"], status["steps_served"]) == ("up", 2, 1)
    # 2 sandboxes x 100m CPU and 64 MiB requested, for an hour
    assert status["idle_cost_per_hour"]["cpu_core_seconds"] == pytest.approx(720)
    assert status["idle_cost_per_hour"]["gib_seconds"] == pytest.approx(2 * 64 / 1024 * 3600)
    assert status["last_step"]["output"] == str(tmp_path / "step-1")
    lines = run_tool("pool", "status", "pool", cluster=sandbox_cluster).stdout.splitlines()
    assert lines[0].startswith("pool pool: ") and "sandboxes Ready" in lines[0] and "1 steps served" in lines[0]


# ---------------------------------------------------------------- steps


def test_a_step_claims_from_the_full_pool_and_deletes_only_its_own_claims(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 2)
    record = read(tmp_path / "pool" / "pool.json")
    done = step(run_tool, sandbox_cluster, "step-1", "--count", "2")
    assert done.code == 0, done
    results = read(tmp_path / "step-1" / "results.json")
    run_id = read(tmp_path / "step-1" / "receipt.json")["run_id"]
    kept = results["kept_pool_step"]
    assert (kept["ready_at_start"], kept["warm"], kept["cold"], kept["size"]) == (2, 2, 0, 2)
    assert [row["claim"] for row in results["pods"]] == ["episode-%s-%d" % (run_id[:8], i) for i in range(2)]
    assert results["successful_episodes"] == 2
    # no pool or template made or deleted: the ones `pool up` made serve on
    live = live_pool(sandbox_cluster, record)
    assert live["metadata"]["uid"] == record["pool_uid"]
    template = sandbox_cluster.get_json("-n", record["namespace"], "sandboxtemplates", "episode")
    assert template["metadata"]["uid"] == record["template_uid"]
    assert claims_of(sandbox_cluster, record["namespace"]) == []
    assert len((tmp_path / "pool" / "steps.jsonl").read_text().splitlines()) == 1


def test_a_step_finds_the_pool_partly_refilled_while_a_concurrent_step_holds_its_sandbox(make_cluster, run_tool,
                                                                                         tmp_path):
    cluster = make_cluster(TWO_PODS_ROOM)
    pool_up(run_tool, cluster, 2, "--episode", EPISODE)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    marker = tmp_path / "release-first-step"
    first, first_id = held_step(cluster, tmp_path, "first", marker)
    # the first step's sandbox holds the node's room: the pool's refill waits, one sandbox is Ready
    wait_for("the pool to be down to one Ready sandbox", lambda: (live_pool(cluster, read(
        tmp_path / "pool" / "pool.json"))["status"].get("readyReplicas") or 0) == 1)
    tasks = write_tasks(tmp_path / "second.jsonl", [{"reward": 0.5}])
    second = step(run_tool, cluster, "second", "--episode", EPISODE, "--tasks", tasks)
    assert second.code == 0, second
    kept = read(tmp_path / "second" / "results.json")["kept_pool_step"]
    assert (kept["ready_at_start"], kept["warm"], kept["cold"]) == (1, 1, 0)
    assert read(tmp_path / "second" / "results.json")["tasks"][0]["reward"] == 0.5
    # the second step deleted its own claim, not the first step's, which is still under way
    assert [claim["metadata"]["name"] for claim in claims_of(cluster, namespace)] == ["episode-%s-0" % first_id[:8]]
    marker.touch()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert read(tmp_path / "first" / "results.json")["kept_pool_step"]["ready_at_start"] == 2
    assert claims_of(cluster, namespace) == []


def test_a_step_larger_than_the_pool_names_its_cold_claims_before_it_starts_them(make_cluster, run_tool, tmp_path):
    # VM sandboxes take 2-5 s to start, so a refill cannot get an IP within a claim's 2 s wait
    cluster = make_cluster(dict(AGENT_SANDBOX, profile="vm-sandbox"))
    pool_up(run_tool, cluster, 2)
    done = step(run_tool, cluster, "big", "--count", "4")
    assert done.code == 0, done
    lines = done.stderr.splitlines()
    warned = next(i for i, line in enumerate(lines) if line.startswith(
        "warning: 2 of 4 claims find no Ready sandbox: the kept pool has 2 of 2 Ready (this step is larger than the "
        "pool)"))
    assert warned < next(i for i, line in enumerate(lines) if "firing 4 claims" in line)
    kept = read(tmp_path / "big" / "results.json")["kept_pool_step"]
    assert (kept["expected_cold"], kept["warm"], kept["cold"]) == (2, 2, 2)


def test_a_step_runs_its_own_tasks_in_the_pools_sandboxes(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 2, "--episode", EPISODE)
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "a", "reward": 0.25}, {"id": "b", "reward": 0.75}])
    done = step(run_tool, sandbox_cluster, "step-1", "--tasks", tasks)  # the pool's --episode, not given again
    assert done.code == 0, done
    results = read(tmp_path / "step-1" / "results.json")
    assert [entry["reward"] for entry in results["tasks"]] == [0.25, 0.75]


def test_a_step_refuses_an_episode_other_than_the_pools(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 1)
    other = tmp_path / "other.py"
    other.write_text("print('another program')\n")
    done = step(run_tool, sandbox_cluster, "step-1", "--episode", str(other))
    assert done.code == 2
    assert "the kept pool in pool runs the built-in episode, which takes no --tasks: bring up a pool with `pool up " \
        "--episode %s`" % other in done.stderr
    assert not (tmp_path / "step-1").exists()


def test_a_step_refuses_options_the_pool_fixed(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 1)
    done = step(run_tool, sandbox_cluster, "step-1", "--image", "python:3.13-alpine")
    assert done.code == 2
    assert "--image is the kept pool's, fixed by `pool up` (image python:3.12-alpine" in done.stderr
    # pool_up made it with --no-runtime-class: said so, not "RuntimeClass None"
    assert "no RuntimeClass, network default, 1 sandboxes)" in done.stderr and "None" not in done.stderr


def test_pool_up_on_a_cluster_without_agent_sandbox_names_pool_up(cluster, run_tool, tmp_path):
    done = run_tool("pool", "up", "--size", "1", "--no-runtime-class", "--output", "pool", cluster=cluster)
    assert done.code == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: `pool up` needs kubernetes-sigs/agent-sandbox") and "--backend" not in line
    assert not (tmp_path / "pool").exists()


def namespace_reads(calls, *plurals):
    """The kubectl calls among `calls` that read (not watch) one of `plurals`."""
    return [call for call in calls if "get" in call and "--watch" not in call and any(
        plural in call for plural in plurals)]


def test_a_step_reads_and_deletes_its_claims_through_its_one_proxy(sandbox_cluster, run_tool, tmp_path):
    # a step's end once waited for four kubectl reads and a second proxy (1.5-4 s of a 64-claim step)
    pool_up(run_tool, sandbox_cluster, 2)
    before = len(sandbox_cluster.calls())
    assert step(run_tool, sandbox_cluster, "step-1", "--count", "2").code == 0
    calls = sandbox_cluster.calls()[before:]
    assert len([call for call in calls if "proxy" in call]) == 1
    assert namespace_reads(calls, "pods", "sandboxes", "sandboxclaims") == []
    assert not [call for call in calls if "delete" in call]
    namespace, run_id = read(tmp_path / "pool" / "pool.json")["namespace"], read(tmp_path / "step-1" / "receipt.json")["run_id"]
    assert claims_of(sandbox_cluster, namespace, run_id) == []
    # what was listed through the proxy is saved as kubectl would have listed it
    pods, claims = read(tmp_path / "step-1" / "pods.json"), read(tmp_path / "step-1" / "claims.json")
    assert pods and {pod["kind"] for pod in pods} == {"Pod"} and {pod["apiVersion"] for pod in pods} == {"v1"}
    assert len(claims) == 2 and {claim["kind"] for claim in claims} == {"SandboxClaim"}


# ---------------------------------------------------------------- the world changed between steps


def test_a_step_after_the_pool_was_deleted_says_so_in_one_line_and_claims_nothing(sandbox_cluster, run_tool,
                                                                                 tmp_path):
    pool_up(run_tool, sandbox_cluster, 1)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    sandbox_cluster.kubectl("-n", namespace, "delete", "sandboxwarmpool", "episodes")
    done = step(run_tool, sandbox_cluster, "step-1", "--count", "1")
    assert done.code == 1, done
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: the kept pool in pool cannot serve: its SandboxWarmPool episodes was deleted by "
                           "someone else, and claims would wait for it (WarmPoolNotFound")
    assert claims_of(sandbox_cluster, namespace) == []


def test_a_step_after_the_pool_was_scaled_says_so_and_measures_against_the_new_size(sandbox_cluster, run_tool,
                                                                                   tmp_path):
    pool_up(run_tool, sandbox_cluster, 1)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    sandbox_cluster.kubectl("-n", namespace, "patch", "sandboxwarmpool", "episodes", "--type=merge",
                            "-p", '{"spec": {"replicas": 2}}')
    wait_for("the scaled pool to fill", lambda: (sandbox_cluster.get_json(
        "-n", namespace, "sandboxwarmpools", "episodes")["status"].get("readyReplicas") or 0) == 2)
    done = step(run_tool, sandbox_cluster, "step-1", "--count", "2")
    assert done.code == 0, done
    assert "warning: the kept pool in pool: it was scaled to 2 sandboxes since `pool up` made it 1" in done.stderr
    kept = read(tmp_path / "step-1" / "results.json")["kept_pool_step"]
    assert (kept["size"], kept["ready_at_start"], kept["warm"]) == (2, 2, 2)


# ---------------------------------------------------------------- interrupts and cleanup


def test_ctrl_c_during_a_step_deletes_its_claims_and_keeps_the_pool(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(AGENT_SANDBOX)
    pool_up(run_tool, cluster, 2, "--episode", EPISODE)
    record = read(tmp_path / "pool" / "pool.json")
    process, run_id = held_step(cluster, tmp_path, "step-1", tmp_path / "never")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "Error: interrupted"
    assert claims_of(cluster, record["namespace"], run_id) == []
    assert live_pool(cluster, record)["metadata"]["uid"] == record["pool_uid"]
    assert (tmp_path / "step-1" / "claims.json").exists()  # what it saw is kept


def test_cleanup_of_a_step_deletes_its_claims_and_leaves_the_pool(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(AGENT_SANDBOX)
    pool_up(run_tool, cluster, 2, "--episode", EPISODE)
    record = read(tmp_path / "pool" / "pool.json")
    process, run_id = held_step(cluster, tmp_path, "step-1", tmp_path / "never")
    # the step dies without its own end, and every process of its group with it (its `kubectl
    # proxy` and watches too): its claim is left behind
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    assert len(claims_of(cluster, record["namespace"], run_id)) == 1
    done = run_tool("cleanup", "step-1", cluster=cluster)
    assert done.code == 0, done
    assert "Deleting the 1 SandboxClaims of step %s (the kept pool stays)" % run_id in done.stderr
    assert claims_of(cluster, record["namespace"], run_id) == []
    assert live_pool(cluster, record)["metadata"]["uid"] == record["pool_uid"]
    assert cluster.get_json("namespace", record["namespace"])["metadata"]["uid"] == record["namespace_uid"]


def test_pool_down_while_a_step_runs_says_a_step_is_running(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(AGENT_SANDBOX)
    pool_up(run_tool, cluster, 2, "--episode", EPISODE)
    record = read(tmp_path / "pool" / "pool.json")
    process, run_id = held_step(cluster, tmp_path, "step-1", tmp_path / "release")
    down = run_tool("pool", "down", "pool", cluster=cluster)
    assert down.code == 1, down
    [error] = [line for line in down.stderr.splitlines() if line.startswith("Error: ")]
    assert error.startswith("Error: a step of this kept pool is running: step %s holds 1 claim(s) (episode-%s-0)"
                            % (run_id, run_id[:8])), error
    assert "did not create" not in down.stderr  # the step's objects are not called foreign
    (tmp_path / "release").touch()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert run_tool("pool", "down", "pool", cluster=cluster).code == 0
    assert cluster.kubectl("get", "namespace", record["namespace"], "--ignore-not-found", "-o", "name").stdout == ""


@pytest.mark.parametrize("command", [["pool", "down", "out"], ["pool", "status", "out"],
                                     ["run", "--backend", "warm-pool", "--pool", "out", "--output", "step"]])
def test_a_run_folder_is_not_a_pool_and_pool_commands_leave_its_run_alone(command, sandbox_cluster, run_tool,
                                                                          tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=sandbox_cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    done = run_tool(*command, cluster=sandbox_cluster)
    assert done.code in (1, 2), done
    assert "out is not a kept pool's folder: it holds the receipt of a `run`" in done.stderr
    assert "cleanup out" in done.stderr and "pool down out" not in done.stderr
    live = sandbox_cluster.get_json("namespace", namespace)
    assert live is not None and not live["metadata"].get("deletionTimestamp")  # the run is untouched


def test_pool_down_refuses_a_foreign_object_and_names_it(sandbox_cluster, run_tool, tmp_path):
    pool_up(run_tool, sandbox_cluster, 1)
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    notes = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": namespace},
             "data": {"todo": "keep me"}}
    sandbox_cluster.kubectl("create", "-f", "-", stdin=json.dumps(notes))
    done = run_tool("pool", "down", "pool", cluster=sandbox_cluster)
    assert done.code == 1, done
    assert done.stderr.strip().splitlines()[-1].startswith(
        "Error: namespace %s holds 1 object(s) this run did not create: ConfigMap notes" % namespace)
    assert sandbox_cluster.get_json("-n", namespace, "sandboxwarmpools", "episodes")  # nothing deleted
    done = run_tool("pool", "down", "pool", "--delete-foreign", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert sandbox_cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0


# ---------------------------------------------------------------- from Python


def test_warm_pool_serves_steps_from_python_and_comes_down_on_leaving(sandbox_cluster, tmp_path):
    program = """
import json, sys
sys.path.insert(0, %r)
import rl_batch_demo
with rl_batch_demo.warm_pool(size=2, output="pool", no_runtime_class=True, episode=%r) as pool:
    first = pool.run_batch(tasks=[{"reward": 0.1}, {"reward": 0.2}])
    second = pool.run_batch(tasks=[{"reward": 0.3}])
    status = pool.status()
    print(json.dumps({"rewards": [first.rewards, second.rewards], "outputs": [str(first.output), str(second.output)],
                      "steps": status["steps_served"], "namespace": status["namespace"]}))
""" % (str(ROOT), EPISODE)
    import subprocess
    done = subprocess.run([sys.executable, "-c", program], cwd=str(tmp_path), env=sandbox_cluster.env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["rewards"] == [[0.1, 0.2], [0.3]]
    assert said["outputs"] == ["pool/step-0001", "pool/step-0002"]  # new folders in the pool's
    assert said["steps"] == 2
    assert sandbox_cluster.kubectl("get", "namespace", said["namespace"], check=False).returncode != 0


# ---------------------------------------------------------------- the refill, in-process


def pool_state(ready, replicas=2):
    return {"spec": {"replicas": replicas}, "status": {"readyReplicas": ready}}


def test_the_refill_is_the_first_full_state_after_one_below_full_since_the_fire(tool):
    states = [(99.0, pool_state(2)), (100.5, pool_state(1)), (101.0, pool_state(0)), (102.25, pool_state(2)),
              (103.0, pool_state(1))]
    refill = tool.pool_refill(states, 100.0, 2)
    assert (refill["seconds"], refill["state"], refill["ready_at_end"]) == (2.25, "refilled", 1)


def test_a_pool_still_below_full_at_the_steps_end_has_no_refill_time(tool):
    refill = tool.pool_refill([(100.5, pool_state(1)), (101.0, pool_state(1))], 100.0, 2)
    assert (refill["seconds"], refill["state"], refill["ready_at_end"]) == (None, "not refilled by the step's end", 1)
