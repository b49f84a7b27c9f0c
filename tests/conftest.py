import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import pytest

from fakecluster import FakeCluster, NoRealKubectl

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "rl-batch-demo.py"


# A default cluster's namespace controller waits 5 s before it works on a deleted namespace
# (ASSUMPTIONS.md "Namespace deletion"); at about 100 cleanups that would add minutes to the
# suite, so its clusters wait 0.3 s, and test_cleanup_waits_out_the_namespace_controllers_delay
# keeps the real value. The benchmarks keep it too.
SUITE_CLUSTER = {"namespaceDeletionSeconds": 0.3}

# Many tests press Ctrl-C (send SIGINT) to the tool. A shell starts a background job with SIGINT
# ignored, and an ignored signal stays ignored across exec, so a suite started with `&` would hand
# every tool a deaf Ctrl-C (the tool, rightly, keeps an inherited ignore, as a background job
# should). A handler, unlike an ignore, is reset to the default at exec: every program this suite
# starts takes Ctrl-C as a terminal delivers it, however the suite itself was started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def load_tool():
    """The tool as a module: rl_batch_demo.py is a symlink to the script."""
    import rl_batch_demo
    return rl_batch_demo


@pytest.fixture(scope="session")
def tool():
    return load_tool()


def processes_under(folder):
    """{pid: command line} of every process whose working folder or command line is under
    `folder`, read from /proc (a zombie, which has no working folder, is not one)."""
    found, folder = {}, str(folder)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % entry)
            with open("/proc/%s/cmdline" % entry, "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if cwd == folder or cwd.startswith(folder + os.sep) or folder in command:
            found[int(entry)] = command
    return found


@pytest.fixture(autouse=True)
def nothing_left_running(tmp_path):
    """Every test ends with nothing it started still running: a process working in its
    temporary folder, or naming it, fails the test once its fixtures have stopped what they
    started (the tool's promise, kept by the tests too: an episode's keeper, a `kubectl proxy`
    or a control-plane part left behind is found here, not by hand). Waits for processes on
    their way out; the 60 s are a safety net, never a bound."""
    yield
    if not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + 60
    left = processes_under(tmp_path)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_under(tmp_path)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, "left running after the test (now killed): %s" % "; ".join(
        "%d %s" % (pid, command[:200]) for pid, command in sorted(left.items()))


@pytest.fixture
def make_cluster(tmp_path):
    started = []

    def make(config=None, **kwargs):
        try:
            cluster = FakeCluster(tmp_path / ("k8s%d" % len(started)), dict(SUITE_CLUSTER, **(config or {})),
                                  **kwargs)
        except NoRealKubectl as missing:
            # CI has the real kubectl (a system package): there its absence fails, never skips
            if __import__("os").environ.get("CI"):
                pytest.fail("%s; CI must have it" % missing)
            pytest.skip("%s; install kubectl 1.29 or newer to run this test" % missing)
        cluster.start()
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


@pytest.fixture
def cluster(make_cluster):
    return make_cluster()


# ---------------------------------------------------------------- the real control plane (tests/controlplane/)


@pytest.fixture(scope="session")
def controlplane_binaries():
    """The cache folder of the upstream programs, built once (tests/controlplane/build.py: the
    first build takes about 14 minutes on 2 cores; later runs find them). In CI a missing Go or a
    failed build fails the tier; elsewhere it is skipped with the reason."""
    import os
    from controlplane import build
    try:
        return build.ensure_built()
    except build.BuildFailed as failure:
        if os.environ.get("CI"):
            pytest.fail("the real control plane cannot be built: %s" % failure, pytrace=False)
        pytest.skip("the real control plane cannot be built here: %s" % failure)


# agent-sandbox releases the real-control-plane tier runs (tests/controlplane/agent-sandbox*/):
# `@AGENT_SANDBOX_VERSIONS` on a test marked parts("agent-sandbox") runs it on each
AGENT_SANDBOX_VERSIONS = pytest.mark.parametrize("agent_sandbox", ["agent-sandbox", "agent-sandbox-v1"],
                                                 ids=["v0.5.6", "v1.0.1"])


@pytest.fixture
def control_plane(request, tmp_path, controlplane_binaries):
    """A real control plane of its own (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    kwok with 2 nodes, the episode runtime), started in tmp_path and stopped at the end; with
    `@pytest.mark.parts("agent-sandbox", ...)` also those add-ons. Clusters are created one at a
    time (kwokctl picks free ports by looking, then binding)."""
    import fcntl
    from controlplane.cluster import ControlPlane, PartDidNotStart
    asked = request.node.get_closest_marker("parts")
    parts = list(asked.args if asked else ())
    # a test parametrized over AGENT_SANDBOX_VERSIONS runs on the agent-sandbox of its parameter
    version = getattr(request.node, "callspec", None) and request.node.callspec.params.get("agent_sandbox")
    if version:
        parts = [version if part == "agent-sandbox" else part for part in parts]
    plane = ControlPlane(tmp_path / "control-plane", controlplane_binaries, parts=parts)
    with open(Path(controlplane_binaries) / "create.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            plane.start()
        except PartDidNotStart as failure:
            plane.stop()
            pytest.fail(str(failure), pytrace=False)
        except BaseException:  # whatever stopped it, nothing it started outlives the test
            plane.stop()
            raise
    yield plane
    plane.stop()


# ---------------------------------------------------------------- the real node (tests/realnode/)


@pytest.fixture(scope="session")
def realnode_binaries(controlplane_binaries):
    """The cache folder of the real node's programs and images (tests/realnode/build.py), built
    once after the control plane's. In CI a machine that cannot run a node, or a failed build,
    fails the tier; elsewhere it is skipped with the reason."""
    from realnode import build
    from realnode.node import can_run_a_node
    why_not = can_run_a_node()
    try:
        if why_not:
            raise build.BuildFailed(why_not)
        return build.ensure_built()
    except (build.BuildFailed, build.controlplane_build.BuildFailed) as failure:
        if os.environ.get("CI"):
            pytest.fail("the real node cannot run here: %s" % failure, pytrace=False)
        pytest.skip("the real node cannot run here: %s" % failure)


@pytest.fixture(scope="session")
def image_registry(realnode_binaries, tmp_path_factory):
    """One registry for the session (a loopback port), holding the images build.py made; a test
    that stops its registry makes its own (realnode.node.Registry)."""
    from realnode.node import Registry
    registry = Registry(tmp_path_factory.mktemp("registry"), realnode_binaries)
    try:
        registry.start().push_built()
    except BaseException:
        registry.stop()
        raise
    yield registry
    registry.stop()


def start_real_node(tmp_path, controlplane_binaries, realnode_binaries, registry, parts=()):
    """A control plane with one kwok node and one real node (its RuntimeClasses select the real one)."""
    import fcntl
    from controlplane.cluster import ControlPlane, PartDidNotStart
    from realnode.node import NodeDidNotStart, RealNode, runtime_classes
    plane = ControlPlane(tmp_path / "control-plane", controlplane_binaries, nodes=1, parts=parts,
                         episode_runtime=False, runtime_classes=runtime_classes())
    node = RealNode(tmp_path / "node", realnode_binaries, plane, registry)
    try:
        with open(Path(controlplane_binaries) / "create.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            plane.start()
        node.start()
    except (PartDidNotStart, NodeDidNotStart) as failure:
        node.stop()
        plane.stop()
        pytest.fail(str(failure), pytrace=False)
    except BaseException:
        node.stop()
        plane.stop()
        raise
    return plane, node


@pytest.fixture
def real_node(request, tmp_path, controlplane_binaries, realnode_binaries, image_registry):
    """(plane, node): a real control plane and a real node (kubelet, containerd, runc, runsc) of its
    own, pulling from the session's registry; with `@pytest.mark.parts(...)` also those add-ons.
    Stopped at the end, and nothing of the node may be left (its leftovers fail the test)."""
    asked = request.node.get_closest_marker("parts")
    plane, node = start_real_node(tmp_path, controlplane_binaries, realnode_binaries, image_registry,
                                  parts=asked.args if asked else ())
    yield plane, node
    node.stop()
    plane.stop()
    left = node.leftovers()
    assert not left, "the real node left: %s" % "; ".join(left)


class Result:
    def __init__(self, done):
        self.code, self.stdout, self.stderr = done.returncode, done.stdout, done.stderr

    def __repr__(self):
        return "Result(code=%r, stdout=%r, stderr=%r)" % (self.code, self.stdout[-2000:], self.stderr[-2000:])


@pytest.fixture
def run_tool(tmp_path):
    """Run the real script as a user would, against a cluster's kubectl (or none)."""

    def run(*args, cluster=None, env=None, timeout=300, python=sys.executable):
        environment = cluster.env() if cluster else dict(__import__("os").environ)
        environment.update(env or {})
        done = subprocess.run([python, str(SCRIPT), *args], cwd=str(tmp_path), env=environment,
                              text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return Result(done)

    return run


def find_python(version):
    """A working pythonX.Y: on PATH, or in a pyenv tree (whose shims refuse inactive versions)."""
    import shutil
    candidates = [shutil.which("python" + version)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/%s.*/bin/python%s" % (version, version)))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    pytest.skip("python%s is not installed here" % version)


# An episode that sleeps a minute but ends at SIGTERM (a PID 1 without a handler would take the
# pod's whole 30 s grace period, which tests about something else need not wait for).
SLEEPS_UNTIL_TERM = "#!/bin/sh\ntrap 'exit 143' TERM\nsleep 60 &\nwait\n"


def interrupt_a_run(make_cluster, tmp_path, signal_number=None):
    """Start a run whose episodes never finish, interrupt it (Ctrl-C unless another signal is
    given) once its episodes run; (cluster, exit code, stderr)."""
    import signal
    image = tmp_path / "image-slow"
    image.write_text(SLEEPS_UNTIL_TERM)
    image.chmod(0o755)
    cluster = make_cluster({"images": {"slow:1": {"python": str(image)}}})
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--count", "2", "--image", "slow:1",
                                "--output", "out"], cwd=str(tmp_path), env=cluster.env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    receipt = tmp_path / "out" / "receipt.json"
    wait_for("the run's Job", lambda: receipt.exists() and "job_uid" in receipt.read_text())
    namespace = json.loads(receipt.read_text())["namespace"]
    wait_for("the run's episodes to be running", lambda: [
        pod for pod in cluster.get_json("-n", namespace, "pods")["items"] if pod["status"].get("phase") == "Running"])
    process.send_signal(signal.SIGINT if signal_number is None else signal_number)
    _, stderr = process.communicate(timeout=60)
    return cluster, process.returncode, stderr


# ---------------------------------------------------------------- helpers shared by the test modules


T0 = 1795946400.0  # 2026-11-29T10:00:00Z as Unix seconds: the in-process tests' clock origin

EPISODE = str(ROOT / "tests" / "episodes" / "scripted.py")


def read(path):
    return json.loads(Path(path).read_text())


def write_tasks(path, tasks):
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return str(path)


PYTHON = sys.executable


def make_image(tmp_path, name, body):
    """A test image: its `python` is a shell script around the real interpreter."""
    path = tmp_path / ("image-" + name)
    path.write_text("#!/bin/sh\n" + body.replace("$PY", '"%s"' % PYTHON) + "\n")
    path.chmod(0o755)
    return str(path)


def cluster_with_image(make_cluster, tmp_path, name, body, **config):
    images = {"python:3.12-alpine": {"python": PYTHON}, name: {"python": make_image(tmp_path, name, body)}}
    return make_cluster({"images": images, **config})


def start_tool(cluster, tmp_path, *args, own_group=False):
    """The real script started in the background (for a test that changes the world mid-run);
    with own_group, in a process group of its own, which a test can kill whole (os.killpg)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=cluster.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=own_group)


def wait_for(what, predicate, timeout=300.0):
    """predicate()'s first true value, asked every 0.1 s; fails the test after `timeout` seconds: a
    safety net against a hang, never a bound (a loaded machine may take minutes)."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "gave up waiting for " + what
        time.sleep(0.1)


def first_then_slow(tmp_path):
    """An image body: the first episode to start runs at once, every other one hangs a minute
    (the episode's own `python` calls, for its tests, run as usual)."""
    return 'case "$*" in *episode.py*) mkdir "%s" 2>/dev/null || exec sleep 60;; esac\nexec $PY "$@"' % (
        tmp_path / "first-episode-ran")


def succeeded_pods(cluster, namespace):
    pods = cluster.get_json("-n", namespace, "pods")["items"]
    return [pod for pod in pods if pod["status"].get("phase") == "Succeeded"]
