"""The tool on a real node (tests/realnode/): the kubelet of Kubernetes v1.36.3 with containerd v2,
runc and gVisor's runsc, registered with the real control plane beside its kwok node, its images
pulled from a registry on a loopback port. Run the tier alone with `python3 -m pytest -m realnode`."""

import json
import subprocess
import sys

import pytest

from conftest import SCRIPT, Result, read

pytestmark = [pytest.mark.realnode, pytest.mark.controlplane]


def run_tool_on(plane, tmp_path, *args, timeout=900):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=plane.env(), text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(done)


def python_image():
    from realnode.node import image_ref
    return image_ref("python")


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
    done = run_tool_on(plane, tmp_path, "run", "--count", "10", "--runtime", "runc", "--image", python_image(),
                       "--output", "out")
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
