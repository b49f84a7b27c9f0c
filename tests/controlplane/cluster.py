"""A real Kubernetes control plane a test can start and stop: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler of Kubernetes v1.36.3 and kwok's controller for the
nodes, started by kwokctl's binary runtime from the binaries build.py cached (kwokctl downloads
nothing when every binary is a local path), plus the episode runtime (runtime.py).

kwokctl gives the API server certificate authentication, RBAC (--authorization-mode=Node,RBAC),
the default admission plugins (PodSecurity among them) and service-account keys, and the
controller manager its default controllers at their default client limits; it waits for
/readyz. Everything lives in one temporary folder (KWOK_WORKDIR) and is stopped by `kwokctl
delete cluster` (each process by the pid kwokctl recorded)."""

import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

HERE = Path(__file__).resolve().parent

# The Stages kwok runs, from kwok v0.8.0's kustomize/stage (copied by build.py into share/), and
# ours: pods are made Running when bound (pod/fast/pod-ready), completed by the episode runtime
# (stages/pod-complete.yaml, not kwok's own pod-complete, which ends every Job pod with exit 0),
# and removed when deleted (pod/fast/pod-delete); nodes initialized and kept Ready by leases.
KWOK_STAGES = ["node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-delete.yaml"]
# kwok's pod/fast/pod-ready, only for a pod whose container the runtime has started (its `Logs`
# and `Exec` objects written): a kubelet reports a container Running once it runs, and a sandbox
# whose pod is Ready must take an exec at once.
POD_READY_STAGE = "pod/fast/pod-ready.yaml"
RUNNING_ANNOTATION = "runtime.rl-batch-demo.test/running"

# The components a kubeadm cluster runs as static pods (restarted by its kubelet when they exit).
STATIC_PODS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")

# The Kueue CRDs whose kustomization (config/components/crd/kustomization.yaml at v0.19.2) patches
# in a conversion webhook (patches/webhook_in_*.yaml); build.py copies only the bases.
KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def pod_ready_when_running(text):
    selector = "    matchExpressions:\n"
    assert selector in text and "name: pod-ready\n" in text, "kwok's pod-ready stage changed shape"
    return text.replace("name: pod-ready\n", "name: pod-ready-when-running\n").replace(
        selector, selector + "    - key: '.metadata.annotations[\"%s\"]'\n      operator: 'Exists'\n" % RUNNING_ANNOTATION, 1)

# The RuntimeClass the tool names by default (DEFAULT_RUNTIME), with the kwok nodes' handler.
RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "cube"},
                 "handler": "cube"}


class PartDidNotStart(Exception):
    """One line: the part that did not come up and the log file that says why."""


def machine_kubectl():
    """The kubectl our users have (this machine's v1.32.4), never the one built at the server's release."""
    from fakecluster import REAL_KUBECTL
    return REAL_KUBECTL


def kwokctl_configuration(pki, component_flags=None):
    """kwokctl's own configuration: kwok-controller manages only the nodes `kwokctl scale node` made
    (their annotation kwok.x-k8s.io/node=fake: kwokctl's binary runtime otherwise passes
    --manage-all-nodes=true, and kwok would fight a real kubelet for its node), and the API server
    can call a real kubelet (logs, exec) with kwokctl's admin certificate (kwokctl gives it no kubelet
    client flags). The address order stays the API server's default, Hostname first: a kwok node's
    Hostname is `localhost`, its InternalIP a documentation address (192.0.2.x) that must never be
    dialled, and a real node is named by its own bridge address (realnode.node). kwok v0.8.0's
    pkg/kwokctl/components/kwok_controller.go. `component_flags` adds flags to a part by its
    kwokctl name ("kube-controller-manager": [("kube-api-qps", "100")]): a benchmark's raised rates."""
    flags = {"kwok-controller": [("manage-all-nodes", "false"),
                                 ("manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake")],
             "kube-apiserver": [("kubelet-client-certificate", str(pki / "admin.crt")),
                                ("kubelet-client-key", str(pki / "admin.key"))]}
    for name, pairs in (component_flags or {}).items():
        flags[name] = flags.get(name, []) + list(pairs)
    return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration", "componentsPatches": [
        {"name": name, "extraArgs": [{"key": key, "value": value} for key, value in pairs]}
        for name, pairs in flags.items()]}


class ControlPlane:
    def __init__(self, root, built, nodes=2, kubectl=None, parts=(), synthetic_seconds=None, episode_runtime=True,
                 runtime_classes=None, component_flags=None):
        self.root, self.built = Path(root), Path(built)
        self.component_flags = dict(component_flags or {})  # kwokctl part name -> [(flag, value)]
        self.bin = self.built / "bin"
        self.name = "rl%d" % os.getpid() + "-" + os.urandom(3).hex()
        self.workdir = self.root / "kwok"
        self.kubeconfig = self.root / "kubeconfig"
        self.nodes = nodes
        self.kubectl_program = kubectl or machine_kubectl()
        self.runtime = None
        self.parts = tuple(parts)  # add-ons a test asked for: "agent-sandbox" (v0.5.6), "agent-sandbox-v1", "kueue"
        self.synthetic_seconds = synthetic_seconds  # benchmarks: episodes without a process (runtime.py)
        # a plane whose episodes run on a real node (tests/realnode/) starts no episode runtime
        self.episode_runtime = episode_runtime
        self.runtime_classes = runtime_classes if runtime_classes is not None else [RUNTIME_CLASS]
        self.addons = {}  # name -> Popen
        self.recipes, self.restarts, self.launched, self.held_down = {}, {}, [], set()
        self.ports = {}  # component -> the (address, port) pairs its first process listened on
        self.stopping = False
        import threading
        self.supervisor_lock = threading.Lock()

    # --- start and stop

    def kwokctl(self, *args, timeout=300):
        env = dict(os.environ, KWOK_WORKDIR=str(self.workdir))
        # kwokctl runs `kubectl`: the machine's, as the tool does
        env["PATH"] = os.pathsep.join([str(self.install_exec_shims()), str(Path(self.kubectl_program).parent),
                                       env.get("PATH", "")])
        return subprocess.run([str(self.bin / "kwokctl"), "--name", self.name, *args], env=env, text=True,
                              capture_output=True, timeout=timeout)

    def start(self):
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "kwok-stages.yaml"
        share = self.built / "share" / "kwok" / "stage"
        config.write_text("\n---\n".join([(share / stage).read_text() for stage in KWOK_STAGES] +
                                          [pod_ready_when_running((share / POD_READY_STAGE).read_text()),
                                           (HERE / "stages" / "pod-complete.yaml").read_text(),
                                           json.dumps(kwokctl_configuration(self.pki, self.component_flags))]))
        b = self.bin
        with ports_lock():  # no other plane's part is down meanwhile, its port free for this one to take
            done = self.kwokctl(
                "--config", str(config), "create", "cluster", "--runtime", "binary",
                "--kube-apiserver-binary", str(b / "kube-apiserver"),
                "--kube-controller-manager-binary", str(b / "kube-controller-manager"),
                "--kube-scheduler-binary", str(b / "kube-scheduler"), "--etcd-binary", str(b / "etcd"),
                "--kwok-controller-binary", str(b / "kwok"), "--enable-crds", "Logs", "--enable-crds", "Exec",
                "--kubeconfig", str(self.kubeconfig), "--wait", "3m")
        if done.returncode != 0:
            raise PartDidNotStart("kwokctl create cluster failed (logs: %s): %s" % (
                self.workdir / "clusters" / self.name / "logs", last_error(done.stderr)))
        self.kubectl("config", "rename-context", current_context(self.kubeconfig), "kwok")
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": self.runtime_classes}))
        scaled = self.kwokctl("scale", "node", "--replicas", str(self.nodes))
        if scaled.returncode != 0:
            raise PartDidNotStart("kwokctl scale node failed: %s" % last_error(scaled.stderr))
        if self.episode_runtime:
            self.start_runtime()
        self.supervise()
        self.wait_for_nodes()
        if "agent-sandbox" in self.parts:
            self.start_agent_sandbox()
        if "agent-sandbox-v1" in self.parts:
            self.start_agent_sandbox_v1()
        if "kueue" in self.parts:
            self.start_kueue()
        return self

    @property
    def pki(self):
        """kwokctl's certificates: ca.crt, admin.crt, admin.key (its binary runtime's pki folder)."""
        return self.workdir / "clusters" / self.name / "pki"

    def install_exec_shims(self):
        """`env` and `sh` for kwok-controller's PATH: exec_shim.py with this machine's Python."""
        shims = self.root / "exec-shims"
        if not shims.exists():
            shims.mkdir(parents=True)
            # runtime.py beside it on the path: its synthetic events (benchmark mode)
            text = "#!%s\nimport sys as _sys\n_sys.path.insert(0, %r)\n%s" % (
                sys.executable, str(HERE), (HERE / "exec_shim.py").read_text())
            for name in ("env", "sh"):
                (shims / name).write_text(text)
                (shims / name).chmod(0o755)
        return shims

    def start_agent_sandbox(self):
        """agent-sandbox v0.5.6's controller (with --extensions: templates, claims, warm pools) and its
        CRDs, whose conversion webhook it serves on loopback with the fixture's own certificate."""
        from .webhooks import as_json, free_port, make_certificates, on_loopback
        certs = self.root / "agent-sandbox-certs"
        ca = make_certificates(certs)
        port, health = free_port(), free_port()
        crds = [on_loopback(crd, port, ca) for path in sorted((self.built / "share" / "agent-sandbox" / "crds").glob("*.yaml"))
                for crd in as_json(self.kubectl, path.read_text())]
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        self.wait_for_established([crd["metadata"]["name"] for crd in crds])  # the controller maps them at start
        self.start_addon("agent-sandbox-controller", [
            str(self.bin / "agent-sandbox-controller"), "--kubeconfig", str(self.kubeconfig), "--extensions",
            "--leader-elect=false", "--metrics-bind-address", "0", "--health-probe-bind-address",
            "127.0.0.1:%d" % health, "--webhook-port", str(port), "--webhook-cert-dir", str(certs),
            "--manage-webhook-certs=false"], ready_url="http://127.0.0.1:%d/readyz" % health)

    def start_agent_sandbox_v1(self):
        """agent-sandbox v1.0.1's controller (--extensions) and its CRDs: v1beta1 alone, no
        conversion webhook and no webhook flags (v1.0.1 removed v1alpha1, its conversion and
        cmd/agent-sandbox-controller's webhook server; ASSUMPTIONS.md "agent-sandbox v1.0.1")."""
        from .webhooks import as_json, free_port
        health = free_port()
        crds = [crd for path in sorted((self.built / "share" / "agent-sandbox-v1" / "crds").glob("*.yaml"))
                for crd in as_json(self.kubectl, path.read_text())]
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        self.wait_for_established([crd["metadata"]["name"] for crd in crds])
        self.start_addon("agent-sandbox-controller", [
            str(self.bin / "agent-sandbox-controller-v1"), "--kubeconfig", str(self.kubeconfig), "--extensions",
            "--leader-elect=false", "--metrics-bind-address", "0", "--health-probe-bind-address",
            "127.0.0.1:%d" % health], ready_url="http://127.0.0.1:%d/readyz" % health)

    def start_kueue(self):
        """Kueue v0.19.2's controller manager managing batch/v1 Jobs, its CRDs (with the conversion
        webhook its kustomization patches in) and its admission webhooks for Jobs and its own
        kinds, all served on loopback with the fixture's own certificate; a ResourceFlavor
        `default` and the ClusterQueues a test names are made by the test."""
        from .webhooks import as_json, free_port, make_certificates, on_loopback
        share = self.built / "share" / "kueue"
        certs = self.root / "kueue-certs"
        ca = make_certificates(certs)
        port, health = free_port(), free_port()
        crds = [crd for path in sorted((share / "crds").glob("*.yaml")) for crd in as_json(self.kubectl, path.read_text())]
        for crd in crds:
            if crd["metadata"]["name"].split(".")[0] in KUEUE_CONVERTED:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
                                             "clientConfig": {"service": {"path": "/convert"}}}}
            on_loopback(crd, port, ca)
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}))
        self.wait_for_established([crd["metadata"]["name"] for crd in crds])
        self.kubectl("create", "namespace", "kueue-system")
        config = self.root / "kueue-config.yaml"
        config.write_text(json.dumps({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": "127.0.0.1:%d" % health}, "metrics": {"bindAddress": "0"},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
            "integrations": {"frameworks": ["batch/job"]},
            # its visibility API server binds a fixed port (8082): two clusters would collide
            "featureGates": {"VisibilityOnDemand": False}}))
        # Kueue without its internal cert management reads its metrics server's certificate from
        # the fixed /etc/kueue/metrics/certs (cmd/kueue/main.go at v0.19.2): it runs in a mount
        # namespace of its own where /etc is an overlay holding that folder, so that nothing is
        # written to this machine's /etc (root only, as CI runs)
        overlay = self.root / "kueue-etc"
        for sub in ("upper", "work"):
            (overlay / sub).mkdir(parents=True, exist_ok=True)
        script = ('mount -t overlay overlay -o lowerdir=/etc,upperdir="$1",workdir="$2" /etc && '
                  'mkdir -p /etc/kueue/metrics/certs && cp "$3/tls.crt" "$3/tls.key" /etc/kueue/metrics/certs/ && '
                  'shift 3 && exec "$@"')
        self.start_addon("kueue", ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                   str(overlay / "upper"), str(overlay / "work"), str(certs),
                                   str(self.bin / "kueue"), "--config", str(config),
                                   "--kubeconfig", str(self.kubeconfig)],
                         ready_url="http://127.0.0.1:%d/readyz" % health)
        # the webhooks only once they are served: a configuration naming a closed port fails every Job
        webhooks = []
        for configuration in as_json(self.kubectl, (share / "webhook" / "manifests.yaml").read_text()):
            configuration["webhooks"] = [hook for hook in configuration["webhooks"]
                                         if any(part in hook["clientConfig"]["service"]["path"] for part in
                                                ("-batch-v1-job", "-kueue-x-k8s-io-"))]
            configuration["metadata"]["name"] = "kueue-" + configuration["metadata"]["name"]
            webhooks.append(on_loopback(configuration, port, ca))
        self.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": webhooks}))

    def wait_for_established(self, names):
        # not `kubectl wait --for=condition=Established`: v1.32.4 fails on a CRD that has no
        # conditions yet (".status.conditions accessor error: <nil>") instead of waiting
        deadline = time.monotonic() + 60
        while True:
            crds = self.get_json("crd")["items"]
            established = {crd["metadata"]["name"] for crd in crds if any(
                c["type"] == "Established" and c["status"] == "True" for c in crd.get("status", {}).get("conditions") or [])}
            if established >= set(names):
                return
            if time.monotonic() > deadline:
                raise PartDidNotStart("CRDs not Established after 60 s: %s" % ", ".join(sorted(set(names) - established)))
            time.sleep(0.2)

    def start_addon(self, name, argv, ready_url):
        import urllib.request
        log = self.root / (name + ".log")
        self.addons[name] = process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                                                       stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise PartDidNotStart("%s exited with %s (log: %s): %s" % (name, process.returncode, log,
                                                                          last_error(log.read_text())))
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise PartDidNotStart("%s is not ready after 120 s (log: %s)" % (name, log))
            time.sleep(0.2)

    def addon_log(self, name):
        return self.root / (name + ".log")

    def start_runtime(self):
        state = self.root / "runtime"
        state.mkdir(exist_ok=True)
        env = dict(os.environ, KUBECTL=self.kubectl_program)
        if self.synthetic_seconds is not None:
            env["RL_RUNTIME_SYNTHETIC_SECONDS"] = str(self.synthetic_seconds)
        self.runtime = subprocess.Popen([sys.executable, str(HERE / "runtime.py"), str(self.kubeconfig), str(state)],
                                        env=env, stdout=subprocess.DEVNULL, stderr=open(state / "stderr", "w"))
        deadline = time.monotonic() + 60
        while not (state / "runtime.ready").exists():
            if self.runtime.poll() is not None or time.monotonic() > deadline:
                raise PartDidNotStart("the episode runtime did not start: see %s" % (state / "stderr"))
            time.sleep(0.05)

    def wait_for_nodes(self):
        deadline = time.monotonic() + 120
        while True:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
            # Ready, and untainted: the node lifecycle controller removes node.kubernetes.io/not-ready
            # a moment after the node reports Ready (the simulated cluster's nodes never carry it)
            ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                            for c in n["status"].get("conditions", []))
                     and not n["spec"].get("taints")]
            if len(ready) >= self.nodes:
                return
            if time.monotonic() > deadline:
                raise PartDidNotStart("kwok's %d nodes are not Ready after 120 s (kwok-controller's log: %s)" % (
                    self.nodes, self.workdir / "clusters" / self.name / "logs" / "kwok-controller.log"))
            time.sleep(0.2)

    def stop(self):
        with self.supervisor_lock:
            self.stopping = True
        for process in self.addons.values():
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
        if self.runtime is not None and self.runtime.poll() is None:
            self.runtime.terminate()
            try:
                self.runtime.wait(10)
            except subprocess.TimeoutExpired:
                self.runtime.kill()
        exec_group = self.exec_process_group()
        self.kwokctl("delete", "cluster", timeout=120)
        if exec_group is not None:
            # What was exec'd into the pods and outlived its exec (an exec journal's keeper, and its
            # episode waiting for a test that failed) is in kwok-controller's process group
            try:
                os.killpg(exec_group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.launched:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()

    def exec_process_group(self):
        """kwok-controller's process group, when it leads one of its own (kwokctl starts it so):
        every process exec'd into a pod starts in it."""
        try:
            pid = self.component_pid("kwok-controller")
            return pid if os.getpgid(pid) == pid else None
        except (OSError, ValueError):
            return None

    # --- components, for the fault tests

    def component_pid(self, component):
        return int((self.workdir / "clusters" / self.name / "pids" / (component + ".pid")).read_text())

    # --- the kubelet's part: static pods are restarted when they exit

    def supervise(self):
        """Restart etcd, kube-apiserver, kube-controller-manager and kube-scheduler when one exits,
        as the kubelet restarts a kubeadm cluster's static pods: upstream, the controller manager
        and the scheduler exit on purpose when they lose their leader lease (an API server down
        for over 10 s), and count on that restart. kwokctl's binary runtime restarts nothing."""
        import threading
        for component in STATIC_PODS:
            pid = self.component_pid(component)
            self.recipes[component] = (
                Path("/proc/%d/cmdline" % pid).read_bytes().rstrip(b"\0").split(b"\0"),
                os.readlink("/proc/%d/cwd" % pid),
                dict(line.split(b"=", 1) for line in Path("/proc/%d/environ" % pid).read_bytes().split(b"\0")
                     if b"=" in line))
            self.ports[component] = listening_addresses(pid)
        threading.Thread(target=self.restart_what_exits, daemon=True).start()

    def restart_what_exits(self):
        while not self.stopping:
            for component in STATIC_PODS:
                with self.supervisor_lock:
                    if self.stopping or component in self.held_down or alive(self.component_pid(component)):
                        continue
                with ports_lock():  # its ports back before another plane's kwokctl looks for free ones
                    with self.supervisor_lock:
                        if self.stopping or component in self.held_down or alive(self.component_pid(component)):
                            continue
                        self.restarts[component] = self.restarts.get(component, 0) + 1
                        self.launch(component)
                    self.wait_until_listening(component)
            time.sleep(0.5)

    def wait_until_listening(self, component, patience=60):
        """Until the component's new process listens on the ports its first one did (at most
        `patience` seconds: a part that cannot come up is the test's to report)."""
        give_up = time.monotonic() + patience
        while time.monotonic() < give_up and not self.stopping:
            pid = self.component_pid(component)
            if not alive(pid) or set(self.ports.get(component, ())) <= set(listening_addresses(pid)):
                return
            time.sleep(0.1)

    def launch(self, component):
        argv, cwd, env = self.recipes[component]
        with open(self.log_of(component), "ab") as log:
            process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        # the pid file kwokctl reads, so that `kwokctl delete cluster` stops this one
        (self.workdir / "clusters" / self.name / "pids" / (component + ".pid")).write_text(str(process.pid))
        self.launched.append(process)  # reaped by stop()

    def restart_component(self, component, down_while=None):
        """Kill a component (SIGKILL: no clean shutdown) and start it again with the same command
        line, folder and environment, its log appended to; `down_while()` runs while it is down.
        Returns when the new process runs, not when it serves."""
        with self.supervisor_lock:
            self.held_down.add(component)
        try:
            # No other plane starts while this part is down: kwokctl looks for free ports from 32767
            # down, and took this API server's port for another plane's etcd (seen: "server gave
            # HTTP response to HTTPS client", and this API server never came back).
            with ports_lock():
                pid = self.component_pid(component)
                os.kill(pid, 9)
                while alive(pid):
                    time.sleep(0.05)
                if down_while is not None:
                    down_while()
                with self.supervisor_lock:
                    self.launch(component)
                self.wait_until_listening(component)
        finally:
            with self.supervisor_lock:
                self.held_down.discard(component)

    def log_of(self, component):
        return self.workdir / "clusters" / self.name / "logs" / (component + ".log")

    # --- what a test reads

    def env(self, **extra):
        """The environment of the tool under test: the machine's kubectl first on PATH, this kubeconfig."""
        env = dict(os.environ)
        env.pop("KUBECTL", None)
        env["PATH"] = os.pathsep.join([str(Path(self.kubectl_program).parent), env.get("PATH", "")])
        env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(extra)
        return env

    def kubectl(self, *args, stdin=None, check=True):
        done = subprocess.run([self.kubectl_program, "--kubeconfig", str(self.kubeconfig), *args], input=stdin,
                              text=True, capture_output=True, timeout=120)
        if check and done.returncode != 0:
            raise AssertionError("kubectl %s failed: %s" % (" ".join(args), done.stderr))
        return done

    def execs(self):
        """[(namespace/pod, argv)] of every command exec'd into a pod so far (exec_shim.py's log)."""
        found = []
        for folder in sorted((self.root / "runtime" / "pods").glob("*")):
            log = folder / "execs.jsonl"
            if log.exists():
                pod = (folder / "pod-name").read_text()
                found += [(pod, json.loads(line)) for line in log.read_text().splitlines() if line.strip()]
        return found

    def get_json(self, *args):
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def alive(pid):
    """Whether the process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def current_context(kubeconfig):
    for line in Path(kubeconfig).read_text().splitlines():
        if line.startswith("current-context:"):
            return line.split(":", 1)[1].strip()
    raise PartDidNotStart("kwokctl wrote no current-context into %s" % kubeconfig)


def last_error(text):
    lines = [line for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if '"level":"ERROR"' in line or "error" in line.lower():
            return line.strip()[-400:]
    return lines[-1][-400:] if lines else "(no output)"


def available_binaries():
    """The cache folder of built programs, building them when missing; raises build.BuildFailed."""
    sys.path.insert(0, str(HERE))
    import build
    return build.ensure_built()


def listening_addresses(pid):
    """The (IPv4 address, port) pairs the process listens on, from /proc (its sockets' inodes)."""
    import socket
    import struct
    inodes = set()
    for fd in Path("/proc/%d/fd" % pid).iterdir():
        try:
            target = os.readlink(str(fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addresses = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            address, port = fields[1].split(":")
            addresses.append((socket.inet_ntoa(struct.pack("<I", int(address, 16))), int(port, 16)))
    return addresses



def ports_lock():
    """A lock every control plane of this machine takes while it starts or while one of its parts
    is down (fcntl, one file in the temporary folder): test workers start planes in parallel."""
    import contextlib
    import fcntl
    import tempfile

    @contextlib.contextmanager
    def held():
        with open(os.path.join(tempfile.gettempdir(), "rl-batch-demo-controlplane-ports.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return held()
