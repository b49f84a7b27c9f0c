"""Start and drive the simulated cluster (server.py) with its fake kubectl (kubectl.py)."""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

HERE = Path(__file__).resolve().parent


class FakeCluster:
    """One simulated cluster in `root`: state, a `bin/kubectl` to put first on PATH, a server."""

    def __init__(self, root, config=None, contexts=("kind-rl",), current_context="kind-rl"):
        self.root = Path(root)
        self.state = self.root / "cluster"
        self.bin = self.root / "bin"
        self.state.mkdir(parents=True)
        self.bin.mkdir(parents=True)
        (self.state / "cluster.json").write_text(json.dumps(config or {}))
        self.set_kubeconfig(contexts, current_context)
        shim = self.bin / "kubectl"
        shim.write_text('#!/bin/sh\nexec "%s" "%s" "$@"\n' % (sys.executable, HERE / "kubectl.py"))
        shim.chmod(0o755)
        self.process = None

    def set_kubeconfig(self, contexts, current_context):
        (self.state / "kubeconfig.json").write_text(
            json.dumps({"contexts": list(contexts), "current-context": current_context}))

    def start(self):
        self.log = open(self.state / "server.log", "w")
        self.process = subprocess.Popen([sys.executable, str(HERE / "server.py"), str(self.state)],
                                        stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not (self.state / "server.json").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("simulated cluster did not start: " + (self.state / "server.log").read_text())
            time.sleep(0.02)
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

    def execs(self):
        """Every exec, as a kubectl argument list: `kubectl exec` calls, and the execs a `kubectl
        proxy` carried over WebSocket (["exec", POD, "-c", CONTAINER, "--", COMMAND...])."""
        path = self.state / "proxied.jsonl"
        proxied = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [call for call in self.calls() if "exec" in call] + proxied
