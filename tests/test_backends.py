"""The backend contract (Backend.CONTRACT, METHODS, CLUSTER_METHODS): every backend in BACKENDS
declares what varies itself, nothing falls back to the Job backend's semantics, and a record
naming a backend this version does not know is refused in one line."""

import json

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
