"""`cleanup` and `list`: ownership proven before anything is deleted, several folders,
concurrent and interrupted cleanups."""

import json
import subprocess
import sys

import pytest

from conftest import EPISODE, SCRIPT, read, start_tool, wait_for, write_tasks


def test_cleanup_deletes_the_namespace_and_keeps_the_output(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "3", "--output", "out", cluster=cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Deleted the run's namespace: " + namespace in result.stderr
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""
    assert (tmp_path / "out" / "results.json").is_file()
    # through the command's proxy: the Job (its pods with it), then the namespace
    deletes = [request["target"] for request in cluster.requests() if request["method"] == "DELETE"]
    assert deletes == ["/apis/batch/v1/namespaces/%s/jobs/rollout" % namespace, "/api/v1/namespaces/" + namespace]


def test_cleanup_of_a_big_job_deletes_its_pods_itself_after_the_jobs_delete(make_cluster, run_tool, tmp_path):
    # the Job's foreground deletion waits for the garbage collector, 20 pods a second on a real
    # controller manager: cleanup deletes 100 pods or more itself, each on its uid (synthetic
    # episodes: 100 episode processes on a busy machine are not what this tests)
    cluster = make_cluster({"syntheticEpisodes": {"seconds": 0.5}})
    done = run_tool("run", "--count", "100", "--allow-large", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    pods = {pod["metadata"]["name"] for pod in read(tmp_path / "out" / "pods.json")}
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Deleting the Jobs' 100 pods at once..." in result.stderr
    requests = cluster.requests()
    [job_deleted] = [r["at"] for r in requests if r["method"] == "DELETE" and "/jobs/rollout" in r["target"]]
    swept = [r for r in requests if r["method"] == "DELETE" and not r["command"]
             and "/namespaces/%s/pods/" % namespace in r["target"]]
    assert {r["target"].rsplit("/", 1)[1] for r in swept} == pods
    assert min(r["at"] for r in swept) > job_deleted
    assert len(swept) == 100  # each once: the namespace's sweep leaves the swept pods alone
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def test_cleanup_of_an_absent_namespace_says_so(cluster, run_tool):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0
    assert "The run's namespace is already gone" in result.stderr


def test_cleanup_without_receipt_fails(cluster, run_tool, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_tool("cleanup", "--output", "empty", cluster=cluster)
    assert result.code == 1
    assert result.stderr.startswith("Error: no receipt.json in empty")
    assert "Traceback" not in result.stderr


def test_cleanup_refuses_a_namespace_whose_uid_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    cluster.kubectl("delete", "namespace", receipt["namespace"])
    impostor = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": receipt["namespace"], "labels": {"agc-demo-run": receipt["run_id"]}}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(impostor))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "ownership check failed, refusing cleanup: namespace %s uid must equal %s: current value is " % (
        receipt["namespace"], receipt["uid"]) in result.stderr
    assert cluster.kubectl("get", "namespace", receipt["namespace"], "-o", "name").stdout.strip()


def test_cleanup_refuses_a_namespace_whose_run_label_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    cluster.kubectl("label", "namespace", receipt["namespace"], "agc-demo-run=someone-else", "--overwrite")
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert ("label agc-demo-run must equal %s: current value is someone-else" % receipt["run_id"]) in result.stderr
    assert not [call for call in cluster.calls() if "delete" in call]


def test_cleanup_refuses_a_job_whose_uid_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = receipt["namespace"]
    cluster.kubectl("-n", namespace, "delete", "job", "rollout")
    other = read(tmp_path / "out" / "job-submitted.json")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(other))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "job rollout uid (receipt job_uid) must equal %s: current value is " % receipt["job_uid"] in result.stderr
    assert cluster.kubectl("-n", namespace, "get", "job", "rollout", "-o", "name").stdout.strip() == "job.batch/rollout"


def test_cleanup_refuses_a_receipt_whose_job_uid_alone_was_changed(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt_path = tmp_path / "out" / "receipt.json"
    receipt = read(receipt_path)
    real_uid, receipt["job_uid"] = receipt["job_uid"], "00000000-0000-0000-0000-000000000000"
    receipt_path.write_text(json.dumps(receipt))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert ("job rollout uid (receipt job_uid) must equal 00000000-0000-0000-0000-000000000000: current value is %s"
            % real_uid) in result.stderr
    assert "uid (receipt jobs.rollout)" not in result.stderr  # the key that agrees is not named
    assert not [call for call in cluster.calls() if "delete" in call]


def test_a_receipt_that_is_not_an_object_is_one_line(run_tool, tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "receipt.json").write_text("[]")
    result = run_tool("cleanup", "--output", "odd")
    assert result.code == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: odd/receipt.json is not the receipt of rl-batch-demo: a JSON object was expected, it holds list"]


def finished_run(make_cluster, run_tool, tmp_path, **config):
    cluster = make_cluster(config)
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    return cluster, read(tmp_path / "out" / "receipt.json")["namespace"]


def test_cleanup_waits_for_a_namespace_that_is_already_terminating(make_cluster, run_tool, tmp_path):
    # 10 s of Terminating: a cleanup started on a loaded machine still finds it there
    cluster, namespace = finished_run(make_cluster, run_tool, tmp_path, namespaceDeletionSeconds=10)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Deleted the run's namespace: %s" % namespace in result.stderr
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def test_cleanup_waits_out_the_namespace_controllers_delay(make_cluster, run_tool, tmp_path):
    # a default installation's namespace controller begins 5 s after the deletion (the suite's
    # clusters shorten it, tests/conftest.py); cleanup still ends with the namespace gone
    cluster, namespace = finished_run(make_cluster, run_tool, tmp_path, namespaceDeletionSeconds=5.0)
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert result.stderr.strip().splitlines()[-1] == "Deleted the run's namespace: %s" % namespace
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def test_cleanup_survives_a_committed_delete_answered_with_an_error(make_cluster, run_tool, tmp_path):
    # The first DELETE is carried out, then answered with an etcd error; the retry meets 409.
    cluster, namespace = finished_run(make_cluster, run_tool, tmp_path, namespaceDeletionSeconds=2, transientFailures=[
        {"verb": "delete", "resource": "namespaces", "times": 1, "kind": "etcd-timeout", "afterCommit": True}])
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Deleted the run's namespace: %s" % namespace in result.stderr


def test_two_cleanups_at_once_both_succeed(make_cluster, tmp_path):
    cluster = make_cluster({"namespaceDeletionSeconds": 2})
    subprocess.run([sys.executable, str(SCRIPT), "run", "--count", "2", "--output", "out"], cwd=str(tmp_path),
                   env=cluster.env(), capture_output=True, timeout=120, check=True)
    cleanups = [subprocess.Popen([sys.executable, str(SCRIPT), "cleanup", "--output", "out"], cwd=str(tmp_path),
                                 env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in cleanups]
    assert [process.returncode for process in cleanups] == [0, 0], outputs


def test_list_finds_a_leftover_run_and_cleanup_removes_it(cluster, run_tool, tmp_path):
    # two levels below the searched folder, as the README's training loop writes its steps
    assert run_tool("run", "--count", "2", "--output", "runs/steps/step-1", cluster=cluster).code == 0
    namespace = read(tmp_path / "runs" / "steps" / "step-1" / "receipt.json")["namespace"]
    listed = run_tool("list", "--search", "runs", cluster=cluster)
    assert listed.code == 0, listed
    header, line = listed.stdout.splitlines()
    assert header.split() == ["NAMESPACE", "AGE", "STATE", "EPISODES", "RECEIPT"]
    assert line.startswith(namespace)
    assert "Complete" in line and "2/2 done, 0 failed" in line and line.endswith("runs/steps/step-1")
    assert run_tool("cleanup", "--output", "runs/steps/step-1", cluster=cluster).code == 0
    after = run_tool("list", "--search", "runs", cluster=cluster)
    assert after.stdout == "No runs of rl-batch-demo on context kind-rl.\n"


def test_cleanup_of_several_missing_folders_names_each_once(run_tool):
    done = run_tool("cleanup", "does-not-exist", "other-missing")
    assert done.code == 1
    assert sorted(done.stderr.splitlines()) == [  # the folders are cleaned up at once: any order
        "Error: no such folder: %s (give the output folder of a run, or --receipt FILE)" % name
        for name in ("does-not-exist", "other-missing")]


def test_list_refuses_a_search_folder_that_does_not_exist(run_tool):
    listed = run_tool("list", "--search", "no-such-folder")
    assert listed.code == 2 and "error: --search no-such-folder: no such folder" in listed.stderr


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
    assert result.stderr.count("Deleted the run's namespace:") == 2
    assert json.loads(run_tool("list", "--json", cluster=cluster).stdout) == []


def test_cleanup_of_several_folders_cleans_them_at_once_each_line_prefixed(make_cluster, run_tool, tmp_path):
    # the namespace controller begins 8 s after each deletion: one after another, a's namespace
    # would be gone before b's deletion began
    cluster = make_cluster({"namespaceDeletionSeconds": 8})
    for name in ("a", "b"):
        assert run_tool("run", "--count", "1", "--output", name, cluster=cluster).code == 0
    namespaces = {name: read(tmp_path / name / "receipt.json")["namespace"] for name in ("a", "b")}
    result = run_tool("cleanup", "--output", "a", "b", cluster=cluster)
    assert result.code == 0, result
    lines = result.stderr.splitlines()
    assert all(line.startswith(("a: ", "b: ")) for line in lines), lines
    deleting = [lines.index("%s: Deleting namespace %s..." % (name, namespaces[name])) for name in ("a", "b")]
    deleted = [lines.index("%s: Deleted the run's namespace: %s" % (name, namespaces[name])) for name in ("a", "b")]
    assert max(deleting) < min(deleted), lines


def test_cleanup_of_several_folders_goes_on_after_a_refusal(cluster, run_tool, tmp_path):
    for name in ("a", "b"):
        assert run_tool("run", "--count", "1", "--output", name, cluster=cluster).code == 0
    refused = read(tmp_path / "a" / "receipt.json")
    cluster.kubectl("label", "namespace", refused["namespace"], "agc-demo-run=intruder", "--overwrite")
    result = run_tool("cleanup", "--output", "a", "b", cluster=cluster)
    assert result.code == 1
    assert [line for line in result.stderr.splitlines() if line.startswith("Error:")] == [(
        "Error: a: ownership check failed, refusing cleanup: namespace %s label agc-demo-run must equal %s: "
        "current value is intruder" % (refused["namespace"], refused["run_id"]))]
    remaining = [row["namespace"] for row in json.loads(run_tool("list", "--json", cluster=cluster).stdout)]
    assert remaining == [refused["namespace"]]


def test_ownership_mismatches_name_each_key(tool):
    live = {"metadata": {"uid": "u2", "labels": {"agc-demo-run": "other"}}}
    assert tool.ownership_mismatches("namespace agc-rl-x", live, {"uid": "u1", "label agc-demo-run": "x"}) == [
        "namespace agc-rl-x uid must equal u1: current value is u2",
        "namespace agc-rl-x label agc-demo-run must equal x: current value is other"]


def test_ownership_matches_when_every_key_is_equal(tool):
    live = {"metadata": {"uid": "u1", "labels": {"agc-demo-run": "x"}}}
    assert tool.ownership_mismatches("namespace n", live, {"uid": "u1", "label agc-demo-run": "x"}) == []


def test_a_receipt_naming_a_namespace_this_tool_never_creates_gets_no_advice_to_delete_it(cluster, run_tool,
                                                                                         tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "receipt.json").write_text(json.dumps(
        {"context": "kind-rl", "namespace": "kube-system", "run_id": "0123456789ab"}))
    result = run_tool("cleanup", "--output", "odd", cluster=cluster)
    assert result.code == 1, result
    assert "names namespace kube-system, which this tool never creates (its namespaces are agc-rl-<run id>)" in \
        result.stderr
    assert "delete namespace kube-system" not in result.stderr
    assert not [call for call in cluster.calls() if "delete" in call]


# ---------------------------------------------------------------- objects someone else put in the run's namespace

def run_with_foreign_objects(cluster, run_tool, tmp_path):
    """A finished run whose namespace then gets a colleague's ConfigMap and Job."""
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    notes = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": namespace},
             "data": {"todo": "keep me"}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "colleague", "namespace": namespace},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "c", "image": "python:3.12-alpine", "command": ["python", "-c", "pass"]}]}}}}
    for obj in (notes, job):
        cluster.kubectl("create", "-f", "-", stdin=json.dumps(obj))
    return namespace


def test_cleanup_names_objects_it_did_not_create_and_refuses(cluster, run_tool, tmp_path):
    namespace = run_with_foreign_objects(cluster, run_tool, tmp_path)
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: namespace %s holds 2 object(s) this run did not create: ConfigMap notes, Job "
                           "colleague; deleting the namespace would delete them too, so cleanup refuses" % namespace)
    assert "`kubectl --context kind-rl -n %s delete configmap notes`" % namespace in line
    assert line.endswith("or run cleanup again with --delete-foreign to delete them with the run")
    assert not [call for call in cluster.calls() if "delete" in call]
    # every kind listed through the proxy, metadata only, not one `kubectl get k1,k2,...` after another
    assert "listing the namespace through" not in result.stderr
    # (the kinds argument right after "get": a run's stall check may read events with a
    # comma-separated field selector on a busy machine)
    assert not [call for call in cluster.calls() if "get" in call and "," in call[call.index("get") + 1]]


def test_cleanup_with_delete_foreign_deletes_them_with_the_run(cluster, run_tool, tmp_path):
    namespace = run_with_foreign_objects(cluster, run_tool, tmp_path)
    result = run_tool("cleanup", "--output", "out", "--delete-foreign", cluster=cluster)
    assert result.code == 0, result
    assert "Deleting Job colleague, which this run did not create (--delete-foreign)" in result.stderr
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def foreign_check_items():
    def obj(kind, name, at, uid, labels=None, owner=None, api="v1", managers=()):
        meta = {"name": name, "uid": uid, "creationTimestamp": at, "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [{"uid": owner}]
        if managers:
            meta["managedFields"] = [{"manager": manager, "operation": "Update"} for manager in managers]
        return {"apiVersion": api, "kind": kind, "metadata": meta}
    return obj


def test_what_the_run_made_its_children_and_what_every_namespace_has_are_not_foreign(tool):
    obj = foreign_check_items()
    items = [obj("Job", "rollout", "2026-12-01T10:00:01Z", "j", {"agc-demo-run": "r1"}, api="batch/v1"),
             obj("Pod", "rollout-x", "2026-12-01T10:00:09Z", "p", owner="j"),
             obj("Workload", "job-rollout", "2026-12-01T10:00:09Z", "w", owner="j", api="kueue.x-k8s.io/v1beta2"),
             obj("Event", "rollout-x.1", "2026-12-01T10:00:09Z", "e"),
             obj("ServiceAccount", "default", "2026-12-01T10:00:30Z", "s"),
             obj("ConfigMap", "kube-root-ca.crt", "2026-12-01T10:00:00Z", "k", managers=["kube-controller-manager"]),
             obj("ConfigMap", "notes", "2026-12-01T10:00:06Z", "c")]
    assert tool.not_created_by_run(items, "r1") == [("ConfigMap", "notes", "configmap")]


def test_an_object_made_moments_after_the_namespace_is_foreign(tool):
    # A colleague's ConfigMap 3 s after the namespace, a policy controller's RoleBinding at once:
    # what made them is not the cluster's own, however early they came.
    obj = foreign_check_items()
    items = [obj("ConfigMap", "notes", "2026-12-01T10:00:03Z", "c"),
             obj("RoleBinding", "policy-edit", "2026-12-01T10:00:00Z", "b", api="rbac.authorization.k8s.io/v1")]
    assert tool.not_created_by_run(items, "r1") == [("ConfigMap", "notes", "configmap"),
                                                   ("RoleBinding", "policy-edit", "rolebinding.rbac.authorization.k8s.io")]


def test_the_root_ca_configmap_edited_by_someone_is_foreign(tool):
    obj = foreign_check_items()
    items = [obj("ConfigMap", "kube-root-ca.crt", "2026-12-01T10:00:00Z", "k",
                 managers=["kube-controller-manager", "kubectl-edit"])]
    assert tool.not_created_by_run(items, "r1") == [("ConfigMap", "kube-root-ca.crt", "configmap")]


def test_a_colleagues_configmap_made_moments_after_the_namespace_is_refused(cluster, tmp_path):
    # Made while the run's episode is held, seconds after the namespace: no time window makes it the cluster's.
    marker = tmp_path / "go-on"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"wait_for": str(marker)}])
    process = start_tool(cluster, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    receipt = tmp_path / "out" / "receipt.json"
    wait_for("the run's Job", lambda: receipt.exists() and "job_uid" in receipt.read_text())
    namespace = read(receipt)["namespace"]
    notes = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes", "namespace": namespace},
             "data": {"todo": "keep me"}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(notes))
    marker.write_text("")
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "cleanup", "out"], cwd=str(tmp_path), env=cluster.env(),
                          text=True, capture_output=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "holds 1 object(s) this run did not create: ConfigMap notes" in done.stderr
    assert cluster.get_json("-n", namespace, "configmap", "notes")["data"] == {"todo": "keep me"}


def test_a_deletion_wait_that_runs_out_names_how_long_and_how_to_look(tool, monkeypatch):
    # the namespace never goes (a finalizer nobody removes): the wait ends at its timeout, woken
    # by its watch or every 2 s at most, and its refusal says how long it waited and what to run
    clock = [1000.0]
    monkeypatch.setattr(tool.time, "monotonic", lambda: clock[0])
    waits = []
    channel = tool.ApiChannel.__new__(tool.ApiChannel)
    channel.cluster = type("Cluster", (), {"context": "kind-rl"})()
    channel.get = lambda *parts: {"kind": "Namespace"}  # never gone
    channel.watch = lambda *parts: type("Watch", (), {  # no change ever comes: each turn waits its longest
        "drain": lambda self, timeout: waits.append(timeout) or clock.__setitem__(0, clock[0] + timeout) or [],
        "stop": lambda self: None})()
    with pytest.raises(tool.BatchTimeout) as raised:
        channel.wait_until_gone("Namespace agc-rl-x", tool.NAMESPACES, name="agc-rl-x", timeout=120)
    assert "Namespace agc-rl-x still terminating after 120 s" in str(raised.value)
    assert "`kubectl --context kind-rl get namespaces agc-rl-x`" in str(raised.value)
    assert max(waits) == 2.0


def test_an_object_all_of_whose_owners_are_gone_is_being_collected_not_foreign(tool):
    # the garbage collector deletes a dependent once every owner is gone, controller or not
    # (a finished step's pod's node-agent objects, in a kept pool's namespace)
    def item(name, uid, owners=()):
        return {"kind": "Exec", "apiVersion": "kwok.x-k8s.io/v1alpha1",
                "metadata": {"name": name, "uid": uid, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": owner} for owner in owners]}}
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "uid": "pod-uid", "labels": {}}}
    items = [pod, item("orphaned", "a", ["gone-pod"]), item("owned", "b", ["pod-uid"]), item("loose", "c")]
    foreign = tool.not_created_by_run(items, "run-x")
    assert ("Exec", "orphaned", "exec.kwok.x-k8s.io") not in foreign
    assert ("Exec", "owned", "exec.kwok.x-k8s.io") in foreign  # its owner lives and is not the run's
    assert ("Exec", "loose", "exec.kwok.x-k8s.io") in foreign


def test_cleanup_waits_longer_for_a_deletion_that_takes_more_objects_with_it(tool):
    assert tool.cleanup_wait_seconds(0) == tool.CLEANUP_WAIT_SECONDS
    assert tool.cleanup_wait_seconds(1000) >= 2 * tool.CLEANUP_WAIT_SECONDS + 100


def test_cleanup_of_a_comparisons_folder_says_compare_cleans_its_batches_and_names_them(run_tool, tmp_path):
    (tmp_path / "cmp" / "a" / "round-1").mkdir(parents=True)
    (tmp_path / "cmp" / "compare.json").write_text("{}")
    (tmp_path / "cmp" / "a" / "round-1" / "receipt.json").write_text("{}")
    done = run_tool("cleanup", "cmp")
    assert done.code == 1
    assert done.stderr.startswith("Error: cmp is a comparison's folder, with no receipt of its own: `compare` "
                                  "cleans up each of its batches once it ran"), done.stderr
    assert done.stderr.rstrip().endswith("cleanup cmp/a/round-1")


def test_cleanup_of_a_receipt_whose_context_the_kubeconfig_lacks_says_what_to_do(cluster, run_tool, tmp_path):
    (tmp_path / "receipt.json").write_text(json.dumps({"context": "nosuch", "namespace": "agc-rl-0123456789ab",
                                                       "run_id": "0123456789ab", "backend": "kubernetes"}))
    done = run_tool("cleanup", "--receipt", "receipt.json", cluster=cluster)
    assert done.code == 1
    assert done.stderr.startswith("Error: context nosuch does not exist in the kubeconfig (error: context nosuch "
                                  "not found), which the run was made on"), done.stderr
    assert "point KUBECONFIG at the kubeconfig that has it" in done.stderr


def test_list_names_a_receipt_it_cannot_read_instead_of_skipping_it_silently(cluster, run_tool, tmp_path):
    (tmp_path / "runs" / "broken").mkdir(parents=True)
    (tmp_path / "runs" / "broken" / "receipt.json").write_text("{not json")
    listed = run_tool("list", "--search", "runs", cluster=cluster)
    assert listed.code == 0, listed
    assert "warning: skipped runs/broken/receipt.json: not a receipt of rl-batch-demo (not JSON)" in listed.stderr
