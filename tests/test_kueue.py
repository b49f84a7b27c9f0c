"""The Kueue gate: the batch through a Kueue LocalQueue, its queue wait apart from startup, end to end
through the simulated cluster (Kueue v0.19.2), and the preflight's quota arithmetic in-process."""

import calendar
import json
import subprocess
import sys
import time

import pytest

from conftest import EPISODE, SCRIPT, read, start_tool, wait_for, write_tasks


TEAM = {"name": "team", "nominalQuota": {"cpu": "2", "memory": "4Gi"}}


def kueue(**extra):
    return {"kueue": dict({"version": "v0.19.2", "clusterQueues": [TEAM]}, **extra)}


def queued_run(run_tool, cluster, output, *args):
    return run_tool("run", "--no-runtime-class", "--count", "4", "--output", output, *args, cluster=cluster)


def test_a_batch_through_a_free_queue_is_admitted_once_and_returns_every_reward(make_cluster, run_tool,
                                                                                     tmp_path):
    cluster = make_cluster(kueue())
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4)
    queue = results["queue"]
    assert (queue["local_queue"], queue["cluster_queue"], queue["admission_cycles"]) == ("team", "team", 1)
    assert queue["queued_seconds"] >= 0  # whole seconds: the admission's API time, not the client's
    assert queue["workload"].startswith("job-rollout-") and queue["batch_figures_include_queueing"] is True
    assert results["batch_to_all_ready_after_admission_seconds"] is not None
    job = read(tmp_path / "out" / "job-submitted.json")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    assert read(tmp_path / "out" / "workload.json")["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == \
        read(tmp_path / "out" / "receipt.json")["job_uid"]


def start_blocker(cluster):
    """A Job of another team that holds 1.9 of the ClusterQueue's 2 CPUs until the test
    releases it (a file): a fixed duration would race the tool's own start on a loaded machine."""
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "blocker", "namespace": "default", "labels": {"kueue.x-k8s.io/queue-name": "team"}},
           "spec": {"completions": 1, "parallelism": 1, "template": {"spec": {"restartPolicy": "Never", "containers": [
               {"name": "work", "image": "slow:1", "command": ["python", "-c", "pass"],
                "resources": {"requests": {"cpu": "1900m", "memory": "64Mi"}}}]}}}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(job))
    deadline = time.monotonic() + 300  # a safety net against a hang, not a bound
    while True:
        workloads = cluster.get_json("-n", "default", "workloads")["items"]
        if workloads and any(c["type"] == "Admitted" and c["status"] == "True"
                             for c in workloads[0].get("status", {}).get("conditions", [])):
            return
        assert time.monotonic() < deadline, "the blocker was never admitted"
        time.sleep(0.1)


def busy_config(tmp_path, **extra):
    """Kueue with a LocalQueue for start_blocker's Job, whose image runs until the test releases it."""
    image = tmp_path / "image-slow"
    image.write_text("#!/bin/sh\nwhile [ ! -e %s ]; do sleep 0.05; done\n" % (tmp_path / "release-blocker"))
    image.chmod(0o755)
    config = kueue(localQueues=[{"namespace": "default", "name": "team", "clusterQueue": "team"}], **extra)
    config["images"] = {"python:3.12-alpine": {"python": sys.executable}, "slow:1": {"python": str(image)}}
    return config


@pytest.fixture
def busy_cluster(make_cluster, tmp_path):
    return make_cluster(busy_config(tmp_path))


def start_queued_run(cluster, tmp_path):
    return subprocess.Popen([sys.executable, str(SCRIPT), "run", "--no-runtime-class", "--count", "4", "--queue",
                             "team", "--cluster-queue", "team", "--output", "out"], cwd=str(tmp_path),
                            env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_queued(cluster, process):
    """Until the run's Workload waits for quota (QuotaReserved=False, reason Pending)."""
    deadline = time.monotonic() + 300  # a safety net against a hang, not a bound
    while True:
        pending = [w for w in cluster.get_json("-A", "workloads")["items"]
                   if w["metadata"]["namespace"].startswith("agc-rl-") and any(
                       c["type"] == "QuotaReserved" and c.get("reason") == "Pending"
                       for c in w.get("status", {}).get("conditions", []))]
        if pending:
            return pending[0]
        assert time.monotonic() < deadline and process.poll() is None, "the run's Workload never waited for quota"
        time.sleep(0.1)


def tool_time(stamp):
    import datetime
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_a_slow_job_create_is_not_counted_as_queue_wait(make_cluster, run_tool, tmp_path):
    # the API server takes 6 s to create the Job (a loaded control plane); the queue is free,
    # so the Workload is admitted within a tick of the Job existing: the wait starts there
    cluster = make_cluster(dict(kueue(), transientFailures=[
        {"verb": "create", "resource": "jobs", "times": 1, "kind": "hang", "seconds": 6}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    [cycle] = read(tmp_path / "out" / "results.json")["queue"]["cycles"]
    assert cycle["queued_source"] in ("Job create call returned (client clock)", "Job creationTimestamp (API clock)")
    # the create's 6 s are not in it: the wait begins no earlier than the Job existed (its
    # creationTimestamp, truncated to its second), an order of events, not a bound on a duration
    job_created = tool_time(read(tmp_path / "out" / "job.json")["metadata"]["creationTimestamp"])
    assert cycle["queued_since_unix"] >= job_created, cycle


def test_a_batch_queued_behind_another_shows_the_wait_and_the_message(busy_cluster, tmp_path):
    start_blocker(busy_cluster)
    process = start_queued_run(busy_cluster, tmp_path)
    created = wait_until_queued(busy_cluster, process)["metadata"]["creationTimestamp"]
    created = calendar.timegm(time.strptime(created, "%Y-%m-%dT%H:%M:%SZ"))  # the API server's clock
    wait_for("two seconds of queueing since the Workload was created", lambda: time.time() >= created + 2)
    (tmp_path / "release-blocker").touch()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert ("rollout: queued: Pending: couldn't assign flavors to pod set main: insufficient unused quota for cpu in "
            "flavor default-flavor, 300m more needed") in stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["queue"]["queued_seconds"] > 1.0
    # the queue wait is in the batch figures from the Job's creation, not in the per-episode phases
    assert results["batch_to_all_ready_seconds"] > results["batch_to_all_ready_after_admission_seconds"]
    assert results["phases"]["pod_to_ready"]["max"] < results["queue"]["queued_seconds"] + \
        results["batch_to_all_ready_after_admission_seconds"]
    # the queue's polls named Kueue's kinds so that kubectl maps them from its cache: it did not
    # discover every group again on each of them (it does for workloads.kueue.x-k8s.io)
    rediscoveries = [r for r in busy_cluster.requests() if r["command"] == "kubectl get"
                     and r["target"].startswith("/apis?")]
    assert len(rediscoveries) <= 2, len(rediscoveries)


def test_a_misspelt_cluster_queue_is_refused_before_anything_is_created(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue())
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "tema")
    assert done.code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ClusterQueue tema does not exist on context kind-rl")
    assert not (tmp_path / "out").exists()
    assert "agc-rl-" not in cluster.kubectl("get", "namespaces").stdout


def test_a_missing_local_queue_is_refused_before_the_job_and_cleanup_finishes(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue(newNamespaceLocalQueue={"name": "team", "clusterQueue": "team", "delaySeconds": 0.2}))
    done = queued_run(run_tool, cluster, "out", "--queue", "tema")
    assert done.code == 1
    assert "LocalQueue tema does not exist in the run's namespace" in done.stderr and "--cluster-queue" in done.stderr
    assert "job_uid" not in read(tmp_path / "out" / "receipt.json")
    # The policy's LocalQueue `team` was not the run's (it named `tema`): someone's, however early it came.
    refused = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert refused.code == 1
    assert "holds 1 object(s) this run did not create: LocalQueue team" in refused.stderr
    assert run_tool("cleanup", "--output", "out", "--delete-foreign", cluster=cluster).code == 0


def test_a_local_queue_made_by_a_namespace_policy_is_used(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue(newNamespaceLocalQueue={"name": "team", "clusterQueue": "team", "delaySeconds": 0.5}))
    done = queued_run(run_tool, cluster, "out", "--queue", "team")
    assert done.code == 0, done
    queue = read(tmp_path / "out" / "results.json")["queue"]
    assert (queue["cluster_queue"], queue["admission_cycles"]) == ("team", 1)


def test_a_batch_that_never_fits_is_refused_by_the_preflight(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue(clusterQueues=[{"name": "tiny", "nominalQuota": {"cpu": "200m", "memory": "4Gi"}}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "tiny")
    assert done.code == 1
    assert ("more than ClusterQueue tiny can ever give: flavor default-flavor: cpu 400m > 200m, so the batch could "
            "never be admitted") in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_batch_that_never_fits_an_unreadable_queue_stops_early_with_the_condition(make_cluster, run_tool,
                                                                                     tmp_path):
    cluster = make_cluster(dict(kueue(
        clusterQueues=[{"name": "tiny", "nominalQuota": {"cpu": "200m", "memory": "4Gi"}}],
        newNamespaceLocalQueue={"name": "team", "clusterQueue": "tiny", "delaySeconds": 0.2}),
        forbid=[{"verb": "get", "resource": "clusterqueues"}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team")
    assert done.code == 1, done  # not 3: the condition ended the wait, not the client's deadline
    assert ("the Job's Workload can never be admitted: couldn't assign flavors to pod set main: insufficient quota "
            "for cpu in flavor default-flavor, previously considered podsets requests (0) + current podset request "
            "(400m) > maximum capacity (200m)") in done.stderr
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_a_preempted_and_readmitted_batch_reports_two_cycles_and_correct_results(make_cluster, run_tool, tmp_path):
    # VM sandboxes start in 2-5 s: the preemption comes 1 s after the admission, the Job's 4 pods
    # made and none started (at once, it could come before the run's pod watch has listed them,
    # as on a real cluster: the Job controller syncs a resume at once).
    cluster = make_cluster(dict(kueue(preempt={"whilePodsPending": 4, "afterSeconds": 1}), profile="vm-sandbox"))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    queue = results["queue"]
    assert queue["admission_cycles"] == 2
    assert queue["cycles"][0]["evicted_reason"] == "Preempted" and queue["cycles"][1]["evicted_reason"] is None
    assert queue["preempted_cycle_pods"] == 4
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4)
    pods = read(tmp_path / "out" / "pods.json")
    assert len(pods) == 8 and {row["pod"] for row in results["pods"]} <= {p["metadata"]["name"] for p in pods}
    # the second cycle's wait is split: draining (evicted -> requeued), then queued (requeued -> admitted)
    second = queue["cycles"][1]
    assert second["draining_seconds"] is not None and second["draining_seconds"] >= 0
    assert second["queued_source"].startswith("Requeued=True") and second["queued_seconds"] >= 0
    assert queue["total_draining_seconds"] == second["draining_seconds"]


def test_a_workload_deleted_under_its_running_job_is_a_new_admission_cycle(make_cluster, tmp_path):
    # someone deletes the admitted Workload while the episodes start (VM sandboxes: 2-5 s): Kueue
    # stops the Job (Missing Workload), makes a new Workload of the same name, admits it again
    cluster = make_cluster(dict(kueue(), profile="vm-sandbox"))
    process = start_tool(cluster, tmp_path, "run", "--no-runtime-class", "--count", "4", "--queue", "team",
                         "--cluster-queue", "team", "--output", "out")
    wait_for("the Job's uid in the receipt", lambda: (tmp_path / "out" / "receipt.json").exists() and
             "job_uid" in (tmp_path / "out" / "receipt.json").read_text())
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]

    def admitted_with_pods():
        workloads = cluster.get_json("-n", namespace, "workloads")["items"]
        pods = cluster.get_json("-n", namespace, "pods")["items"]
        return workloads and pods and any(c["type"] == "Admitted" and c["status"] == "True"
                                          for c in workloads[0].get("status", {}).get("conditions", [])) and workloads[0]

    first = wait_for("the Workload admitted and the Job's pods made", admitted_with_pods)
    cluster.kubectl("-n", namespace, "delete", "workload", first["metadata"]["name"], "--wait=false")
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 0, stderr
    results = read(tmp_path / "out" / "results.json")
    queue = results["queue"]
    assert queue["admission_cycles"] == 2, queue
    assert queue["cycles"][0]["evicted_reason"] == "WorkloadDeleted"
    assert first["metadata"]["uid"] in queue["cycles"][0]["evicted_message"]
    assert queue["cycles"][1]["queued_source"].startswith("the new Workload") and queue["preempted_cycle_pods"] >= 1
    assert read(tmp_path / "out" / "workload.json")["metadata"]["uid"] != first["metadata"]["uid"]
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4)


def test_kueue_that_does_not_manage_jobs_is_named_as_such(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue(manageJobs=False))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 1
    assert "Kueue did not suspend Job rollout when it was created" in done.stderr
    assert "does not manage batch/v1 Jobs" in done.stderr


def test_a_cluster_without_kueue_gets_one_line_with_the_install_command(cluster, run_tool, tmp_path):
    done = queued_run(run_tool, cluster, "out", "--queue", "team")
    assert done.code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--queue needs Kueue on context kind-rl" in lines[0]
    assert "kubectl --context kind-rl apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/" \
           "download/v0.19.2/manifests.yaml" in lines[0]
    assert not (tmp_path / "out").exists()


def test_cleanup_of_a_queued_run_waits_for_the_workload(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue())
    assert queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team").code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    done = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    assert namespace not in cluster.kubectl("get", "namespaces").stdout
    assert cluster.get_json("-A", "workloads")["items"] == []


def test_report_shows_the_queue_wait_and_the_timeline_draws_it(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue())
    assert run_tool("run", "--no-runtime-class", "--count", "4", "--output", "plain", cluster=cluster).code == 0
    assert queued_run(run_tool, cluster, "queued", "--queue", "team", "--cluster-queue", "team").code == 0
    done = run_tool("report", "plain", "queued", "--json", "--timeline", "both.svg")
    assert done.code == 0, done
    rows = {row["measure"]: row for row in json.loads(done.stdout)["rows"]}
    assert rows["queued: Job created -> admitted (first cycle)"]["values"][0] is None
    # milliseconds as the watch saw it, or whole seconds when it first saw the Workload already admitted
    value = rows["queued: Job created -> admitted (first cycle)"]["values"][1]
    source = read(tmp_path / "queued" / "results.json")["queue"]["cycles"][0]["admitted_source"]
    assert value.endswith(" ms") if source == "watch arrival (client clock)" else value.endswith(" s"), (value, source)
    assert rows["Kueue admission cycles"]["values"] == [None, "1"]
    svg = (tmp_path / "both.svg").read_text()
    assert svg.count('class="queued"') == 1 and "queued: Job created (or requeued) -&gt; admitted by Kueue" in svg


def test_dry_run_shows_the_queue_label_and_the_local_queue(run_tool):
    done = run_tool("run", "--count", "4", "--queue", "team", "--cluster-queue", "gpu", "--dry-run")
    assert done.code == 0, done
    items = json.loads(done.stdout)["items"]
    queue = next(item for item in items if item["kind"] == "LocalQueue")
    assert queue["spec"] == {"clusterQueue": "gpu"} and queue["metadata"]["name"] == "team"
    job = items[-1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team"
    assert job["spec"]["backoffLimit"] == 0  # as unqueued: preempted pods are never counted as failed


@pytest.mark.parametrize("args, message", [
    (("--cluster-queue", "team"), "--cluster-queue needs --queue"),
    (("--queue", "team", "--backend", "local"), "--queue is for the Job backend"),
    (("--queue", "team", "--prewarm"), "--queue is for the Job backend without --prewarm"),
])
def test_queue_flags_that_do_not_fit_are_usage_errors(args, message, run_tool):
    done = run_tool("run", "--count", "4", "--dry-run", *args)
    assert done.code == 2 and message in done.stderr


def test_list_shows_a_suspended_job_as_queued(tool):
    namespace = {"metadata": {"name": "agc-rl-x", "creationTimestamp": "2026-11-30T00:00:00Z",
                              "labels": {"agc-demo-run": "x"}, "uid": "u"}}
    job = {"metadata": {"name": "rollout"}, "spec": {"suspend": True, "completions": 4},
           "status": {"conditions": [{"type": "Suspended", "status": "True"}]}}
    assert tool.run_row(namespace, {"jobs": [job]}, {}, 0)["state"] == "Queued"


def test_admission_cycles_backfill_a_late_watch_from_the_condition(tool):
    cycles = tool.AdmissionCycles(job_created=1000.4, job_created_server=1000.0)
    workload = {"metadata": {"name": "job-rollout-abcde"}, "status": {"conditions": [
        {"type": "Admitted", "status": "True", "lastTransitionTime": "1970-01-01T00:16:42Z"}]}}  # 1002 s
    cycles.update(1003.7, workload)
    [cycle] = cycles.cycles
    assert (cycle["admitted_at"], cycle["queued_since"]) == (1002.0, 1000.0)  # both from the API, whole seconds
    assert "lastTransitionTime" in cycle["admitted_source"]


def admitted_workload(at, evictions=(), previously=None):
    conditions = [{"type": "Admitted", "status": "True", "lastTransitionTime": at}]
    if previously:
        conditions.append({"type": "Evicted", "status": "False", "reason": "QuotaReserved", "lastTransitionTime": at,
                           "message": "Previously: " + previously})
    status = {"conditions": conditions}
    if evictions:
        status["schedulingStats"] = {"evictions": [
            {"reason": reason, "underlyingCause": cause, "count": count} for reason, cause, count in evictions]}
    return {"metadata": {"name": "job-rollout-abcde"}, "status": status}


def test_an_eviction_the_watch_missed_is_still_counted_from_scheduling_stats(tool):
    # Admitted at 1001 (seen), preempted and re-admitted at 1004 while the watch was down: the
    # relist shows it admitted again, with Kueue's eviction count and "Previously: ...".
    cycles = tool.AdmissionCycles(job_created=1000.4, job_created_server=1000.0)
    cycles.update(1001.2, admitted_workload("1970-01-01T00:16:41Z"))
    cycles.update(1004.6, admitted_workload("1970-01-01T00:16:44Z", [("Preempted", "", 1)], "Preempted to fit"))
    first, second = cycles.cycles
    assert (first["evicted_reason"], first["evicted_message"], first["evicted_at"]) == (
        "Preempted", "Preempted to fit", None)
    assert (second["admitted_at"], second["admitted_at_server"], second["queued_since"]) == (1004.0, 1004.0, None)
    summary = tool.queue_summary(cycles.record("team", "team"))
    assert summary["admission_cycles"] == 2 and summary["unseen_queue_waits"] == 1
    assert [c["queued_seconds"] for c in summary["cycles"]] == [1.0, None]  # the first backfilled at 1 s
    assert summary["total_queued_seconds"] == 1.0  # the unseen wait is not made up
    assert tool.last_admission_time(cycles.record("team", "team")) == 1004.0


def test_a_watch_that_first_sees_a_readmitted_workload_counts_the_cycles_before_it(tool):
    cycles = tool.AdmissionCycles(job_created=1000.4, job_created_server=1000.0)
    cycles.update(1009.0, admitted_workload("1970-01-01T00:16:48Z", [("PodsReadyTimeout", "", 2)]))
    assert [c["evicted_reason"] for c in cycles.cycles[:-1]] == ["PodsReadyTimeout", "PodsReadyTimeout"]
    assert [c["admitted_at"] for c in cycles.cycles] == [None, None, 1008.0] and cycles.admitted


def test_an_eviction_the_watch_delivered_is_not_counted_twice(tool):
    cycles = tool.AdmissionCycles(job_created=1000.4, job_created_server=1000.0)
    cycles.update(1001.2, admitted_workload("1970-01-01T00:16:41Z"))
    evicted = admitted_workload("1970-01-01T00:16:41Z", [("Preempted", "", 1)])
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted",
                                            "message": "Preempted to fit", "lastTransitionTime": "x"})
    cycles.update(1002.5, evicted)
    cycles.update(1002.9, evicted)
    cycles.update(1004.6, admitted_workload("1970-01-01T00:16:44Z", [("Preempted", "", 1)], "Preempted to fit"))
    first, second = cycles.cycles
    assert (first["evicted_at"], first.get("evicted_source"), second["admitted_at"], second["queued_since"]) == (
        1002.5, None, 1004.6, 1002.5)


def test_an_interrupted_queued_run_leaves_what_cleanup_needs(busy_cluster, run_tool, tmp_path):
    import signal
    start_blocker(busy_cluster)
    process = start_queued_run(busy_cluster, tmp_path)
    wait_until_queued(busy_cluster, process)
    wait_for("the Job's uid in the receipt", lambda: "job_uid" in (tmp_path / "out" / "receipt.json").read_text())
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert read(tmp_path / "out" / "queue.json")["cycles"] == []
    (tmp_path / "release-blocker").touch()
    assert run_tool("cleanup", "--output", "out", cluster=busy_cluster).code == 0


def test_a_pods_ready_timeout_evicts_and_requeues_with_back_off_then_the_batch_completes(make_cluster, run_tool,
                                                                                        tmp_path):
    # The first pods wait 10 s for their image, longer than the 5 s PodsReady timeout; after a
    # 2 s back-off the second admission finds the image cached and has 5 s to get ready. On a
    # busy machine even that can pass (a third cycle, as Kueue would do too): every cycle but the
    # last is a PodsReady eviction, and the requeue count says how many there were.
    cluster = make_cluster(dict(kueue(waitForPodsReady={"timeoutSeconds": 5, "backoffBaseSeconds": 2}),
                                imagePullSeconds=10))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team", "--queue-timeout", "60",
                      "--timeout", "60")
    assert done.code == 0, done
    queue = read(tmp_path / "out" / "results.json")["queue"]
    cycles = queue["cycles"]
    assert queue["admission_cycles"] == len(cycles) >= 2
    first, second = cycles[:2]
    assert [cycle["evicted_reason"] for cycle in cycles[:-1]] == ["PodsReadyTimeout"] * (len(cycles) - 1)
    assert first["evicted_message"].startswith("Exceeded the PodsReady timeout agc-rl-")
    # the requeue back-off is draining (evicted -> Requeued=True, requeueAt in whole seconds), not queueing
    assert second["draining_seconds"] > 0.5 and second["queued_seconds"] < second["draining_seconds"]
    assert read(tmp_path / "out" / "workload.json")["status"]["requeueState"]["count"] == len(cycles) - 1


def test_a_workload_deactivated_after_its_requeue_limit_stops_the_run_early(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(dict(kueue(waitForPodsReady={"timeoutSeconds": 1, "backoffLimitCount": 0}),
                                imagePullSeconds=30))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 1, done  # not 3: the deactivation ended the wait, not the deadline
    assert ("the Job's Workload can never be admitted: The workload is deactivated due to exceeding the maximum "
            "number of re-queuing retries") in done.stderr
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_each_round_of_a_queued_run_is_queued_and_reported(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(kueue())
    done = run_tool("run", "--no-runtime-class", "--count", "2", "--rounds", "2", "--queue", "team",
                    "--cluster-queue", "team", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    for number in (1, 2):
        queue = read(tmp_path / "out" / ("round-%d" % number) / "results.json")["queue"]
        assert queue["admission_cycles"] == 1 and queue["workload"].startswith("job-rollout-%d-" % number)


def test_custom_episodes_of_a_preempted_cycle_are_retried_and_only_the_last_cycle_counts(make_cluster, run_tool,
                                                                                        tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 1}, {"mode": "ok", "reward": 0.5}])
    cluster = make_cluster(dict(kueue(preempt={"whilePodsPending": 2, "afterSeconds": 1}), profile="vm-sandbox"))
    done = run_tool("run", "--no-runtime-class", "--episode", EPISODE, "--tasks", "tasks.jsonl", "--retries", "1",
                    "--queue", "team", "--cluster-queue", "team", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["queue"]["admission_cycles"] == 2 and results["queue"]["preempted_cycle_pods"] == 2
    assert (results["successful_episodes"], results["rewards"]["sum"], results["infrastructure_failures"]) == (
        2, 1.5, [])


def test_a_queued_batch_survives_what_real_clusters_do(make_cluster, run_tool, tmp_path):
    # A late ServiceAccount, watches that end with an ERROR Status (the Workload watch restarts
    # and lists again), etcd errors on the LocalQueue's create after the commit and on Workload
    # lists, VM sandboxes, and a preemption: still two cycles and every reward.
    cluster = make_cluster(dict(kueue(preempt={"afterSeconds": 1.8}), profile="vm-sandbox",
                                serviceAccountDelaySeconds=2, watchEnds={"afterSeconds": 1, "with": "expired"},
                                transientFailures=[
                                    {"verb": "create", "resource": "localqueues", "times": 1,
                                     "kind": "etcd-leader-changed", "afterCommit": True},
                                    {"verb": "list", "resource": "workloads", "times": 2, "kind": "etcd-timeout"}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["queue"]["admission_cycles"] == 2 and results["successful_episodes"] == 4
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_a_preemption_while_the_workload_watch_is_down_is_still_counted(make_cluster, run_tool, tmp_path):
    # The Workload watch cannot start for ~16 s (its list fails 20 times: 5 retries at 0.2 s, then
    # 1 s each); meanwhile Kueue admits, preempts (the Job's 4 pods pending) and re-admits. The
    # first state the watch delivers is admitted again: only schedulingStats tells of the eviction.
    cluster = make_cluster(dict(kueue(preempt={"whilePodsPending": 4}), profile="vm-sandbox", transientFailures=[
        {"verb": "list", "resource": "workloads", "times": 20, "kind": "etcd-timeout"}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    assert "rollout: evicted (Preempted) and re-admitted while the Workload watch was down" in done.stderr
    results = read(tmp_path / "out" / "results.json")
    queue = results["queue"]
    assert (queue["admission_cycles"], queue["unseen_queue_waits"]) == (2, 2)  # both waits unseen
    assert queue["cycles"][0]["evicted_reason"] == "Preempted" and queue["cycles"][0]["queued_seconds"] is None
    assert queue["cycles"][0]["evicted_message"].startswith("Preempted to accommodate a workload")
    assert (results["successful_episodes"], results["reward_sum"]) == (4, 4)
    # The first cycle's pods live only until the preemption, which comes as soon as they are
    # pending: the run counts those its pod watch saw (all 4 on a quiet machine; on a loaded one
    # the watch may list pods only after they are gone, as on a real cluster), never as results.
    pods = read(tmp_path / "out" / "pods.json")
    assert queue["preempted_cycle_pods"] == len(pods) - 4
    assert {row["pod"] for row in results["pods"]} <= {pod["metadata"]["name"] for pod in pods}


# ---------------------------------------------------------------- in-process: the preflight's arithmetic

def cluster_queue(nominal_cpu="1", nominal_memory="1Gi", name="team", **spec):
    return {"metadata": {"name": name}, "spec": dict({"resourceGroups": [{"coveredResources": ["cpu", "memory"],
                                                                         "flavors": [{"name": "default", "resources": [
        {"name": "cpu", "nominalQuota": nominal_cpu}, {"name": "memory", "nominalQuota": nominal_memory}]}]}]}, **spec)}


def test_a_demand_over_the_nominal_quota_never_fits(tool):
    demand = tool.queue_demand(20, 20, None)  # 20 x 100m CPU, 20 x 64Mi
    assert demand == {"cpu": pytest.approx(2.0), "memory": 20 * 64 * 2 ** 20}
    assert tool.never_fits(cluster_queue(), demand) == (
        "the batch needs 2000m cpu, 1280Mi (1.2GiB) memory at once from one flavor (Kueue never splits a pod set's "
        "resources over flavors), more than ClusterQueue team can ever give: flavor default: cpu 2000m > 1000m, "
        "memory 1280Mi (1.2GiB) > 1024Mi (1.0GiB)")


def test_a_resource_the_cluster_queue_does_not_cover_never_fits(tool):
    queue = cluster_queue()
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()  # no memory
    queue["spec"]["resourceGroups"][0]["coveredResources"].pop()
    assert tool.never_fits(queue, tool.queue_demand(1, 1, None)) == "ClusterQueue team covers no memory"


def test_a_demand_within_the_quota_fits(tool):
    assert tool.never_fits(cluster_queue(), tool.queue_demand(5, 20, None)) is None


def test_a_stopped_or_inactive_cluster_queue_is_held_not_refused(tool):
    assert tool.queue_hold(cluster_queue(stopPolicy="Hold"), "ClusterQueue") == \
        "ClusterQueue team is held (stopPolicy Hold)"
    inactive = cluster_queue()
    inactive["status"] = {"conditions": [{"type": "Active", "status": "False", "reason": "FlavorNotFound",
                                          "message": "Can't admit new workloads: references missing ResourceFlavor(s)"}]}
    assert tool.queue_hold(inactive, "ClusterQueue") == ("ClusterQueue team is not active (FlavorNotFound: Can't admit "
                                                         "new workloads: references missing ResourceFlavor(s))")
    assert tool.queue_hold(cluster_queue(), "ClusterQueue") is None
    held = cluster_queue(stopPolicy="HoldAndDrain")
    held["metadata"]["managedFields"] = [{"manager": "kubectl-patch", "fieldsV1": {"f:spec": {"f:stopPolicy": {}}}}]
    assert tool.queue_hold(held, "ClusterQueue") == "ClusterQueue team is held (stopPolicy HoldAndDrain, set by " \
                                                    "kubectl-patch)"


@pytest.mark.parametrize("cached", [False, True], ids=["fresh-discovery", "cached-discovery"])
def test_kueue_uninstalled_while_the_batch_is_queued_is_named_instead_of_waiting_out_the_queue_timeout(
        make_cluster, run_tool, tmp_path, cached):
    # Kueue's CRDs, webhooks and controller go 2 s after the run's Job (the cluster's second) is
    # created; with a kubectl whose discovery cache still lists them, the list gets a 404 instead.
    cluster = make_cluster(busy_config(tmp_path, uninstall={"afterJobs": 2, "seconds": 2.0,
                                                            "discoveryCached": cached}))
    start_blocker(cluster)
    process = start_queued_run(cluster, tmp_path)
    _, stderr = process.communicate(timeout=120)
    (tmp_path / "release-blocker").touch()
    assert process.returncode == 1, stderr
    line = stderr.strip().splitlines()[-1]
    # the list goes through the command's channel, whatever a discovery cache says, and meets the
    # API server's 404 for the path, worded as kubectl words it
    said = "Error from server (NotFound): the server could not find the requested resource"
    assert line.startswith("Error: the API server no longer serves Kueue's Workloads (" + said), stderr
    assert "): Kueue was uninstalled while Job rollout waited in its queue, and nothing will admit it now" in line
    assert (tmp_path / "out" / "job.json").exists() and (tmp_path / "out" / "queue.json").exists()
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def two_flavors(cpu_a="1", cpu_b="1", **spec):
    return {"metadata": {"name": "team"}, "spec": dict({"resourceGroups": [{"coveredResources": ["cpu", "memory"],
                                                                           "flavors": [
        {"name": "a", "resources": [{"name": "cpu", "nominalQuota": cpu_a}, {"name": "memory", "nominalQuota": "8Gi"}]},
        {"name": "b", "resources": [{"name": "cpu", "nominalQuota": cpu_b}, {"name": "memory", "nominalQuota": "8Gi"}]},
    ]}]}, **spec)}


def test_a_batch_that_fits_only_the_sum_of_two_flavors_never_fits(tool):
    demand = tool.queue_demand(15, 15, None)  # 1.5 CPU, from one flavor or not at all
    assert tool.never_fits(two_flavors(), demand).endswith(
        "flavor a: cpu 1500m > 1000m; flavor b: cpu 1500m > 1000m")
    assert tool.never_fits(two_flavors(cpu_b="2"), demand) is None


def test_a_cluster_queue_in_a_cohort_fits_what_its_cohort_could_lend(tool):
    demand = tool.queue_demand(20, 20, None)  # 2 CPU
    team = cluster_queue(cohortName="shared")
    lender = cluster_queue("8", "16Gi", name="lender", cohortName="shared")
    stranger = cluster_queue("8", "16Gi", name="stranger", cohortName="other")
    lending = tool.cohort_lending(team, [team, lender, stranger], [])
    assert lending[("default", "cpu")] == 8.0
    assert tool.never_fits(team, demand, lending) is None
    assert tool.never_fits(team, demand) is not None  # without the cohort: over the nominal quota


def test_lending_and_borrowing_limits_bound_what_a_cohort_gives(tool):
    demand = tool.queue_demand(20, 20, None)  # 2 CPU
    lender = cluster_queue("8", "16Gi", name="lender", cohortName="shared")
    lender["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["lendingLimit"] = "500m"
    team = cluster_queue(cohortName="shared")
    assert "cpu 2000m > 1500m" in tool.never_fits(team, demand, tool.cohort_lending(team, [team, lender], []))
    # a Cohort object of the tree lends its own quota; a child cohort's members count too
    parent = {"metadata": {"name": "root"}, "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
        {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}}
    child = {"metadata": {"name": "shared"}, "spec": {"parentName": "root"}}
    assert tool.cohort_lending(team, [team, lender], [parent, child])[("default", "cpu")] == 4.5
    team["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = "200m"
    assert "cpu 2000m > 1200m" in tool.never_fits(team, demand, tool.cohort_lending(team, [team, lender],
                                                                                    [parent, child]))


def test_the_older_cohort_field_is_read_too(tool):
    assert tool.cohort_of(cluster_queue(cohort="legacy")) == "legacy"
    assert tool.cohort_of(cluster_queue(cohortName="shared")) == "shared"



# ---------------------------------------------------------------- Kueue as Kueue does it: cohorts, holds, failures

def test_a_cluster_queue_that_borrows_from_its_cohort_is_accepted_and_the_batch_runs(make_cluster, run_tool,
                                                                                      tmp_path):
    # 1 CPU of its own, 20 episodes of 100m at once: only with the cohort's lending (kueue.x-k8s.io/v1beta2 cohortName)
    cluster = make_cluster(kueue(clusterQueues=[
        {"name": "team", "nominalQuota": {"cpu": "1", "memory": "4Gi"}, "cohortName": "shared"},
        {"name": "lender", "nominalQuota": {"cpu": "8", "memory": "16Gi"}, "cohortName": "shared"}]))
    done = run_tool("run", "--no-runtime-class", "--count", "20", "--queue", "team", "--cluster-queue", "team",
                    "--output", "out", cluster=cluster)
    assert done.code == 0, done
    assert read(tmp_path / "out" / "run.json")["queue"]["cluster_queue_state"] == "active, fits with its cohort's lending"
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 20


def test_a_cohort_whose_members_cannot_be_read_skips_the_fit_check_and_says_so(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(dict(kueue(clusterQueues=[
        {"name": "team", "nominalQuota": {"cpu": "200m", "memory": "4Gi"}, "cohortName": "shared"},
        {"name": "lender", "nominalQuota": {"cpu": "8", "memory": "16Gi"}, "cohortName": "shared"}]),
        forbid=[{"verb": "list", "resource": "clusterqueues"}]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    assert ("ClusterQueue team borrows from cohort shared, whose other ClusterQueues cannot be read (forbidden): "
            "whether the batch can ever fit was not checked") in done.stderr


def test_a_batch_that_fits_only_the_sum_of_two_flavors_is_refused_before_anything_is_created(make_cluster, run_tool,
                                                                                             tmp_path):
    groups = [{"coveredResources": ["cpu", "memory"], "flavors": [
        {"name": "spot", "resources": [{"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "8Gi"}]},
        {"name": "on-demand", "resources": [{"name": "cpu", "nominalQuota": "1"},
                                            {"name": "memory", "nominalQuota": "8Gi"}]}]}]
    cluster = make_cluster(kueue(clusterQueues=[{"name": "team", "resourceGroups": groups}]))
    done = run_tool("run", "--no-runtime-class", "--count", "15", "--queue", "team", "--cluster-queue", "team",
                    "--output", "out", cluster=cluster)
    assert done.code == 1, done
    assert "flavor spot: cpu 1500m > 1000m; flavor on-demand: cpu 1500m > 1000m" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_queued_batch_whose_episodes_all_fail_fails_at_once_as_unqueued(make_cluster, run_tool, tmp_path):
    image = tmp_path / "image-broken"
    image.write_text("#!/bin/sh\nexit 1\n")
    image.chmod(0o755)
    cluster = make_cluster(dict(kueue(), images={"broken:1": {"python": str(image)}}))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team", "--image", "broken:1")
    assert done.code == 4, done  # not 3: the failures ended it, not the Job's 240 s deadline
    assert "Job rollout failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in done.stderr
    # no replacement waves (backoffLimit 0, as unqueued); fewer than 4 when the first failure comes before the
    # Job controller's slow-start batches have made them all
    assert len(read(tmp_path / "out" / "pods.json")) <= 4


def test_a_held_cluster_queue_is_waited_for_and_the_batch_runs_once_it_is_resumed(make_cluster, run_tool, tmp_path):
    # stopPolicy Hold, resumed by its administrator 3 s after the Job is created
    cluster = make_cluster(kueue(clusterQueues=[dict(TEAM, stopPolicy="Hold", resumeAfterJobCreatedSeconds=3)]))
    done = queued_run(run_tool, cluster, "out", "--queue", "team", "--cluster-queue", "team")
    assert done.code == 0, done
    assert "ClusterQueue team is held (stopPolicy Hold): the batch will wait until it is resumed" in done.stderr
    assert "rollout: held: Inadmissible: ClusterQueue team is inactive; waiting for the queue to be resumed" in done.stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["reward_sum"] == 4 and results["queue"]["queued_seconds"] >= 2


def test_a_pod_created_in_the_second_of_the_readmission_is_told_apart_by_when_the_watch_saw_it(tool):
    # Evicted and re-admitted within one second (1004): pods of both cycles have creationTimestamp 1004.
    record = {"cycles": [
        {"admitted_at": 1001.2, "admitted_at_server": 1001.0, "admitted_source": "watch arrival (client clock)",
         "queued_since": 1000.4, "evicted_at": 1004.3, "evicted_reason": "Preempted"},
        {"admitted_at": 1004.6, "admitted_at_server": 1004.0, "admitted_source": "watch arrival (client clock)",
         "queued_since": 1004.5, "queued_source": "Requeued=True as the watch delivered it (client clock)"}]}

    def pod(name, phase, deleted=False):
        meta = {"name": name, "creationTimestamp": "1970-01-01T00:16:44Z"}
        if deleted:
            meta["deletionTimestamp"] = "1970-01-01T00:16:44Z"
        return {"metadata": meta, "status": {"phase": phase}}

    pods = [pod("old-running", "Failed", deleted=True), pod("old-done", "Succeeded"), pod("new", "Succeeded")]
    observed = {"old-running": {"first_seen": 1004.1}, "old-done": {"first_seen": 1004.05},
                "new": {"first_seen": 1004.8}}
    gate = tool.SavedAdmission(record)
    kept, _ = gate.results_pods(pods, [""] * 3, 2, observed)
    # the preempted pod is never a result; one that succeeded before the eviction was counted by the Job
    assert [p["metadata"]["name"] for p in kept] == ["old-done", "new"]
    assert [p["metadata"]["name"] for p in gate.earlier] == ["old-running"]


def test_a_queue_wait_read_from_whole_second_api_times_is_shown_in_whole_seconds(tool):
    report = {"queue": {"queued_seconds": 0.0, "admission_cycles": 1, "cycles": [
        {"admitted_source": "Admitted lastTransitionTime - Job creationTimestamp (API clocks, whole seconds: ...)"}]}}
    assert tool.KueueGate.summary_lines(report)[0].startswith("Queued 0 s before Kueue admitted the Job")
    report["queue"]["cycles"][0]["admitted_source"] = "watch arrival (client clock)"
    report["queue"]["queued_seconds"] = 1.234
    assert tool.KueueGate.summary_lines(report)[0].startswith("Queued 1.23 s before")


def test_shared_code_reaches_the_kueue_gate_only_through_the_registry():
    # a second admission gate is one section and one line in GATES (issue 33): outside the Kueue
    # section, nothing names KueueGate but the registry
    source = SCRIPT.read_text()
    start = source.index("# Kueue gate: --queue")
    end = source.index("\n# Warm-pool backend", start)  # the next section
    outside = source[:start] + source[end:]
    assert [line.strip() for line in outside.splitlines() if "KueueGate" in line] == [
        "GATES = (KueueGate,)  # admission gates (Gate); shared code asks each, in this order"]


def test_the_state_line_of_an_evicted_workload_whose_pods_still_terminate_says_so(tool):
    cycles = tool.AdmissionCycles(1.0, 1.0)
    conditions = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
                   "lastTransitionTime": "2026-12-02T10:00:01Z"},
                  {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "",
                   "lastTransitionTime": "2026-12-02T10:00:01Z"}]
    workload = {"metadata": {"name": "job-rollout-1", "uid": "u1"}, "status": {"conditions": conditions}}
    cycles.update(2.0, workload)
    evicted = dict(workload, status={"conditions": conditions + [{
        "type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload",
        "lastTransitionTime": "2026-12-02T10:00:02Z"}]})
    cycles.update(3.0, evicted)
    assert cycles.state() == "evicted (Preempted), its pods terminating: Preempted to accommodate a workload"


def test_the_gates_timeline_spans_are_data_the_timeline_draws(tool):
    # the gate says what its spans are; only the presentation section turns them into SVG
    results = {"queue": {"cycles": [
        {"cycle": 1, "queued_seconds": 2.0, "queued_since_unix": 100.0, "admitted_at_unix": 102.0},
        {"cycle": 2, "queued_seconds": 1.0, "queued_since_unix": 105.0, "admitted_at_unix": 106.0,
         "draining_seconds": 0.5, "draining_since_unix": 104.5}]}}
    spans = tool.KueueGate.timeline_spans(results)
    assert [(span["kind"], span["from"], span["to"]) for span in spans] == [
        ("queued", 100.0, 102.0), ("draining", 104.5, 105.0), ("queued", 105.0, 106.0)]
    assert not any("<" in str(value) for span in spans for value in span.values())
    svg = tool.timeline_span_svg(spans[0], origin=100.0, scale=10.0, left=50, y=20)
    assert svg.startswith('<rect class="queued" x="50.00" y="20" width="20.00" height="8"')
    assert tool.KueueGate.timeline_spans({}) is None
