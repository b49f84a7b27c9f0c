"""The tool on a real node (tests/realnode/): the kubelet of Kubernetes v1.36.3 with containerd v2,
runc and gVisor's runsc, registered with the real control plane beside its kwok node, its images
pulled from a registry on a loopback port. Run the tier alone with `python3 -m pytest -m realnode`."""

import json
import re
import signal
import subprocess
import sys

import pytest

from conftest import EPISODE, SCRIPT, Result, read, wait_for, write_tasks

pytestmark = [pytest.mark.realnode, pytest.mark.controlplane]


def run_tool_on(plane, tmp_path, *args, timeout=900):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=plane.env(), text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(done)


def python_image():
    from realnode.node import image_ref
    return image_ref("python")


def start_tool_on(plane, tmp_path, *args):
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=plane.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


# Custom episodes (tests/episodes/scripted.py) held after their ready event until the test writes
# /workspace/release into each one's emptyDir from outside: a batch the test can fault mid-way.
RELEASE = "/workspace/release"


def start_held_batch(plane, tmp_path, count, *extra):
    """A run of `count` held episodes on runc; (process, namespace, running pods) once each runs."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"wait_for": RELEASE, "on_sigterm": "exit", "reward": 0.5}] * count)
    process = start_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                            "--image", python_image(), "--output", "out", *extra)
    receipt = tmp_path / "out" / "receipt.json"

    def created():
        assert process.poll() is None, "the tool ended early: %s" % (process.communicate(),)
        return receipt.exists() and "job_uid" in receipt.read_text()
    wait_for("the run's Job", created)
    namespace = read(receipt)["namespace"]

    def running():
        pods = [pod for pod in plane.get_json("-n", namespace, "pods")["items"]
                if (pod["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("running")]
        return pods if len(pods) == count else None
    return process, namespace, wait_for("the episodes to run", running)


def release(node, pods):
    for pod in pods:
        (node.pod_volume(pod["metadata"]["uid"], "workspace") / "release").write_text("")


def restarts(plane, namespace):
    return [status.get("restartCount") for pod in plane.get_json("-n", namespace, "pods")["items"]
            for status in pod["status"].get("containerStatuses") or []]


def test_a_pod_runs_on_the_real_node_hardened_and_the_node_leaves_nothing(real_node, tmp_path):
    plane, node = real_node
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": "default"},
           "spec": {"runtimeClassName": "runc", "restartPolicy": "Never",
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
                    "containers": [{"name": "c", "image": python_image(), "command": [
                        "python", "-c", "import os; print(os.getuid(), open('/proc/self/status').read().count('CapEff:\\t0000000000000000'))"],
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}}}]}}
    plane.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    from conftest import wait_for
    wait_for("the probe pod to succeed", lambda: plane.get_json("-n", "default", "pod", "probe")["status"].get("phase")
             in ("Succeeded", "Failed"))
    status = plane.get_json("-n", "default", "pod", "probe")
    assert status["spec"]["nodeName"] == node.name
    assert status["status"]["phase"] == "Succeeded", status["status"]
    # the log went API server -> the real kubelet -> containerd's log file
    assert plane.kubectl("-n", "default", "logs", "probe").stdout.split() == ["1000", "1"]
    plane.kubectl("-n", "default", "delete", "pod", "probe", "--wait=true")
    node.stop()
    assert node.leftovers() == []


def test_a_job_batch_of_ten_on_runc_is_verified_through_the_real_kubelet(real_node, tmp_path):
    plane, node = real_node
    # five at a time: ten at once on the node's 2 CPUs, beside a busy suite, once starved the built-in
    # episode's unit tests past the tutorial's 20 s subprocess timeout (seen on 2026-12-07)
    done = run_tool_on(plane, tmp_path, "run", "--count", "10", "--parallelism", "5", "--runtime", "runc",
                       "--image", python_image(), "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10.0)
    pods = read(tmp_path / "out" / "pods.json")
    assert {pod["spec"]["nodeName"] for pod in pods} == {node.name}
    # the kubelet wrote each termination message (the episode's events), and containerd ran the image
    assert all(pod["status"]["containerStatuses"][0]["imageID"].startswith("rlbd.test/python@sha256:") for pod in pods)
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    cleaned = run_tool_on(plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert "Deleted the run's namespace: " + namespace in cleaned.stderr


def test_a_job_batch_under_gvisor_runs_on_gvisors_own_kernel(real_node, tmp_path):
    plane, node = real_node
    done = run_tool_on(plane, tmp_path, "run", "--count", "3", "--runtime", "gvisor", "--image", python_image(),
                       "--require-isolation", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == 3
    node_kernel = node.node_object()["status"]["nodeInfo"]["kernelVersion"]
    for row in results["pods"]:
        # gVisor answers uname and /proc/version itself: its Sentry is the episode's kernel
        assert row["kernel"]["node_kernel"] == node_kernel
        assert row["kernel"]["release"] != node_kernel
        assert row["kernel"]["shared_node_kernel"] is False
        assert "gvisor" in row["kernel"]["proc_version"].lower() or row["kernel"]["release"].startswith("4."), row
    assert results["isolation"]["verdict"] == "separate-kernel"
    assert "not a sandbox" not in done.stderr
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_a_runtime_class_named_as_a_sandbox_on_runc_is_named_as_sharing_the_nodes_kernel(real_node, tmp_path):
    plane, node = real_node
    node_kernel = node.node_object()["status"]["nodeInfo"]["kernelVersion"]
    done = run_tool_on(plane, tmp_path, "run", "--count", "2", "--runtime", "cube", "--image", python_image(),
                       "--output", "out")
    assert done.code == 0, done
    assert ("warning: RuntimeClass cube: every episode ran on the node's own kernel %s: this is not a sandbox on "
            "this cluster" % node_kernel) in done.stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["isolation"]["verdict"] == "node-kernel"
    assert all(row["kernel"]["release"] == node_kernel for row in results["pods"])
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_require_isolation_fails_a_run_whose_episodes_shared_the_nodes_kernel(real_node, tmp_path):
    plane, node = real_node
    done = run_tool_on(plane, tmp_path, "run", "--count", "2", "--runtime", "cube", "--image", python_image(),
                       "--require-isolation", "--output", "out")
    assert done.code == 6, done
    assert "Error: --require-isolation: RuntimeClass cube: every episode ran on the node's own kernel" in done.stderr
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 2  # the results are kept
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_an_image_that_does_not_exist_is_named_with_the_kubelets_reason_long_before_the_deadline(real_node, tmp_path):
    plane, node = real_node
    from realnode.node import REGISTRY_HOST
    missing = REGISTRY_HOST + "/python:no-such-tag"
    done = run_tool_on(plane, tmp_path, "run", "--count", "2", "--runtime", "runc", "--image", missing,
                       "--timeout", "300", "--output", "out")
    assert done.code != 0, done
    assert missing in done.stderr, done
    assert "ErrImagePull" in done.stderr or "ImagePullBackOff" in done.stderr, done
    assert "does not exist in its registry" in done.stderr, done  # named at once, not at the deadline (exit 3)
    assert done.code != 3, done
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_an_image_without_python_is_named_with_the_kubelets_start_error(real_node, tmp_path):
    plane, node = real_node
    from realnode.node import image_ref
    done = run_tool_on(plane, tmp_path, "run", "--count", "1", "--runtime", "runc", "--image", image_ref("no-python"),
                       "--timeout", "300", "--output", "out")
    assert done.code != 0, done
    assert "StartError" in done.stderr or "executable file not found" in done.stderr, done
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_an_episode_killed_at_its_memory_limit_is_named_oomkilled(real_node, tmp_path):
    plane, node = real_node
    episode = tmp_path / "hog.py"
    episode.write_text("import json, os, time\n"
                       "print(json.dumps({'event': 'ready', 'at': time.time(), 'episode_id': os.environ['EPISODE_ID']}),"
                       " flush=True)\nhog = [bytearray(16 * 2 ** 20) for _ in range(64)]\n")
    done = run_tool_on(plane, tmp_path, "run", "--count", "1", "--runtime", "runc", "--image", python_image(),
                       "--episode", str(episode), "--output", "out")
    assert done.code != 0, done
    assert "OOMKilled" in done.stderr, done
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


# ---------------------------------------------------------------- agent-sandbox's warm pool on the real node


@pytest.mark.parts("agent-sandbox")
def test_a_warm_pool_batch_under_gvisor_execs_through_the_kubelet_and_proves_its_kernel(real_node, tmp_path):
    plane, node = real_node
    done = run_tool_on(plane, tmp_path, "run", "--backend", "warm-pool", "--count", "4", "--runtime", "gvisor",
                       "--image", python_image(), "--require-isolation", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (4, 4, 4.0)
    assert results["exec_channel"]["kind"] == "websocket"  # the API server's exec, then the kubelet's CRI stream
    node_kernel = node.node_object()["status"]["nodeInfo"]["kernelVersion"]
    # the exec'd episode ran the probe first, inside gVisor's Sentry
    assert {row["kernel"]["shared_node_kernel"] for row in results["pods"]} == {False}
    assert {row["kernel"]["node_kernel"] for row in results["pods"]} == {node_kernel}
    assert results["isolation"]["verdict"] == "separate-kernel"
    cleaned = run_tool_on(plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned


@pytest.mark.parts("agent-sandbox")
def test_a_kept_pool_serves_two_steps_on_the_real_node_each_episode_once(real_node, tmp_path):
    plane, node = real_node
    up = run_tool_on(plane, tmp_path, "pool", "up", "--size", "2", "--runtime", "runc", "--image", python_image(),
                     "--output", "pool")
    assert up.code == 0, up
    namespace = read(tmp_path / "pool" / "pool.json")["namespace"]
    for number in (1, 2):
        done = run_tool_on(plane, tmp_path, "run", "--backend", "warm-pool", "--pool", "pool", "--count", "2",
                           "--output", "step-%d" % number)
        assert done.code == 0, done
        results = read(tmp_path / ("step-%d" % number) / "results.json")
        assert results["successful_episodes"] == 2
        assert results["isolation"]["verdict"] == "node-kernel"  # runc: a fact, not a finding
        assert "not a sandbox" not in done.stderr
        assert plane.get_json("-n", namespace, "sandboxclaims")["items"] == []
    # every sandbox pod ran on the real node, and each step's episodes were distinct
    pods = plane.get_json("-n", namespace, "pods")["items"]
    assert pods and {pod["spec"]["nodeName"] for pod in pods} == {node.name}
    ids = [row["claim"] for number in (1, 2) for row in read(tmp_path / ("step-%d" % number) / "results.json")["pods"]]
    assert len(ids) == len(set(ids)) == 4
    down = run_tool_on(plane, tmp_path, "pool", "down", "pool")
    assert down.code == 0, down


# ---------------------------------------------------------------- faults only a real node shows


def test_ctrl_c_mid_batch_on_the_real_node_then_cleanup_leaves_nothing(real_node, tmp_path):
    plane, node = real_node
    process, namespace, _ = start_held_batch(plane, tmp_path, 2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130, stderr
    assert "Interrupted. Clean up with:" in stderr
    cleaned = run_tool_on(plane, tmp_path, "cleanup", "out")
    assert cleaned.code == 0, cleaned
    assert "Deleted the run's namespace: " + namespace in cleaned.stderr
    # the kubelet stopped both containers and removed their pod sandboxes (the fixture checks the rest)
    wait_for("the node to have no pod of the run", lambda: not [
        pod for pod in plane.get_json("pods", "--all-namespaces")["items"] if pod["metadata"]["namespace"] == namespace])


@pytest.mark.parametrize("part", ["containerd", "kubelet"])
def test_a_batch_rides_out_a_node_part_killed_and_restarted_mid_batch(real_node, tmp_path, part):
    # What the kubelet did (this test's finding): the containers outlive both, since containerd's
    # shims hold them; the restarted kubelet finds them through the CRI and reports their exits.
    plane, node = real_node
    process, namespace, pods = start_held_batch(plane, tmp_path, 2)
    node.kill(part)
    release(node, pods)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (2, 1.0)
    assert restarts(plane, namespace) == [0, 0]  # no episode ran twice
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_a_container_killed_by_its_runtime_is_named_with_its_signal(real_node, tmp_path):
    plane, node = real_node
    process, namespace, pods = start_held_batch(plane, tmp_path, 1)
    (episode,) = node.container_processes(pods[0]["metadata"]["uid"])
    __import__("os").kill(episode, signal.SIGKILL)  # as a runtime (or the kernel) would
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 5, stderr  # results written; the episode is an infrastructure failure
    assert "exit code 137 (128 + SIGKILL: killed by a signal)" in stderr, stderr
    failures = read(tmp_path / "out" / "results.json")["infrastructure_failures"]
    assert "SIGKILL" in json.dumps(failures), failures
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_custom_episodes_with_tasks_run_on_the_real_node_each_with_its_task(real_node, tmp_path):
    plane, node = real_node
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "t%d" % n, "reward": n / 4} for n in range(4)])
    done = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "gvisor",
                       "--image", python_image(), "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["reward_sum"] == pytest.approx(1.5)
    assert [(task["task"], task["reward"]) for task in results["tasks"]] == [(n, n / 4) for n in range(4)]
    assert results["isolation"]["verdict"] == "separate-kernel"  # the probe wraps custom episodes too
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_rounds_with_prewarm_tell_the_first_pull_from_the_cached_ones(real_node, tmp_path):
    plane, node = real_node
    done = run_tool_on(plane, tmp_path, "run", "--count", "2", "--rounds", "2", "--prewarm", "--runtime", "runc",
                       "--image", python_image(), "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["cache_state"] == "prewarmed"
    # the warm-up episode pulled (the image was in the registry only); every measured one found it cached
    assert (results["image_pulls"]["pulled"], results["image_pulls"]["cached"]) == (0, 4), results["image_pulls"]
    prewarm = [read(path) for path in (tmp_path / "out" / "prewarm").glob("*/results.json")]
    assert [result["image_pulls"]["pulled"] for result in prewarm] == [1], prewarm
    pull = next(row["image_pull"] for row in prewarm[0]["pods"])
    assert pull["image"] == python_image() and pull["pull_seconds"] > 0 and pull["image_size_bytes"] > 0
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_an_episode_that_ends_while_containerd_is_down_is_named_with_the_runtimes_unknown(real_node, tmp_path):
    # What the real parts did (containerd v2.4.2): the episode's exit reached no containerd, and
    # the restarted one took its shim for a leaked one (core/runtime/v2/shim_load.go,
    # shouldCleanupShim: not a sandbox, no process left) and deleted it with the exit status; the
    # CRI then reports reason Unknown, exit code 255 (internal/cri/server/helpers.go), and what the
    # episode printed while containerd was stopped never reached its log.
    plane, node = real_node
    process, namespace, pods = start_held_batch(plane, tmp_path, 1)
    uid = pods[0]["metadata"]["uid"]
    node.pause("containerd")
    release(node, pods)
    wait_for("the episode to end", lambda: not node.container_processes(uid))
    node.kill("containerd")
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 5, stderr  # results written; the episode is an infrastructure failure
    assert "Unknown: the container runtime lost the container's exit status" in stderr, stderr
    (pod,) = read(tmp_path / "out" / "pods.json")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("Unknown", 255)
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_the_registry_stopped_mid_batch_leaves_the_rest_to_the_nodes_cached_image(
        tmp_path, controlplane_binaries, realnode_binaries):
    # What the kubelet did: imagePullPolicy IfNotPresent, so once the first pod pulled the image
    # every later pod found it on the node ("already present") and never asked the stopped registry.
    from conftest import start_real_node
    from realnode.node import Registry
    registry = Registry(tmp_path / "registry", realnode_binaries)
    try:
        registry.start().push_built()
        plane, node = start_real_node(tmp_path, controlplane_binaries, realnode_binaries, registry)
    except BaseException:
        registry.stop()
        raise
    try:
        process = start_tool_on(plane, tmp_path, "run", "--count", "3", "--parallelism", "1", "--runtime", "runc",
                                "--image", python_image(), "--output", "out")
        receipt = tmp_path / "out" / "receipt.json"
        wait_for("the run's namespace", lambda: receipt.exists() and "job_uid" in receipt.read_text())
        namespace = read(receipt)["namespace"]
        wait_for("the first pull", lambda: [event for event in plane.get_json("-n", namespace, "events")["items"]
                                            if event["message"].startswith("Successfully pulled image")])
        registry.stop()
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
        pulls = read(tmp_path / "out" / "results.json")["image_pulls"]
        assert (pulls["pulled"], pulls["cached"], pulls["unknown"]) == (1, 2, 0), pulls
        assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0
    finally:
        node.stop()
        plane.stop()
        registry.stop()
    assert node.leftovers() == []


def test_the_preflight_names_the_real_node_once_it_holds_a_tasks_image(real_node, tmp_path):
    plane, node = real_node
    image = python_image()
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1, "image": image}])
    first = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                        "--output", "first")
    assert first.code == 0, first
    assert read(tmp_path / "first" / "results.json")["image"] == image  # the task's, not --image's default

    def listed():  # the kubelet writes what it pulled into its node's status.images
        status = plane.get_json("node", node.name)["status"]
        return any(image in entry.get("names", []) for entry in status.get("images") or [])
    wait_for("the kubelet to list the image in its node's status", listed)
    second = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                         "--output", "second")
    assert second.code == 0, second
    assert re.search(r"preflight: image %s \(1 episode\(s\)\): on 1 of \d+ usable node\(s\) already \(%s\)"
                     % (re.escape(image), re.escape(node.name)), second.stderr), second.stderr
    assert read(tmp_path / "second" / "run.json")["images"][0]["nodes_holding"] == [node.name]
    pulls = read(tmp_path / "second" / "results.json")["image_pulls"]
    assert (pulls["by_image"][image]["cached"], pulls["mixed_startup"]) == (1, None), pulls
    for folder in ("first", "second"):
        assert run_tool_on(plane, tmp_path, "cleanup", folder).code == 0


def three_images(node, tmp_path):
    """Three repositories of the node's registry (the python image under three names), and six
    tasks over them in turn, task n rewarding n: ([image references], the tasks file)."""
    from realnode.node import image_ref
    images = []
    for name in ("task-a:1", "task-b:1", "task-c:1"):
        node.registry.push(node.registry.built / "images" / "python", name)
        images.append(image_ref(name))
    return images, write_tasks(tmp_path / "tasks.jsonl", [{"id": n, "reward": n, "image": images[n % 3]}
                                                          for n in range(6)])


def test_prewarm_across_images_leaves_every_measured_episode_its_image_cached(real_node, tmp_path):
    plane, node = real_node
    images, tasks = three_images(node, tmp_path)
    done = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                       "--prewarm", "--output", "out")
    assert done.code == 0, done
    pulls = read(tmp_path / "out" / "prewarm" / "prewarm.json")["pulls"]
    assert sorted((pull["image"], pull["state"]) for pull in pulls) == [(image, "pulled") for image in images]
    assert all(pull["pull_seconds"] > 0 for pull in pulls), pulls
    results = read(tmp_path / "out" / "results.json")
    assert (results["image_pulls"]["pulled"], results["image_pulls"]["cached"]) == (0, 6), results["image_pulls"]
    assert [entry["reward"] for entry in results["tasks"]] == list(range(6))
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_a_batch_across_three_images_pulls_each_in_its_first_round_and_finds_them_cached_in_the_next(
        real_node, tmp_path):
    plane, node = real_node
    images, tasks = three_images(node, tmp_path)
    done = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                       "--rounds", "2", "--output", "out")
    assert done.code == 0, done
    for number in (1, 2):
        results = read(tmp_path / "out" / ("round-%d" % number) / "results.json")
        assert [entry["reward"] for entry in results["tasks"]] == list(range(6))  # each task its own image's
        assert [row["image"] for row in results["pods"]] == [images[n % 3] for n in range(6)]
        by_image = results["image_pulls"]["by_image"]
        if number == 1:  # in the registry only: each image's first episode pulls it
            assert all(by_image[image]["pulled"] >= 1 for image in images), by_image
        else:  # every image is on the node now
            assert [(by_image[image]["pulled"], by_image[image]["cached"]) for image in images] == [(0, 2)] * 3, by_image
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0


def test_an_image_missing_from_the_registry_fails_its_job_with_its_tasks_while_the_others_run(real_node, tmp_path):
    plane, node = real_node
    images, _ = three_images(node, tmp_path)
    from realnode.node import image_ref
    missing = image_ref("task-missing:1")  # in no repository of the registry
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": n, "reward": n, "image": (images[:2] + [missing])[n % 3]}
                                                   for n in range(6)])
    done = run_tool_on(plane, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--runtime", "runc",
                       "--timeout", "300", "--output", "out")
    assert done.code == 1, done  # named within the kubelet's first back-off, not at the deadline (3)
    last = done.stderr.strip().splitlines()[-1]
    assert ("image %s (Job rollout-i2): the image %s does not exist in its registry" % (missing, missing)) in last, last
    assert re.search(r"; tasks? [25](, [25])? needs? it", last), last
    assert [read(tmp_path / "out" / ("image-%d" % k) / "results.json")["reward_sum"] for k in range(2)] == [3, 5]
    assert run_tool_on(plane, tmp_path, "cleanup", "out").code == 0
