"""Bring-your-own episodes on every backend: samples and infrastructure failures kept apart,
retries, tasks."""

import json
import re

import pytest

from conftest import EPISODE, read, write_tasks


@pytest.fixture(params=["kubernetes", "local"])
def backend(request, make_cluster):
    """Run the same test through the simulated cluster and through the local backend."""
    cluster = make_cluster() if request.param == "kubernetes" else None
    return request.param, cluster


def run_backend(run_tool, backend, *args):
    name, cluster = backend
    return run_tool("run", "--backend", name, *args, cluster=cluster)


def test_mixed_rewards_are_all_samples(backend, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "reward": i % 2} for i in range(6)])
    result = run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (6, 6, 3)
    assert results["rewards"] == {"count": 6, "sum": 3, "mean": 0.5, "min": 0, "max": 1}
    assert results["infrastructure_failures"] == []
    assert sorted(row["reward"] for row in results["pods"]) == [0, 0, 0, 1, 1, 1]


def test_each_episode_gets_the_task_of_its_index(backend, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": "task-%d" % i, "reward": i} for i in range(4)])
    assert run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", tasks, "--output", "out").code == 0
    rows = read(tmp_path / "out" / "results.json")["pods"]
    assert sorted((row["index"], row["reward_fields"]["task_id"], row["reward"]) for row in rows) == [
        (i, "task-%d" % i, i) for i in range(4)]
    assert all(row["reward_fields"]["index"] == str(row["index"]) for row in rows)


def test_crash_and_malformed_events_are_infrastructure_failures_not_rewards(backend, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1}, {"id": 1, "mode": "crash"},
                                                   {"id": 2, "mode": "malformed"}, {"id": 3, "mode": "no_ready"},
                                                   {"id": 4, "reward": 0}])
    result = run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    assert result.code == 5, result
    assert "warning: 3 of 5 episodes are infrastructure failures, not samples" in result.stderr
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"]) == (2, 1)
    assert sorted(row["index"] for row in results["pods"]) == [0, 4]
    failures = {failure["index"]: failure["reason"] for failure in results["infrastructure_failures"]}
    assert failures[1] == "crashed: exit code 3 (RuntimeError: the sandbox lost its tools)"
    assert failures[2] == "malformed reward: 'high' is not a finite number"
    if backend[0] == "local":  # a local episode's log is a whole file: no kubelet rotated it
        assert failures[3] == "never ready: no ready event", failures[3]
    else:
        assert failures[3].startswith("never ready: no ready event in its log, yet a reward event: the episode did "
                                      "not emit one, or the log's beginning is gone"), failures[3]


def test_a_failed_episode_is_retried_and_then_succeeds(backend, run_tool, tmp_path):
    marker = tmp_path / "crashed-once"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1},
                                                   {"id": 1, "mode": "crash_once", "marker": str(marker)}])
    result = run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", tasks, "--retries", "1",
                         "--output", "out")
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"], results["infrastructure_failures"]) == (2, 2, [])
    retried = [row for row in results["pods"] if row["index"] == 1][0]
    assert [attempt["reason"] for attempt in retried["failed_attempts"]] == [
        "crashed: exit code 3 (RuntimeError: the sandbox lost its tools)"]


def test_a_failure_without_retries_fails_only_its_own_episode(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "mode": "crash"}] + [{"id": i} for i in range(1, 5)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 5, result
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == 4
    job = read(tmp_path / "out" / "job.json")
    assert job["status"]["failedIndexes"] == "0" and job["status"]["completedIndexes"] == "1-4"
    assert job["status"]["conditions"][-1]["reason"] == "FailedIndexes"


def test_an_evicted_episode_is_retried_without_counting_against_retries(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "evictFirstPod": True}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "sleep": 1.5} for i in range(2)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--parallelism", "1", "--output", "out",
                      cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == 2 and results["infrastructure_failures"] == []
    attempts = [attempt for row in results["pods"] for attempt in row["failed_attempts"]]
    assert len(attempts) == 1 and attempts[0]["reason"].startswith("evicted: The node was low on resource: memory")


def test_an_oversized_task_file_is_refused_before_any_change(cluster, run_tool, tmp_path):
    big = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "blob": "x" * 100000} for i in range(11)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", big, "--allow-large", "--output", "out", cluster=cluster)
    assert result.code == 2
    assert "makes a ConfigMap of 1100" in result.stderr and "over Kubernetes' limit of 1048576 (1 MiB)" in result.stderr
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


def test_a_task_file_over_a_configmaps_limit_runs_on_the_local_backend(run_tool, tmp_path):
    # the limit is Kubernetes' (the tasks travel in a ConfigMap); local episodes read files
    big = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "reward": 1, "blob": "x" * 100000} for i in range(11)])
    result = run_tool("run", "--backend", "local", "--episode", EPISODE, "--tasks", big, "--allow-large",
                      "--output", "out")
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 11


def test_a_task_file_holding_one_json_array_is_refused_with_what_to_write(run_tool, tmp_path):
    (tmp_path / "tasks.json").write_text(json.dumps([{"id": 0}, {"id": 1}]) + "\n")
    result = run_tool("run", "--backend", "local", "--episode", EPISODE, "--tasks", "tasks.json", "--output", "out")
    assert result.code == 2
    assert "--tasks tasks.json line 1 is a JSON array, not a task: write one task a line (JSON Lines)" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--tasks", "t.jsonl"], "--tasks needs --episode"),
    (["--retries", "2"], "--retries needs --episode"),
    (["--backend", "local", "--prewarm"], "--prewarm is for --backend kubernetes"),
    (["--backend", "warm-pool", "--prewarm"], "--prewarm is for --backend kubernetes"),
])
def test_flags_that_do_not_fit_together_are_usage_errors(args, message, run_tool, tmp_path):
    (tmp_path / "t.jsonl").write_text('{"id": 1}\n')
    result = run_tool("run", *args, "--output", "out")
    assert result.code == 2 and message in result.stderr


def test_count_must_match_the_tasks(run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0}, {"id": 1}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--count", "3", "--output", "out")
    assert result.code == 2 and "--count 3 differs from the 2 tasks" in result.stderr


def test_the_custom_job_is_indexed_with_per_index_retries(run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0}, {"id": 1}])
    job = json.loads(run_tool("run", "--dry-run", "--episode", EPISODE, "--tasks", tasks, "--retries", "2").stdout)[
        "items"][-1]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimitPerIndex"] == 2
    assert "backoffLimit" not in job["spec"]
    assert job["spec"]["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "TASK_FILE", "value": "/tasks/task-$(TASK_INDEX).json"} in env


def test_an_old_server_gets_a_warning_about_per_episode_retries(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"kubernetesVersion": "v1.27.3"})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert "warning: the server is Kubernetes v1.27.3; per-episode retries (backoffLimitPerIndex) need 1.29" \
        in result.stderr


def test_an_episode_printing_a_python_dict_is_still_a_sample(cluster, run_tool, tmp_path):
    episode = tmp_path / "chatty.py"
    episode.write_text('import json, os, time\n'
                       'emit = lambda event, **f: print(json.dumps(dict(event=event, at=time.time(), '
                       'episode_id=os.environ["EPISODE_ID"], **f)), flush=True)\n'
                       'emit("ready")\nprint({"step": 1})\nemit("reward", reward=0.5)\n')
    result = run_tool("run", "--episode", str(episode), "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert results["infrastructure_failures"] == [] and results["reward_sum"] == 1.0


# ---------------------------------------------------------------- in-process: what counts as a sample

def custom_pod(name="rollout-0-abc", index=0, phase="Succeeded", created="2026-11-29T10:00:01Z", message=""):
    terminated = {"exitCode": 0 if phase == "Succeeded" else 1, "reason": "Completed"}
    if message:
        terminated["message"] = message
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "spec": {"nodeName": "kind-worker"},
            "status": {"phase": phase, "containerStatuses": [{"restartCount": 0, "imageID": "img",
                                                              "state": {"terminated": terminated}}]}}


def events(name, reward=1, ready_at=1795946402.0):
    return "\n".join(json.dumps(event) for event in (
        {"event": "ready", "at": ready_at, "episode_id": name},
        {"event": "reward", "at": ready_at + 1, "episode_id": name, "reward": reward, "passed": 3}))


CUSTOM_JOB = {"metadata": {"creationTimestamp": "2026-11-29T10:00:00Z"}}


def test_sample_events_ignore_the_episodes_own_output_lines(tool):
    pod = custom_pod()
    log = "collecting tests\n{'not': 'an event'}\n" + events(pod["metadata"]["name"], 0.5) + "\nbye\n"
    ready, reward, source = tool.sample_events(pod, log, tool.POD_SCHEME)
    assert (ready["event"], reward["reward"], source) == ("ready", 0.5, "log")


def test_sample_events_prefer_the_termination_message(tool):
    pod = custom_pod(message=events("rollout-0-abc", 0.25))
    assert tool.sample_events(pod, "", tool.POD_SCHEME)[1]["reward"] == 0.25
    assert tool.sample_events(pod, "", tool.POD_SCHEME)[2] == "termination-message"


@pytest.mark.parametrize("log, reason", [
    ("", "never ready: no ready event"),
    (json.dumps({"event": "ready", "at": 1, "episode_id": "rollout-0-abc"}), "no reward: the episode was ready"),
    ('{"event": "ready", "at": 1,', 'malformed events: log line 1 names "event" but is not valid JSON'),
    (events("someone-else"), "malformed events: ready episode_id 'someone-else' is not the pod name"),
    (events("rollout-0-abc", reward="high"), "malformed reward: 'high' is not a finite number"),
])
def test_sample_events_name_the_malformation(tool, log, reason):
    with pytest.raises(tool.EpisodeInvalid, match=re.escape(reason)):
        tool.sample_events(custom_pod(), log, tool.POD_SCHEME)


def test_a_log_with_a_reward_but_no_ready_event_names_a_rotation_as_one_cause(tool):
    # what a log rotated by the kubelet keeps: the later part, its reward, not its ready event
    log = "step 9999 of the episode's own output\n" + events("rollout-0-abc").splitlines()[1] + "\n"
    with pytest.raises(tool.EpisodeInvalid) as raised:
        tool.sample_events(custom_pod(), log, tool.POD_SCHEME)
    assert str(raised.value).startswith("never ready: no ready event in its log, yet a reward event")
    assert "containerLogMaxSize" in str(raised.value) and "events seen: reward" in str(raised.value)


@pytest.mark.parametrize("scheme", ["LOCAL_SCHEME", "WARM_SCHEME"])
def test_a_log_no_kubelet_rotates_without_a_ready_event_is_never_ready_with_no_word_of_rotation(tool, scheme):
    # a local process's log file and an exec's captured output are whole: no kubelet rotated them
    log = "step 9999 of the episode's own output\n" + events("rollout-0-abc").splitlines()[1] + "\n"
    with pytest.raises(tool.EpisodeInvalid) as raised:
        tool.sample_events(custom_pod(), log, getattr(tool, scheme))
    assert str(raised.value) == "never ready: no ready event"


def test_a_pod_deleted_before_its_log_was_read_is_no_sample(tool):
    with pytest.raises(tool.EpisodeInvalid, match="no events: the pod was deleted before its log could be read"):
        tool.sample_events(custom_pod(), None, tool.POD_SCHEME)


def test_collect_samples_keeps_a_retried_index_once_and_lists_its_failed_attempt(tool):
    failed = custom_pod("rollout-0-aaa", 0, phase="Failed", created="2026-11-29T10:00:01Z")
    retried = custom_pod("rollout-0-bbb", 0, created="2026-11-29T10:00:03Z")
    other = custom_pod("rollout-1-ccc", 1)
    result = tool.collect_samples([failed, retried, other],
                                  ["boom", events("rollout-0-bbb", 0.5), events("rollout-1-ccc", 0)], CUSTOM_JOB, 2)
    assert (result["successful_episodes"], result["reward_sum"]) == (2, 0.5)
    first = next(row for row in result["pods"] if row["index"] == 0)
    assert first["pod"] == "rollout-0-bbb" and first["reward_fields"] == {"passed": 3}
    # when it ran, for the timeline: its creation (the API server's whole seconds); no end its pod said
    assert first["failed_attempts"] == [{"pod": "rollout-0-aaa", "reason": "crashed: exit code 1 (boom)",
                                         "created_at": tool.parse_k8s_time("2026-11-29T10:00:01Z"), "ended_at": None}]
    assert result["infrastructure_failures"] == []


def test_collect_samples_reports_an_index_no_pod_ran_for(tool):
    result = tool.collect_samples([custom_pod()], [events("rollout-0-abc")], CUSTOM_JOB, 2)
    assert result["infrastructure_failures"] == [
        {"index": 1, "reason": "no pod ran for this episode (see events.txt)", "attempts": []}]
    assert result["rewards"]["count"] == 1 and result["episodes"] == 2


# ---------------------------------------------------------------- output that is not UTF-8

NOT_UTF8 = b"\xff\xfe a line that is not UTF-8 \xc3\x28\n"


@pytest.mark.parametrize("count", [2, 4])  # below 4 pods each log is read alone; from 4, in one call
def test_an_episode_printing_bytes_that_are_not_utf8_is_still_a_sample(backend, run_tool, tmp_path, count):
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 1, "binary": True}] * count)
    done = run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", "tasks.jsonl", "--output", "out")
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    assert results["successful_episodes"] == count and results["reward_sum"] == count
    for row in results["pods"]:
        assert NOT_UTF8 in (tmp_path / "out" / (row["pod"] + ".log")).read_bytes()  # kept byte for byte


def test_results_list_every_task_in_task_order_with_its_reward_or_failure(backend, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 0.25}, {"id": 1, "mode": "crash"},
                                                   {"id": 2, "reward": 0.75}])
    result = run_backend(run_tool, backend, "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    assert result.code == 5, result
    by_task = read(tmp_path / "out" / "results.json")["tasks"]
    assert [(t["task"], t["reward"]) for t in by_task] == [(0, 0.25), (1, None), (2, 0.75)]
    assert by_task[1]["infrastructure_failure"].startswith("crashed: exit code 3")
    assert by_task[0]["infrastructure_failure"] is None and by_task[0]["episode"] and by_task[0]["attempts"] == 1


# ---------------------------------------------------------------- episodes written for a pod, and on a skewed node

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
