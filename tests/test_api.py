"""The Python API (import rl_batch_demo): run_batch and stream_batch as a training loop calls
them, in this process, through the local backend and the simulated cluster."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import EPISODE, ROOT, wait_for

def being_deleted(cluster, namespace):
    """The namespace is gone, or going (Terminating)."""
    done = cluster.kubectl("get", "namespace", namespace, "-o", "json", check=False)
    return done.returncode != 0 or bool(json.loads(done.stdout)["metadata"].get("deletionTimestamp"))


MIXED = [{"id": 0, "reward": 1}, {"id": 1, "mode": "crash"}, {"id": 2, "reward": 0.25}]


def test_run_batch_returns_rewards_in_task_order_with_the_infrastructure_failure_named(tool, tmp_path):
    result = tool.run_batch(backend="local", episode=EPISODE, tasks=MIXED, output=str(tmp_path / "step-1"),
                            quiet=True)
    assert result.rewards == [1, None, 0.25]
    assert result.failures == {1: "crashed: exit code 3 (RuntimeError: the sandbox lost its tools)"}
    assert result.exit_code == 5 and result.output == tmp_path / "step-1"
    assert result.results["tasks"] == result.tasks
    assert [line["task"] for line in result.streamed] and len(result.streamed) == 3


def test_a_task_list_travels_as_a_tasks_file_that_is_removed_afterwards(tool, tmp_path):
    result = tool.run_batch(backend="local", episode=EPISODE, tasks=[{"id": "a", "reward": 2}],
                            output=str(tmp_path / "out"), quiet=True)
    assert result.results["tasks"][0]["reward"] == 2
    assert result.results["run"]["flags"]["tasks"].endswith(".jsonl")
    assert not os.path.exists(result.results["run"]["flags"]["tasks"])


def test_stream_batch_yields_an_early_episode_while_a_slow_one_runs(tool, tmp_path):
    tasks = [{"id": 0, "reward": 1}, {"id": 1, "reward": 0, "sleep": 10}]
    batch = tool.stream_batch(backend="local", episode=EPISODE, tasks=tasks, output=str(tmp_path / "out"))
    first = next(batch)
    assert (first["task"], first["reward"]) == (0, 1)
    assert batch.result is None and batch.process.poll() is None
    assert [episode["task"] for episode in batch] == [1]
    assert batch.result.rewards == [1, 0] and batch.result.exit_code == 0


def test_a_refused_run_raises_run_failed_with_the_commands_line_and_exit_code(tool, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(tool.RunFailed) as refused:
        tool.run_batch(backend="local", count=2, output=str(tmp_path / "taken"))
    assert refused.value.exit_code == 1
    assert refused.value.message == ("output folder %s already exists; choose a new --output so that no experiment "
                                     "record is overwritten" % (tmp_path / "taken"))
    with pytest.raises(tool.RunFailed) as usage:
        tool.run_batch(backend="local", count=0, output=str(tmp_path / "none"))
    assert usage.value.exit_code == 2 and usage.value.message.startswith("count must be between 1 and 20")


def test_a_bad_option_value_raises_before_anything_runs_and_prints_no_usage(tool, tmp_path, capfd):
    with pytest.raises(tool.RunFailed) as usage:
        tool.run_batch(backend="local", count=0, output=str(tmp_path / "none"))
    assert usage.value.exit_code == 2 and usage.value.message.startswith("count must be between 1 and 20")
    assert capfd.readouterr().err == ""  # no argparse usage, no "see 'rl-batch-demo.py run --help'"
    assert not (tmp_path / "none").exists()


def test_a_count_over_the_bound_names_the_keyword_that_lifts_it(tool, tmp_path):
    with pytest.raises(tool.RunFailed) as usage:
        tool.run_batch(backend="local", count=25, output=str(tmp_path / "none"))
    assert usage.value.message == ("count must be between 1 and 20 (the demo's bound to keep first trials small; "
                                   "allow_large=True lifts it to 10000), got 25")


def test_a_pool_over_the_bound_is_one_line_naming_the_keyword(tool, tmp_path):
    with pytest.raises(tool.RunFailed) as usage:
        with tool.warm_pool(size=64, output=tmp_path / "pool"):
            pass
    assert usage.value.exit_code == 2
    assert "\n" not in usage.value.message and "usage:" not in usage.value.message
    assert usage.value.message.startswith("size must be between 1 and 20") and "allow_large=True" in usage.value.message
    assert not (tmp_path / "pool").exists()


def test_leaving_a_stream_early_says_nothing_on_stderr(tool, tmp_path, capfd):
    tasks = [{"id": 0, "reward": 1}, {"id": 1, "sleep": 60}]
    with tool.stream_batch(backend="local", episode=EPISODE, tasks=tasks, output=str(tmp_path / "early"),
                           quiet=True) as batch:
        for episode in batch:
            break  # the loop has what it wants
    err = capfd.readouterr().err
    assert "Interrupted" not in err and "Error:" not in err, err


def test_an_unknown_option_is_a_type_error_that_names_the_close_one(tool, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'cout'; did you mean 'count'"):
        tool.run_batch(backend="local", cout=2, output=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_failed_batch_on_the_cluster_raises_with_the_output_folder_to_clean_up(tool, make_cluster, tmp_path,
                                                                                  monkeypatch):
    cluster = make_cluster({"images": {"python:3.12-alpine": {"python": "/bin/false"}}})
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(tool.RunFailed) as failed:
        tool.run_batch(count=2, no_runtime_class=True, output=str(tmp_path / "out"), quiet=True)
    assert failed.value.exit_code == 4 and failed.value.message.startswith("Job rollout failed")
    failed.value.cleanup()
    assert being_deleted(cluster, json.loads((tmp_path / "out" / "receipt.json").read_text())["namespace"])


def test_the_context_manager_cleans_up_the_cluster_run_on_exit(tool, make_cluster, tmp_path, monkeypatch):
    cluster = make_cluster()
    for name, value in cluster.env().items():
        monkeypatch.setenv(name, value)
    with tool.run_batch(episode=EPISODE, tasks=MIXED, no_runtime_class=True, output=str(tmp_path / "out"),
                        quiet=True) as result:
        assert result.rewards == [1, None, 0.25]
        namespace = result.results["namespace"]
        assert not being_deleted(cluster, namespace)
    assert being_deleted(cluster, namespace)


LOOP = textwrap.dedent("""
    import sys
    sys.path.insert(0, %r)
    import rl_batch_demo
    batch = rl_batch_demo.stream_batch(backend="local", episode=%r, tasks=[{"reward": 1}, {"sleep": 60}],
                                       output="out", quiet=True)

    def resumed(frame, event, arg):  # the loop is back in the tool's iterator: say so, once
        if event == "call" and frame.f_globals.get("__name__") == "rl_batch_demo":
            sys.setprofile(None)
            open("in-iterator", "w").close()

    try:
        for episode in batch:
            print("episode", episode["task"], flush=True)
            sys.setprofile(resumed)
    except rl_batch_demo.RunInterrupted as stop:
        print("interrupted", stop.exit_code, stop.output, flush=True)
        raise
""")


def test_ctrl_c_in_the_training_loop_stops_the_batch_and_raises_run_interrupted(tmp_path):
    loop = subprocess.Popen([sys.executable, "-c", LOOP % (str(ROOT), EPISODE)], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert loop.stdout.readline() == "episode 0\n"
    wait_for("the loop back in the iterator, waiting for the slow episode (60 s)",
             lambda: (tmp_path / "in-iterator").exists())
    loop.send_signal(signal.SIGINT)
    stdout, stderr = loop.communicate(timeout=60)
    assert loop.returncode == 1 and stdout == "interrupted 130 out\n"
    assert "KeyboardInterrupt" in stderr or "RunInterrupted" in stderr
    # the batch was stopped as Ctrl-C stops the command: what it saw is kept, the streamed line too
    assert json.loads((tmp_path / "out" / "job.json").read_text())["status"]["interrupted"] is True
    assert [json.loads(line)["task"] for line in (tmp_path / "out" / "stream.jsonl").read_text().splitlines()] == [0]


def test_ctrl_c_in_the_loops_own_code_stops_the_batch_it_left_running(tmp_path):
    # between two episodes the loop trains on the first: the KeyboardInterrupt never reaches the
    # iterator, and the batch runs in a session of its own, out of the terminal's reach
    training = LOOP.replace('print("episode", episode["task"], flush=True)',
                            'print("episode", episode["task"], flush=True); time.sleep(30)').replace(
        "import sys", "import sys, time")
    loop = subprocess.Popen([sys.executable, "-c", training % (str(ROOT), EPISODE)], cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert loop.stdout.readline() == "episode 0\n"
    loop.send_signal(signal.SIGINT)
    stdout, stderr = loop.communicate(timeout=60)
    assert loop.returncode != 0 and stdout == "" and "KeyboardInterrupt" in stderr
    # stopped before the interpreter exited, as Ctrl-C stops the command
    assert json.loads((tmp_path / "out" / "job.json").read_text())["status"]["interrupted"] is True
    assert [json.loads(line)["task"] for line in (tmp_path / "out" / "stream.jsonl").read_text().splitlines()] == [0]
    assert not (tmp_path / "out" / "results.json").exists()


def readme_block(language, after, document="README.md"):
    """The first ```language block of a document (the README) after the heading `after`."""
    text = (ROOT / document).read_text().split(after, 1)[1]
    return text.split("```" + language + "\n", 1)[1].split("```", 1)[0]


def test_the_readmes_training_loop_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    loop = readme_block("python", "## Use it from a training loop")
    done = subprocess.run([sys.executable, "-c", loop], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith("[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] {}") for line in lines)
    assert json.loads((tmp_path / "steps" / "step-2" / "results.json").read_text())["successful_episodes"] == 8


def test_the_readmes_stream_from_a_shell_prints_each_episode_then_the_summary(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / "bin").mkdir()
    command = tmp_path / "bin" / "rl-batch-demo"  # the installed command, as this checkout's script
    command.write_text('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, ROOT / "rl-batch-demo.py"))
    command.chmod(0o755)
    shell = readme_block("sh", "From a shell, `run --stream`", "docs/reference.md")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PATH="%s:%s" % (tmp_path / "bin", os.environ["PATH"])))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:4]) == ["episode 0 1.0", "episode 1 0.0", "episode 2 1.0", "episode 3 0.0"]
    assert lines[4] == "summary None None"


@pytest.mark.parametrize("call", ["run_batch", "stream_batch"])
def test_a_batch_without_an_output_folder_names_the_function_called(tool, call):
    with pytest.raises(TypeError, match=r"^%s\(\) needs output=DIR" % call):
        getattr(tool, call)(backend="local", count=2)
