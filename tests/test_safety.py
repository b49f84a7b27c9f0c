"""Safety and hygiene on a shared cluster: dry run, labels, pod security, network isolation,
`list`, several-folder cleanup, exit codes. End to end through the simulated cluster."""

import json
from pathlib import Path
import time

from conftest import SCRIPT, interrupt_a_run

SIDECAR = {"name": "istio-proxy", "image": "istio/proxyv2:1.24.0"}


def read(path):
    return json.loads(Path(path).read_text())


def test_dry_run_touches_neither_the_cluster_nor_the_output_folder(cluster, run_tool, tmp_path):
    result = run_tool("run", "--dry-run", "--count", "3", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    listing = json.loads(result.stdout)
    assert listing["kind"] == "List"
    assert [item["kind"] for item in listing["items"]] == ["Namespace", "ConfigMap", "Job"]
    assert listing["items"][-1]["spec"]["completions"] == 3
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


def test_dry_run_output_is_accepted_by_kubectl_create(cluster, run_tool):
    result = run_tool("run", "--dry-run", "--network", "none", cluster=cluster)
    assert result.code == 0, result
    namespace = json.loads(result.stdout)["items"][0]["metadata"]["name"]
    created = cluster.kubectl("create", "-f", "-", stdin=result.stdout)
    assert created.stdout.splitlines() == [
        "namespace/%s created" % namespace, "configmap/episode created",
        "networkpolicy.networking.k8s.io/deny-all created", "job.batch/rollout created"]


def test_every_created_object_carries_the_recommended_labels(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--network", "none", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace, run_id = receipt["namespace"], receipt["run_id"]
    objects = [cluster.get_json("namespace", namespace),
               cluster.get_json("-n", namespace, "configmap", "episode"),
               cluster.get_json("-n", namespace, "networkpolicy", "deny-all"),
               cluster.get_json("-n", namespace, "job", "rollout"),
               *cluster.get_json("-n", namespace, "pods")["items"]]
    assert len(objects) == 6
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["agc-demo-run"] == run_id, obj["kind"]
        assert labels["app.kubernetes.io/instance"] == run_id, obj["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "rl-batch-demo", obj["kind"]
        assert labels["app.kubernetes.io/name"] == "rl-batch-demo", obj["kind"]


def test_run_passes_pod_security_restricted(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    namespace = cluster.get_json("namespace", read(tmp_path / "out" / "receipt.json")["namespace"])
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_pod_security_rejection_stops_the_run_early_with_the_reason(make_cluster, run_tool, tmp_path):
    # A cluster-wide mutating webhook injects a sidecar that violates `restricted`; on a slow
    # VM-sandbox cluster whose new namespaces get their ServiceAccount 2 s late (a refusal
    # that passes), so the stall check must tell the two apart.
    cluster = make_cluster({"injectSidecar": SIDECAR, "profile": "vm-sandbox", "serviceAccountDelaySeconds": 2})
    started = time.monotonic()
    result = run_tool("run", "--count", "2", "--timeout", "120", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert time.monotonic() - started < 60
    assert result.stderr.startswith("Error: the cluster refused to create the episode pods: pods \"rollout-")
    assert ('is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
            '(container "istio-proxy" must set securityContext.allowPrivilegeEscalation=false)') in result.stderr
    assert "stopped early instead of waiting for the deadline" in result.stderr
    assert "cleanup --output out" in result.stderr
    assert "FailedCreate" in (tmp_path / "out" / "events.txt").read_text()
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_network_none_creates_a_default_deny_policy(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--network", "none", "--output", "out", cluster=cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    policy = cluster.get_json("-n", namespace, "networkpolicy", "deny-all")
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_default_network_creates_no_policy(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    assert cluster.get_json("-n", namespace, "networkpolicy")["items"] == []


def test_list_finds_a_leftover_run_and_cleanup_removes_it(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--output", "runs/a", cluster=cluster).code == 0
    namespace = read(tmp_path / "runs" / "a" / "receipt.json")["namespace"]
    listed = run_tool("list", "--search", "runs", cluster=cluster)
    assert listed.code == 0, listed
    header, line = listed.stdout.splitlines()
    assert header.split() == ["NAMESPACE", "AGE", "STATE", "EPISODES", "RECEIPT"]
    assert line.startswith(namespace)
    assert "Complete" in line and "2/2 done, 0 failed" in line and line.endswith("runs/a")
    assert run_tool("cleanup", "--output", "runs/a", cluster=cluster).code == 0
    after = run_tool("list", "--search", "runs", cluster=cluster)
    assert after.stdout == "No runs of rl-batch-demo on context kind-rl.\n"


def test_list_shows_runs_that_no_local_receipt_names(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "runs/a", cluster=cluster).code == 0
    (tmp_path / "elsewhere").mkdir()
    listed = run_tool("list", "--search", "elsewhere", "--json", cluster=cluster)
    (row,) = json.loads(listed.stdout)
    assert row["receipt"] == "-"
    assert (row["state"], row["succeeded"], row["completions"]) == ("Complete", 1, 1)


def test_list_counts_every_job_of_a_run_with_rounds(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--rounds", "2", "--output", "runs/r", cluster=cluster).code == 0
    (row,) = json.loads(run_tool("list", "--search", "runs", "--json", cluster=cluster).stdout)
    assert (row["state"], row["jobs"], row["succeeded"], row["completions"]) == (
        "Complete", ["rollout-1", "rollout-2"], 4, 4)


def test_list_ignores_namespaces_this_tool_did_not_create(cluster, run_tool):
    other = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(other))
    listed = run_tool("list", "--json", cluster=cluster)
    assert json.loads(listed.stdout) == []


def test_cleanup_accepts_several_folders(cluster, run_tool, tmp_path):
    for name in ("a", "b"):
        assert run_tool("run", "--count", "1", "--output", name, cluster=cluster).code == 0
    result = run_tool("cleanup", "--output", "a", "b", cluster=cluster)
    assert result.code == 0, result
    assert result.stdout.count("Deleted test namespace:") == 2
    assert json.loads(run_tool("list", "--json", cluster=cluster).stdout) == []


def test_cleanup_of_several_folders_goes_on_after_a_refusal(cluster, run_tool, tmp_path):
    for name in ("a", "b"):
        assert run_tool("run", "--count", "1", "--output", name, cluster=cluster).code == 0
    refused = read(tmp_path / "a" / "receipt.json")
    cluster.kubectl("label", "namespace", refused["namespace"], "agc-demo-run=intruder", "--overwrite")
    result = run_tool("cleanup", "--output", "a", "b", cluster=cluster)
    assert result.code == 1
    assert result.stderr.splitlines()[0] == (
        "Error: a: ownership check failed, refusing cleanup: namespace %s label agc-demo-run must equal %s: "
        "current value is intruder" % (refused["namespace"], refused["run_id"]))
    remaining = [row["namespace"] for row in json.loads(run_tool("list", "--json", cluster=cluster).stdout)]
    assert remaining == [refused["namespace"]]


def test_interrupt_exits_130_and_leaves_a_folder_cleanup_finishes(make_cluster, run_tool, tmp_path):
    cluster, code, stderr = interrupt_a_run(make_cluster, tmp_path)
    assert code == 130, stderr
    assert "cleanup --output out" in stderr
    assert "Traceback" not in stderr
    cleanup = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert cleanup.code == 0, cleanup


def test_exit_codes_are_documented_in_help_and_readme(run_tool):
    help_text = run_tool("--help").stdout
    readme = (SCRIPT.parent / "README.md").read_text()
    for code, meaning in ((0, "ok"), (1, "error"), (2, "bad command line"), (3, "timed out"),
                          (4, "batch failed or validation failed"), (5, "custom episodes: results written"),
                          (130, "interrupted")):
        assert "  %-4d %s" % (code, meaning) in help_text, code
        assert "| %d |" % code in readme, code
