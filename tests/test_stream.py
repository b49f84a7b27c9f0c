"""run --stream: each episode on stdout as soon as it is verified, on every backend, agreeing
with results.json; the summary or the error as the last line; Ctrl-C while streaming."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import EPISODE, SCRIPT, read, write_tasks

AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}
ENTRY_KEYS = ("task", "reward", "episode", "attempts", "infrastructure_failure")


@pytest.fixture(params=["kubernetes", "warm-pool", "local"])
def backend(request, make_cluster):
    """The same test on each backend: the simulated cluster (with agent-sandbox for the warm pool)
    or none."""
    cluster = {"kubernetes": lambda: make_cluster(), "warm-pool": lambda: make_cluster(AGENT_SANDBOX),
               "local": lambda: None}[request.param]()
    return request.param, cluster


def start_streaming(tmp_path, backend, *args):
    """`run --stream` started in the background, as a training loop's shell would."""
    name, cluster = backend
    argv = [sys.executable, str(SCRIPT), "run", "--backend", name, "--stream", "--output", "out", *args]
    if name != "local":
        argv.append("--no-runtime-class")
    return subprocess.Popen(argv, cwd=str(tmp_path), env=cluster.env() if cluster else dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def episode_lines(stdout):
    lines = [json.loads(line) for line in stdout.splitlines()]
    return [line for line in lines if line["type"] == "episode"], lines[-1]


def test_an_early_episode_is_on_stdout_while_a_slow_one_still_runs(backend, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1}, {"id": 1, "reward": 0.5, "sleep": 10}])
    process = start_streaming(tmp_path, backend, "--episode", EPISODE, "--tasks", tasks)
    first = json.loads(process.stdout.readline())
    # the slow episode still runs: no results yet
    assert process.poll() is None and not (tmp_path / "out" / "results.json").exists()
    assert (first["type"], first["task"], first["reward"], first["infrastructure_failure"]) == ("episode", 0, 1, None)
    assert first["phases"]["ready_to_reward"] >= 0
    rest, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    episodes, summary = episode_lines(json.dumps(first) + "\n" + rest)
    assert [line["task"] for line in episodes] == [0, 1]
    assert episodes[0]["streamed_after_seconds"] + 5 < episodes[1]["streamed_after_seconds"]
    assert (summary["type"], summary["exit_code"], summary["reward_sum"]) == ("summary", 0, 1.5)


def test_streamed_lines_agree_with_results_json_and_are_kept_in_the_folder(backend, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"id": 0, "reward": 1}, {"id": 1, "mode": "crash"}, {"id": 2, "mode": "malformed"},
        {"id": 3, "reward": 0, "termination_message": True}, {"id": 4, "mode": "no_ready"}])
    process = start_streaming(tmp_path, backend, "--episode", EPISODE, "--tasks", tasks)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr
    episodes, summary = episode_lines(stdout)
    results = read(tmp_path / "out" / "results.json")
    assert sorted(({key: line[key] for key in ENTRY_KEYS} for line in episodes), key=lambda e: e["task"]) == \
        results["tasks"]
    rows = {row["index"]: row for row in results["pods"]}
    assert all(line["phases"] == rows[line["task"]]["phases"] for line in episodes if line["reward"] is not None)
    assert [json.loads(line) for line in (tmp_path / "out" / "stream.jsonl").read_text().splitlines()] == episodes
    assert (summary["exit_code"], summary["infrastructure_failures"]) == (5, 3)
    assert "disagrees" not in stderr


def test_a_retried_episode_is_streamed_once_with_its_attempts(make_cluster, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "mode": "crash_once", "marker": str(tmp_path / "m")}])
    process = start_streaming(tmp_path, ("kubernetes", make_cluster()), "--episode", EPISODE, "--tasks", tasks,
                              "--retries", "1")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    episodes, _ = episode_lines(stdout)
    assert [(line["task"], line["reward"], line["attempts"]) for line in episodes] == [(0, 1, 2)]
    assert read(tmp_path / "out" / "results.json")["tasks"][0]["attempts"] == 2


def test_an_episode_the_job_gave_up_on_is_streamed_before_the_batch_ends(make_cluster, tmp_path):
    # index 0 fails twice (one retry), and the Job controller marks it failed while index 1 still runs:
    # on a real cluster that takes two pod starts, two status reports and batched syncs, and the
    # index's 10 s back-off (~17 s with runc, ~25 s in a VM sandbox), so index 1 runs for 30 s
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "mode": "crash"}, {"id": 1, "reward": 1, "sleep": 30}])
    process = start_streaming(tmp_path, ("kubernetes", make_cluster()), "--episode", EPISODE, "--tasks", tasks,
                              "--retries", "1")
    first = json.loads(process.stdout.readline())
    assert process.poll() is None and not (tmp_path / "out" / "results.json").exists()
    assert (first["task"], first["reward"], first["attempts"]) == (0, None, 2)
    assert first["infrastructure_failure"] == "crashed: exit code 3 (RuntimeError: the sandbox lost its tools)"
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr


def test_the_built_in_episode_streams_each_pod_with_no_task_index(cluster, tmp_path):
    process = start_streaming(tmp_path, ("kubernetes", cluster), "--count", "3")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    episodes, summary = episode_lines(stdout)
    results = read(tmp_path / "out" / "results.json")
    assert sorted(line["episode"] for line in episodes) == sorted(row["pod"] for row in results["pods"])
    assert {(line["task"], line["reward"], line["attempts"]) for line in episodes} == {(None, 1, 1)}
    assert summary["successful_episodes"] == 3


def test_the_summary_line_is_the_usual_summary_on_one_line(tmp_path, run_tool):
    plain = run_tool("run", "--backend", "local", "--count", "2", "--output", "plain")
    assert plain.code == 0
    process = start_streaming(tmp_path, ("local", None), "--count", "2")
    stdout, _ = process.communicate(timeout=120)
    _, summary = episode_lines(stdout)
    assert len(stdout.splitlines()) == 3
    assert set(summary) == {"type", "exit_code"} | set(json.loads(plain.stdout))


def test_a_failed_run_ends_the_stream_with_its_error_line(tmp_path):
    (tmp_path / "out").mkdir()
    process = start_streaming(tmp_path, ("local", None), "--count", "2")
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    line = json.loads(stdout)
    assert line == {"type": "error", "exit_code": 1, "error": stderr.strip()[len("Error: "):]}
    assert line["error"].startswith("output folder out already exists")


def test_stream_with_dry_run_is_a_usage_error(run_tool):
    result = run_tool("run", "--stream", "--dry-run")
    assert result.code == 2
    assert "error: --stream streams a run's episodes; --dry-run runs none" in result.stderr


@pytest.mark.parametrize("where", ["kubernetes", "warm-pool", "local"])
def test_ctrl_c_while_streaming_keeps_what_was_streamed_and_ends_with_the_error_line(where, make_cluster, tmp_path):
    # An episode cut short by the tool's own shutdown has no verdict: never streamed, whatever the
    # backend (a warm pool's cut exec stream once blamed "an outage, a restart").
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1},
                                                   {"id": 1, "sleep": 60, "on_sigterm": "exit"}])
    cluster = {"kubernetes": lambda: make_cluster(),
               "warm-pool": lambda: make_cluster(AGENT_SANDBOX),
               "local": lambda: None}[where]()
    process = start_streaming(tmp_path, (where, cluster), "--episode", EPISODE, "--tasks", tasks)
    first = json.loads(process.stdout.readline())
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert [json.loads(line) for line in rest.splitlines()] == [
        {"type": "error", "exit_code": 130, "error": "interrupted"}]
    assert [json.loads(line) for line in (tmp_path / "out" / "stream.jsonl").read_text().splitlines()] == [first]
    assert first["task"] == 0 and not (tmp_path / "out" / "results.json").exists()
    if where != "local":
        assert "Interrupted. Clean up with: " in stderr


def test_an_episode_the_deadline_cut_short_is_streamed_at_the_end_before_the_summary(make_cluster, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1},
                                                   {"id": 1, "sleep": 60, "on_sigterm": "exit"}])
    process = start_streaming(tmp_path, ("kubernetes", make_cluster()), "--episode", EPISODE, "--tasks", tasks,
                              "--timeout", "8")
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr
    episodes, summary = episode_lines(stdout)
    assert [(line["task"], line["reward"]) for line in episodes] == [(0, 1), (1, None)]
    assert episodes[1]["infrastructure_failure"] == read(tmp_path / "out" / "results.json")["tasks"][1][
        "infrastructure_failure"]
    assert episodes[1]["streamed_after_seconds"] > 8 and summary["type"] == "summary"
    # named by what cut it short, not as a crash or a pod that did not finish
    assert "cut short by the deadline (the Job's activeDeadlineSeconds, 8 s, from --timeout)" in json.dumps(
        episodes[1]["infrastructure_failure"]), episodes[1]
