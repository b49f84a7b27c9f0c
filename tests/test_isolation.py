"""Isolation on a shared cluster: Pod Security `restricted`, default-deny networking, the
recommended labels on every object."""


from conftest import read


SIDECAR = {"name": "istio-proxy", "image": "istio/proxyv2:1.24.0"}


def test_every_object_a_run_creates_on_the_cluster_carries_the_recommended_labels(cluster, run_tool, tmp_path):
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
    result = run_tool("run", "--count", "2", "--timeout", "120", "--output", "out", cluster=cluster)
    assert result.code == 1, result  # not 3: the refusal ended the wait, not the 120 s deadline
    assert result.stderr.splitlines()[-1].startswith(
        "Error: the cluster refused to create the episode pods: pods \"rollout-")
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


def test_namespace_manifest_enforces_pod_security_restricted(tool):
    labels = tool.namespace_manifest("agc-rl-x", "x")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_network_policy_denies_all_ingress_and_egress(tool):
    policy = tool.network_policy_manifest("ns", "x")
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
