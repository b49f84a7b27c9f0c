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
                                 "kubernetes, local, recycled-pool, warm-pool): was it written by a newer version?")


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
                                        "know (it knows kubernetes, local, recycled-pool, warm-pool): was it written by a newer "
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
    """A backend that runs its episodes on other machines over ssh (`--ssh-hosts A,B`): the
    episode program, the probe and the tasks copied into a folder of the run's own on each host
    (~/.rl-batch-demo/<run id>, named in the receipt before anything is copied, its .run-id file
    the proof cleanup asks for), each episode run there with its workspace on that side, episode i
    on host i mod N; the folders removed at the end, and by cleanup after a run that was killed.
    Its section: the contract declared, its preflight, its EpisodeHost, its receipt, cleanup and
    list state; nothing outside it but the registry line."""
    import io
    import shlex
    import subprocess
    import tarfile

    def ssh(host, command, data=None):
        """`ssh HOST COMMAND` through the tool's one spawner: its stdout, or one line of refusal."""
        process = tool.CHILDREN.popen(["ssh", "-o", "BatchMode=yes", host, command], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = process.communicate(data, timeout=120)
        if process.returncode:
            raise tool.DemoError("ssh %s failed (exit %d): %s" % (host, process.returncode, tool.last_line(
                err.decode("utf-8", "replace")) or "no message"))
        return out

    def folder_of(run_id):
        return ".rl-batch-demo/%s" % run_id  # relative to the remote user's home, as ssh starts there

    class SshHost(tool.EpisodeHost):
        def __init__(self, run_id, homes):
            super().__init__(run_id)
            self.homes, self.hosts = homes, sorted(homes)
            self.staged = []

        def host(self, index):
            return self.hosts[index % len(self.hosts)]

        def node(self, index):
            return "ssh:" + self.host(index)

        def image(self, index):
            return "ssh:%s python3" % self.host(index)

        def path(self, index, name):
            return "%s/%s/%s" % (self.homes[self.host(index)], folder_of(self.run_id), name)

        def stage(self, files):
            archive = io.BytesIO()
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for name, text in dict(files, **{".run-id": self.run_id + "\n"}).items():
                    data = text.encode()
                    info = tarfile.TarInfo(name)
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
            folder = folder_of(self.run_id)
            for host in self.hosts:
                # `mkdir` without -p for the run's own folder: never into one that exists already
                ssh(host, "mkdir -p .rl-batch-demo && mkdir %s && tar -x -C %s && mkdir %s/bin && ln -s "
                          "\"$(command -v python3)\" %s/bin/python" % ((shlex.quote(folder),) * 4), archive.getvalue())
                self.staged.append(host)

        def make_workspace(self, index, name):
            return self.path(index, name)  # made on the host as the episode starts (no ssh call of its own)

        def start(self, index, env, workspace, log):
            command = "mkdir %s && cd %s && exec env %s PATH=%s:\"$PATH\" python3 -B %s %s" % (
                shlex.quote(workspace), shlex.quote(workspace),
                " ".join(shlex.quote("%s=%s" % item) for item in sorted(env.items())),
                shlex.quote(self.path(index, "bin")), shlex.quote(self.path(index, tool.SANDBOX_PROBE_FILE)),
                shlex.quote(self.path(index, "episode.py")))
            return tool.CHILDREN.popen(["ssh", "-o", "BatchMode=yes", self.host(index), command], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

        def termination(self, index, name):
            return ssh(self.host(index), "cat %s 2>/dev/null || true" % shlex.quote(
                self.path(index, name + ".termination")))[-4096:]

        def close(self):
            for host in self.staged:
                ssh(host, "rm -rf %s" % shlex.quote(folder_of(self.run_id)))

    class SshBackend(tool.LocalBackend):
        """`--backend ssh`: each episode a process on one of --ssh-hosts, started over ssh."""
        name = "ssh"
        help = "each episode a process on another machine, over ssh"
        scheme = tool.LOCAL_SCHEME
        episodes_file = "pods.json"
        uses_cluster = False
        leaves_remote_state = True  # a killed run leaves its folders on the hosts
        api_timestamps = False
        coarse_batch_keys = ()
        takes_queue = False
        takes_parallelism = True
        runs_several_images = False  # processes run no image
        own_flags = (("--ssh-hosts", "ssh_hosts"),)
        batch_origin = "batch started"
        startup_label = "Episode process launched -> ready"
        timeline_origin = "batch"
        phase_words = tool.LocalBackend.phase_words  # processes too, on other machines
        REPORT_ROWS = {}

        @classmethod
        def add_arguments(cls, parser):
            parser.add_argument("--ssh-hosts", metavar="HOST,HOST", help="with --backend ssh: the machines to run on")

        @classmethod
        def check_options(cls, args, fail):
            hosts = [host for host in (args.ssh_hosts or "").split(",") if host]
            if not hosts:
                fail("--backend ssh needs --ssh-hosts HOST[,HOST...]")
            return {"ssh_hosts": hosts}

        def read_facts(self, cluster):
            # each host answers before anything is made: its home (the folder's root) and kernel
            self.hosts = {}
            for host in self.spec.ssh_hosts:
                home, kernel = ssh(host, "cd && pwd && uname -r").decode().split()
                self.hosts[host] = {"home": home, "kernel": kernel}
            return {"hosts": self.hosts}

        def episode_host(self, run_id):
            return SshHost(run_id, {host: facts["home"] for host, facts in self.hosts.items()})

        def new_receipt(self, context, namespace, run_id):
            return {"backend": self.name, "namespace": None, "run_id": run_id, "hosts": sorted(self.hosts),
                    "remote_folder": folder_of(run_id)}

        def run(self, run):
            # the hosts' kernels, as nodes.json names a cluster's nodes: the isolation verdict's
            tool.write_json(run.output / "nodes.json", [{"name": "ssh:" + host, "kernel": facts["kernel"]}
                                                        for host, facts in sorted(self.hosts.items())])
            return super().run(run)

        @classmethod
        def describe_results(cls, output, report, observed):
            super().describe_results(output, report, observed)
            report.update(image="ssh python3", runtime="remote-process")

        @classmethod
        def timeline_where(cls, results):
            return "ssh hosts"

        @classmethod
        def off_cluster_state(cls, folder, receipt):
            return "ran on %s over ssh (its folder there: ~/%s)" % (", ".join(receipt["hosts"]),
                                                                    receipt["remote_folder"])

        @classmethod
        def cleanup(cls, receipt, source, output, console, delete_foreign=False):
            folder, run_id = receipt["remote_folder"], receipt["run_id"]
            if folder != folder_of(run_id):
                raise tool.DemoError("%s names remote folder %s, which this backend never makes for run %s; "
                                     "refusing cleanup" % (source, folder, run_id))
            for host in receipt["hosts"]:
                said = ssh(host, "if [ -d %s ]; then cat %s/.run-id 2>/dev/null || echo; else echo gone; fi"
                           % (shlex.quote(folder), shlex.quote(folder))).decode().strip()
                if said == "gone":
                    console.tell("%s:~/%s is already gone" % (host, folder))
                    continue
                if said != run_id:
                    raise tool.DemoError("refusing cleanup: %s:~/%s/.run-id must equal %s: current value is %r"
                                         % (host, folder, run_id, said))
                ssh(host, "rm -rf %s" % shlex.quote(folder))
                console.tell("Removed %s:~/%s" % (host, folder))
            return tool.EXIT_OK
    return SshBackend


FAKE_SSH = """#!/bin/sh
# ssh [-o OPTION]... HOST COMMAND: COMMAND run by sh in HOST's home (hosts/HOST), as sshd runs it
# in the remote user's; a host without a home refuses the connection, as ssh says it.
echo "$*" >> %(calls)s
while [ "$1" = "-o" ]; do shift 2; done
host=$1; shift
if [ ! -d %(hosts)s/"$host" ]; then
    echo "ssh: connect to host $host port 22: Connection refused" >&2
    exit 255
fi
cd %(hosts)s/"$host" && HOME=$PWD exec sh -c "$*"
"""


@pytest.fixture
def with_ssh(tool, tmp_path, monkeypatch):
    """The ssh backend registered (its one line), two hosts (worker-1, worker-2: a home each under
    hosts/), and an `ssh` on PATH that runs each command in its host's home and logs each call.
    The tests call main() in this process, which installs its SIGTERM handler: the worker's own
    is put back after."""
    import signal
    previous = signal.getsignal(signal.SIGTERM)
    backend = ssh_backend(tool)
    monkeypatch.setitem(tool.BACKENDS, backend.name, backend)  # the registry line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for host in ("worker-1", "worker-2"):
        (tmp_path / "hosts" / host).mkdir(parents=True)
    (bin_dir / "ssh").write_text(FAKE_SSH % {"calls": tmp_path / "ssh-calls", "hosts": tmp_path / "hosts"})
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.chdir(tmp_path)
    yield backend
    signal.signal(signal.SIGTERM, previous)


def ssh_calls(tmp_path):
    return (tmp_path / "ssh-calls").read_text().splitlines()


def run_on_two_hosts(tool, count=4, *flags):
    return tool.main(["run", "--backend", "ssh", "--ssh-hosts", "worker-1,worker-2", "--count", str(count),
                      "--output", "out", *flags])


def test_an_ssh_backend_declares_the_whole_contract(tool, with_ssh):
    assert [attribute for attribute in tool.Backend.CONTRACT if attribute not in vars(with_ssh)] == []
    assert not [method for method in tool.Backend.METHODS if is_stub(getattr(with_ssh, method))]


def test_an_ssh_backend_runs_each_episode_on_its_host_with_its_workspace_there(tool, with_ssh, tmp_path):
    assert run_on_two_hosts(tool) == 0
    results = read(tmp_path / "out" / "results.json")
    assert (results["backend"], results["successful_episodes"], results["reward_sum"]) == ("ssh", 4, 4)
    pods = read(tmp_path / "out" / "pods.json")
    assert sorted((pod["metadata"]["name"], pod["spec"]["nodeName"]) for pod in pods) == [
        ("local-0", "ssh:worker-1"), ("local-1", "ssh:worker-2"), ("local-2", "ssh:worker-1"),
        ("local-3", "ssh:worker-2")]
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    home = tmp_path / "hosts" / "worker-2"
    started = [call for call in ssh_calls(tmp_path) if "episode.py" in call and call.startswith("-o BatchMode=yes "
                                                                                                 "worker-2 mkdir ")]
    assert len(started) == 2 and all("%s/.rl-batch-demo/%s/local-" % (home, run_id) in call for call in started)
    assert not (home / ".rl-batch-demo" / run_id).exists()  # the run removed its folder on each host


def test_an_ssh_run_records_each_hosts_kernel_and_its_episodes_ran_on_it(tool, with_ssh, tmp_path):
    assert run_on_two_hosts(tool, 2) == 0
    assert read(tmp_path / "out" / "nodes.json")[0]["kernel"] == os.uname().release  # the fake's hosts are here
    assert read(tmp_path / "out" / "results.json")["isolation"]["episodes_on_node_kernel"] == 2


def test_report_of_an_ssh_run_shows_its_episodes_and_their_kernel(tool, with_ssh, tmp_path, capfd):
    assert run_on_two_hosts(tool, 2) == 0
    capfd.readouterr()
    assert tool.main(["report", "out"]) == 0
    table = capfd.readouterr().out
    assert "| episodes passed / run | 2/2 |" in table
    assert "| episodes on the node's kernel / their own / unknown | 2 / 0 / 0 |" in table


def test_list_names_an_ssh_run_its_hosts_and_its_folder_there(tool, with_ssh, tmp_path, capfd):
    assert run_on_two_hosts(tool, 2) == 0
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    capfd.readouterr()
    tool.main(["list", "--json"])  # the context's runs cannot be listed here: a note, the folders' still are
    listed = json.loads(capfd.readouterr().out)
    runs = listed["runs"] if isinstance(listed, dict) else listed
    [row] = [row for row in runs if row["backend"] == "ssh"]
    assert row["run_id"] == run_id and (row["succeeded"], row["failed"]) == (2, 0)
    assert row["state"] == "ran on worker-1, worker-2 over ssh (its folder there: ~/.rl-batch-demo/%s)" % run_id


def killed_run_folders(tmp_path, run_id, marker=None):
    """What a run killed mid-batch leaves on each host: its folder, with its .run-id."""
    for host in ("worker-1", "worker-2"):
        folder = tmp_path / "hosts" / host / ".rl-batch-demo" / run_id
        (folder / "local-0").mkdir(parents=True)
        (folder / ".run-id").write_text((marker or run_id) + "\n")


def test_cleanup_of_an_ssh_run_removes_what_a_killed_run_left_on_each_host(tool, with_ssh, tmp_path, capfd):
    assert run_on_two_hosts(tool, 2) == 0
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    killed_run_folders(tmp_path, run_id)
    capfd.readouterr()
    assert tool.main(["cleanup", "out"]) == 0
    assert capfd.readouterr().err.splitlines() == ["Removed worker-1:~/.rl-batch-demo/%s" % run_id,
                                                   "Removed worker-2:~/.rl-batch-demo/%s" % run_id]
    assert not list((tmp_path / "hosts").glob("*/.rl-batch-demo/*"))


def test_cleanup_of_an_ssh_run_whose_folders_are_gone_says_so(tool, with_ssh, tmp_path, capfd):
    assert run_on_two_hosts(tool, 2) == 0
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    capfd.readouterr()
    assert tool.main(["cleanup", "out"]) == 0
    assert "worker-1:~/.rl-batch-demo/%s is already gone" % run_id in capfd.readouterr().err


def test_cleanup_of_an_ssh_run_refuses_a_folder_another_run_owns_naming_the_key(tool, with_ssh, tmp_path, capfd):
    assert run_on_two_hosts(tool, 2) == 0
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    killed_run_folders(tmp_path, run_id, marker="0123456789ab")
    capfd.readouterr()
    assert tool.main(["cleanup", "out"]) == 1
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "Error: refusing cleanup: worker-1:~/.rl-batch-demo/%s/.run-id must equal %s: current value is "
        "'0123456789ab'" % (run_id, run_id))
    assert (tmp_path / "hosts" / "worker-1" / ".rl-batch-demo" / run_id / "local-0").is_dir()


def test_an_ssh_host_that_cannot_be_reached_refuses_the_run_before_anything_is_made(tool, with_ssh, tmp_path,
                                                                                     capfd):
    assert tool.main(["run", "--backend", "ssh", "--ssh-hosts", "worker-1,worker-9", "--output", "out"]) == 1
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "Error: ssh worker-9 failed (exit 255): ssh: connect to host worker-9 port 22: Connection refused")
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "hosts").glob("*/.rl-batch-demo"))


def test_an_ssh_backend_refuses_the_cluster_only_flags(tool, with_ssh, tmp_path, capfd):
    with pytest.raises(SystemExit) as refused:
        tool.main(["run", "--backend", "ssh", "--ssh-hosts", "worker-1", "--image", "python:3.13", "--output", "out"])
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
        runs_several_images = False
        own_flags = ()
        batch_origin = "first pod was created"
        startup_label = "Pod created -> ready"
        timeline_origin = "batch"
        phase_words = {}
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
                pods = run.cluster.api.list(tool.PODS, run.namespace, selector)
                if pods and all(pod["status"].get("phase") in ("Succeeded", "Failed") for pod in pods):
                    break
                if time.time() > created + self.spec.timeout:
                    raise tool.BatchTimeout("bare pods still running at --timeout")
                time.sleep(0.2)
            tool.fetch_logs(run.cluster, run.namespace, run.output, [pod["metadata"]["name"] for pod in pods])
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
            return {"pods": cluster.api.list(tool.PODS, namespace)}

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
