"""The read-only checks before a run: capacity, taints, the RuntimeClass; a refusal leaves no folder."""

import pytest

from conftest import read


def test_missing_runtime_class_is_named_with_how_to_list_them(cluster, run_tool, tmp_path):
    result = run_tool("run", "--runtime", "kata-qemu", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "Error: RuntimeClass 'kata-qemu' not found on context kind-rl" in result.stderr
    assert "kubectl --context kind-rl get runtimeclass" in result.stderr
    # refused by a read-only check: nothing to clean up, and the same --output can be used again
    assert "cleanup" not in result.stderr
    assert not (tmp_path / "out").exists()
    assert not [call for call in cluster.calls() if "create" in call]


def test_a_run_refused_by_a_read_only_check_leaves_no_folder(cluster, run_tool, tmp_path):
    result = run_tool("run", "--context", "nosuch", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert "context nosuch does not exist in the kubeconfig (error: context nosuch not found)" in result.stderr
    assert "cleanup" not in result.stderr
    assert not (tmp_path / "out").exists()


SANDBOX_TAINT = {"key": "sandbox.gke.io/runtime", "value": "gvisor", "effect": "NoSchedule"}


SANDBOX_POOL = {"runtimeClasses": [{"name": "gvisor", "handler": "runsc", "scheduling": {
    "nodeSelector": {"sandbox.gke.io/runtime": "gvisor"},
    "tolerations": [{"key": "sandbox.gke.io/runtime", "operator": "Equal", "value": "gvisor",
                     "effect": "NoSchedule"}]}}],
    "nodes": [{"name": "pool-node-1", "hostname": "ip-10-0-0-1", "labels": {"sandbox.gke.io/runtime": "gvisor"},
               "taints": [SANDBOX_TAINT]},
              {"name": "general-1", "taints": [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}]}


def test_a_tainted_pool_the_runtime_class_tolerates_passes_preflight_and_prewarms(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(SANDBOX_POOL)
    result = run_tool("run", "--runtime", "gvisor", "--count", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "no usable node" not in result.stderr
    assert read(tmp_path / "out" / "run.json")["preflight"]["pods_that_fit_at_once"] > 0
    prewarm = read(tmp_path / "out" / "prewarm" / "pool-node-1" / "job-submitted.json")
    # pinned by the node's own hostname label, which differs from its name here
    assert prewarm["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "ip-10-0-0-1"}
    assert read(tmp_path / "out" / "results.json")["nodes"] == {"pool-node-1": 2}


def test_preflight_refuses_taints_nothing_tolerates(tool):
    node = {"metadata": {"name": "n", "labels": {}}, "spec": {"taints": [SANDBOX_TAINT]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"cpu": "8", "memory": "8Gi"}}}
    assert tool.usable_nodes([node], None) == []
    runtime_class = {"scheduling": {"tolerations": [{"key": "sandbox.gke.io/runtime", "operator": "Exists"}]}}
    assert tool.usable_nodes([node], runtime_class) == [node]


KATA = {"name": "kata", "handler": "kata-qemu", "overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}}


def test_preflight_warns_with_the_arithmetic_when_the_batch_cannot_fit(make_cluster, run_tool, tmp_path):
    nodes = [{"name": "kind-worker", "cpu": "8", "memory": "4Gi"}, {"name": "kind-worker2", "cpu": "8", "memory": "4Gi"}]
    cluster = make_cluster({"nodes": nodes, "runtimeClasses": [KATA]})
    result = run_tool("run", "--count", "10", "--runtime", "kata", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "warning: preflight: only 8 of 10 episode pods fit at once" in result.stderr
    assert "overhead alone: 768Mi x 10 = 7680Mi (7.5GiB)" in result.stderr
    assert "10 at once need 3500m CPU and 8320Mi (8.1GiB) memory" in result.stderr
    preflight = read(tmp_path / "out" / "results.json")["run"]["preflight"]
    assert preflight["pods_that_fit_at_once"] == 8


def test_preflight_refuses_when_no_node_can_run_an_episode(make_cluster, run_tool, tmp_path):
    pinned = dict(KATA, scheduling={"nodeSelector": {"katacontainers.io/kata-runtime": "true"}})
    cluster = make_cluster({"runtimeClasses": [pinned]})
    result = run_tool("run", "--count", "2", "--runtime", "kata", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "preflight: no usable node can run even one episode pod" in result.stderr
    assert "0 usable node(s) of 2" in result.stderr and "--force" in result.stderr
    assert not [call for call in cluster.calls() if "create" in call]
    assert not (tmp_path / "out").exists()  # refused before any change: retry with the same --output


def test_preflight_counts_requests_and_overhead_per_node(tool):
    node = {"metadata": {"name": "n", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "2", "memory": "2Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    kata = {"overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}}
    fit, text = tool.preflight(10, kata, [node, dict(node, spec={"unschedulable": True})])
    assert fit == 2  # 2Gi / 832Mi; the cordoned node does not count
    assert "1 usable node(s) of 2 fit 2 such pods at once" in text


def test_a_forced_run_that_no_node_can_run_is_not_said_to_queue(make_cluster, run_tool, tmp_path):
    pinned = dict(KATA, scheduling={"nodeSelector": {"katacontainers.io/kata-runtime": "true"}})
    cluster = make_cluster({"runtimeClasses": [pinned]})
    result = run_tool("run", "--count", "2", "--runtime", "kata", "--force", "--timeout", "2", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result  # the pods never run: the deadline passes
    assert ("warning: preflight: no usable node can run even one episode pod, submitted anyway (--force): the pods "
            "stay Pending until capacity appears or the deadline passes: " in result.stderr)
    assert "will queue" not in result.stderr and "only 0 of" not in result.stderr


def test_quantities_parse_as_the_api_writes_them(tool):
    # every suffix resource.Quantity accepts, the exponent form, and "1E" alone as exa
    for text, value in (("100m", 0.1), ("64Mi", 64 * 2 ** 20), ("2Pi", 2 * 2 ** 50), ("1Ei", 2 ** 60),
                        ("500u", 5e-4), ("3n", 3e-9), ("1E", 1e18), ("2P", 2e15), ("1e3", 1000.0), ("1.5E2", 150.0),
                        ("8", 8.0), (".5", 0.5), (4, 4.0)):
        assert abs(tool.parse_quantity(text) - value) <= 1e-9 * abs(value), text


def test_prewarm_without_the_right_to_list_nodes_is_refused_before_any_change(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"forbid": [{"verb": "list", "resource": "nodes"}]})
    result = run_tool("run", "--count", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert "Error: --prewarm needs to list the nodes, and kubectl could not: " in result.stderr
    assert 'nodes is forbidden: User "kind-user" cannot list resource "nodes"' in result.stderr
    assert "preflight skipped" not in result.stderr  # one line: the refusal, not a note before it
    assert not (tmp_path / "out").exists()
    assert not [call for call in cluster.calls() if "create" in call]


# ---------------------------------------------------------------- the context itself


@pytest.mark.parametrize("command", [["run", "--count", "1", "--no-runtime-class"],
                                     ["run", "--count", "1", "--backend", "warm-pool"],
                                     ["pool", "up", "--size", "1"]])
def test_a_context_that_does_not_exist_is_refused_before_anything(cluster, run_tool, tmp_path, command):
    done = run_tool(*command, "--context", "nope", "--output", "out", cluster=cluster)
    assert done.code == 1, done
    assert done.stderr.splitlines() == [
        "Error: context nope does not exist in the kubeconfig (error: context nope not found); list them with "
        "`kubectl config get-contexts`"], done.stderr
    assert not (tmp_path / "out").exists()
    assert not [ns for ns in cluster.get_json("namespaces")["items"] if ns["metadata"]["name"].startswith("agc-rl-")]


def test_a_kubectl_that_fails_without_a_word_is_named(cluster, run_tool, tmp_path):
    done = run_tool("run", "--count", "1", "--output", "out", cluster=cluster, env={"KUBECTL": "/bin/false"})
    assert done.code == 1, done
    assert done.stderr.splitlines() == [
        "Error: kubectl failed: `/bin/false config current-context` exited 1 with no message; check that /bin/false "
        "is the kubectl program"], done.stderr
