"""Bring-your-own episodes, infrastructure failures kept apart from rewards, the local backend."""

import json
from pathlib import Path

import pytest

from conftest import ROOT

EPISODE = str(ROOT / "tests" / "episodes" / "scripted.py")


def read(path):
    return json.loads(Path(path).read_text())


def write_tasks(path, tasks):
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return str(path)


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
    assert failures[3] == "never ready: no ready event"


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


def test_the_built_in_task_keeps_the_strict_checks_on_the_local_backend(run_tool, tmp_path):
    result = run_tool("run", "--backend", "local", "--count", "3", "--output", "out")
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (3, 3, 3)
    assert results["runtime"] == "local-process" and list(results["nodes"])[0].startswith("local:")
    assert "infrastructure_failures" not in results
    assert results["phases"]["module_import"]["clocks"] == ["local"]
    assert results["pods"][0]["phase_notes"]["scheduling"] == "local backend: no scheduler and no sandbox"
    cleanup = run_tool("cleanup", "--output", "out")
    assert cleanup.code == 0 and cleanup.stdout.startswith("Nothing to clean up")


def test_local_backend_honours_parallelism(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "4", "--parallelism", "1", "--output", "out").code == 0
    rows = sorted(read(tmp_path / "out" / "results.json")["pods"], key=lambda row: row["times"]["pod_created"])
    for earlier, later in zip(rows, rows[1:]):
        assert earlier["times"]["container_finished"] <= later["times"]["pod_created"]


def test_report_sets_a_local_baseline_beside_a_cluster_run(cluster, run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "3", "--output", "bare").code == 0
    assert run_tool("run", "--count", "3", "--output", "sandbox", cluster=cluster).code == 0
    table = run_tool("report", "bare", "sandbox", "--label", "bare process", "--label", "cube")
    assert table.code == 0, table
    assert table.stdout.splitlines()[0] == "| measure | bare process | cube |"


def test_an_oversized_task_file_is_refused_before_any_change(cluster, run_tool, tmp_path):
    big = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "blob": "x" * 100000} for i in range(11)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", big, "--allow-large", "--output", "out", cluster=cluster)
    assert result.code == 2
    assert "makes a ConfigMap of 1100" in result.stderr and "over Kubernetes' limit of 1048576 (1 MiB)" in result.stderr
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


@pytest.mark.parametrize("args, message", [
    (["--tasks", "t.jsonl"], "--tasks needs --episode"),
    (["--retries", "2"], "--retries needs --episode"),
    (["--backend", "local", "--prewarm"], "--prewarm is for the kubernetes backend"),
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


def test_the_worked_example_runs_locally(run_tool, tmp_path):
    result = run_tool("run", "--backend", "local", "--episode", str(ROOT / "examples" / "sum_episode.py"),
                      "--tasks", str(ROOT / "examples" / "sum_tasks.jsonl"), "--output", "sums")
    assert result.code == 0, result
    results = read(tmp_path / "sums" / "results.json")
    assert results["rewards"]["count"] == 4 and results["reward_sum"] == 2.0


def test_an_old_server_gets_a_warning_about_per_episode_retries(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"kubernetesVersion": "v1.27.3"})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert "warning: the server is Kubernetes v1.27.3; per-episode retries (backoffLimitPerIndex) need 1.29" \
        in result.stderr
