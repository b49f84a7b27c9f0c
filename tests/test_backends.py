"""The backend contract (Backend.CONTRACT, METHODS, CLUSTER_METHODS): every backend in BACKENDS
declares what varies itself, nothing falls back to the Job backend's semantics, and a record
naming a backend this version does not know is refused in one line."""

import json
import os

import pytest

import rl_batch_demo
from conftest import read


def is_stub(function):
    """A method whose whole body raises NotImplementedError (an abstract one of the base classes)."""
    code = getattr(function, "__func__", function).__code__
    return code.co_names == ("NotImplementedError",)


@pytest.mark.parametrize("name", list(rl_batch_demo.BACKENDS))
def test_every_backend_declares_the_whole_contract_in_its_own_class(name):
    backend = rl_batch_demo.BACKENDS[name]
    missing = [attribute for attribute in rl_batch_demo.Backend.CONTRACT if attribute not in vars(backend)]
    assert missing == [], "%s inherits %s" % (name, ", ".join(missing))
    assert backend.name == name


@pytest.mark.parametrize("name", list(rl_batch_demo.BACKENDS))
def test_every_backend_writes_every_method_it_needs(name):
    backend = rl_batch_demo.BACKENDS[name]
    needed = rl_batch_demo.Backend.METHODS + (rl_batch_demo.Backend.CLUSTER_METHODS if backend.uses_cluster else ())
    stubs = [method for method in needed if is_stub(getattr(backend, method))]
    assert stubs == [], "%s leaves %s abstract" % (name, ", ".join(stubs))


def test_the_base_class_holds_no_backends_semantics():
    declared = [attribute for attribute in rl_batch_demo.Backend.CONTRACT if attribute in vars(rl_batch_demo.Backend)]
    assert declared == []
    assert all(is_stub(getattr(rl_batch_demo.Backend, method)) for method in rl_batch_demo.Backend.METHODS)


def test_a_record_without_a_backend_is_the_job_backends():
    assert rl_batch_demo.backend_named(None) is rl_batch_demo.JobBackend


def test_an_unknown_backend_name_is_refused_naming_the_record():
    with pytest.raises(rl_batch_demo.DemoError) as raised:
        rl_batch_demo.backend_named("ssh", "out/run.json")
    assert str(raised.value) == ("out/run.json names backend 'ssh', which this rl-batch-demo does not know (it knows "
                                 "kubernetes, local, warm-pool): was it written by a newer version?")


def test_results_json_names_the_job_backend(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    assert read(tmp_path / "out" / "results.json")["backend"] == "kubernetes"


def test_results_json_of_several_rounds_names_its_backend(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--rounds", "2", "--output", "out", cluster=cluster).code == 0
    assert read(tmp_path / "out" / "results.json")["backend"] == "kubernetes"


def test_report_of_a_run_by_an_unknown_backend_is_one_line(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "1", "--output", "out").code == 0
    results = read(tmp_path / "out" / "results.json")
    (tmp_path / "out" / "results.json").write_text(json.dumps(dict(results, backend="ssh")))
    done = run_tool("report", "out")
    assert done.code == 1, done
    assert done.stderr.splitlines() == ["Error: results.json names backend 'ssh', which this rl-batch-demo does not "
                                        "know (it knows kubernetes, local, warm-pool): was it written by a newer "
                                        "version?"]


def test_cleanup_of_a_receipt_naming_an_unknown_backend_is_one_line(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "1", "--output", "out").code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    (tmp_path / "out" / "receipt.json").write_text(json.dumps(dict(receipt, backend="ssh")))
    done = run_tool("cleanup", "out")
    assert done.code == 1, done
    assert len(done.stderr.splitlines()) == 1 and "names backend 'ssh'" in done.stderr, done


# ---------------------------------------------------------------- a new backend: its section and one registry line


def ssh_backend(tool):
    """What a backend that runs each episode on another machine over ssh is: its section (the
    whole contract, declared, and its launcher), nothing outside it."""
    import sys

    class SshBackend(tool.LocalBackend):
        """`--backend ssh`: each episode on host `worker-1`, started over ssh."""
        name = "ssh"
        help = "each episode a process on another machine, over ssh"
        scheme = tool.LOCAL_SCHEME
        episodes_file = "pods.json"
        uses_cluster = False
        leaves_remote_state = False
        api_timestamps = False
        coarse_batch_keys = ()
        takes_queue = False
        takes_parallelism = True
        own_flags = ()
        batch_origin = "batch started"
        startup_label = "Episode process launched -> ready"
        timeline_origin = "batch"
        REPORT_ROWS = {}

        @staticmethod
        def episode_argv(program, workspace, env):
            return ["ssh", "worker-1", sys.executable, "-B", str(program)]
    return SshBackend


@pytest.fixture
def with_ssh(tool, tmp_path, monkeypatch):
    """The ssh backend registered (its one line), and an `ssh` on PATH that runs the command here
    and logs each call. The tests call main() in this process, which installs its SIGTERM
    handler: the worker's own is put back after."""
    import signal
    previous = signal.getsignal(signal.SIGTERM)
    backend = ssh_backend(tool)
    monkeypatch.setitem(tool.BACKENDS, backend.name, backend)  # the registry line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text('#!/bin/sh\necho "$@" >> %s\nshift\nexec "$@"\n' % (tmp_path / "ssh-calls"))
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.chdir(tmp_path)
    yield backend
    signal.signal(signal.SIGTERM, previous)


def test_an_ssh_shaped_backend_declares_the_whole_contract(tool, with_ssh):
    assert [attribute for attribute in tool.Backend.CONTRACT if attribute not in vars(with_ssh)] == []
    assert not [method for method in tool.Backend.METHODS if is_stub(getattr(with_ssh, method))]


def test_an_ssh_shaped_backend_runs_a_batch_through_its_launcher(tool, with_ssh, tmp_path, capfd):
    assert tool.main(["run", "--backend", "ssh", "--count", "2", "--output", "out"]) == 0
    results = read(tmp_path / "out" / "results.json")
    assert (results["backend"], results["successful_episodes"]) == ("ssh", 2)
    calls = (tmp_path / "ssh-calls").read_text().splitlines()
    assert len(calls) == 2 and all(call.startswith("worker-1 ") for call in calls)
    assert tool.main(["cleanup", "out"]) == 0
    assert "Nothing to clean up: out ran with --backend ssh" in capfd.readouterr().err


def test_an_ssh_shaped_backend_refuses_the_cluster_only_flags(tool, with_ssh, tmp_path, capfd):
    with pytest.raises(SystemExit) as refused:
        tool.main(["run", "--backend", "ssh", "--image", "python:3.13", "--output", "out"])
    assert refused.value.code == 2
    assert "--image is for a backend on a cluster; --backend ssh runs without one" in capfd.readouterr().err
    assert not (tmp_path / "out").exists()
