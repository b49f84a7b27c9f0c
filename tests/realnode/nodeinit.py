"""The real node's first process: run as `unshare --mount --propagation private python3 nodeinit.py
CONFIG`, it binds the node's own folders over the paths containerd, the kubelet and the CNI plugins
write (/var/lib, /var/log, /run), starts containerd, then the kubelet, and at SIGTERM stops them and
every process they left (shims, sandboxes, containers), then exits.

Why one process: the mounts live in a mount namespace of their own, which this process makes and
holds, so every overlay, shm, netns and volume mount the node makes disappears with it, whatever
failed; it is the child subreaper of everything the node starts (containerd's shims double-fork
away from containerd), so it finds and kills all of it by parentage, and nothing outlives it.

CONFIG is JSON: {"binds": [[source, target], ...], "containerd": [argv], "kubelet": [argv],
"env": {...}, "state": folder}. It writes `state/pids.json` ({"containerd": pid, "kubelet": pid})
once both run (again, with "restarts", after one was restarted), `state/ready` when containerd's
socket answers, and each program's output to `state/<name>.log`. Test infrastructure only."""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def descendants(root_pid):
    """Every live process under root_pid, by the parent pids /proc shows."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root_pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def write_pids(state, started, restarts):
    """pids.json, whole or not at all (written beside it, then renamed)."""
    record = {name: process.pid for name, process in started.items()}
    if restarts:
        record["restarts"] = restarts
    with open(os.path.join(state, "pids.json.partial"), "w") as f:
        json.dump(record, f)
    os.replace(os.path.join(state, "pids.json.partial"), os.path.join(state, "pids.json"))


def stop(process, seconds):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main():
    config = json.loads(open(sys.argv[1]).read())
    state = config["state"]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("nodeinit: prctl(PR_SET_CHILD_SUBREAPER) failed: errno %d" % ctypes.get_errno())
    for source, target in config["binds"]:
        subprocess.run(["mount", "--bind", source, target], check=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    env = dict(os.environ, **config["env"])
    started = {}

    def start(name):
        log = open(os.path.join(state, name + ".log"), "ab")
        started[name] = subprocess.Popen(config[name], stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)

    start("containerd")
    sock = config["containerd_socket"]
    while not stopping and started["containerd"].poll() is None:
        try:
            probe = socket.socket(socket.AF_UNIX)
            probe.connect(sock)
            probe.close()
            break
        except OSError:
            time.sleep(0.05)
    if not stopping and started["containerd"].poll() is None:
        open(os.path.join(state, "ready"), "w").close()
        start("kubelet")
    write_pids(state, started, {})
    # Until told to stop: containerd and the kubelet are restarted when they exit, as systemd's
    # Restart=always does on a node (a fault test kills one by its pid); pids.json follows.
    restarts = {}
    while not stopping:
        reap()
        for name in ("containerd", "kubelet"):
            if name in started and started[name].poll() is not None and not stopping:
                restarts[name] = restarts.get(name, 0) + 1
                start(name)
                write_pids(state, started, restarts)
        time.sleep(0.1)
    if "kubelet" in started:
        stop(started["kubelet"], 20)
    # What the node left: shims, gVisor sandboxes, containers. SIGKILL until none is left.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = [pid for pid in descendants(os.getpid()) if pid != started["containerd"].pid]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.05)
    stop(started["containerd"], 20)
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reap()


if __name__ == "__main__":
    main()
