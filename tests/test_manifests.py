"""The manifests a run creates and the episode program it ships, in-process."""

import ast
import json
import subprocess

import pytest

from conftest import find_python


def manifests_of(tool, spec, namespace="agc-rl-x", run_id="x"):
    """Every object of one run, in creation order, as its backend makes them."""
    return tool.backend_named(spec.backend)(spec, tool.Console(quiet=True)).manifests(namespace, run_id)


@pytest.mark.parametrize("count, parallelism, deadline", [(10, 10, 240), (20, 20, 240), (10, 1, 510),
                                                           (1000, 1000, 338), (1000, 100, 608)])
def test_deadline_follows_count_and_parallelism(tool, count, parallelism, deadline):
    assert tool.default_deadline(count, parallelism) == deadline


def test_job_manifest_matches_the_tutorial(tool):
    job = tool.job_manifest("agc-rl-0123456789ab", "0123456789ab", 10, 4, "python:3.12-alpine", "cube")
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"], job["metadata"]["namespace"]) == (
        "batch/v1", "Job", "rollout", "agc-rl-0123456789ab")
    assert (spec["completions"], spec["parallelism"], spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (
        10, 4, 0, 240)
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"]["app"] == "rl-batch-demo"
    assert pod["runtimeClassName"] == "cube"
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": True}
    (container,) = pod["containers"]
    assert container["name"] == "episode"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == ["python", "-B", "/demo/sandbox.py", "/demo/episode.py"]  # the kernel probe first
    assert container["env"] == [{"name": "EPISODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "64Mi"},
                                      "limits": {"cpu": "500m", "memory": "128Mi"}}
    assert container["volumeMounts"] == [{"name": "script", "mountPath": "/demo", "readOnly": True},
                                         {"name": "workspace", "mountPath": "/workspace"}]
    assert pod["volumes"] == [{"name": "script", "configMap": {"name": "episode"}},
                              {"name": "workspace", "emptyDir": {}}]


def test_job_manifest_without_runtime_class_has_no_runtimeClassName(tool):
    job = tool.job_manifest("ns", "r", 1, 1, "python:3.12-alpine", None)
    assert "runtimeClassName" not in job["spec"]["template"]["spec"]


def test_job_manifest_deadline_follows_timeout(tool):
    assert tool.job_manifest("ns", "r", 1, 1, "img", "cube", 30)["spec"]["activeDeadlineSeconds"] == 30


def test_namespace_manifest_carries_the_run_label(tool):
    ns = tool.namespace_manifest("agc-rl-x", "x")
    assert (ns["apiVersion"], ns["kind"], ns["metadata"]["name"]) == ("v1", "Namespace", "agc-rl-x")
    assert ns["metadata"]["labels"]["agc-demo-run"] == "x"


def test_the_pods_command_runs_the_program_the_configmap_ships(tool):
    cm = tool.configmap_manifest("ns", "x")
    pod = tool.episode_pod_template("x", "python:3.12-alpine", None, False)["spec"]
    [container] = pod["containers"]
    [script] = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == script["name"]]
    key = "episode.py"
    # the path the command runs is the ConfigMap's one key under the volume's mount path
    assert mount["mountPath"] + "/" + key in container["command"]
    assert cm["metadata"]["namespace"] == "ns"
    compile(cm["data"][key], key, "exec")  # a Python program, whole


def test_every_created_object_carries_the_recommended_labels(tool):
    args = tool.parse_args(["run", "--output", "o", "--network", "none"])
    for obj in manifests_of(tool, args):
        labels = obj["metadata"]["labels"]
        assert labels["agc-demo-run"] == "x", obj["kind"]
        assert labels["app.kubernetes.io/name"] == "rl-batch-demo"
        assert labels["app.kubernetes.io/instance"] == "x"
        assert labels["app.kubernetes.io/managed-by"] == "rl-batch-demo"
        assert labels["app.kubernetes.io/version"] == tool.__version__
        assert labels["app.kubernetes.io/component"]
    job = manifests_of(tool, args)[-1]
    assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "x"


def test_a_job_runs_objects_are_the_namespace_first_and_the_job_last(tool):
    args = tool.parse_args(["run", "--output", "o", "--network", "none"])
    kinds = [obj["kind"] for obj in manifests_of(tool, args)]
    assert kinds == ["Namespace", "ConfigMap", "NetworkPolicy", "Job"]
    args = tool.parse_args(["run", "--output", "o"])
    assert [obj["kind"] for obj in manifests_of(tool, args)] == ["Namespace", "ConfigMap", "Job"]


def test_episode_program_imports_only_cheap_standard_modules(tool):
    tree = ast.parse(tool.EPISODE_PROGRAM)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"json", "os", "pathlib", "subprocess", "time"}
    assert not any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))


def run_episode(python, tmp_path, tool):
    """Run the episode program as a pod would: `python` on PATH, EPISODE_ID set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(python)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    program = tmp_path / "episode.py"
    program.write_text(tool.EPISODE_PROGRAM)
    env = {"PATH": "%s:/usr/bin:/bin" % bin_dir, "EPISODE_ID": "rollout-xyz12", "RL_WORKSPACE": str(workspace)}
    return subprocess.run([str(bin_dir / "python"), "-B", str(program)], env=env, text=True,
                          capture_output=True, timeout=60)


@pytest.mark.parametrize("version", ["3.9", "3.12"])
def test_episode_program_runs_on_python_3_9_and_later(version, tmp_path, tool):
    python = find_python(version)
    done = run_episode(python, tmp_path, tool)
    assert done.returncode == 0, done.stderr
    ready, reward = [json.loads(line) for line in done.stdout.splitlines()]
    assert ready["event"] == "ready" and ready["episode_id"] == "rollout-xyz12"
    assert (reward["reward"], reward["tests_exit"], reward["baseline_exit"]) == (1, 0, 1)
    assert ready["at"] <= reward["at"]
