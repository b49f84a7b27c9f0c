"""Start and drive the simulated cluster (server.py): through the real kubectl against its HTTP
API (httpapi.py), or, where a test needs a CLI-level behaviour the real binary cannot be made to
show, through the fake kubectl (kubectl.py)."""

import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import time

HERE = Path(__file__).resolve().parent


def find_real_kubectl():
    """The kubectl on PATH (this machine's is v1.32.4), never one of our shims; None without one."""
    found = shutil.which("kubectl", path=os.pathsep.join(
        part for part in os.environ.get("PATH", "").split(os.pathsep) if part and "fakecluster" not in part
        and not Path(part, "fake-kubectl").exists()))
    return os.path.realpath(found) if found else None


REAL_KUBECTL = find_real_kubectl()

# Which kubectl the clusters of this run are driven with: "real" (the default) or "fake".
DEFAULT_KUBECTL = os.environ.get("FAKE_K8S_KUBECTL", "real")


def kubeconfig(port, contexts, current_context):
    """A kubeconfig for the real kubectl: every context on the cluster's HTTP API (plain HTTP on
    127.0.0.1), one token user."""
    return {"apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "simulated", "cluster": {"server": "http://127.0.0.1:%d" % port}}],
            "users": [{"name": "kind-user", "user": {"token": "simulated-cluster-token"}}],
            "contexts": [{"name": name, "context": {"cluster": "simulated", "user": "kind-user"}}
                         for name in contexts],
            "current-context": current_context or ""}


class NoRealKubectl(Exception):
    """The real kubectl is needed and not installed (a test skips; CI fails)."""


class FakeCluster:
    """One simulated cluster in `root`: state, a `bin/kubectl` to put first on PATH, a server."""

    def __init__(self, root, config=None, contexts=("kind-rl",), current_context="kind-rl", kubectl=None):
        self.root = Path(root)
        self.state = self.root / "cluster"
        self.bin = self.root / "bin"
        self.kubectl_kind = kubectl or DEFAULT_KUBECTL
        if self.kubectl_kind == "real" and REAL_KUBECTL is None:
            raise NoRealKubectl("no kubectl on PATH (the suite drives the simulated cluster with the real one)")
        self.state.mkdir(parents=True)
        self.bin.mkdir(parents=True)
        (self.state / "cluster.json").write_text(json.dumps(config or {}))
        self.api_port = None
        self.set_kubeconfig(contexts, current_context)
        shim = self.bin / "kubectl"
        if self.kubectl_kind == "real":
            # Records each command line for the tests, then is the real kubectl (exec: same process).
            shim.write_text("#!%s -S\nimport json, os, sys\nwith open(%r, 'a') as calls:\n"
                            "    calls.write(json.dumps(sys.argv[1:]) + '\\n')\nos.execv(%r, [%r] + sys.argv[1:])\n"
                            % (sys.executable, str(self.state / "calls.jsonl"), REAL_KUBECTL, REAL_KUBECTL))
            (self.bin / "fake-kubectl").write_text("marks this folder as a shim's, not a kubectl's\n")
        else:
            shim.write_text('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, HERE / "kubectl.py"))
        shim.chmod(0o755)
        self.process = None

    def set_kubeconfig(self, contexts, current_context):
        self.contexts, self.current_context = list(contexts), current_context
        (self.state / "kubeconfig.json").write_text(
            json.dumps({"contexts": list(contexts), "current-context": current_context}))
        if self.api_port is not None:
            (self.state / "kubeconfig").write_text(json.dumps(kubeconfig(self.api_port, contexts, current_context)))

    def start(self):
        self.log = open(self.state / "server.log", "w")
        self.process = subprocess.Popen([sys.executable, str(HERE / "server.py"), str(self.state)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not (self.state / "server.json").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("simulated cluster did not start: " + (self.state / "server.log").read_text())
            time.sleep(0.02)
        self.api_port = json.loads((self.state / "server.json").read_text())["api_port"]
        self.set_kubeconfig(self.contexts, self.current_context)
        return self

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            self.log.close()

    def env(self, **extra):
        env = dict(os.environ)
        env.pop("KUBECTL", None)
        env["PATH"] = "%s%s%s" % (self.bin, os.pathsep, env.get("PATH", ""))
        env["FAKE_K8S_DIR"] = str(self.state)
        if self.kubectl_kind == "real":
            env["KUBECONFIG"] = str(self.state / "kubeconfig")
            env["KUBECACHEDIR"] = str(self.state / "kubectl-cache")
        env.update(extra)
        return env

    def kubectl(self, *args, stdin=None, check=True):
        done = subprocess.run([str(self.bin / "kubectl"), *args], input=stdin, text=True,
                              capture_output=True, env=self.env(), timeout=60)
        if check and done.returncode != 0:
            raise AssertionError("kubectl %s failed: %s" % (" ".join(args), done.stderr))
        return done

    def get_json(self, *args):
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def calls(self):
        path = self.state / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def requests(self):
        """Every HTTP request the API served: {"at", "method", "target", "agent", "command", "session"}."""
        path = self.state / "requests.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def execs(self):
        """Every exec, as a kubectl argument list (["exec", POD, "-c", CONTAINER, "--", COMMAND...]):
        with the real kubectl, each one the API server carried (a `kubectl exec` or a WebSocket
        through `kubectl proxy`); with the fake, `kubectl exec` calls and the fake proxy's execs."""
        if self.kubectl_kind == "real":
            path = self.state / "execs.jsonl"
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        path = self.state / "proxied.jsonl"
        proxied = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [call for call in self.calls() if "exec" in call] + proxied
