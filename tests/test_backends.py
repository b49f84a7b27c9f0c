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


# ---------------------------------------------------------------- a bare-Pod backend: its section and one line

def bare_pod_backend(tool):
    """What a backend that creates one Pod per episode (no Job) is: its section, nothing outside
    it. It reuses the shared parts a cluster backend has (the receipt, the namespace and episode
    program, the pod template, the Job-shaped batch record, validation and the summary)."""
    import time

    class BarePodBackend(tool.ClusterBackend):
        """`--backend bare-pods`: a Pod per episode, created at once, polled until every one ends."""
        name = "bare-pods"
        help = "a Pod per episode, no Job"
        scheme = tool.POD_SCHEME
        episodes_file = "pods.json"
        uses_cluster = True
        leaves_remote_state = True
        api_timestamps = True
        coarse_batch_keys = ("batch_to_all_ready_seconds", "batch_to_all_rewards_seconds")
        takes_queue = False
        takes_parallelism = False
        own_flags = ()
        batch_origin = "first pod was created"
        startup_label = "Pod created -> ready"
        timeline_origin = "batch"
        REPORT_ROWS = {}

        def pods_at_once(self):
            return self.spec.count

        def manifests(self, namespace, run_id):
            template = tool.episode_pod_template(run_id, self.spec.image, self.spec.runtime_class)
            pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": dict(
                template.get("metadata", {}), name="episode-%d" % index, namespace=namespace,
                labels=dict(template.get("metadata", {}).get("labels", {}), **tool.object_labels(run_id, "episode")),
                annotations={tool.INDEX_KEY: str(index)}), "spec": template["spec"]}
                for index in range(self.spec.count)]
            return tool.common_manifests(self.spec, namespace, run_id) + pods

        def run(self, run):
            run_info = run.new_run_info(self)
            run.write_facts(run_info)
            namespace_obj, *rest = self.manifests(run.namespace, run.run_id)
            run.create_namespace(namespace_obj, [obj for obj in rest if obj["kind"] != "Pod"])
            created = time.time()
            for pod in (obj for obj in rest if obj["kind"] == "Pod"):
                while True:  # a new namespace's `default` ServiceAccount comes a moment later (fact 25)
                    try:
                        run.cluster.create_owned(pod, run.run_id)
                        break
                    except tool.KubectlError as error:
                        if 'serviceaccount "default" not found' not in error.stderr:
                            raise
                        time.sleep(0.2)
            selector = "%s=%s" % (tool.RUN_LABEL, run.run_id)
            while True:
                pods = run.cluster.read_items("-n", run.namespace, "get", "pods", "-l", selector)
                if pods and all(pod["status"].get("phase") in ("Succeeded", "Failed") for pod in pods):
                    break
                if time.time() > created + self.spec.timeout:
                    raise tool.BatchTimeout("bare pods still running at --timeout")
                time.sleep(0.2)
            for pod in pods:
                name = pod["metadata"]["name"]
                (run.output / (name + ".log")).write_bytes(run.cluster.read("-n", run.namespace, "logs", name,
                                                                            binary=True))
            first = min(pod["metadata"]["creationTimestamp"] for pod in pods)  # the batch's origin, API clock
            job = tool.batch_record(type(self), "BarePodBatch", "bare-pods", first, {
                "conditions": [{"type": "Complete", "status": "True"}]}, spec={"completions": self.spec.count})
            run_info["client_job_complete_seconds"] = time.time() - created
            tool.write_json(run.output / "run.json", run_info)
            tool.write_state(run.output, job, sorted(pods, key=tool.by_creation))
            return tool.conclude(tool.write_results(run.output, "diagnostics saved in %s" % run.output), run)

        @classmethod
        def describe_results(cls, output, report, observed):
            pass

        @classmethod
        def cost(cls, output, report, prices, records):
            return tool.JobBackend.cost(output, report, prices, records)

        @classmethod
        def delete_objects(cls, cluster, namespace, run_id, receipt, output, listing):
            pass  # its pods carry the run's label and go with the namespace

        @classmethod
        def list_objects(cls, cluster, namespace):
            return {"pods": cluster.read_items("-n", namespace, "get", "pods")}

        @classmethod
        def list_state(cls, objects):
            phases = {pod["status"].get("phase") for pod in objects["pods"]}
            return "running" if phases - {"Succeeded", "Failed"} else "finished"

        @classmethod
        def list_fields(cls, objects, folder):
            phases = [pod["status"].get("phase") for pod in objects["pods"]]
            return {"completions": len(phases), "succeeded": phases.count("Succeeded"),
                    "failed": phases.count("Failed"), "active": len(phases) - phases.count("Succeeded") -
                    phases.count("Failed")}
    return BarePodBackend


@pytest.fixture
def with_bare_pods(tool, cluster, tmp_path, monkeypatch):
    """The bare-Pod backend registered (its one line), main() pointed at the simulated cluster."""
    import signal
    previous = signal.getsignal(signal.SIGTERM)
    backend = bare_pod_backend(tool)
    monkeypatch.setitem(tool.BACKENDS, backend.name, backend)  # the registry line
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    yield backend
    signal.signal(signal.SIGTERM, previous)


def test_a_bare_pod_backend_declares_the_whole_contract(tool, with_bare_pods):
    assert [attribute for attribute in tool.Backend.CONTRACT if attribute not in vars(with_bare_pods)] == []
    assert not [method for method in tool.Backend.METHODS + tool.Backend.CLUSTER_METHODS
                if is_stub(getattr(with_bare_pods, method))]


def test_a_bare_pod_backend_runs_a_batch_lists_it_and_cleans_it_up(tool, with_bare_pods, cluster, tmp_path, capfd):
    assert tool.main(["run", "--backend", "bare-pods", "--count", "3", "--output", "out"]) == 0
    results = read(tmp_path / "out" / "results.json")
    assert (results["backend"], results["successful_episodes"], results["reward_sum"]) == ("bare-pods", 3, 3)
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = receipt["namespace"]
    # the shared code names the backend, whatever the backend: in the receipt and on the namespace
    assert receipt["backend"] == "bare-pods"
    assert cluster.get_json("namespace", namespace)["metadata"]["labels"][tool.BACKEND_LABEL] == "bare-pods"
    capfd.readouterr()
    assert tool.main(["list", "--json"]) == 0
    listed = json.loads(capfd.readouterr().out)
    runs = listed["runs"] if isinstance(listed, dict) else listed
    assert [run["backend"] for run in runs if run.get("namespace") == namespace] == ["bare-pods"], listed
    assert tool.main(["cleanup", "--output", "out"]) == 0
    assert namespace not in cluster.kubectl("get", "namespaces").stdout
