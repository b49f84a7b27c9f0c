"""A newcomer's first hour: interruptions, pipes, odd files and refusals end in one clear line
and the right exit code, with no traceback, temporary folder or process left behind."""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import pytest

from conftest import SCRIPT
from test_custom import read, write_tasks

SLOW_EPISODE = '''import os, pathlib, time
pathlib.Path(os.environ["PID_DIR"], str(os.getpid())).write_text("")
time.sleep(60)
'''


def test_ctrl_c_twice_on_a_local_batch_stops_every_episode_and_leaves_nothing(tmp_path):
    episode, pids, scratch = tmp_path / "slow.py", tmp_path / "pids", tmp_path / "tmp"
    episode.write_text(SLOW_EPISODE)
    pids.mkdir()
    scratch.mkdir()
    env = dict(os.environ, PID_DIR=str(pids), TMPDIR=str(scratch))
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "local", "--episode", str(episode),
                                "--count", "6", "--output", "out"], cwd=str(tmp_path), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 6:
        assert time.monotonic() < deadline, "the episodes never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - started < 5, "the episodes were waited for instead of stopped"
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "Error: interrupted"
    assert list(scratch.iterdir()) == []  # no temporary folder left
    time.sleep(0.2)
    for pid in (int(path.name) for path in pids.iterdir()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert (tmp_path / "out" / "pods.json").exists() and (tmp_path / "out" / "job.json").exists()


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_a_run_piped_into_head_ends_cleanly(make_cluster, tmp_path, backend):
    env = make_cluster().env() if backend == "kubernetes" else dict(os.environ)
    done = subprocess.run('"%s" "%s" run --backend %s --count 2 --output out | head -1; echo "exit ${PIPESTATUS[0]}"'
                          % (sys.executable, SCRIPT, backend), shell=True, executable="/bin/bash",
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines()[-1] == "exit 0", done
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 2


def local_results(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "2", "--output", "out").code == 0
    return tmp_path / "out"


def test_a_timeline_into_a_missing_folder_is_one_line(run_tool, tmp_path):
    local_results(run_tool, tmp_path)
    result = run_tool("report", "out", "--timeline", "/no/such/dir/t.svg")
    assert result.code == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: cannot write the timeline to /no/such/dir/t.svg: No such file or directory"]


@pytest.mark.parametrize("content, holds", [("{}", "it lacks episodes"), ("[]", "it holds list")])
def test_a_results_file_of_the_wrong_shape_is_one_line(run_tool, tmp_path, content, holds):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "results.json").write_text(content)
    result = run_tool("report", "odd")
    assert result.code == 1, result
    line, = result.stderr.strip().splitlines()
    assert line.startswith("Error: odd/results.json is not the results of rl-batch-demo") and holds in line


def test_a_receipt_that_is_not_an_object_is_one_line(run_tool, tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "receipt.json").write_text("[]")
    result = run_tool("cleanup", "--output", "odd")
    assert result.code == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: odd/receipt.json is not the receipt of rl-batch-demo: a JSON object was expected, it holds list"]


def test_a_run_refused_by_a_read_only_check_leaves_no_folder(cluster, run_tool, tmp_path):
    result = run_tool("run", "--context", "nosuch", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert "context was not found for specified context: nosuch" in result.stderr
    assert "cleanup" not in result.stderr
    assert not (tmp_path / "out").exists()


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


@pytest.mark.parametrize("flags", [["--image", "python:3.13"], ["--runtime", "kata"], ["--no-runtime-class"],
                                   ["--force"], ["--context", "kind-rl"]])
def test_cluster_only_flags_are_refused_alike_by_the_local_backend(run_tool, tmp_path, flags):
    result = run_tool("run", "--backend", "local", *flags, "--output", "out")
    assert result.code == 2, result
    assert "%s is for the kubernetes backend" % flags[0] in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_terminal_gets_a_human_summary_and_scripts_keep_the_json(tmp_path):
    import pty
    leader, follower = pty.openpty()
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--backend", "local", "--count", "2", "--output", "out"],
                          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert done.returncode == 0
    assert json.loads(done.stdout)["successful_episodes"] == 2
    text = shown.decode()
    assert "Done: 2 episodes, 2 with a reward (sum 2)." in text
    assert "Results: out/results.json" in text and "Clean up" not in text


def test_local_runs_are_titled_and_footnoted_as_local(run_tool, tmp_path):
    out = local_results(run_tool, tmp_path)
    assert "context None" not in (out / "timeline.svg").read_text()
    assert "local backend" in (out / "timeline.svg").read_text()
    report = run_tool("report", "out")
    assert report.code == 0 and "uses Kubernetes timestamps" not in report.stdout
    assert " *" not in report.stdout
