"""The Job backend end to end through the simulated cluster: the batch, its failures, rounds,
prewarm, the log archive, interrupts; and its stall check in-process."""

import json
import urllib.parse
from pathlib import Path
import re

import pytest

from conftest import (EPISODE, SLEEPS_UNTIL_TERM, cluster_with_image, interrupt_a_run, read, start_tool, wait_for,
                      write_tasks)


def test_run_10_parallel_writes_results(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "10", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    results = read(out / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10)
    assert (results["parallelism"], results["runtime"], results["image"]) == (10, "cube", "python:3.12-alpine")
    assert results["cache_state"] == "uncontrolled"
    assert results["context"] == "kind-rl"
    assert sum(results["nodes"].values()) == 10
    assert len(results["pods"]) == 10
    assert 0 < results["pod_to_ready_p50_seconds"] <= results["pod_to_ready_p95_seconds"] <= results[
        "pod_to_ready_max_seconds"]
    assert results["batch_to_all_ready_seconds"] <= results["batch_to_all_rewards_seconds"]
    assert results["client_job_complete_seconds"] > 0
    for name in ("receipt.json", "job-submitted.json", "job.json", "pods.json", "events.txt"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in out.glob("rollout-*.log")) == sorted(row["pod"] + ".log" for row in results["pods"])
    assert "namespace: " + results["namespace"] in result.stderr
    summary = json.loads(result.stdout)  # stdout is the JSON summary and nothing else
    assert "pods" not in summary and summary["reward_sum"] == 10


def test_run_records_ownership_in_the_receipt(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = cluster.get_json("namespace", receipt["namespace"])
    job = cluster.get_json("-n", receipt["namespace"], "job", "rollout")
    assert receipt == {"context": "kind-rl", "namespace": "agc-rl-" + receipt["run_id"], "run_id": receipt["run_id"],
                       "backend": "kubernetes", "images": ["python:3.12-alpine"], "uid": namespace["metadata"]["uid"],
                       "job_uid": job["metadata"]["uid"],
                       "jobs": {"rollout": job["metadata"]["uid"]},
                       "sent": ["Namespace/" + receipt["namespace"], "Job/rollout"]}
    assert namespace["metadata"]["labels"]["agc-demo-run"] == receipt["run_id"]
    assert namespace["metadata"]["labels"]["agc-demo-backend"] == "kubernetes"  # on every namespace, whatever the backend


def test_run_10_sequential_runs_one_episode_at_a_time(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "10", "--parallelism", "1", "--output", "seq", cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "seq" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10)
    assert results["parallelism"] == 1
    assert read(tmp_path / "seq" / "job.json")["spec"]["parallelism"] == 1
    rows = sorted(results["pods"], key=lambda row: row["batch_to_ready_seconds"])
    for earlier, later in zip(rows, rows[1:]):
        assert earlier["batch_to_reward_seconds"] < later["batch_to_ready_seconds"]
    assert run_tool("cleanup", "--output", "seq", cluster=cluster).code == 0
    gone = cluster.kubectl("get", "namespace", results["namespace"], "--ignore-not-found", "-o", "name")
    assert gone.stdout == ""


def test_no_runtime_class_runs_on_the_default_runtime(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"runtimeClasses": []})
    result = run_tool("run", "--count", "2", "--no-runtime-class", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["runtime"] is None
    assert "runtimeClassName" not in read(tmp_path / "out" / "job-submitted.json")["spec"]["template"]["spec"]


def test_failing_episode_fails_the_batch_with_diagnostics(make_cluster, run_tool, tmp_path):
    # An image whose test runner always fails: the patched code "fails" its tests.
    cluster = cluster_with_image(make_cluster, tmp_path, "broken:tests",
                                 '[ "$2" = test_shipping.py ] && exit 1\nexec $PY "$@"')
    result = run_tool("run", "--count", "2", "--image", "broken:tests", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "Error: Job rollout failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in result.stderr
    assert "RuntimeError: patched code failed its tests" in result.stderr
    assert "diagnostics saved in out" in result.stderr and "cleanup --output out" in result.stderr
    out = tmp_path / "out"
    assert not (out / "results.json").exists()
    for name in ("job.json", "pods.json", "events.txt"):
        assert (out / name).is_file()
    assert any('"reward": 0' in log.read_text() for log in out.glob("rollout-*.log"))
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_baseline_that_passes_fails_the_batch(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "broken:baseline",
                                 '[ "$2" = test_shipping.py ] && exit 0\nexec $PY "$@"')
    result = run_tool("run", "--count", "1", "--image", "broken:baseline", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "RuntimeError: baseline must fail the boundary test" in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_restarted_container_fails_validation(make_cluster, run_tool, tmp_path):
    nodes = [{"name": "kind-worker", "restartContainersOnce": True}]
    cluster = make_cluster({"nodes": nodes})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "validation failed, no results.json written: pod rollout-" in result.stderr
    assert "container restarted 1 times, expected 0" in result.stderr
    errors = (tmp_path / "out" / "validation-errors.txt").read_text().splitlines()
    assert len(errors) == 2 and all("restarted 1 times" in line for line in errors)
    assert not (tmp_path / "out" / "results.json").exists()


def test_a_log_whose_start_was_rotated_away_is_named_as_rotated_not_as_never_ready(make_cluster, run_tool,
                                                                                   tmp_path):
    # The node's runtime returns no termination message, so the log is read; its rotation dropped
    # the first line, so the log lacks the ready event but still has the reward after it.
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "logDropFirstLines": 2, "dropTerminationMessages": True}]})
    result = run_tool("run", "--count", "1", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "never ready: no ready event in its log, yet a reward event: the episode did not emit one, or the " \
        "log's beginning is gone (the kubelet rotates" in result.stderr
    assert "events seen: reward" in result.stderr


def test_mismatched_episode_id_fails_validation(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "odd:id", 'EPISODE_ID=someone-else exec $PY "$@"')
    result = run_tool("run", "--count", "1", "--image", "odd:id", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "ready event has episode_id 'someone-else', expected the pod name" in result.stderr


def test_job_past_its_deadline_times_out(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "slow:1", SLEEPS_UNTIL_TERM.split("\n", 1)[1])
    result = run_tool("run", "--count", "2", "--image", "slow:1", "--timeout", "2", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result
    assert "Job rollout failed (DeadlineExceeded: Job was active longer than specified deadline)" in result.stderr
    assert "cleanup --output out" in result.stderr
    assert read(tmp_path / "out" / "job.json")["status"]["conditions"][-1]["reason"] == "DeadlineExceeded"
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def log_calls(cluster):
    return [call for call in cluster.calls() if "logs" in call]


def query_of(request):
    return urllib.parse.parse_qs(urllib.parse.urlsplit(request["target"]).query)


def watched_collection(request):
    """(path, labelSelector, fieldSelector) of a watch's request: one watch's list and watches share it."""
    query = query_of(request)
    return (request["target"].split("?")[0], tuple(query.get("labelSelector", ())),
            tuple(query.get("fieldSelector", ())))


def test_logs_are_archived_as_their_pods_finish_not_after_the_job(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    result = run_tool("run", "--count", "6", "--parallelism", "1", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    complete_at = [json.loads(line)["complete_at"] for line in (cluster.state / "marks.jsonl").read_text().splitlines()
                   if json.loads(line)["job"] == "rollout"][0]
    first_read = {}  # pod -> when the proxy first forwarded a GET of its log (a retry may follow)
    for request in cluster.requests():
        if not request["command"] and request["target"].split("?")[0].endswith("/log"):
            first_read.setdefault(request["target"].split("/pods/")[1].split("/")[0], request["at"])
    # one episode at a time: the first five pods finished (and were read) before the Job was Complete
    read_at = sorted(first_read.values())
    assert len(read_at) == 6 and read_at[4] < complete_at, (read_at, complete_at)
    assert read(tmp_path / "out" / "results.json")["log_archive"]["logs"] == 6


def test_every_log_comes_through_one_proxy_byte_for_byte(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    # more output than a termination message holds, a crash, a last line without a newline
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"id": 0, "chatter": 200, "termination_message": True}, {"id": 1, "mode": "crash"},
        {"id": 2, "trailing": "no newline at the end"}, {"id": 3}, {"id": 4, "reward": 0}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 5, result
    out = tmp_path / "out"
    pods = [pod["metadata"]["name"] for pod in read(out / "pods.json")]
    before = len(log_calls(cluster))
    for name in pods:
        direct = cluster.kubectl("-n", read(out / "receipt.json")["namespace"], "logs", name, "-c", "episode").stdout
        assert (out / (name + ".log")).read_text() == direct, name
    # every log came through one `kubectl proxy` (one GET each, unthrottled), none by `kubectl logs`
    assert before == 0, log_calls(cluster)
    # the command's one channel: one `kubectl proxy`, serving the tool's namespaces
    proxies = [call for call in cluster.calls() if "proxy" in call]
    assert len(proxies) == 1 and any("agc\\-rl\\-" in arg for arg in proxies[0] if arg.startswith("--accept-paths="))
    # the proxy forwards the tool's own GETs (no Kubectl-Command header): one per pod or more (a retry)
    proxied = {r["target"].split("/pods/")[1].split("/")[0] for r in cluster.requests()
               if not r["command"] and r["target"].split("?")[0].endswith("/log")}
    assert proxied == set(pods)
    assert any("no newline at the end" in (out / (name + ".log")).read_text() for name in pods)
    assert max(len((out / (name + ".log")).read_text()) for name in pods) > 4096
    sources = read(out / "logs.json")
    assert set(sources) == set(pods)
    assert set(sources.values()) == {"GET pods/NAME/log through the run's kubectl proxy"}
    assert read(out / "results.json")["log_archive"]["logs"] == 5


def test_a_pod_gone_before_its_log_was_read_is_recorded_as_such(make_cluster, tmp_path):
    # a pod deleted while its image is still being pulled never had a log: no follow can save one
    cluster = make_cluster({"imagePullSeconds": 3})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "termination_message": True} for i in range(4)])
    process = start_tool(cluster, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    receipt = tmp_path / "out" / "receipt.json"
    wait_for("the Job", lambda: receipt.exists() and "job_uid" in receipt.read_text())
    namespace = read(receipt)["namespace"]
    victim = wait_for("a pod", lambda: cluster.kubectl("-n", namespace, "get", "pods", "-o", "name").stdout.split())[0]
    cluster.kubectl("-n", namespace, "delete", victim, "--wait=false")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr  # its episode is an infrastructure failure, the other three samples
    out = tmp_path / "out"
    gone = read(out / "run.json")["pods_seen_only_by_watch"]
    assert gone == [victim.split("/")[1]]
    assert read(out / "logs.json")[gone[0]].startswith("not available: the pod was gone from the API")
    assert not (out / (gone[0] + ".log")).exists()
    assert read(out / "results.json")["log_archive"]["sources"]["not available"] == 1


def test_prewarm_on_many_nodes_uses_two_watches_in_all(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker%d" % i} for i in range(4)]})
    result = run_tool("run", "--count", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    # each watch through the run's proxy: its list and its watches, one collection and selector each
    watches = {watched_collection(request) for request in cluster.requests() if request["agent"].endswith(" watch")}
    # prewarm: one pod watch and one Job watch for its four Jobs; the measured round: two more.
    # At least two: a watch stopped before it sent a request (a loaded machine) is not counted,
    # and the point is that there is no watch per node or per Job.
    assert 2 <= len(watches) <= 4, watches
    assert not [call for call in cluster.calls() if "--watch" in call]  # no kubectl process per watch
    assert len(list((tmp_path / "out" / "prewarm").glob("*/results.json"))) == 4


def test_the_stall_check_reads_only_the_jobs_failed_create_events(make_cluster, run_tool, tmp_path):
    # The pods are refused until the ServiceAccount comes, 7 s after the namespace: a stall of
    # at least the 3 s that starts a check, even when a loaded machine slows the tool's start.
    cluster = make_cluster({"serviceAccountDelaySeconds": 7})
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    # events.json is saved at the end without a selector (every event); a stall check reads with one
    event_reads = [request for request in cluster.requests() if not request["command"]
                   and request["target"].split("?")[0].endswith("/events") and "fieldSelector" in request["target"]]
    assert event_reads, "the run made no stall check"
    for request in event_reads:
        assert query_of(request)["fieldSelector"] == [
            "involvedObject.kind=Job,involvedObject.name=rollout,reason=FailedCreate"]


def test_interrupt_exits_130_and_leaves_a_folder_cleanup_finishes(make_cluster, run_tool, tmp_path):
    cluster, code, stderr = interrupt_a_run(make_cluster, tmp_path)
    assert code == 130, stderr
    assert "cleanup --output out" in stderr
    assert (tmp_path / "out" / "observed.json").exists()  # the sandbox-ready times only the watch saw
    assert "Traceback" not in stderr
    cleanup = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert cleanup.code == 0, cleanup


def test_rounds_with_prewarm_keep_each_round_and_pool_the_percentiles(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "3", "--rounds", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    prewarm = read(out / "prewarm" / "prewarm.json")
    assert prewarm["nodes"] == ["kind-worker", "kind-worker2"]
    for node in prewarm["nodes"]:
        warm = read(out / "prewarm" / node / "results.json")
        assert warm["episodes"] == 1 and warm["nodes"] == {node: 1}
    rounds = [read(out / ("round-%d" % n) / "results.json") for n in (1, 2)]
    assert [r["episodes"] for r in rounds] == [3, 3] and [r["round"] for r in rounds] == [1, 2]
    pooled = read(out / "results.json")
    assert (pooled["episodes"], pooled["successful_episodes"], pooled["reward_sum"]) == (6, 6, 6)
    assert [r["round"] for r in pooled["rounds"]] == [1, 2]
    assert pooled["rounds"][0]["batch_to_all_rewards_seconds"] == rounds[0]["batch_to_all_rewards_seconds"]
    assert len(pooled["pods"]) == 6  # the warm-up episodes are not in the figures
    assert pooled["phases"]["pod_to_ready"]["count"] == 6
    assert pooled["cache_state"] == "prewarmed"
    assert pooled["run"]["cache_state"]["nodes"] == ["kind-worker", "kind-worker2"]
    receipt = read(out / "receipt.json")
    assert sorted(receipt["jobs"]) == ["prewarm-1", "prewarm-2", "rollout-1", "rollout-2"]
    cleanup = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert cleanup.code == 0, cleanup
    assert cluster.kubectl("get", "namespace", receipt["namespace"], "--ignore-not-found", "-o", "name").stdout == ""


def test_pooled_rounds_recompute_from_the_folder(cluster, run_tool, tmp_path, tool):
    assert run_tool("run", "--count", "2", "--rounds", "2", "--output", "out", cluster=cluster).code == 0
    assert tool.results_from_folder(tmp_path / "out") == read(tmp_path / "out" / "results.json")


def test_interrupt_saves_what_is_known(make_cluster, tmp_path):
    _, code, stderr = interrupt_a_run(make_cluster, tmp_path)
    assert code == 130, stderr
    out = tmp_path / "out"
    assert len(read(out / "pods.json")) == 2
    assert read(out / "job.json")["metadata"]["name"] == "rollout"
    assert (out / "events.txt").exists()


def test_a_25_episode_batch_runs_with_allow_large(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "25", "--allow-large", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 25


def watch_processes(cluster):
    """kubectl watch processes of this cluster still alive (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"--watch" in argv and ("FAKE_K8S_DIR=%s" % cluster.state).encode() in environ:
            found.append(proc.name)
    return found


def test_no_watch_is_left_running_after_a_run(cluster, run_tool):
    assert run_tool("run", "--count", "2", "--output", "ok", cluster=cluster).code == 0
    assert run_tool("run", "--count", "2", "--image", "no-such/image:1", "--timeout", "2", "--output", "failed",
                    cluster=cluster).code == 3
    assert watch_processes(cluster) == []


def test_blocking_reason_reports_an_admission_refusal(tool):
    events = [{"reason": "SuccessfulCreate", "message": "Created pod: rollout-a"},
              {"reason": "FailedCreate", "message": 'Error creating: pods "rollout-b" is forbidden: violates '
                                                    'PodSecurity "restricted:latest": seccompProfile (...)'}]
    assert tool.blocking_reason(events, []) == (
        'the cluster refused to create the episode pods: pods "rollout-b" is forbidden: violates PodSecurity '
        '"restricted:latest": seccompProfile (...)')


def test_blocking_reason_reports_a_container_config_error(tool):
    pod = {"metadata": {"name": "rollout-a"}, "status": {"containerStatuses": [{"state": {"waiting": {
        "reason": "CreateContainerConfigError",
        "message": "container has runAsNonRoot and image will run as root"}}}]}}
    assert tool.blocking_reason([], [pod]) == ("pod rollout-a cannot start its container "
                                               "(CreateContainerConfigError: container has runAsNonRoot and "
                                               "image will run as root)")


def test_blocking_reason_ignores_transient_states(tool):
    pod = {"metadata": {"name": "rollout-a"}, "status": {"containerStatuses": [{"state": {"waiting": {
        "reason": "ContainerCreating"}}}]}}
    events = [{"reason": "FailedScheduling", "message": "0/2 nodes are available"}]
    assert tool.blocking_reason(events, [pod]) is None


def test_the_waits_fallback_poll_goes_through_the_runs_proxy_once_it_is_open(make_cluster, run_tool, tmp_path):
    # the Job watch delivers nothing (a stalled proxy or load balancer): the wait polls the Job;
    # once the log archive's proxy is open, a poll starts no kubectl process (issue 31: 143 of
    # them in a 10,000-episode run)
    cluster = make_cluster({"watchStalls": ["jobs"]})
    result = run_tool("run", "--count", "8", "--parallelism", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    job_path = "/apis/batch/v1/namespaces/%s/jobs/rollout" % namespace
    proxied = [r for r in cluster.requests() if r["method"] == "GET" and r["target"] == job_path
               and not r.get("command")]
    assert proxied, [r["target"] for r in cluster.requests() if "jobs/rollout" in r["target"]]
    # no `kubectl get job` after the first poll through the proxy
    assert [r["target"] for r in cluster.requests() if r["target"].startswith(job_path + "?")
            and r.get("command") == "kubectl get" and r["at"] > proxied[0]["at"]] == []


# ---------------------------------------------------------------- the Job's deadline and what a timed-out wait names; a skewed node clock

def test_deadline_ends_the_run_at_failure_target_not_after_the_grace_period(make_cluster, run_tool, tmp_path):
    # `sleep` as the container's PID 1 ignores SIGTERM: the pods take their full 30 s grace period.
    cluster = cluster_with_image(make_cluster, tmp_path, "slow:1", "exec sleep 60")
    result = run_tool("run", "--count", "2", "--image", "slow:1", "--timeout", "2", "--output", "out", cluster=cluster)
    assert result.code == 3, result
    assert "Job rollout failed (DeadlineExceeded: Job was active longer than specified deadline)" in result.stderr
    assert "client's" not in result.stderr
    # Saved at FailureTarget: Failed comes only once the pods' 30 s grace period has ended.
    job = read(tmp_path / "out" / "job.json")
    assert [c["type"] for c in job["status"]["conditions"]] == ["FailureTarget"]


def test_an_image_missing_from_its_registry_is_named_at_once_and_the_pods_are_kept(make_cluster, run_tool, tmp_path):
    # The fake answers with containerd's words, gRPC code first (as the real node showed them);
    # with the old wording, which lacked the code, this run waited for its deadline.
    cluster = make_cluster()
    result = run_tool("run", "--count", "2", "--image", "nosuch:1", "--timeout", "300", "--output", "out",
                      cluster=cluster)
    assert result.code == 1, result  # not 3: named at once, not at the deadline
    assert re.search(r'the image nosuch:1 does not exist in its registry: pod rollout-\w+ cannot pull it '
                     r'\((ErrImagePull|ImagePullBackOff): ', result.stderr), result.stderr
    assert "stopped early instead of waiting for the deadline" in result.stderr
    assert len(read(tmp_path / "out" / "pods.json")) == 2
    assert "ErrImagePull" in (tmp_path / "out" / "events.txt").read_text()
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_an_unschedulable_batch_timeout_names_the_scheduler_message(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "tiny", "cpu": "50m", "memory": "1Gi"}]})
    result = run_tool("run", "--count", "2", "--timeout", "3", "--force", "--output", "out", cluster=cluster)
    assert result.code == 3, result
    assert "FailedScheduling: 0/1 nodes are available: 1 Insufficient cpu." in result.stderr


@pytest.mark.parametrize("offset", [-8, 5])
def test_a_skewed_node_clock_fails_validation_naming_the_node_and_size(make_cluster, run_tool, tmp_path, offset):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "clockOffsetSeconds": offset}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    direction = "behind" if offset < 0 else "ahead of"
    found = re.search(r"the episode clock on node kind-worker is at least ([0-9.]+) s %s the API server" % direction,
                      result.stderr)
    assert found, result.stderr
    # a lower bound: the API's whole seconds and the episode's own run time make it smaller
    assert abs(offset) - 3.0 <= float(found.group(1)) <= abs(offset)
    assert "synchronise that node's clock with the API server's (NTP)" in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_the_stall_check_of_a_long_wait_reads_events_through_the_runs_proxy(cluster, tmp_path):
    # three episodes done (their logs read through the run's proxy: 4 pods or more), one held: the
    # wait sees no progress and looks for FailedCreate events every few seconds, which once cost a
    # kubectl process each
    release = tmp_path / "release"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok"}] * 3 + [{"mode": "ok", "wait_for": str(release)}])
    process = start_tool(cluster, tmp_path, "run", "--episode", EPISODE, "--tasks", tasks, "--output", "out")

    def stall_checks():
        return [request for request in cluster.requests() if request["method"] == "GET" and
                request["target"].split("?")[0].endswith("/events") and "fieldSelector" in request["target"]]
    try:
        wait_for("two stall checks after the first log", lambda: len([
            request for request in stall_checks() if request["at"] > first_log_read(cluster)]) >= 2
            if first_log_read(cluster) else False, timeout=120)
    finally:
        release.touch()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    later = [request for request in stall_checks() if request["at"] > first_log_read(cluster)]
    assert later and not [request for request in later if request["command"] == "kubectl get"], later


def first_log_read(cluster):
    return next((request["at"] for request in cluster.requests() if request["target"].split("?")[0].endswith("/log")),
                None)
