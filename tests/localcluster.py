#!/usr/bin/env python3
"""A local cluster to try the tool's cluster backends on, started from the programs the tests
build and cache (tests/controlplane/, tests/realnode/): no Docker, no network, nothing installed
outside the cache and the folder you name.

    python3 tests/localcluster.py up DIR [--nodes N] [--kueue] [--real-node]
    export KUBECONFIG=DIR/kubeconfig       # `up` prints this path on stdout
    rl-batch-demo run --count 10 --output job-10
    python3 tests/localcluster.py status DIR
    python3 tests/localcluster.py down DIR

What runs: the real control plane of the tests (Kubernetes v1.36.3's etcd, API server, controller
manager and scheduler) with agent-sandbox v0.5.6's controller (the warm-pool backend and kept
pools), kwok's nodes and the tests' episode runtime, which runs each episode pod's program as a
process on this machine (the image is not pulled); with --kueue also Kueue v0.19.2, a
ResourceFlavor `default` and a ClusterQueue `team` of 2 CPUs and 4 GiB; with --real-node
instead one real node (the kubelet with containerd, runc and gVisor's runsc, root only) pulling
from a registry on a loopback port that holds `rlbd.test/python:3.11`.

`up` builds what the cache lacks first (a first build of the control plane takes tens of minutes
on 2 cores), then starts a keeper process that owns every part and stops them all on `down`
(or on SIGTERM). Everything the cluster writes is under DIR; `down` leaves DIR's logs for reading.
Exit codes: 0 done, 1 the cluster did not start or stop, 2 bad command line or folder."""

import argparse
import fcntl
import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import threading
import time

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # controlplane/ and realnode/, as the tests import them

STATE = "localcluster.json"   # what `up` asked for, and the keeper's pid: the folder is a local cluster's
READY = "ready.json"          # written by the keeper once every part serves; removed when it stops
FAILED = "failed.txt"         # the keeper's one line when a part did not start
KEEPER_LOG = "keeper.log"
CLUSTER_QUEUE = "team"
PROGRESS_EVERY = 15.0         # seconds between "still starting" lines


class Refused(Exception):
    """A bad command line or folder: one line, exit code 2."""


class Failed(Exception):
    """The cluster did not start or stop: one line, exit code 1."""


def say(line):
    print("localcluster: " + line, file=sys.stderr, flush=True)


def alive(pid):
    from controlplane.cluster import alive as process_alive
    return process_alive(pid)


def read_state(folder):
    path = folder / STATE
    if not path.exists():
        raise Refused("%s is not a local cluster's folder (no %s): give the folder `up` made" % (folder, STATE))
    return json.loads(path.read_text())


# ---------------------------------------------------------------- the keeper: owns every part


class Keeper:
    """Starts the parts in `folder` and stops them all when told (SIGTERM or SIGINT)."""

    def __init__(self, folder, options):
        self.folder, self.options = folder, options
        self.plane = self.node = self.registry = None
        self.stop_asked = threading.Event()

    def start(self):
        from controlplane import build
        from controlplane.cluster import ControlPlane
        built = build.ensure_built()
        parts = ["agent-sandbox"] + (["kueue"] if self.options["kueue"] else [])
        if self.options["real_node"]:
            from realnode import build as node_build
            from realnode.node import Registry, RealNode, runtime_classes
            node_built = node_build.ensure_built()
            self.registry = Registry(self.folder / "registry", node_built)
            self.registry.start().push_built()
            self.plane = ControlPlane(self.folder / "control-plane", built, nodes=1, parts=parts,
                                      episode_runtime=False, runtime_classes=runtime_classes())
        else:
            self.plane = ControlPlane(self.folder / "control-plane", built, nodes=self.options["nodes"], parts=parts)
        with open(Path(built) / "create.lock", "w") as lock:  # kwokctl picks free ports by looking
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.plane.start()
        if self.options["real_node"]:
            self.node = RealNode(self.folder / "node", node_built, self.plane, self.registry)
            self.node.start()
        if self.options["kueue"]:
            self.make_cluster_queue()

    def make_cluster_queue(self):
        objects = [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
                   {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
                    "spec": {"namespaceSelector": {}, "resourceGroups": [{
                        "coveredResources": ["cpu", "memory"], "flavors": [{"name": "default", "resources": [
                            {"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "4Gi"}]}]}]}}]
        self.plane.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def ready(self):
        """What `up` prints and `status` reads."""
        found = {"kubeconfig": str(self.plane.kubeconfig), "context": "kwok", "pid": os.getpid(),
                 "parts": ["agent-sandbox"] + (["kueue"] if self.options["kueue"] else []),
                 "nodes": self.plane.nodes}
        if self.node is not None:
            from realnode.node import image_ref
            found.update(real_node=self.node.name, image=image_ref("python"), runtime_classes=["cube", "runc", "gvisor"])
        if self.options["kueue"]:
            found["cluster_queue"] = CLUSTER_QUEUE
        return found

    def stop(self):
        for part in (self.node, self.plane, self.registry):
            if part is not None:
                try:
                    part.stop()
                except Exception as failure:  # the others are still stopped
                    say("stopping %s: %s" % (type(part).__name__, failure))
        # What a part started on its way out (the episode runtime's `kubectl get pods --watch`) ends
        # soon after it: `down` returns once nothing that names the folder runs (killed after 60 s)
        deadline = time.monotonic() + 60
        while leftovers(self.folder) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in leftovers(self.folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run(self):
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: self.stop_asked.set())
        try:
            self.start()
        except BaseException as failure:
            (self.folder / FAILED).write_text("%s\n" % (str(failure) or type(failure).__name__))
            self.stop()
            return 1
        write_atomically(self.folder / READY, json.dumps(self.ready(), indent=2) + "\n")
        while not self.stop_asked.wait(1.0):
            pass
        (self.folder / READY).unlink()
        self.stop()
        return 0


def leftovers(folder):
    """The pids of processes whose command line names `folder`: not a zombie, and not this script
    (the keeper itself, `down` waiting for it)."""
    found, me = [], os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if str(folder) in command and Path(__file__).name not in command and alive(int(entry)):
            found.append(int(entry))
    return found


def write_atomically(path, text):
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


# ---------------------------------------------------------------- up, status, down


def up(arguments):
    folder = Path(arguments.folder).resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise Refused("%s exists and is not an empty folder: name a new one (nothing is overwritten)" % folder)
    if os.geteuid() != 0 and (arguments.real_node or arguments.kueue):
        raise Refused("--real-node and --kueue need root (mount namespaces, bridges, cgroups)")
    if arguments.real_node:
        from realnode.node import can_run_a_node
        why_not = can_run_a_node()
        if why_not:
            raise Refused("this machine cannot run a real node: %s" % why_not)
    # built here, in the foreground, so that its progress lines reach the terminal
    from controlplane import build
    try:
        build.ensure_built()
        if arguments.real_node:
            from realnode import build as node_build
            node_build.ensure_built()
    except Exception as failure:
        raise Failed("the programs cannot be built: %s" % failure)
    folder.mkdir(parents=True, exist_ok=True)
    options = {"nodes": arguments.nodes, "kueue": arguments.kueue, "real_node": arguments.real_node}
    with open(folder / KEEPER_LOG, "ab") as log:
        keeper = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "keep", str(folder),
                                   json.dumps(options)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True, cwd=str(folder))
    write_atomically(folder / STATE, json.dumps({"options": options, "keeper_pid": keeper.pid}, indent=2) + "\n")
    say("starting a local cluster in %s (keeper pid %d)" % (folder, keeper.pid))
    started = time.monotonic()
    next_line = started + PROGRESS_EVERY
    try:
        while not (folder / READY).exists():
            if keeper.poll() is not None:
                why = (folder / FAILED).read_text().strip() if (folder / FAILED).exists() else \
                    "the keeper exited with %s (see %s)" % (keeper.returncode, folder / KEEPER_LOG)
                raise Failed("the local cluster did not start: %s" % why)
            if time.monotonic() >= next_line:
                say("still starting (%.0f s)" % (time.monotonic() - started))
                next_line += PROGRESS_EVERY
            time.sleep(0.2)
    except KeyboardInterrupt:
        say("interrupted: stopping what started")
        stop_keeper(folder, keeper.pid)
        return 130
    ready = json.loads((folder / READY).read_text())
    say("ready in %.0f s: context %s; nodes %s; %s" % (
        time.monotonic() - started, ready["context"], ready.get("real_node") or ready["nodes"],
        ", ".join(ready["parts"])))
    say("use it:  export KUBECONFIG=%s" % ready["kubeconfig"])
    if ready.get("image"):
        say("episodes on the real node need its registry's image: --image %s" % ready["image"])
    if ready.get("cluster_queue"):
        say("queue through Kueue:  --queue team --cluster-queue %s" % ready["cluster_queue"])
    say("stop it: python3 %s down %s" % (sys.argv[0], folder))  # the script as it was named
    print(ready["kubeconfig"])
    return 0


def stop_keeper(folder, pid):
    if not alive(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    started = time.monotonic()
    next_line = started + PROGRESS_EVERY
    while alive(pid):
        if time.monotonic() >= next_line:
            say("still stopping (%.0f s; pid %d)" % (time.monotonic() - started, pid))
            next_line += PROGRESS_EVERY
        time.sleep(0.2)
    return True


def down(arguments):
    folder = Path(arguments.folder).resolve()
    state = read_state(folder)
    if not stop_keeper(folder, state["keeper_pid"]):
        if (folder / READY).exists():  # killed (SIGKILL): it could not stop its parts
            raise Failed("the keeper (pid %d) died without stopping the cluster: its parts' pids are in %s" % (
                state["keeper_pid"], folder / "control-plane" / "kwok" / "clusters"))
        say("the local cluster in %s was already stopped" % folder)
        return 0
    if (folder / READY).exists():
        raise Failed("the keeper ended without stopping every part: see %s" % (folder / KEEPER_LOG))
    say("stopped the local cluster in %s (its logs stay there)" % folder)
    return 0


def status(arguments):
    folder = Path(arguments.folder).resolve()
    state = read_state(folder)
    running = alive(state["keeper_pid"])
    ready = (folder / READY).exists()
    what = "running" if running and ready else "starting" if running else "stopped"
    answer = {"folder": str(folder), "state": what}
    if ready and running:
        answer.update(json.loads((folder / READY).read_text()))
    print(json.dumps(answer, indent=2))
    return 0


def parser():
    top = argparse.ArgumentParser(prog="localcluster.py", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="build what is missing, start a cluster in DIR, print its kubeconfig")
    start.add_argument("folder", metavar="DIR", help="a new or empty folder: the cluster's files and logs")
    start.add_argument("--nodes", type=int, default=2, help="kwok nodes (default 2; ignored with --real-node)")
    start.add_argument("--kueue", action="store_true", help="also Kueue, with a ClusterQueue `team`")
    start.add_argument("--real-node", action="store_true",
                       help="one real node (kubelet, containerd, runc, runsc) instead of kwok's: root only")
    start.set_defaults(handler=up)
    for name, handler, text in (("down", down, "stop the cluster in DIR"),
                                ("status", status, "print the cluster's state and kubeconfig as JSON")):
        command = commands.add_parser(name, help=text)
        command.add_argument("folder", metavar="DIR")
        command.set_defaults(handler=handler)
    keep = commands.add_parser("keep")  # the keeper `up` starts; not for people
    keep.add_argument("folder")
    keep.add_argument("options")
    keep.set_defaults(handler=lambda arguments: Keeper(Path(arguments.folder), json.loads(arguments.options)).run())
    return top


def main(argv=None):
    arguments = parser().parse_args(argv)
    if getattr(arguments, "nodes", 1) < 1:
        say("--nodes must be at least 1")
        return 2
    try:
        return arguments.handler(arguments)
    except Refused as refusal:
        say(str(refusal))
        return 2
    except Failed as failure:
        say(str(failure))
        return 1


if __name__ == "__main__":
    sys.exit(main())
