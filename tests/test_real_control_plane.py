"""The tool against a real control plane (tests/controlplane/): Kubernetes v1.36.3's API server,
controller manager (the real Job, namespace and garbage-collector controllers) and scheduler,
etcd, kwok's nodes and the episode runtime, driven through this machine's kubectl v1.32.4, as a
user would. Run the tier alone with `python3 -m pytest -m controlplane`."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import AGENT_SANDBOX_VERSIONS, EPISODE, SCRIPT, Result, read, wait_for, write_tasks

pytestmark = pytest.mark.controlplane


def run_tool_on(plane, tmp_path, *args, timeout=600):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=plane.env(), text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(done)


def start_tool_on(plane, tmp_path, *args):
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=plane.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def wait_for_the_job(process, tmp_path):
    """The run's namespace once its Job exists (the receipt records its UID); a tool that ended
    before that fails the test with its stderr."""
    receipt = tmp_path / "out" / "receipt.json"

    def created():
        assert process.poll() is None, "the tool ended early: %s" % process.communicate()[1]
        return receipt.exists() and "job_uid" in receipt.read_text()
    wait_for("the run's Job", created)
    return read(receipt)["namespace"]


def namespace_gone(plane, namespace):
    return plane.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout.strip() == ""


def running_pods(plane, namespace):
    return [pod for pod in plane.get_json("-n", namespace, "pods")["items"]
            if pod["status"].get("phase") == "Running" and pod["spec"].get("nodeName")]


def test_a_job_batch_of_ten_is_verified_and_cleanup_leaves_nothing(control_plane, tmp_path):
    done = run_tool_on(control_plane, tmp_path, "run", "--count", "10", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10.0)
    assert read(tmp_path / "out" / "version.json")["serverVersion"]["gitVersion"] == "v1.36.3"
    logs = [path for path in (tmp_path / "out").rglob("*.log")]
    assert len(logs) >= 10, logs
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    cleaned = run_tool_on(control_plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert "Deleted the run's namespace: " + namespace in cleaned.stderr
    assert namespace_gone(control_plane, namespace)


def test_custom_episodes_with_tasks_and_retries(control_plane, tmp_path):
    marker = tmp_path / "crashed-once"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 0.5},
                                                   {"mode": "crash_once", "marker": str(marker), "reward": 1.0}])
    done = run_tool_on(control_plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--retries", "1",
                       "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == 2
    assert results["reward_sum"] == pytest.approx(1.5)
    assert marker.exists()  # the second task crashed once and was tried again


def test_ctrl_c_mid_batch_then_cleanup_leaves_nothing(control_plane, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"wait_for": str(tmp_path / "never")}] * 2)
    process = start_tool_on(control_plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    namespace = wait_for_the_job(process, tmp_path)
    wait_for("the episodes to run", lambda: len(running_pods(control_plane, namespace)) == 2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "Interrupted. Clean up with:" in stderr
    cleaned = run_tool_on(control_plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert namespace_gone(control_plane, namespace)


def test_cleanup_refuses_a_foreign_object_and_names_it(control_plane, tmp_path):
    done = run_tool_on(control_plane, tmp_path, "run", "--count", "1", "--output", "out")
    assert done.code == 0, done
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    notes = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": namespace},
             "data": {"todo": "keep me"}}
    control_plane.kubectl("create", "-f", "-", stdin=json.dumps(notes))
    refused = run_tool_on(control_plane, tmp_path, "cleanup", "out")
    assert refused.code == 1, refused
    assert ("Error: namespace %s holds 1 object(s) this run did not create: ConfigMap notes" % namespace) in \
        refused.stderr
    assert control_plane.get_json("-n", namespace, "configmap", "notes")["data"] == {"todo": "keep me"}
    forced = run_tool_on(control_plane, tmp_path, "cleanup", "out", "--delete-foreign")
    assert forced.code == 0, forced
    assert namespace_gone(control_plane, namespace)


def test_a_batch_rides_out_the_controller_manager_stopped_for_20_seconds(control_plane, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 1}] * 4)
    process = start_tool_on(control_plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks,
                            "--parallelism", "2", "--output", "out")
    wait_for_the_job(process, tmp_path)
    manager = control_plane.component_pid("kube-controller-manager")
    os.kill(manager, signal.SIGSTOP)  # the Job controller makes no pod and counts no finish meanwhile
    try:
        time.sleep(20)  # the fault's length, not a bound on anything the test asserts
    finally:
        os.kill(manager, signal.SIGCONT)
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == 4
    assert run_tool_on(control_plane, tmp_path, "cleanup", "out").code == 0


def test_cleanup_waits_for_a_namespace_held_by_a_finalizer(control_plane, tmp_path):
    done = run_tool_on(control_plane, tmp_path, "run", "--count", "1", "--output", "out")
    assert done.code == 0, done
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = receipt["namespace"]
    held = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "held", "namespace": namespace, "finalizers": ["example.com/hold"],
                         "labels": {"agc-demo-run": receipt["run_id"]}}}
    control_plane.kubectl("create", "-f", "-", stdin=json.dumps(held))
    cleanup = start_tool_on(control_plane, tmp_path, "cleanup", "out")

    def held_by_the_finalizer():
        conditions = control_plane.get_json("namespace", namespace)["status"].get("conditions") or []
        return any(c["type"] == "NamespaceFinalizersRemaining" and c["status"] == "True" for c in conditions)
    # The real namespace controller says why the namespace stays (a condition the simulated one lacks).
    wait_for("the namespace controller to name the finalizer", held_by_the_finalizer)
    assert cleanup.poll() is None  # cleanup is still waiting for the namespace
    control_plane.kubectl("-n", namespace, "patch", "configmap", "held", "--type", "merge",
                          "-p", '{"metadata":{"finalizers":null}}')
    _, stderr = cleanup.communicate(timeout=300)
    assert cleanup.returncode == 0, stderr
    assert "Deleted the run's namespace: " + namespace in stderr


def test_rounds_with_prewarm_pin_a_warm_up_to_each_node(control_plane, tmp_path):
    done = run_tool_on(control_plane, tmp_path, "run", "--count", "3", "--rounds", "2", "--prewarm", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["episodes"] == 6 and results["successful_episodes"] == 6
    assert results["cache_state"] == "prewarmed"
    assert sorted(path.name for path in (tmp_path / "out" / "prewarm").iterdir() if path.is_dir()) == [
        "node-000000", "node-000001"]
    assert run_tool_on(control_plane, tmp_path, "cleanup", "out").code == 0


def test_compare_of_two_arms(control_plane, tmp_path):
    done = run_tool_on(control_plane, tmp_path, "compare", "--arm", "serial=--parallelism 1", "--arm", "parallel=",
                       "--count", "2", "--rounds", "2", "--seed", "1", "--output", "cmp")
    assert done.code == 0, done
    record = read(tmp_path / "cmp" / "comparison.json")
    assert sorted(record["arms"]) == ["parallel", "serial"]
    assert not [ns for ns in control_plane.get_json("namespaces")["items"]
                if ns["metadata"]["name"].startswith("agc-rl-") and not ns["metadata"].get("deletionTimestamp")]


def test_a_job_batch_with_the_kubectl_of_the_servers_release(controlplane_binaries, tmp_path):
    from controlplane.cluster import ControlPlane
    import fcntl
    from pathlib import Path
    plane = ControlPlane(tmp_path / "control-plane", controlplane_binaries,
                         kubectl=str(Path(controlplane_binaries) / "bin" / "kubectl"))
    with open(Path(controlplane_binaries) / "create.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        plane.start()
    try:
        assert "v1.36.3" in plane.kubectl("version", "--client").stdout
        done = run_tool_on(plane, tmp_path, "run", "--count", "5", "--output", "out")
        assert done.code == 0, done
        assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 5
        assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0
    finally:
        plane.stop()


# ---------------------------------------------------------------- agent-sandbox v0.5.6's controller on it


def episode_execs_per_pod(plane):
    """{namespace/pod: how many times the episode program was exec'd into it}, from the runtime."""
    counts = {}
    for pod, argv in plane.execs():
        if any("episode.py" in part for part in argv):
            counts[pod] = counts.get(pod, 0) + 1
    return counts


@pytest.mark.parts("agent-sandbox")
@AGENT_SANDBOX_VERSIONS
def test_a_warm_pool_batch_runs_every_episode_exactly_once_over_the_exec_channel(
        control_plane, tmp_path, agent_sandbox):
    done = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--count", "6", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (6, 6, 6.0)
    assert results["launch_types"] == {"warm": 6}
    assert results["exec_channel"]["kind"] == "websocket"
    # through the real API server's exec to kwok: once into each of 6 sandbox pods
    assert sorted(episode_execs_per_pod(control_plane).values()) == [1] * 6
    cleaned = run_tool_on(control_plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert namespace_gone(control_plane, read(tmp_path / "out" / "receipt.json")["namespace"])


@pytest.mark.parts("agent-sandbox")
def test_a_kept_pool_serves_three_steps_and_pool_down_leaves_nothing(control_plane, tmp_path):
    up = run_tool_on(control_plane, tmp_path, "pool", "up", "--size", "2", "--output", "pool")
    assert up.code == 0, up
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    for number in (1, 2, 3):
        done = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--count", "2",
                           "--output", "step-%d" % number)
        assert done.code == 0, done
        results = read(tmp_path / ("step-%d" % number) / "results.json")
        assert results["successful_episodes"] == 2
        assert results["kept_pool_step"]["size"] == 2
        # the step deleted its claims; the pool stays
        assert control_plane.get_json("-n", namespace, "sandboxclaims")["items"] == []
    assert len((tmp_path / "pool" / "steps.jsonl").read_text().splitlines()) == 3
    assert sorted(episode_execs_per_pod(control_plane).values()) == [1] * 6
    down = run_tool_on(control_plane, tmp_path, "pool", "down", "pool")
    assert down.code == 0, down
    assert namespace_gone(control_plane, namespace)


# ------------------------------------------------ a recycled kept pool on agent-sandbox v0.5.6 and v1.0.1


def claims_on(plane, namespace):
    return plane.get_json("-n", namespace, "sandboxclaims")["items"]


@pytest.mark.parts("agent-sandbox")
@AGENT_SANDBOX_VERSIONS
def test_a_recycled_pool_serves_three_steps_on_the_claims_it_keeps_and_replaces_a_dirty_one(
        control_plane, tmp_path, agent_sandbox):
    up = run_tool_on(control_plane, tmp_path, "pool", "up", "--recycle", "--size", "2", "--episode", EPISODE,
                     "--output", "pool")
    assert up.code == 0, up
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    kept = sorted(claim["metadata"]["uid"] for claim in claims_on(control_plane, namespace))
    for number in (1, 2, 3):
        tasks = write_tasks(tmp_path / ("tasks-%d.jsonl" % number), [{"reward": 0.5}, {"reward": 0.25}])
        done = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--tasks",
                           tasks, "--output", "step-%d" % number)
        assert done.code == 0, done
        results = read(tmp_path / ("step-%d" % number) / "results.json")
        assert [row["reward"] for row in results["pods"]] == [0.5, 0.25]
        assert [row["episodes_before"] for row in results["pods"]] == [number - 1] * 2
    # the controller's claims, as the API has them: the same two objects all along
    assert sorted(claim["metadata"]["uid"] for claim in claims_on(control_plane, namespace)) == kept
    dirty = write_tasks(tmp_path / "dirty.jsonl", [{}, {"leave": "tmpfile"}])
    done = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--tasks", dirty,
                       "--output", "step-4")
    assert done.code == 0, done
    quarantined = read(tmp_path / "step-4" / "results.json")["recycled_pool"]["quarantined"]
    assert [entry["task"] for entry in quarantined] == [1]
    now = sorted(claim["metadata"]["name"] for claim in claims_on(control_plane, namespace))
    assert len(now) == 2 and quarantined[0]["claim"] not in now  # its claim deleted, a fresh one in its slot
    down = run_tool_on(control_plane, tmp_path, "pool", "down", "pool")
    assert down.code == 0, down
    assert namespace_gone(control_plane, namespace)


@pytest.mark.parts("agent-sandbox")
@AGENT_SANDBOX_VERSIONS
def test_a_sigkilled_steps_sandboxes_are_deleted_by_the_controller_at_their_expiry(
        control_plane, tmp_path, agent_sandbox):
    up = run_tool_on(control_plane, tmp_path, "pool", "up", "--recycle", "--size", "2", "--ttl", "10", "--episode",
                     EPISODE, "--output", "pool")
    assert up.code == 0, up
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"sleep": 600}, {"sleep": 600}])
    step = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "warm-pool", "--pool", "pool", "--tasks",
                             tasks, "--timeout", "5", "--output", "step"], cwd=str(tmp_path), env=control_plane.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # the episodes under way: each has its journal in its sandbox, as the runtime saw it exec'd
        wait_for("the step's two episodes", lambda: step.poll() is None and len(episode_execs_per_pod(
            control_plane)) == 2 or (step.poll() is not None and pytest.fail(step.communicate()[1])))
    finally:
        try:
            os.killpg(step.pid, signal.SIGKILL)  # the tool and its kubectl children: a machine that never comes back
        except ProcessLookupError:
            pass  # it had ended (the wait above says how)
        step.wait()
    expiries = {claim["metadata"]["name"]: claim["spec"]["lifecycle"]["shutdownTime"]
                for claim in claims_on(control_plane, namespace)}
    assert len(expiries) == 2
    latest = max(rl_batch_demo_time(stamp) for stamp in expiries.values())
    # the step had made them outlive its deadline (5 s, its last reset check, a margin) and --ttl
    assert latest - time.time() <= 5 + 15 + 30 + 10
    wait_for("the controller to delete the expired claims and their sandboxes", lambda: not claims_on(
        control_plane, namespace) and not control_plane.get_json("-n", namespace, "sandboxes")["items"] and not [
        pod for pod in control_plane.get_json("-n", namespace, "pods")["items"]
        if not pod["metadata"].get("deletionTimestamp")], timeout=300)
    assert time.time() >= min(rl_batch_demo_time(stamp) for stamp in expiries.values())  # not before their time
    down = run_tool_on(control_plane, tmp_path, "pool", "down", "pool")
    assert down.code == 0, down
    assert namespace_gone(control_plane, namespace)


@pytest.mark.parts("agent-sandbox")
@AGENT_SANDBOX_VERSIONS
def test_a_step_that_sees_two_pods_for_one_sandbox_stops_says_so_and_deletes_that_claim(
        control_plane, tmp_path, agent_sandbox):
    up = run_tool_on(control_plane, tmp_path, "pool", "up", "--recycle", "--size", "2", "--episode", EPISODE,
                     "--output", "pool")
    assert up.code == 0, up
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    slot = read(tmp_path / "pool" / "sandboxes.json")["slots"][0]
    hold = tmp_path / "hold"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"wait_for": str(hold)}, {"wait_for": str(hold)}])
    step = start_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--tasks", tasks,
                         "--timeout", "120", "--output", "step")
    try:
        wait_for("the step's two episodes", lambda: len(episode_execs_per_pod(control_plane)) == 2 or (
            step.poll() is not None and pytest.fail(step.communicate()[1])))
        # a controller making one pod too many (agent-sandbox #1332): a second pod its Sandbox controls
        extra = control_plane.get_json("-n", namespace, "pod", slot["pod"])
        extra["metadata"] = {key: extra["metadata"][key] for key in ("labels", "ownerReferences", "annotations")
                             if key in extra["metadata"]}
        extra["metadata"].update(name=slot["pod"] + "-extra", namespace=namespace)
        extra["spec"].pop("nodeName", None)
        extra.pop("status", None)
        control_plane.kubectl("create", "-f", "-", stdin=json.dumps(extra))
        # the guard's answer: that slot's claim deleted while the other episode is still held
        wait_for("the step to delete the over-made claim", lambda: slot["claim"] not in [
            claim["metadata"]["name"] for claim in claims_on(control_plane, namespace)] or (
            step.poll() is not None and pytest.fail(step.communicate()[1])))
        hold.write_text("")
        stdout, stderr = step.communicate(timeout=300)
    finally:
        hold.write_text("")
        if step.poll() is None:
            step.kill()
            step.wait()
    assert step.returncode == 4, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Error: over-creation: Sandbox %s (claim %s) controls 2 pods (%s, %s-extra), one asked "
                           "for; the step stopped creating" % (slot["sandbox"], slot["claim"], slot["pod"],
                                                               slot["pod"])), last
    wait_for("the over-made claim, its Sandbox and both its pods to go", lambda: not [
        pod for pod in control_plane.get_json("-n", namespace, "pods")["items"]
        if pod["metadata"]["name"] in (slot["pod"], slot["pod"] + "-extra")] and slot["claim"] not in [
        claim["metadata"]["name"] for claim in claims_on(control_plane, namespace)], timeout=300)
    again = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--tasks",
                        write_tasks(tmp_path / "again.jsonl", [{}, {}]), "--output", "step-2")
    assert again.code == 0, again
    assert "slot 0 of the recycled pool cannot serve" in again.stderr
    down = run_tool_on(control_plane, tmp_path, "pool", "down", "pool")
    assert down.code == 0, down
    assert namespace_gone(control_plane, namespace)


def rl_batch_demo_time(stamp):
    import calendar
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


# ---------------------------------------------------------------- Kueue v0.19.2's controller manager on it


def make_cluster_queue(plane, name, **spec):
    """A ResourceFlavor `default` and a ClusterQueue of 2 CPUs and 4 GiB for every namespace."""
    objects = [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
               {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": dict({"namespaceSelector": {}, "resourceGroups": [{
                    "coveredResources": ["cpu", "memory"], "flavors": [{"name": "default", "resources": [
                        {"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "4Gi"}]}]}]},
                    **spec)}]
    plane.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


@pytest.mark.parts("kueue")
def test_a_batch_through_a_real_kueue_queue_has_its_queue_wait_apart(control_plane, tmp_path):
    make_cluster_queue(control_plane, "team")
    done = run_tool_on(control_plane, tmp_path, "run", "--count", "4", "--queue", "team", "--cluster-queue", "team",
                       "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4)
    queue = results["queue"]
    assert (queue["local_queue"], queue["cluster_queue"], queue["admission_cycles"]) == ("team", "team", 1)
    assert queue["queued_seconds"] >= 0 and results["batch_to_all_ready_after_admission_seconds"] is not None
    # the Workload the real Kueue made for the Job names the Job's uid
    assert read(tmp_path / "out" / "workload.json")["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == \
        read(tmp_path / "out" / "receipt.json")["job_uid"]
    cleaned = run_tool_on(control_plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert namespace_gone(control_plane, read(tmp_path / "out" / "receipt.json")["namespace"])


@pytest.mark.parts("kueue")
def test_a_held_real_cluster_queue_is_waited_for_and_the_batch_runs_once_it_is_resumed(control_plane, tmp_path):
    make_cluster_queue(control_plane, "team", stopPolicy="Hold")
    process = start_tool_on(control_plane, tmp_path, "run", "--count", "4", "--queue", "team", "--cluster-queue",
                            "team", "--output", "out")
    namespace = wait_for_the_job(process, tmp_path)

    def held_by_kueue():
        return [c for workload in control_plane.get_json("-n", namespace, "workloads")["items"]
                for c in workload.get("status", {}).get("conditions", [])
                if c["type"] == "QuotaReserved" and c["status"] == "False" and "ClusterQueue team is" in c["message"]]
    [held] = wait_for("the real Kueue to hold the Job's Workload", held_by_kueue)
    # and the tool to have seen it so (its Workload watch lags the API a little): then resumed
    said = []
    reader = threading.Thread(target=lambda: said.extend(process.stderr), daemon=True)
    reader.start()
    wait_for("the tool to say the batch is held", lambda: any("rollout: held: " in line for line in said))
    control_plane.kubectl("patch", "clusterqueue", "team", "--type", "merge", "-p", '{"spec":{"stopPolicy":"None"}}')
    process.wait(timeout=300)
    reader.join(timeout=60)
    stderr = "".join(said)
    assert process.returncode == 0, stderr
    # who held it, from the ClusterQueue's managedFields (kubectl shows them only when asked)
    assert "ClusterQueue team is held (stopPolicy Hold, set by kubectl-create): the batch will wait until it is " \
           "resumed" in stderr
    assert "rollout: held: %s: %s" % (held["reason"], held["message"]) in stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["reward_sum"] == 4 and results["queue"]["admission_cycles"] == 1


def test_a_batch_rides_out_the_api_server_killed_and_restarted(control_plane, tmp_path):
    # etcd keeps the state; every client (the tool's kubectl, the controllers, kwok, the runtime)
    # loses its connections and its watches while the API server is down
    release = tmp_path / "release"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok"}] * 2 + [{"mode": "ok", "wait_for": str(release)}] * 2)
    process = start_tool_on(control_plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    namespace = wait_for_the_job(process, tmp_path)
    # two episodes done before the outage, two held across it
    wait_for("2 done and 2 running episodes", lambda: len(running_pods(control_plane, namespace)) == 2 and len(
        [p for p in control_plane.get_json("-n", namespace, "pods")["items"] if p["status"].get("phase") == "Succeeded"]) == 2)
    control_plane.restart_component("kube-apiserver", down_while=lambda: time.sleep(10))  # the outage's length
    release.touch()
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4.0)
    assert run_tool_on(control_plane, tmp_path, "cleanup", "out").code == 0
    assert namespace_gone(control_plane, namespace)


@pytest.mark.parts("agent-sandbox")
def test_a_warm_pool_batch_rides_out_the_api_server_killed_with_every_episode_run_once(control_plane, tmp_path):
    # Two episodes are still running when the API server goes for 10 s: their exec streams are cut
    # (through the real API server to kwok); the tool reads their exec journals once it is back.
    release, runs = tmp_path / "release", str(tmp_path / "runs")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "runs": runs}] * 2 +
                        [{"mode": "ok", "runs": runs, "wait_for": str(release)}] * 2)
    process = start_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--episode", EPISODE, "--tasks",
                            tasks, "--output", "out")

    def all_four_started():
        assert process.poll() is None, "the tool ended early: %s" % process.communicate()[1]
        return sum(episode_execs_per_pod(control_plane).values()) == 4
    wait_for("the 4 episodes' execs", all_four_started)
    control_plane.restart_component("kube-apiserver", down_while=lambda: time.sleep(10))
    release.touch()
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    assert "was cut" in stderr, stderr
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4.0)
    # each episode ran once (an exec the outage stopped before its journal began is sent again)
    assert sorted(Path(runs).read_text().split()) == ["episode-%d" % index for index in range(4)]
    assert run_tool_on(control_plane, tmp_path, "cleanup", "out").code == 0


# ---------------------------------------------------------------- the kind workflow's steps


@pytest.mark.parts("agent-sandbox", "kueue")
def test_the_kind_workflows_steps_pass_on_the_real_control_plane(control_plane, tmp_path):
    # .github/workflows/kind-smoke.yml, step by step: a Job batch of 10, a warm pool of 5 next to
    # it and `report` of both, a queued batch of 5, cleanup of all three, their namespaces gone
    smoke = run_tool_on(control_plane, tmp_path, "run", "--count", "10", "--output", "smoke-out")
    assert smoke.code == 0, smoke
    results = read(tmp_path / "smoke-out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10)
    warm = run_tool_on(control_plane, tmp_path, "run", "--backend", "warm-pool", "--count", "5", "--output", "warm-out")
    assert warm.code == 0, warm
    results = read(tmp_path / "warm-out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"], results["backend"]) == (5, 5, "warm-pool")
    report = run_tool_on(control_plane, tmp_path, "report", "smoke-out", "warm-out", "--label", "Job", "--label",
                         "warm pool")
    assert report.code == 0, report
    assert "Job" in report.stdout and "warm pool" in report.stdout
    make_cluster_queue(control_plane, "smoke")
    queued = run_tool_on(control_plane, tmp_path, "run", "--count", "5", "--queue", "smoke", "--cluster-queue", "smoke",
                         "--output", "queued-out")
    assert queued.code == 0, queued
    results = read(tmp_path / "queued-out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (5, 5)
    assert results["queue"]["admission_cycles"] >= 1
    for out in ("smoke-out", "warm-out", "queued-out"):
        cleaned = run_tool_on(control_plane, tmp_path, "cleanup", "--output", out)
        assert cleaned.code == 0, cleaned
        assert namespace_gone(control_plane, read(tmp_path / out / "receipt.json")["namespace"])
