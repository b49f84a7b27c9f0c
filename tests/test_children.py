"""No child outlives the tool: however the tool ends (SIGKILL included), its kubectl processes
(the proxy, the watches, the calls in flight) end with it, and the proxy's private folder does not
stay behind for long: the next invocation removes the folders of tool processes that are gone."""

from pathlib import Path
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import EPISODE, SCRIPT, wait_for, write_tasks

AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")


def process_table():
    """{pid: (parent pid, state letter)} of every process /proc shows now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid):
    table = process_table()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, (parent, _) in table.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids):
    """The pids among `pids` still running (a zombie has ended: only its parent's reaping is left)."""
    table = process_table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


@pytest.fixture
def short_temp():
    """A TMPDIR of the test's own, short enough for a socket's path below it (under xdist,
    tmp_path is too deep: the tool would put its proxy's folder in /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="rlbd-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_a_held_warm_pool_batch(make_cluster, tmp_path, temp):
    """A warm-pool batch of one episode held after ready (until a file that never comes), in the
    background with TMPDIR `temp`; (cluster, process) once the episode runs."""
    cluster = make_cluster(AGENT_SANDBOX)
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"wait_for": str(tmp_path / "never")}])
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "warm-pool", "--episode", EPISODE,
                                "--tasks", tasks, "--output", "out"], cwd=str(tmp_path),
                               env=cluster.env(TMPDIR=str(temp)), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wait_for("the episode to be exec'd", cluster.execs)
    return cluster, process


def test_a_tool_killed_with_sigkill_leaves_no_child_running(make_cluster, tmp_path, short_temp):
    cluster, process = start_a_held_warm_pool_batch(make_cluster, tmp_path, short_temp)
    children = descendants(process.pid)
    assert children, "the batch runs no kubectl"
    process.kill()
    process.wait()
    wait_for("every child of the killed tool to end", lambda: not alive(children))


def test_the_next_invocation_removes_a_killed_tools_proxy_folder(make_cluster, run_tool, tmp_path, short_temp):
    temp = short_temp
    cluster, process = start_a_held_warm_pool_batch(make_cluster, tmp_path, temp)
    left = wait_for("the proxy's folder", lambda: list(temp.glob("rl-batch-demo-proxy-%d-*" % process.pid)))
    process.kill()
    process.wait()
    assert left[0].exists()  # a SIGKILLed process removes nothing of its own
    done = run_tool("cleanup", "out", cluster=cluster, env={"TMPDIR": str(temp)})
    assert done.code == 0, done
    assert not left[0].exists()
    assert not list(temp.glob("rl-batch-demo-proxy-*")), "cleanup left its own proxy folder"


def test_a_temp_folder_too_deep_for_a_socket_still_gets_the_proxy(make_cluster, run_tool, tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    cluster = make_cluster(AGENT_SANDBOX)
    done = run_tool("run", "--backend", "warm-pool", "--count", "2", "--output", "out", cluster=cluster,
                    env={"TMPDIR": str(deep)})
    assert done.code == 0, done
    assert "falling back to one `kubectl exec`" not in done.stderr
    proxies = [call for call in cluster.calls() if "proxy" in call]
    assert proxies and all(arg.startswith("--unix-socket=/tmp/rl-batch-demo-proxy-")
                           for call in proxies for arg in call if arg.startswith("--unix-socket="))


def test_every_process_the_tool_starts_goes_through_its_one_spawner():
    # subprocess.Popen/run/call outside ChildSpawner would start a child without its parent-death
    # signal (a compare's cleanup once did), which outlives a SIGKILLed tool. The episode program
    # shipped to the sandbox (its own process, not the tool's) runs its tests with subprocess.run.
    import ast
    tree = ast.parse(SCRIPT.read_text())
    spawner = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ChildSpawner")
    inside = {id(node) for node in ast.walk(spawner)}
    outside = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute)
               and isinstance(node.value, ast.Name) and node.value.id == "subprocess"
               and node.attr in ("Popen", "run", "call", "check_call", "check_output") and id(node) not in inside]
    assert outside == [], "subprocess started outside ChildSpawner at line(s) %s" % outside
