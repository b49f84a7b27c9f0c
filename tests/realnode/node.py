"""A real Kubernetes node a test can start and stop: the kubelet of the control plane's release with
containerd v2, runc and gVisor's runsc, registered with a real control plane (tests/controlplane/)
beside its kwok nodes, pulling its images from a registry on a loopback port (Registry).

Everything the node writes is in its own folder: nodeinit.py binds `fs/var-lib`, `fs/var-log` and
`fs/run` over /var/lib, /var/log and /run in a mount namespace of its own (the kubelet hard-codes
/var/lib/kubelet/device-plugins and /var/log/containers, the CNI plugins /var/lib/cni, the shims
/run/containerd/s); its pods' cgroups are under a cgroup root of its own (`/rlbd-<name>` in each
hierarchy); its network is a bridge of its own whose /24 exists only on this machine: pods get no
default route and no name server, so nothing they send leaves it. The kubelet listens on the
bridge's address (it refuses a loopback node IP), which the API server reaches with kwokctl's admin
certificate (ControlPlane's kubelet client flags) at its Hostname address: the node is named by
that address.

RuntimeClasses: `runc` (handler runc), `gvisor` (handler runsc, on the systrap platform: the kvm
platform panics in this nested VM), and `cube`, the tool's default name, with handler runc: a
"sandbox" class that is not one. Each selects the real node (scheduling.nodeSelector), so that no
episode lands on a kwok node.

stop() stops every process by its pid and leaves no container, shim, mount, veth, bridge, cgroup or
file outside the folder; leftovers() says what is left, for the test that checks it."""

import contextlib
import fcntl
import json
import os
from pathlib import Path
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/
from controlplane.cluster import alive  # noqa: E402  (the tier's helpers, one copy each)
from controlplane.webhooks import free_port  # noqa: E402
NODE_LABEL = "rl-batch-demo.test/node"
# The registry's name in image references: containerd's hosts.toml maps it to the loopback port
# the test's registry listens on, so image names do not change from run to run.
REGISTRY_HOST = "rlbd.test"
IMAGES = {"pause": "pause:1", "python": "python:3.11", "no-python": "no-python:1"}
CGROUP_ROOT = "/sys/fs/cgroup"
KUBELET_PORT = 10250  # its API (logs, exec), on the node's own address: each node has its own
# Where a node writes when nothing binds its own folder there (checked by leftovers())
OUTSIDE_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/run/containerd",
                 "/var/lib/containerd", "/run/netns", "/etc/cni/net.d", "/opt/cni")


class NodeDidNotStart(Exception):
    """One line: the part that did not come up and the log that says why."""


def image_ref(name):
    return "%s/%s" % (REGISTRY_HOST, IMAGES.get(name, name))


def last_lines(path, count=3):
    try:
        lines = [line for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if " E" in line[:30] or "level=error" in line or "error" in line.lower()]
    return " | ".join(line.strip()[-300:] for line in (errors or lines)[-count:])


@contextlib.contextmanager
def machine_lock(name):
    """A lock shared by every node of this machine (test workers start nodes in parallel)."""
    with open(os.path.join(tempfile.gettempdir(), "rl-batch-demo-realnode-%s.lock" % name), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def can_run_a_node():
    """None when this machine can run a real node, else why not (a skip's reason outside CI)."""
    if os.geteuid() != 0:
        return "a real node needs root (mount namespaces, bridges, cgroups)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "a real node needs overlayfs (containerd's snapshotter)"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "a real node needs util-linux's unshare and iproute2's ip"
    return None


# ---------------------------------------------------------------- the registry


class Registry:
    """distribution's registry on a loopback port, its storage in `root`; images pushed from the
    OCI layouts build.py made, through the registry's HTTP API (as `docker push` does)."""

    def __init__(self, root, built):
        self.root, self.built = Path(root), Path(built)
        self.port = None
        self.process = None

    def start(self):
        self.outside_before = {path for path in OUTSIDE_PATHS if os.path.exists(path)}
        self.root.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port()
        config = self.root / "config.yml"
        config.write_text(json.dumps({
            "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "storage")}, "delete": {"enabled": True}},
            "http": {"addr": "127.0.0.1:%d" % self.port}}))
        log = open(self.root / "registry.log", "ab")
        self.process = subprocess.Popen([str(self.built / "bin" / "registry"), "serve", str(config)],
                                        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url("/v2/"), timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise NodeDidNotStart("the registry did not start (log: %s): %s" % (
                    self.root / "registry.log", last_lines(self.root / "registry.log")))
            time.sleep(0.05)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def push(self, layout, reference):
        """Push the image of an OCI layout (build.py's images/<name>) as repository:tag."""
        repository, tag = reference.rsplit(":", 1)
        layout = Path(layout)
        index = json.loads((layout / "index.json").read_text())
        manifest_digest = index["manifests"][0]["digest"]
        manifest_bytes = (layout / "blobs" / "sha256" / manifest_digest.split(":")[1]).read_bytes()
        manifest = json.loads(manifest_bytes)
        for blob in [manifest["config"]] + manifest["layers"]:
            data = (layout / "blobs" / "sha256" / blob["digest"].split(":")[1]).read_bytes()
            head = urllib.request.Request(self.url("/v2/%s/blobs/%s" % (repository, blob["digest"])), method="HEAD")
            try:
                urllib.request.urlopen(head, timeout=30).close()
                continue
            except urllib.error.HTTPError as missing:
                if missing.code != 404:
                    raise
            started = urllib.request.urlopen(urllib.request.Request(
                self.url("/v2/%s/blobs/uploads/" % repository), data=b"", method="POST"), timeout=30)
            location = started.headers["Location"]
            started.close()
            location = location if location.startswith("http") else self.url(location)
            separator = "&" if "?" in location else "?"
            urllib.request.urlopen(urllib.request.Request(
                location + separator + "digest=" + blob["digest"], data=data, method="PUT",
                headers={"Content-Type": "application/octet-stream"}), timeout=120).close()
        urllib.request.urlopen(urllib.request.Request(
            self.url("/v2/%s/manifests/%s" % (repository, tag)), data=manifest_bytes, method="PUT",
            headers={"Content-Type": manifest["mediaType"]}), timeout=30).close()

    def push_built(self, names=None):
        for name in names or IMAGES:
            self.push(self.built / "images" / name, IMAGES[name])
        return self


# ---------------------------------------------------------------- the node


def runtime_classes():
    select = {"nodeSelector": {NODE_LABEL: "real"}}
    return [{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
             "handler": handler, "scheduling": select}
            for name, handler in (("runc", "runc"), ("gvisor", "runsc"), ("cube", "runc"))]


class RealNode:
    def __init__(self, root, built, plane, registry):
        self.root, self.built = Path(root), Path(built)
        self.plane, self.registry = plane, registry
        self.process = None
        self.subnet = None  # the third octet of 10.250.X.0/24
        self.bridge = None
        self.state = self.root / "state"
        self.outside_before = set()
        self.mount_namespace = None  # "mnt:[inode]" of nodeinit's namespace

    # --- paths and addresses

    @property
    def name(self):
        """The node's name is its bridge address: the kubelet reports its name as the node's Hostname
        address, which the API server dials first (its default --kubelet-preferred-address-types;
        kwok's nodes need that order, their Hostname being localhost), and no name server here
        resolves any other name."""
        return self.node_ip

    @property
    def node_ip(self):
        return "10.250.%d.1" % self.subnet

    @property
    def cgroup_name(self):
        return "rlbd-node-%d" % self.subnet

    def hierarchies(self):
        """The cgroup hierarchies mounted under /sys/fs/cgroup (v1 each, and the unified one)."""
        found = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            mount_point, fstype = fields[4], line.split(" - ")[1].split()[0]
            if fstype in ("cgroup", "cgroup2") and mount_point.startswith(CGROUP_ROOT + "/"):
                found.append(mount_point)
        return found

    # --- start

    def start(self):
        self.outside_before = {path for path in OUTSIDE_PATHS if os.path.exists(path)}
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(exist_ok=True)
        with machine_lock("network"):
            self.subnet = self.pick_subnet()
            self.bridge = "rlbd%d" % self.subnet
            self.make_bridge()
        for hierarchy in self.hierarchies():
            os.makedirs(os.path.join(hierarchy, self.cgroup_name), exist_ok=True)
        self.write_configs()
        config = self.root / "nodeinit.json"
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", sys.executable, str(HERE / "nodeinit.py"), str(config)],
            stdout=open(self.state / "nodeinit.log", "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.mount_namespace = self.wait_for_mount_namespace()
        self.wait_until_ready()
        return self

    def wait_for_mount_namespace(self):
        """nodeinit's mount namespace (once `unshare` made it): every process of the node is in it."""
        mine = os.readlink("/proc/self/ns/mnt")
        while self.process.poll() is None:
            try:
                namespace = os.readlink("/proc/%d/ns/mnt" % self.process.pid)
            except OSError:
                break
            if namespace != mine:
                return namespace
            time.sleep(0.01)
        return None

    def pick_subnet(self):
        taken = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        for third in range(10, 250):
            if " 10.250.%d." % third not in taken and "rlbd%d:" % third not in taken:
                return third
        raise NodeDidNotStart("no free 10.250.X.0/24 subnet for the node's bridge")

    def make_bridge(self):
        for argv in (["ip", "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "addr", "add", self.node_ip + "/24", "dev", self.bridge],
                     ["ip", "link", "set", self.bridge, "up"]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise NodeDidNotStart("%s failed: %s" % (" ".join(argv), done.stderr.strip()))

    def write_configs(self):
        fs = self.root / "fs"
        binds = []
        for sub, target in (("var-lib", "/var/lib"), ("var-log", "/var/log"), ("run", "/run")):
            (fs / sub).mkdir(parents=True, exist_ok=True)
            binds.append([str(fs / sub), target])
        for sub in ("var-lib/kubelet", "var-lib/containerd", "var-lib/cni", "var-log/pods", "var-log/containers",
                    "run/containerd", "run/netns"):
            (fs / sub).mkdir(parents=True, exist_ok=True)
        bin_dir, cni_dir = self.built / "bin", self.built / "cni"
        pki = self.plane.pki
        (self.root / "resolv.conf").write_text("# the node's pods have no name server: nothing they send leaves "
                                                "this machine\nnameserver 127.0.0.1\n")
        cni_conf = self.root / "cni-conf"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-rlbd.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "rlbd", "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": False, "isDefaultGateway": False,
                 "ipMasq": False, "hairpinMode": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.250.%d.0/24" % self.subnet,
                                                              "gateway": self.node_ip}]], "routes": []}},
                {"type": "loopback"}]}))
        hosts = self.root / "certs.d" / REGISTRY_HOST
        hosts.mkdir(parents=True, exist_ok=True)
        registry = "http://127.0.0.1:%d" % self.registry.port
        (hosts / "hosts.toml").write_text('server = "%s"\n\n[host."%s"]\n  capabilities = ["pull", "resolve"]\n' % (
            registry, registry))
        (self.root / "runsc.toml").write_text(
            'binary_name = "%s"\nroot = "/run/containerd/runsc"\n\n[runsc_config]\n'
            '  platform = "systrap"\n  oci-seccomp = "true"\n' % (bin_dir / "runsc"))
        (self.root / "containerd.toml").write_text(CONTAINERD_CONFIG % {
            "sandbox": image_ref("pause"), "certs": self.root / "certs.d", "cni_bin": cni_dir, "cni_conf": cni_conf,
            "runc": bin_dir / "runc", "runsc_shim": bin_dir / "containerd-shim-runsc-v1",
            "runsc_config": self.root / "runsc.toml"})
        kubelet_config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # this machine mounts cgroup v1 hierarchies (deprecated; refused by default since 1.35) and
            # PID 1 is not systemd
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": "/" + self.cgroup_name,
            "address": self.node_ip, "port": KUBELET_PORT, "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": str(self.root / "resolv.conf"), "failSwapOn": False,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "staticPodPath": "", "podPidsLimit": 4096,
        }
        (self.root / "kubelet.yaml").write_text(json.dumps(kubelet_config))
        kubeconfig = self.plane.kubeconfig
        env = {"PATH": os.pathsep.join([str(bin_dir), str(cni_dir), os.environ.get("PATH", "/usr/bin:/bin")])}
        (self.root / "nodeinit.json").write_text(json.dumps({
            "binds": binds, "state": str(self.state), "env": env,
            "containerd_socket": "/run/containerd/containerd.sock",
            "containerd": [str(bin_dir / "containerd"), "--config", str(self.root / "containerd.toml")],
            "kubelet": [str(bin_dir / "kubelet"), "--config", str(self.root / "kubelet.yaml"),
                        "--kubeconfig", str(kubeconfig), "--hostname-override", self.name,
                        "--node-ip", self.node_ip, "--node-labels", "%s=real" % NODE_LABEL, "--v", "2"]}))

    def wait_until_ready(self, patience=180):
        deadline = time.monotonic() + patience
        while True:
            if self.process.poll() is not None:
                raise NodeDidNotStart("the node's init exited with %s: %s (logs: %s)" % (
                    self.process.returncode, last_lines(self.state / "nodeinit.log"), self.state))
            restarted = self.pids().get("restarts")
            if restarted:  # a part that exits while the node starts will not serve
                part = sorted(restarted)[0]
                raise NodeDidNotStart("%s exited while the node started (log: %s): %s" % (
                    part, self.state / (part + ".log"), last_lines(self.state / (part + ".log"))))
            if self.is_ready():
                return
            if time.monotonic() > deadline:
                part = "kubelet" if (self.state / "ready").exists() else "containerd"
                raise NodeDidNotStart("the node %s is not Ready after %d s; %s's log %s says: %s" % (
                    self.name, patience, part, self.state / (part + ".log"), last_lines(self.state / (part + ".log"))))
            time.sleep(0.2)

    def is_ready(self):
        done = self.plane.kubectl("get", "node", self.name, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        node = json.loads(done.stdout)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])) \
            and not any(t["key"] == "node.kubernetes.io/not-ready" for t in node["spec"].get("taints") or [])

    def pids(self):
        try:
            return json.loads((self.state / "pids.json").read_text())
        except (OSError, ValueError):
            return {}

    def node_object(self):
        return self.plane.get_json("node", self.name)

    # --- faults

    def kill(self, part):
        """SIGKILL containerd or the kubelet; nodeinit starts it again (as systemd would). Returns
        the old pid once the new one serves: containerd once it says it booted (it loads its
        shims before it serves), the kubelet once its port accepts a connection."""
        old = self.pids()[part]
        logged = (self.state / (part + ".log")).stat().st_size
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not self.serving_again(part, old, logged):
            assert time.monotonic() < deadline, "%s was not restarted (%s)" % (part, self.state / (part + ".log"))
            time.sleep(0.05)
        return old

    def serving_again(self, part, old, logged):
        if self.pids().get(part) in (None, old):
            return False
        if part == "containerd":
            with open(self.state / "containerd.log", "rb") as log:
                log.seek(logged)
                return b"containerd successfully booted" in log.read()
        try:
            socket.create_connection((self.node_ip, KUBELET_PORT), timeout=1).close()
            return True
        except OSError:
            return False

    def pause(self, part):
        """SIGSTOP containerd or the kubelet (a process that stops answering, not one that ended)."""
        os.kill(self.pids()[part], signal.SIGSTOP)

    def pod_volume(self, pod_uid, volume):
        """Where the kubelet keeps a pod's emptyDir volume, as this machine sees it."""
        return self.root / "fs" / "var-lib" / "kubelet" / "pods" / pod_uid / "volumes" / "kubernetes.io~empty-dir" / volume

    def container_processes(self, pod_uid):
        """The pids of a pod's containers (not its pause): the processes in the pod's cgroup under
        this node's cgroup root, found through /proc/PID/cgroup (cgroupfs names it pod<uid>)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                groups = Path("/proc/%s/cgroup" % entry).read_text()
                command = Path("/proc/%s/cmdline" % entry).read_bytes()
            except OSError:
                continue
            if "/%s/" % self.cgroup_name in groups and "pod" + pod_uid in groups and b"pause" not in command:
                found.append(int(entry))
        return found

    def log(self, part):
        return (self.state / (part + ".log")).read_text(errors="replace")

    # --- stop and what is left

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for pid in self.pids().values():
            if isinstance(pid, int) and alive(pid):
                os.kill(pid, signal.SIGKILL)
        # What escaped nodeinit's parentage (seen once: a `runc init` of a container that failed to
        # start, still there after nodeinit ended) is still in the node's mount namespace.
        deadline = time.monotonic() + 30
        while self.mount_namespace is not None and time.monotonic() < deadline:
            members = self.namespace_members()
            if not members:
                break
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if self.subnet is not None:
            self.remove_cgroups()
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def namespace_members(self):
        """The live processes in the node's mount namespace."""
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and self.in_mount_namespace(entry)
                and alive(int(entry))]

    def in_mount_namespace(self, pid):
        """Whether process `pid` is in the node's mount namespace. The kernel reuses a namespace's
        inode number once it is gone (seen: a gVisor gofer of another test's node, in a namespace
        of its own, had the number of this node's ended one), so the number alone is not the
        namespace: its mounts of the node's folder are."""
        try:
            return os.readlink("/proc/%s/ns/mnt" % pid) == self.mount_namespace and \
                str(self.root) in Path("/proc/%s/mountinfo" % pid).read_text()
        except OSError:
            return False

    def remove_cgroups(self):
        for hierarchy in self.hierarchies():
            top = os.path.join(hierarchy, self.cgroup_name)
            if not os.path.isdir(top):
                continue
            # deepest first; a cgroup is removed with rmdir once no process is in it
            folders = [root for root, _, _ in os.walk(top)]
            for folder in sorted(folders, key=len, reverse=True):
                for _ in range(100):
                    try:
                        os.rmdir(folder)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)

    def leftovers(self):
        """What the node left outside its folder: [description]; empty when nothing."""
        left = []
        if self.subnet is not None:
            links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
            for line in links.splitlines():
                if self.bridge + ":" in line or "master %s " % self.bridge in line:
                    left.append("network link: " + line.split(":")[1].strip())
            for hierarchy in self.hierarchies():
                if os.path.exists(os.path.join(hierarchy, self.cgroup_name)):
                    left.append("cgroup: " + os.path.join(hierarchy, self.cgroup_name))
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    mounts = Path("/proc/%s/mountinfo" % entry).read_text()
                    command = Path("/proc/%s/cmdline" % entry).read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if str(self.root) in mounts:
                    left.append("mounts of the node's folder seen by process %s (%s)" % (entry, command[:100]))
                if self.in_mount_namespace(entry) or str(self.root) in command:
                    left.append("process %s: %s" % (entry, command[:200]))
        for path in OUTSIDE_PATHS:
            if os.path.exists(path) and path not in self.outside_before:
                left.append("file outside the folder: " + path)
        return left


CONTAINERD_CONFIG = """version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "%(sandbox)s"
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = "%(certs)s"

  [plugins.'io.containerd.cri.v1.runtime']
    # root here lacks CAP_SYS_RESOURCE: runc may not lower a container's oom_score_adj below its own
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["%(cni_bin)s"]
      conf_dir = "%(cni_conf)s"
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "%(runc)s"
          SystemdCgroup = false
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
        runtime_type = "io.containerd.runsc.v1"
        runtime_path = "%(runsc_shim)s"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
          TypeUrl = "io.containerd.runsc.v1.options"
          ConfigPath = "%(runsc_config)s"
"""
