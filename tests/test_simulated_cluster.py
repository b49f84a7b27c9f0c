"""The simulated cluster's own fidelity: what it must do as the real parts do, checked in-process
or through the real kubectl (the tool's tests rely on it)."""

import io
import json
from pathlib import Path
import sys

import pytest

from conftest import read


def test_the_fake_kubectl_throttles_each_process_at_five_requests_a_second_after_a_burst_of_ten(monkeypatch):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "fakecluster"))
    import kubectl as fake
    clock = [100.0]
    monkeypatch.setattr(fake.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(fake.time, "sleep", lambda seconds: clock.__setitem__(0, clock[0] + seconds))
    stderr = io.StringIO()
    monkeypatch.setattr(fake.sys, "stderr", stderr)
    throttle = fake.ClientThrottle()
    throttle.take({"verb": "logs_many", "names": ["p%d" % i for i in range(30)]}, 30)
    assert abs(clock[0] - 104.0) < 1e-6  # 10 at once, then 20 at 5 a second
    assert stderr.getvalue().count("due to client-side throttling, not priority and fairness") == 1


def test_the_real_kubectl_pages_a_long_list_and_prints_it_whole(cluster):
    # 520 ConfigMaps: kubectl asks limit=500 and follows metadata.continue
    items = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c%03d" % i}} for i in range(520)]
    cluster.kubectl("create", "-n", "default", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                            "items": items}))
    listed = cluster.get_json("-n", "default", "configmaps")
    assert len(listed["items"]) == 520
    lists = [r["target"] for r in cluster.requests() if r["method"] == "GET" and "/configmaps?" in r["target"]]
    assert any("continue=" in target for target in lists)


def test_a_deleted_namespace_keeps_its_contents_until_the_namespace_controller_begins(make_cluster):
    # upstream's namespaceDeletionGracePeriod (5 s by default; 60 s here, so that a busy machine
    # cannot make the check late): nothing in the namespace is deleted before it has passed
    cluster = make_cluster({"namespaceDeletionSeconds": 60})
    for obj in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "doomed"}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": "doomed"},
                 "data": {"a": "b"}}):
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(obj))
    cluster.kubectl("delete", "namespace", "doomed", "--wait=false")
    assert cluster.get_json("namespace", "doomed")["status"]["phase"] == "Terminating"
    assert cluster.get_json("-n", "doomed", "configmap", "notes")["data"] == {"a": "b"}


def test_a_delete_whose_uid_precondition_fails_is_refused_with_409(cluster, tmp_path):
    notes = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": "default"}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(notes))
    options = tmp_path / "options.json"
    options.write_text(json.dumps({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-it"}}))
    refused = cluster.kubectl("delete", "--raw", "/api/v1/namespaces/default/configmaps/notes", "-f", str(options),
                              check=False)
    assert refused.returncode == 1
    assert "(Conflict)" in refused.stderr and "Precondition failed: UID in precondition: not-it" in refused.stderr
    assert cluster.get_json("-n", "default", "configmap", "notes")["metadata"]["name"] == "notes"


# ---------------------------------------------------------------- client rate limits of a default installation

@pytest.mark.parametrize("rates, spread", [({"jobController": [2, 3]}, (2, 10)), ("unlimited", (0, 1))])
def test_the_job_controller_creates_pods_no_faster_than_its_client_rate_limit(make_cluster, run_tool, tmp_path,
                                                                              rates, spread):
    # 9 pods with a burst of 3 at 2 a second: the last is created 3 s after the first
    cluster = make_cluster({"clientRates": rates})
    done = run_tool("run", "--no-runtime-class", "--count", "9", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    import datetime
    created = sorted(datetime.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
                     for pod in read(tmp_path / "out" / "pods.json"))
    seconds = (created[-1] - created[0]).total_seconds()  # whole seconds apart, across any hour or day
    assert spread[0] <= seconds <= spread[1], created


class RefusesOnce:
    """A client rate limiter with no token for the first call and plenty after."""
    calls = 0

    def take(self):
        self.calls += 1
        return self.calls > 1


@pytest.mark.parametrize("mode", ["NonIndexed", "Indexed"])
def test_a_pod_that_succeeded_before_its_count_is_not_replaced(tmp_path, mode):
    # the controller's finalizer removal finds no token, its pod creation a moment later does:
    # the uncounted Succeeded pod is succeeded all the same (calculateSucceededIndexes, getStatus)
    sys.path.insert(0, str(Path(__file__).parent / "fakecluster"))
    from api import DEFAULT_CONFIG
    from server import Cluster
    cluster = Cluster(tmp_path, dict(DEFAULT_CONFIG, clientRates="unlimited"))
    template = {"metadata": {}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
    with cluster.lock:
        job = cluster.api_create("jobs", "default", {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"completions": 2, "parallelism": 2, "completionMode": mode, "template": template}})
        cluster.job_controller()
        first = cluster.owned_pods(job)[0]
        first["status"]["phase"] = "Succeeded"
        cluster.put("pods", first)
        cluster.client_limits["jobController"] = RefusesOnce()
        cluster.job_controller()
        assert len(cluster.owned_pods(job)) == 2
