"""What real clusters do that a kind simulation forgets (issue "Survive a real cluster"):
refusals that pass on their own, watches that end, 409s, grace periods, etcd errors, taints,
skewed node clocks, slow VM sandboxes, evictions, signals. Each test runs the real script
through the simulated cluster configured the way a real cluster behaves."""

import json
import re
import signal

import pytest

from conftest import EPISODE, cluster_with_image, interrupt_a_run, read, write_tasks


def test_serviceaccount_lag_in_a_new_namespace_does_not_stop_the_run(make_cluster, run_tool, tmp_path):
    # The namespace's `default` ServiceAccount appears 6 s late, on a VM-sandbox timing profile:
    # every pod creation is refused for longer than the stall check's 3 s (with room for a
    # loaded machine's slow start of the tool before the Job is created).
    cluster = make_cluster({"serviceAccountDelaySeconds": 6, "profile": "vm-sandbox"})
    result = run_tool("run", "--count", "3", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 3
    events = (tmp_path / "out" / "events.txt").read_text()
    assert 'is forbidden: error looking up service account' in events
    assert 'pods "rollout-" is forbidden' in events  # admission names the generateName prefix


def test_full_resource_quota_waits_for_quota_to_free(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"namespaceQuota": {"name": "pod-quota", "pods": 2}})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "sleep": 3} for i in range(4)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 4
    assert "exceeded quota: pod-quota, requested: pods=1, used: pods=2, limited: pods=2" in (
        tmp_path / "out" / "events.txt").read_text()


def test_a_refusal_followed_by_a_created_pod_is_not_blocking(tool):
    refused = {"reason": "FailedCreate", "lastTimestamp": "2026-11-30T10:00:01Z",
               "message": 'Error creating: pods "rollout-" is forbidden: pod rejected: RuntimeClass "kata" not found'}
    later_pod = {"metadata": {"name": "rollout-abcde", "creationTimestamp": "2026-11-30T10:00:02Z"}, "status": {}}
    assert tool.blocking_reason([refused], [later_pod]) is None
    assert tool.blocking_reason([refused], []).startswith("the cluster refused to create the episode pods")


def test_refusals_that_pass_on_their_own_are_not_blocking(tool):
    for message in ('pods "rollout-" is forbidden: error looking up service account ns/default: serviceaccount '
                    '"default" not found',
                    'pods "rollout-" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2'):
        event = {"reason": "FailedCreate", "lastTimestamp": "2026-11-30T10:00:01Z", "message": "Error creating: " + message}
        assert tool.blocking_reason([event], []) is None


@pytest.mark.parametrize("ending", ["expired", "close"])
def test_watches_that_end_do_not_break_the_run(make_cluster, run_tool, tmp_path, ending):
    cluster = make_cluster({"watchEnds": {"afterSeconds": 0.5, "with": ending}, "profile": "vm-sandbox"})
    result = run_tool("run", "--count", "3", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 3


def test_etcd_errors_on_reads_after_completion_are_retried(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [
        {"verb": "list", "resource": "pods", "times": 2, "kind": "etcd-leader-changed", "afterJobComplete": True}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "etcdserver: leader changed; retrying" in result.stderr


def test_reads_failing_after_completion_keep_what_the_watches_saw(make_cluster, run_tool, tmp_path):
    # Every list of pods fails once the Job is complete (more often than the retries): the
    # watches already hold the finished Job and its pods, so the results are still written.
    cluster = make_cluster({"transientFailures": [
        {"verb": "list", "resource": "pods", "times": 12, "kind": "etcd-leader-changed", "afterJobComplete": True}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert "results.json is written, but archiving the episode logs and events failed" in result.stderr
    assert "etcdserver: leader changed" in result.stderr
    assert "Clean up with:" in result.stderr
    out = tmp_path / "out"
    assert read(out / "job.json")["status"]["succeeded"] == 2
    assert all(pod["status"]["phase"] == "Succeeded" for pod in read(out / "pods.json"))
    assert read(out / "results.json")["successful_episodes"] == 2


def test_a_create_answered_with_an_etcd_error_after_commit_is_adopted(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [
        {"verb": "create", "resource": "namespaces", "times": 1, "kind": "etcd-leader-changed", "afterCommit": True}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    receipt = read(tmp_path / "out" / "receipt.json")
    assert receipt["uid"] == cluster.get_json("namespace", receipt["namespace"])["metadata"]["uid"]


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


def test_an_unpullable_image_timeout_names_the_pull_error_and_keeps_the_pods(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    result = run_tool("run", "--count", "2", "--image", "nosuch:1", "--timeout", "3", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result
    # the waiting reason flips from ErrImagePull to ImagePullBackOff a moment after the failed pull
    assert re.search(r'pods not running: (ErrImagePull: failed to pull and unpack image "docker.io/library/nosuch:1"|'
                     r'ImagePullBackOff: Back-off pulling image "nosuch:1")', result.stderr), result.stderr
    pods = read(tmp_path / "out" / "pods.json")
    assert len(pods) == 2  # the Job controller deleted them; the watch kept their last state
    assert "pods_seen_only_by_watch" in read(tmp_path / "out" / "run.json")


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
    assert not (tmp_path / "out" / "results.json").exists()


def test_custom_episodes_on_a_skewed_node_never_report_a_negative_batch_time(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "clockOffsetSeconds": -5}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i} for i in range(2)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert results["batch_to_all_ready_seconds"] is None
    assert results["pod_to_ready_p50_seconds"] is None
    finding = results["clock_skew"]["findings"][0]
    assert (finding["node"], finding["clock"], finding["direction"]) == ("kind-worker", "episode", "behind")
    assert 2.0 <= finding["at_least_seconds"] <= 5.0  # a lower bound of the 5 s (whole-second API times)
    phrase = "the episode clock on node kind-worker is at least %.1f s behind the API server" % finding[
        "at_least_seconds"]
    assert results["clock_skew"]["headline_withheld"] == phrase
    assert finding["bound"].startswith("an episode cannot start before its pod's creation")
    assert "warning: clock skew: " + phrase in result.stderr


def test_pod_scheduled_is_on_the_api_server_clock(tool):
    definition = tool.phase_definition("scheduling")
    assert (definition["clocks"], definition["mixed_clocks"]) == (["api-server"], False)


def test_a_kubelet_eviction_of_the_builtin_episode_is_named_as_such(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "evictFirstPod": True}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "was evicted (The node was low on resource: memory" in result.stderr


def test_a_drain_that_fails_a_builtin_batch_names_the_eviction_of_a_pod_still_in_its_grace_period(
        make_cluster, run_tool, tmp_path):
    # A drain evicts the first pod; with backoffLimit 0 and no failure policy the Job
    # controller counts the deleted pod as failed at once and the Job fails, while the pod,
    # whose `python` (PID 1) ignores SIGTERM, is still Running in its grace period.
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "apiEvictFirstPodAfterSeconds": 0.05}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: Job rollout failed (BackoffLimitExceeded: Job has reached the specified "
                           "backoff limit)"), result.stderr
    # named whatever phase the watch last saw it in: still Running, or finished inside its grace period
    assert re.search(r"pod rollout-\w+ was evicted \(Eviction API: evicting\); it (was still Running, in its grace "
                     r"period|finished anyway inside its grace period, but the Job had counted it as failed)", line), line
    assert (tmp_path / "out" / "pods.json").exists() and (tmp_path / "out" / "events.txt").exists()


def test_an_api_eviction_inside_the_grace_period_keeps_the_custom_reward(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "apiEvictFirstPodAfterSeconds": 0.3}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 0.5, "sleep": 1, "termination_message": True}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert results["infrastructure_failures"] == []
    assert [row["reward"] for row in results["pods"]] == [0.5]
    assert len(read(tmp_path / "out" / "run.json")["pods_seen_only_by_watch"]) == 1


def test_an_evicted_episode_that_finishes_inside_its_grace_period_keeps_its_reward(make_cluster, run_tool,
                                                                                   tmp_path):
    # no termination message: the reward is only in the log, which goes with the pod when its
    # grace period ends; the log is followed from the eviction on (issue 32 item 6). The episode
    # goes on 4 s after its eviction: the window in which the run must start following (with 1 s,
    # a machine at a load average of 17 lost the race, as a real cluster's client may)
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "apiEvictFirstPodAfterSeconds": 0.3}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 0.5, "sleep": 4}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    results = read(out / "results.json")
    assert results["infrastructure_failures"] == [] and [row["reward"] for row in results["pods"]] == [0.5]
    [gone] = read(out / "run.json")["pods_seen_only_by_watch"]
    assert read(out / "logs.json")[gone].startswith("GET pods/NAME/log?follow=true through the run's kubectl proxy")


def test_a_retried_evicted_attempt_is_listed_among_failed_attempts(make_cluster, run_tool, tmp_path):
    # This episode handles SIGTERM and exits 143: the evicted attempt fails, is deleted by the
    # API server, and the Job controller replaces it (DisruptionTarget is ignored, not counted).
    # The drain comes after the ready event, so the handler is in place: on a loaded machine a
    # drain 0.3 s after start came before it and the episode (PID 1) ignored SIGTERM and succeeded.
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "apiEvictFirstPodAfterSeconds": 0.2,
                                       "apiEvictFirstPodAfterLogLine": '"event": "ready"'}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "sleep": 2, "on_sigterm": "exit"}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    row = read(tmp_path / "out" / "results.json")["pods"][0]
    assert [attempt["reason"] for attempt in row["failed_attempts"]] == ["evicted: Eviction API: evicting"]


def test_sigterm_saves_what_is_known_and_exits_143(make_cluster, tmp_path):
    _, code, stderr = interrupt_a_run(make_cluster, tmp_path, signal.SIGTERM)
    assert code == 143, stderr
    assert "Error: terminated (SIGTERM)" in stderr
    assert "Clean up with:" in stderr
    assert len(read(tmp_path / "out" / "pods.json")) == 2
    # what only the watch saw is kept on this way out too, and the line says what stops it at once
    assert (tmp_path / "out" / "observed.json").exists()
    assert "(interrupt again to stop at once)" in stderr and "Ctrl-C again" not in stderr


POD_PATHS_EPISODE = '''import json, os, time
started = time.time()
assert os.path.exists("/demo/episode.py"), "the ConfigMap is mounted at /demo"
with open("/workspace/scratch.txt", "w") as scratch:  # the emptyDir at /workspace
    scratch.write("ok")
events = []
for event in ("ready", "reward"):
    fields = dict(event=event, at=time.time(), episode_id=os.environ["EPISODE_ID"])
    if event == "ready":
        fields.update(started_at=started, imports_done_at=started)
    else:
        fields.update(reward=1, cwd=os.getcwd())
    events.append(json.dumps(fields))
    print(events[-1], flush=True)
with open("/dev/termination-log", "w") as message:
    message.write("\\n".join(events) + "\\n")
'''


def run_pod_program(make_cluster, run_tool, tmp_path, source, count):
    """Run an episode program written for a pod (real pod paths) through the simulated cluster."""
    cluster = make_cluster()
    if "pod mount namespaces: on" not in (cluster.state / "server.log").read_text():
        pytest.skip("per-pod mount namespaces need root and a working `unshare --mount` here")
    episode = tmp_path / "episode_for_a_pod.py"
    episode.write_text(source)
    result = run_tool("run", "--episode", str(episode), "--count", str(count), "--output", "out", cluster=cluster)
    assert result.code == 0, result
    return read(tmp_path / "out" / "results.json")


def test_an_episode_written_for_a_pod_runs_unchanged(make_cluster, run_tool, tmp_path):
    rows = run_pod_program(make_cluster, run_tool, tmp_path, POD_PATHS_EPISODE, 2)["pods"]
    assert [row["events_source"] for row in rows] == ["termination-message"] * 2
    assert [row["reward_fields"]["cwd"] for row in rows] == ["/", "/"]


# The tutorial's own episode program (its WORKER, as the seed ships it): it writes /workspace
# directly, with no RL_WORKSPACE fallback.
TUTORIAL_WORKER = """import json, os, pathlib, subprocess, time
p = pathlib.Path('/workspace')
os.chdir(p)
p.joinpath('shipping.py').write_text('def shipping(total):\\n    return 0 if total > 99 else 10\\n')
p.joinpath('test_shipping.py').write_text('''import unittest
from shipping import shipping
class ShippingTest(unittest.TestCase):
    def test_below(self): self.assertEqual(shipping(98), 10)
    def test_boundary(self): self.assertEqual(shipping(99), 0)
    def test_above(self): self.assertEqual(shipping(100), 0)
if __name__ == '__main__': unittest.main()
''')
def emit(event, **data):
    print(json.dumps(dict(event=event, at=time.time(), episode_id=os.environ['EPISODE_ID'], **data)), flush=True)
def test():
    result = subprocess.run(['python', '-B', 'test_shipping.py'], text=True, capture_output=True, timeout=20)
    return result.returncode, result.stderr
emit('ready')
before, before_output = test()
if before == 0:
    raise RuntimeError('baseline must fail the boundary test')
p.joinpath('shipping.py').write_text(p.joinpath('shipping.py').read_text().replace('total > 99', 'total >= 99'))
after, after_output = test()
emit('reward', reward=int(after == 0), baseline_exit=before, tests_exit=after, tests_output=after_output)
if after != 0:
    raise RuntimeError('patched code failed its tests')
"""


def test_the_tutorials_own_episode_runs_unchanged(make_cluster, run_tool, tmp_path):
    results = run_pod_program(make_cluster, run_tool, tmp_path, TUTORIAL_WORKER, 3)
    assert (results["successful_episodes"], results["reward_sum"]) == (3, 3)
    assert {row["reward_fields"]["baseline_exit"] for row in results["pods"]} == {1}


def test_transient_kubectl_failures_are_retried(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [{"verb": "list", "resource": "events", "times": 2}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Error from server (InternalError)" in result.stderr and "retrying in" in result.stderr
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 2


def test_a_create_that_timed_out_after_commit_is_adopted_not_repeated(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [{"verb": "create", "resource": "jobs", "times": 1,
                                                   "kind": "timeout-after-commit"}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    receipt = read(tmp_path / "out" / "receipt.json")
    jobs = cluster.get_json("-n", receipt["namespace"], "jobs")["items"]
    assert [job["metadata"]["uid"] for job in jobs] == [receipt["job_uid"]]
    calls = cluster.calls()
    creates = [index for index, call in enumerate(calls) if "create" in call]
    assert len(creates) == 3  # namespace, configmap, Job: never a second create of the Job
    assert calls[creates[-1] + 1][3:6] == ["get", "-n", receipt["namespace"]]  # it looked, found it, adopted it


# ---------------------------------------------------------------- client rate limits of a default installation

@pytest.mark.parametrize("rates, spread", [({"jobController": [2, 3]}, (2, 10)), ("unlimited", (0, 1))])
def test_the_job_controller_creates_pods_no_faster_than_its_client_rate_limit(make_cluster, run_tool, tmp_path,
                                                                              rates, spread):
    # 9 pods with a burst of 3 at 2 a second: the last is created 3 s after the first
    cluster = make_cluster({"clientRates": rates})
    done = run_tool("run", "--no-runtime-class", "--count", "9", "--output", "out", cluster=cluster)
    assert done.code == 0, done
    created = sorted(pod["metadata"]["creationTimestamp"] for pod in read(tmp_path / "out" / "pods.json"))
    seconds = int(created[-1][17:19]) - int(created[0][17:19]) + 60 * (int(created[-1][14:16]) - int(created[0][14:16]))
    assert spread[0] <= seconds <= spread[1], created


# ---------------------------------------------------------------- a create whose answer was lost

@pytest.mark.parametrize("resource, uid_key", [("namespaces", "uid"), ("configmaps", None), ("jobs", "job_uid")])
def test_a_create_the_server_committed_but_answered_with_a_transport_error_is_adopted(make_cluster, run_tool,
                                                                                      tmp_path, resource, uid_key):
    # kubectl: error: error when creating "STDIN": Post "https://...": unexpected EOF (not a refusal)
    cluster = make_cluster({"transientFailures": [
        {"verb": "create", "resource": resource, "times": 1, "kind": "connection-lost", "afterCommit": True}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    receipt = read(tmp_path / "out" / "receipt.json")
    if uid_key == "uid":
        assert receipt["uid"] == cluster.get_json("namespace", receipt["namespace"])["metadata"]["uid"]
    elif uid_key == "job_uid":
        assert receipt["job_uid"] == cluster.get_json("-n", receipt["namespace"], "job", "rollout")["metadata"]["uid"]
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_a_skewed_node_never_reports_a_negative_duration_in_rows_or_phases(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "clockOffsetSeconds": -5}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i} for i in range(2)])
    assert run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster).code == 0
    results = read(tmp_path / "out" / "results.json")
    for row in results["pods"]:
        assert row["pod_to_ready_seconds"] is None and row["batch_to_ready_seconds"] is None
        assert all(value is None or value >= -1.0 for value in row["phases"].values()), row["phases"]
        assert row["phase_notes"]["sandbox_start"].startswith("withheld: the kubelet clock on node kind-worker is "
                                                              "at least")
    for name, phase in results["phases"].items():
        assert phase["min"] is None or phase["min"] >= -1.0, (name, phase["min"])  # within the API's resolution
    report = run_tool("report", "out", "--json")
    assert report.code == 0, report
    assert not any(value and value.startswith("-") and not value.startswith("-0")
                   for row in json.loads(report.stdout)["rows"] for value in row["values"])
    assert (tmp_path / "out" / "timeline.svg").exists()


def test_a_retry_note_names_the_whole_kubectl_command(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [{"verb": "list", "resource": "events", "times": 1}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    assert re.search(r"kubectl -n %s get events --sort-by=.metadata.creationTimestamp: Error from server "
                     r"\(InternalError\): .*; retrying in" % namespace, result.stderr), result.stderr
