"""The local backend: episodes as local processes, no cluster."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, SCRIPT, read, wait_for


def test_the_built_in_task_keeps_the_strict_checks_on_the_local_backend(run_tool, tmp_path):
    result = run_tool("run", "--backend", "local", "--count", "3", "--output", "out")
    assert result.code == 0, result
    results = read(tmp_path / "out" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (3, 3, 3)
    assert results["runtime"] == "local-process" and list(results["nodes"])[0].startswith("local:")
    assert "infrastructure_failures" not in results
    # rewards are one type, whatever the episode wrote (the built-in one writes 1)
    assert isinstance(results["reward_sum"], float) and all(isinstance(row["reward"], float) for row in results["pods"])
    assert results["phases"]["module_import"]["clocks"] == ["local"]
    assert results["pods"][0]["phase_notes"]["scheduling"] == "local backend: no scheduler and no sandbox"
    cleanup = run_tool("cleanup", "--output", "out")
    assert cleanup.code == 0 and cleanup.stderr.startswith("Nothing to clean up")


def test_local_backend_honours_parallelism(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "4", "--parallelism", "1", "--output", "out").code == 0
    rows = sorted(read(tmp_path / "out" / "results.json")["pods"], key=lambda row: row["times"]["pod_created"])
    for earlier, later in zip(rows, rows[1:]):
        assert earlier["times"]["container_finished"] <= later["times"]["pod_created"]


def test_the_worked_example_runs_locally(run_tool, tmp_path):
    result = run_tool("run", "--backend", "local", "--episode", str(ROOT / "examples" / "sum_episode.py"),
                      "--tasks", str(ROOT / "examples" / "sum_tasks.jsonl"), "--output", "sums")
    assert result.code == 0, result
    results = read(tmp_path / "sums" / "results.json")
    assert results["rewards"]["count"] == 4 and results["reward_sum"] == 2.0


SLOW_EPISODE = '''import os, pathlib, time
pathlib.Path(os.environ["PID_DIR"], str(os.getpid())).write_text("")
time.sleep(60)
'''


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_twice_on_a_local_batch_stops_every_episode_and_leaves_nothing(tmp_path):
    episode, pids, scratch = tmp_path / "slow.py", tmp_path / "pids", tmp_path / "tmp"
    episode.write_text(SLOW_EPISODE)
    pids.mkdir()
    scratch.mkdir()
    env = dict(os.environ, PID_DIR=str(pids), TMPDIR=str(scratch))
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "local", "--episode", str(episode),
                                "--count", "6", "--output", "out"], cwd=str(tmp_path), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a safety net against a hang, not a bound
    while len(list(pids.iterdir())) < 6:
        assert time.monotonic() < deadline, "the episodes never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    first = process.stderr.readline()  # the tool took the first Ctrl-C and says so
    assert first.startswith("Interrupted"), first
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    # the episodes sleep 60 s: stopped, not waited for, or this times out
    _, stderr = process.communicate(timeout=30)
    stderr = first + stderr
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "Error: interrupted"
    assert list(scratch.iterdir()) == []  # no temporary folder left
    for pid in (int(path.name) for path in pids.iterdir()):
        wait_for("episode %d to be gone" % pid, lambda: not process_exists(pid))
    assert (tmp_path / "out" / "pods.json").exists() and (tmp_path / "out" / "job.json").exists()
    # none had finished: every record says it was interrupted, and job.json counts none finished
    status = read(tmp_path / "out" / "job.json")["status"]
    assert (status["finished_episodes"], status["interrupted_episodes"]) == (0, 6)
    assert {record["status"]["reason"] for record in read(tmp_path / "out" / "pods.json")} == {"Interrupted"}


@pytest.mark.parametrize("flags", [["--image", "python:3.13"], ["--runtime", "kata"], ["--no-runtime-class"],
                                   ["--force"], ["--context", "kind-rl"]])
def test_cluster_only_flags_are_refused_alike_by_the_local_backend(run_tool, tmp_path, flags):
    result = run_tool("run", "--backend", "local", *flags, "--output", "out")
    assert result.code == 2, result
    assert "%s is for a backend on a cluster; --backend local runs without one" % flags[0] in result.stderr
    assert not (tmp_path / "out").exists()


def test_list_shows_a_local_run_without_kubectl(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "2", "--output", "out").code == 0
    # no kubectl at all: the local run is still listed, from its folder
    done = run_tool("list", env={"KUBECTL": "/nonexistent/kubectl"})
    assert done.code == 0, done
    [row] = [line for line in done.stdout.splitlines() if line.endswith(" out")]
    assert "ran on this machine: nothing to clean up" in row and "2/2 done, 0 failed" in row
    assert "warning: runs on a cluster not listed: " in done.stderr
    rows = json.loads(run_tool("list", "--json", env={"KUBECTL": "/nonexistent/kubectl"}).stdout)
    assert [(r["backend"], r["namespace"], r["succeeded"]) for r in rows] == [("local", None, 2)]


def test_list_in_an_empty_folder_without_a_context_finds_nothing_and_is_no_error(run_tool, tmp_path):
    done = run_tool("list", env={"KUBECONFIG": str(tmp_path / "no-kubeconfig")})
    assert done.code == 0, done
    assert done.stdout == "No runs of rl-batch-demo in . (none on a cluster could be listed: see the warning).\n"
    assert done.stderr.startswith("warning: runs on a cluster not listed: no current kubectl context")


def test_list_on_a_named_context_the_kubeconfig_lacks_shows_the_local_runs_then_fails(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "1", "--output", "out").code == 0
    done = run_tool("list", "--context", "nosuch", env={"KUBECONFIG": str(tmp_path / "no-kubeconfig")})
    assert done.code == 1, done
    assert [line for line in done.stdout.splitlines() if line.endswith(" out")]  # what was found here
    assert done.stderr.strip().splitlines()[-1].startswith(
        "Error: runs on context nosuch not listed (the 1 found here are above): context nosuch does not exist in "
        "the kubeconfig")
    assert "kubectl proxy" not in done.stderr  # refused before any kubectl but `config`


# --- the deadline (--timeout): episodes named by what ended them ------------------------------

def run_past_the_deadline(run_tool, tmp_path, count, parallelism):
    from conftest import EPISODE, write_tasks
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 3600}] * count)
    result = run_tool("run", "--backend", "local", "--episode", EPISODE, "--tasks", tasks, "--parallelism",
                      str(parallelism), "--timeout", "2", "--output", "out")
    return result, read(tmp_path / "out" / "results.json")["infrastructure_failures"]


def test_an_episode_killed_at_the_deadline_is_named_so_not_crashed(run_tool, tmp_path):
    result, failures = run_past_the_deadline(run_tool, tmp_path, 2, 2)
    assert result.code == 5, result
    assert [failure["reason"] for failure in failures] == [
        "cut short by the deadline (the batch's, 2 s, from --timeout) (exit code 137: killed at the deadline)"] * 2
    assert "2 of them ended by the deadline: raise --timeout if the episodes need longer" in result.stderr
    assert read(tmp_path / "out" / "job.json")["status"]["conditions"][0]["reason"] == "DeadlineExceeded"


def test_an_episode_whose_turn_came_after_the_deadline_never_starts_and_is_named_so(run_tool, tmp_path):
    result, failures = run_past_the_deadline(run_tool, tmp_path, 3, 1)
    assert result.code == 5, result
    assert [failure["reason"] for failure in failures[1:]] == [
        "never started: the deadline came first (the batch's, 2 s, from --timeout)"] * 2
    assert not (tmp_path / "out" / "local-1.log").exists()  # not spawned to be killed at once
