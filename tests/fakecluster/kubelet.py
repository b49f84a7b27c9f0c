"""The simulated kubelet and container runtime: each container a real local process, its sandbox start, image pulls, statuses, evictions, termination with its grace period.

A mixin of server.Cluster: `self` is the cluster (its lock is held while controllers run).
"""

import hashlib
import json
import os
from pathlib import Path
import random
import secrets
import shutil
import signal
import subprocess
import time

from api import now_rfc3339
from containerenv import container_env


# Run as `sh -c POD_ROOT_SCRIPT pod-root ROOT BINDS CGROUP COMMAND...` inside `unshare --mount`:
# a tmpfs root holding the host's top-level directories (bind-mounted), a minimal /dev, and the
# BINDS (lines "rw|ro<TAB>source<TAB>path"); the pod's own CPU-accounting cgroup CGROUP at
# /sys/fs/cgroup, as a container runtime gives it (made where the host lets root make one, else
# no cgroup is visible: the host's own must never pass for the pod's); then the command runs
# chrooted there, cwd /.
POD_ROOT_SCRIPT = r"""set -e
root=$1; binds=$2; cgroup=$3; shift 3
container_path=$PATH; PATH=/usr/sbin:/usr/bin:/sbin:/bin
chroot_program=$(command -v chroot)
mount -t tmpfs -o mode=755 pod-root "$root"
for entry in /* /.[!.]*; do
  name=${entry#/}
  case "$name" in dev|proc|sys|"*"|".[!.]*") continue;; esac
  if [ -L "$entry" ]; then ln -s "$(readlink "$entry")" "$root/$name"
  elif [ -d "$entry" ]; then mkdir "$root/$name"; mount --rbind "$entry" "$root/$name"
  fi
done
mkdir "$root/proc" "$root/sys" "$root/dev"
mount --rbind /proc "$root/proc"; mount --rbind /sys "$root/sys"
own=""
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2: the pod's cgroup is its /sys/fs/cgroup
  if mkdir -p "/sys/fs/cgroup/$cgroup" 2>/dev/null && echo $$ > "/sys/fs/cgroup/$cgroup/cgroup.procs" 2>/dev/null; then
    own=/sys/fs/cgroup/$cgroup; mount --bind "$own" "$root/sys/fs/cgroup"
  fi
elif [ -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]; then  # cgroup v1: its cpuacct hierarchy
  if mkdir -p "/sys/fs/cgroup/cpuacct/$cgroup" 2>/dev/null && echo $$ > "/sys/fs/cgroup/cpuacct/$cgroup/tasks" 2>/dev/null; then
    own=/sys/fs/cgroup/cpuacct/$cgroup; mount -t tmpfs -o mode=755 pod-cgroup "$root/sys/fs/cgroup"
    mkdir "$root/sys/fs/cgroup/cpuacct"; mount --bind "$own" "$root/sys/fs/cgroup/cpuacct"
  fi
fi
[ -n "$own" ] || mount -t tmpfs -o mode=755 no-cgroup "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=755 pod-dev "$root/dev"
for node in null zero full random urandom tty; do
  [ -e "/dev/$node" ] || continue
  touch "$root/dev/$node"; mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/shm" "$root/dev/pts"; mount -t tmpfs shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"; ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"; ln -s /proc/self/fd/2 "$root/dev/stderr"
tab=$(printf '\t')
printf '%s\n' "$binds" | while IFS=$tab read -r mode source target; do
  [ -n "$target" ] || continue
  if [ -d "$source" ]; then mkdir -p "$root$target"
  else mkdir -p "$(dirname "$root$target")"; touch "$root$target"; fi
  mount --bind "$source" "$root$target"
  if [ "$mode" = ro ]; then mount -o remount,bind,ro "$root$target"; fi
done
PATH=$container_path
exec "$chroot_program" "$root" "$@"
"""


def pod_cgroup(uid):
    """The name of a pod's CPU-accounting cgroup under the host's hierarchy."""
    return "fake-k8s-pod-" + uid


def pod_cgroup_procs(uid):
    """The file that moves a process into a pod's cgroup (v2 cgroup.procs, v1 cpuacct tasks), or None."""
    for path in ("/sys/fs/cgroup/%s/cgroup.procs", "/sys/fs/cgroup/cpuacct/%s/tasks"):
        if os.path.exists(path % pod_cgroup(uid)):
            return path % pod_cgroup(uid)
    return None


def remove_pod_cgroups(uids, patience=0.0):
    """Remove the pods' cgroups (rmdir of an empty cgroup); the uids whose cgroup is still busy."""
    give_up, busy = time.monotonic() + patience, set()
    for uid in uids:
        for hierarchy in ("/sys/fs/cgroup", "/sys/fs/cgroup/cpuacct"):
            while True:
                try:
                    os.rmdir(os.path.join(hierarchy, pod_cgroup(uid)))
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() < give_up:
                        time.sleep(0.05)  # its killed processes are still leaving
                        continue
                    busy.add(uid)
                break
    return busy


def pod_mount_namespaces_available(setting):
    """Per-pod mount namespaces need root and util-linux `unshare`; "auto" uses them when they work."""
    if setting == "off":
        return False
    works = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("chroot") and subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode == 0
    if setting == "on" and not works:
        raise SystemExit("podMountNamespaces is on, but unshare --mount does not work here (needs root)")
    return bool(works)


def handles_sigterm(pid):
    """Whether the process has a SIGTERM handler (SigCgt in /proc/PID/status, bit 15 - 1)."""
    try:
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (OSError, ValueError):
        pass
    return False


def translated_argv(argv, mounts, bin_dir):
    """Without a mount namespace: paths under a mount point to the volume's folder, and
    `python` to the image's."""
    translated = []
    for arg in argv:
        for mount_path, local in mounts.items():
            if arg == mount_path or arg.startswith(mount_path + "/"):
                arg = str(local) + arg[len(mount_path):]
        translated.append(arg)
    if translated and translated[0] == "python":
        translated[0] = str(bin_dir / "python")
    return translated


class Kubelet:
    def node_config(self, name):
        for node in self.config["nodes"]:
            if node["name"] == name:
                return node
        return {}

    def set_condition(self, pod, type_, status, reason=None):
        """A condition the kubelet writes: its time comes from the node's clock."""
        at = self.node_now(pod["spec"]["nodeName"])
        conditions = pod["status"].setdefault("conditions", [])
        for condition in conditions:
            if condition["type"] == type_:
                if condition["status"] != status or condition.get("reason") != reason:
                    condition["status"] = status
                    condition["lastTransitionTime"] = now_rfc3339(at)
                    condition.pop("reason", None)
                    if reason:
                        condition["reason"] = reason
                return
        condition = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339(at)}
        if reason:
            condition["reason"] = reason
        conditions.append(condition)
        order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
        conditions.sort(key=lambda c: order.index(c["type"]) if c["type"] in order else 99)

    def kubelet(self):
        lag = self.timing["kubeletStatusLagSeconds"]
        for pod in self.items("pods"):
            node = pod["spec"].get("nodeName")
            if not node:
                if pod["metadata"].get("deletionTimestamp"):
                    # Never scheduled: no kubelet to wait for, the deletion is immediate
                    # (pod strategy CheckGracefulDelete: grace 0 when spec.nodeName is empty).
                    self.finish_pod_termination(pod, None)
                continue
            uid = pod["metadata"]["uid"]
            record = self.processes.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                self.finish_pod_termination(pod, record)
                continue
            if pod["status"]["phase"] in ("Succeeded", "Failed"):
                continue
            if record is None:
                low, high = self.timing["sandboxStartSeconds"]
                ready_at = time.time() + random.uniform(low, high)
                pull = self.config.get("imagePullSeconds", 0)
                if pull:
                    # The first pod of an image on a node waits for its pull, which goes on
                    # even if that pod is deleted; later pods find the image cached. (Folded
                    # into the sandbox start here: on a real node the pull comes after it.)
                    key = (node, pod["spec"]["containers"][0].get("image"))
                    ready_at = max(ready_at, self.image_pulled.setdefault(key, time.time() + pull))
                self.processes[uid] = {"process": None, "log_path": None, "sandbox_ready_at": ready_at}
            elif record.get("sandbox_ready_at") is not None:
                if time.time() >= record["sandbox_ready_at"]:
                    self.start_pod(pod, node)
            elif record.get("starting"):
                if self.root_in_place(record):
                    self.mark_running(pod, node, *record.pop("starting"))
            elif record.get("process") is not None and record["process"].poll() is not None:
                # The status manager reports an exit a moment later (the kubelet's status lag).
                record.setdefault("exit_seen", (time.time(), self.node_now(node)))
                if time.time() - record["exit_seen"][0] >= lag:
                    self.container_exited(pod, record, finished_at=record["exit_seen"][1])
            elif record.get("synthetic_end") is not None and time.time() >= record["synthetic_end"]:
                self.finish_synthetic_episode(pod, record)
            elif record.get("evict_at") is not None and time.time() >= record["evict_at"]:
                self.evict(pod, record)
            elif record.get("process") is not None and (self.dir / ("evict-" + pod["metadata"]["name"])).exists() \
                    and not record.get("evicted_on_demand"):
                # fault on demand: the test writes `evict-<pod>` into the state folder, and this
                # kubelet evicts that pod under node pressure now (as `evictFirstPod` does at start)
                record["evicted_on_demand"] = True
                self.evict(pod, record)
            elif record.get("api_evict_after_line") is not None:
                text, delay = record["api_evict_after_line"]
                if text.encode() in Path(record["log_path"]).read_bytes():
                    record["api_evict_at"], record["api_evict_after_line"] = time.time() + delay, None
            elif record.get("api_evict_at") is not None and time.time() >= record["api_evict_at"]:
                self.evict_through_api(pod, record)
            elif record.get("pull_failed_at") is not None and time.time() - record["pull_failed_at"] >= 1.0:
                self.image_pull_backoff(pod, record)

    def image_info(self, image):
        return self.config["images"].get(image)

    def normalized_image(self, image):
        name = image
        if "/" not in name.split(":")[0]:
            name = "docker.io/library/" + name
        elif "." not in name.split("/")[0]:
            name = "docker.io/" + name
        return name

    def start_pod(self, pod, node):
        """Sandbox, image, container: what the kubelet does for a newly bound pod."""
        uid = pod["metadata"]["uid"]
        container = pod["spec"]["containers"][0]
        image = container["image"]
        self.set_condition(pod, "PodReadyToStartContainers", "True")
        self.set_condition(pod, "Initialized", "True")
        self.set_condition(pod, "Ready", "False", "ContainersNotReady")
        self.set_condition(pod, "ContainersReady", "False", "ContainersNotReady")
        pod["status"]["hostIP"] = "172.18.0.%d" % (2 + [n["name"] for n in self.config["nodes"]].index(node))
        pod["status"]["hostIPs"] = [{"ip": pod["status"]["hostIP"]}]
        pod["status"].setdefault("startTime", now_rfc3339(self.node_now(node)))
        info = self.image_info(image)
        if info is None:
            # containerd v2.4.2's words through the CRI, as the real node showed them (ASSUMPTIONS.md,
            # "The real node": the gRPC code first, then containerd's resolver)
            registry = ('rpc error: code = NotFound desc = failed to pull and unpack image "%s": failed to resolve '
                        'image: %s: not found' % (self.normalized_image(image), self.normalized_image(image)))
            pod["status"]["containerStatuses"] = [{
                "image": image, "imageID": "", "lastState": {}, "name": container["name"], "ready": False,
                "restartCount": 0, "started": False, "state": {"waiting": {"reason": "ErrImagePull",
                                                                           "message": registry}}}]
            self.put("pods", pod)
            self.record_event(pod, "Normal", "Pulling", 'Pulling image "%s"' % image, "kubelet", node)
            self.record_event(pod, "Warning", "Failed", 'Failed to pull image "%s": %s' % (image, registry),
                              "kubelet", node)
            self.record_event(pod, "Warning", "Failed", "Error: ErrImagePull", "kubelet", node)
            self.processes[uid] = {"process": None, "log_path": None, "pull_failed_at": time.time(),
                                   "registry_message": registry}
            return
        pod_dir = self.dir / "pods" / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        log_path = pod_dir / "container.log"
        termination_path = pod_dir / "termination-log"
        # The same image has the same digest on every node (a real pull resolves one manifest).
        digest = info.get("digest") or "sha256:" + hashlib.sha256(image.encode()).hexdigest()
        container_id = "containerd://" + secrets.token_hex(32)
        synthetic = self.config.get("syntheticEpisodes")
        owned_by_sandbox = any(ref.get("kind") == "Sandbox" for ref in pod["metadata"].get("ownerReferences", []))
        if synthetic and owned_by_sandbox:
            # Benchmark mode: a sandbox's keep-alive runs no process; `exec` makes up the episode.
            self.processes[uid] = {"process": None, "log_path": log_path, "termination_path": termination_path,
                                   "container_id": container_id, "synthetic_keepalive": True,
                                   "restart_once": False, "restarts": 0}
            log_path.write_text("")
            self.mark_running(pod, node, container, image, digest, container_id)
            return
        if synthetic:
            # Benchmark mode, clearly labelled: no process runs; the episode's events are made up.
            self.processes[uid] = {"process": None, "log_path": log_path, "termination_path": termination_path,
                                   "container_id": container_id, "synthetic_start": time.time(),
                                   "synthetic_end": time.time() + synthetic.get("seconds", 0.5),
                                   "restart_once": False, "restarts": 0}
            log_path.write_text("")
            self.mark_running(pod, node, container, image, digest, container_id)
            return
        volumes = {}
        for volume in pod["spec"].get("volumes", []):
            path = pod_dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = self.get("configmaps", pod["metadata"]["namespace"], volume["configMap"]["name"])
                for key, value in (cm or {}).get("data", {}).items():
                    (path / key).write_text(value)
            volumes[volume["name"]] = path
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}
        read_only = {m["mountPath"] for m in container.get("volumeMounts", []) if m.get("readOnly")}
        bin_dir = pod_dir / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(info["python"], bin_dir / "python")
        # The container's own HOME and TMPDIR (a container's /tmp is its own), and the mark by which
        # the tool's reset check finds this sandbox's processes in the machine's /proc (RL_SANDBOX_ID)
        for own in ("home", "tmp"):
            (pod_dir / own).mkdir(exist_ok=True)
        env = {"PATH": "%s:/usr/bin:/bin" % bin_dir, "HOME": str(pod_dir / "home"), "TMPDIR": str(pod_dir / "tmp"),
               "RL_SANDBOX_ID": uid, "LANG": "C.UTF-8"}
        env.update(container_env(container, pod, node))
        offset = self.node_config(node).get("clockOffsetSeconds")
        if offset:
            # A node whose clock differs from the API server's: shift time.time() in the container.
            (pod_dir / "clock").mkdir(exist_ok=True)
            (pod_dir / "clock" / "sitecustomize.py").write_text(
                "import time\n_real = time.time\ntime.time = lambda: _real() + %r\n" % float(offset))
        argv = list(container.get("command", []) + container.get("args", []))
        termination_path.write_text("")
        if self.mount_namespaces:
            # The container sees its volumes at their pod paths, as in a real pod: its own mount
            # namespace, a root assembled from the host's directories, the volumes and the
            # termination-message file bind-mounted in (pod_root_script).
            env["PATH"] = "/.kubelet/bin:/usr/local/bin:/usr/bin:/bin"
            if offset:
                env["PYTHONPATH"] = "/.kubelet/clock"
            binds = [(str(bin_dir), "/.kubelet/bin", True), (str(pod_dir / "home"), "/.kubelet/home", False),
                     (str(pod_dir / "tmp"), "/.kubelet/tmp", False)]
            env.update(HOME="/.kubelet/home", TMPDIR="/.kubelet/tmp")
            if offset:
                binds.append((str(pod_dir / "clock"), "/.kubelet/clock", True))
            binds += [(str(local), path, path in read_only) for path, local in mounts.items()]
            binds.append((str(termination_path), container.get("terminationMessagePath", "/dev/termination-log"),
                          False))
            (pod_dir / "root").mkdir(exist_ok=True)
            lines = "\n".join("%s\t%s\t%s" % ("ro" if ro else "rw", source, path) for source, path, ro in binds)
            argv = [shutil.which("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c", POD_ROOT_SCRIPT,
                    "pod-root", str(pod_dir / "root"), lines, pod_cgroup(uid)] + argv
            self.pod_cgroups.add(uid)
            workdir = pod_dir
        else:
            # No mount namespace here: paths under a mount, in the environment and in the
            # command, are translated to the volume's folder, and the episode is told where its
            # workspace and termination-message file are.
            for name, value in list(env.items()):
                for mount_path, local in mounts.items():
                    if value == mount_path or value.startswith(mount_path + "/"):
                        env[name] = str(local) + value[len(mount_path):]
            if "/workspace" in mounts:
                env["RL_WORKSPACE"] = str(mounts["/workspace"])
            env["RL_CGROUP"] = str(pod_dir / "no-cgroup")  # the host's cgroup is not the pod's: none visible
            if offset:
                env["PYTHONPATH"] = str(pod_dir / "clock")
            argv = translated_argv(argv, mounts, bin_dir)
            workdir = mounts.get("/workspace", pod_dir)
            env["RL_TERMINATION_LOG"] = str(termination_path)
        restart_fault = self.node_config(node).get("restartContainersOnce", False)
        evict_at = api_evict_at = api_evict_after_line = None
        if self.node_config(node).get("evictFirstPod") and node not in self.evicted_nodes:
            self.evicted_nodes.add(node)  # fault: memory pressure on this node evicts its first pod
            evict_at = time.time() + 0.05  # before any episode of the tests can finish
        if self.node_config(node).get("apiEvictFirstPodAfterSeconds") is not None and node not in self.evicted_nodes:
            self.evicted_nodes.add(node)  # fault: a drain evicts this node's first pod through the Eviction API
            delay = self.node_config(node)["apiEvictFirstPodAfterSeconds"]
            if self.node_config(node).get("apiEvictFirstPodAfterLogLine"):
                # Counted from the moment the log first shows this text instead: a test whose
                # episode must have installed its SIGTERM handler before the drain says so, rather
                # than hoping the interpreter starts within a fixed time on a loaded machine.
                api_evict_after_line = (self.node_config(node)["apiEvictFirstPodAfterLogLine"], delay)
            else:
                api_evict_at = time.time() + delay
        process = self.spawn(argv, env, workdir, log_path, truncate=True)
        self.processes[uid] = {"process": process, "uid": uid, "log_path": log_path, "argv": argv, "env": env,
                               "mounts": mounts, "bin_dir": bin_dir, "execs": [],
                               "workdir": workdir, "container_id": container_id,
                               "termination_path": termination_path,
                               "restart_once": restart_fault, "restarts": 0, "evict_at": evict_at,
                               "api_evict_at": api_evict_at, "api_evict_after_line": api_evict_after_line,
                               "log_drop_first_lines": self.node_config(node).get("logDropFirstLines", 0)}
        if self.mount_namespaces:
            # The runtime reports the container running once its root is in place (the process
            # has chrooted), not while the pod-root script is still mounting: an exec before
            # that would run in the host's root.
            self.processes[uid]["starting"] = (container, image, digest, container_id)
            return
        self.mark_running(pod, node, container, image, digest, container_id)

    def root_in_place(self, record):
        """Whether the container's process has entered its own root (or is already gone)."""
        process = record["process"]
        try:
            return process.poll() is not None or os.readlink("/proc/%d/root" % process.pid) != "/"
        except OSError:
            return True

    def mark_running(self, pod, node, container, image, digest, container_id):
        started = now_rfc3339(self.node_now(node))
        repo = self.normalized_image(image).rsplit(":", 1)[0]
        pod["status"]["containerStatuses"] = [{
            "containerID": container_id, "image": self.normalized_image(image),
            "imageID": "%s@%s" % (repo, digest), "lastState": {}, "name": container["name"],
            "ready": True, "restartCount": 0, "started": True, "state": {"running": {"startedAt": started}}}]
        pod["status"]["phase"] = "Running"
        pod["status"]["podIP"] = "10.244.%d.%d" % (random.randint(1, 3), random.randint(2, 250))
        pod["status"]["podIPs"] = [{"ip": pod["status"]["podIP"]}]
        self.set_condition(pod, "Ready", "True")
        self.set_condition(pod, "ContainersReady", "True")
        self.put("pods", pod)
        self.record_event(pod, "Normal", "Pulled", 'Container image "%s" already present on machine' % image,
                          "kubelet", node)
        self.record_event(pod, "Normal", "Created", "Created container: " + container["name"], "kubelet", node)
        self.record_event(pod, "Normal", "Started", "Started container " + container["name"], "kubelet", node)

    def finish_synthetic_episode(self, pod, record):
        """Benchmark mode: write the events a real episode would have written, then exit 0."""
        name, start, end = pod["metadata"]["name"], record["synthetic_start"], record["synthetic_end"]
        ready = {"event": "ready", "at": start + 0.02, "episode_id": name, "started_at": start + 0.005,
                 "imports_done_at": start + 0.015, "synthetic": True}
        reward = {"event": "reward", "at": end - 0.01, "episode_id": name, "reward": 1, "baseline_exit": 1,
                  "tests_exit": 0, "tests_output": "synthetic episode: no tests ran\n", "synthetic": True}
        text = json.dumps(ready) + "\n" + json.dumps(reward) + "\n"
        record["log_path"].write_text(text)
        record["termination_path"].write_text(text)
        record["synthetic_end"] = None
        self.container_exited(pod, record, code=0)

    def evict(self, pod, record):
        """Node-pressure eviction as the kubelet does it: kill, Failed/Evicted, DisruptionTarget."""
        record["evict_at"] = None
        process = record["process"]
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        message = ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. Container "
                   "%s was using 12Mi, request is 64Mi, has larger consumption of memory. "
                   % pod["spec"]["containers"][0]["name"])
        self.container_exited(pod, record, code=137)
        pod["status"]["phase"] = "Failed"
        pod["status"]["reason"] = "Evicted"
        pod["status"]["message"] = message
        pod["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": now_rfc3339(self.node_now(pod["spec"]["nodeName"])),
                                            "reason": "TerminationByKubelet", "message": message})
        self.put("pods", pod)
        self.record_event(pod, "Warning", "Evicted", message, "kubelet", pod["spec"]["nodeName"])

    def evict_through_api(self, pod, record):
        """An Eviction API call (kubectl drain): the API server adds DisruptionTarget
        (EvictionByEvictionAPI) and deletes the pod with its grace period. The container gets
        SIGTERM only if it handles it (PID 1); one that finishes inside the grace period
        still ends Succeeded (pkg/registry/core/pod/storage/eviction.go, kubelet terminal phase)."""
        record["api_evict_at"] = None
        pod["status"].setdefault("conditions", []).append({
            "type": "DisruptionTarget", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339(),
            "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"})
        self.begin_pod_termination(pod)
        self.put("pods", pod)

    def image_pull_backoff(self, pod, record):
        """After a failed pull the kubelet backs off: the waiting reason becomes ImagePullBackOff."""
        record["pull_failed_at"] = None
        image, node = pod["spec"]["containers"][0]["image"], pod["spec"]["nodeName"]
        pod["status"]["containerStatuses"][0]["state"] = {"waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "%s": ErrImagePull: %s' % (image, record["registry_message"])}}
        self.put("pods", pod)
        self.record_event(pod, "Normal", "BackOff", 'Back-off pulling image "%s"' % image, "kubelet", node)
        self.record_event(pod, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet", node)

    def spawn(self, argv, env, workdir, log_path, truncate):
        with open(log_path, "w" if truncate else "a") as log:
            return subprocess.Popen(argv, env=env, cwd=str(workdir), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def container_exited(self, pod, record, code=None, finished_at=None):
        code = record["process"].returncode if code is None else code
        if record.get("process") is not None:
            # PID 1 is gone: the runtime kills what is left in the container (a keep-alive's
            # `sleep`, an exec'd process).
            for pid in [record["process"].pid] + [e.pid for e in record.get("execs", [])]:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        node = pod["spec"]["nodeName"]
        status = pod["status"]["containerStatuses"][0]
        started = status["state"].get("running", {}).get("startedAt", now_rfc3339(self.node_now(node)))
        terminated = {"containerID": record["container_id"], "exitCode": code if code >= 0 else 128 - code,
                      "finishedAt": now_rfc3339(finished_at or self.node_now(node)),
                      "reason": "Completed" if code == 0 else "Error", "startedAt": started}
        termination = record.get("termination_path")
        if self.node_config(pod["spec"]["nodeName"]).get("dropTerminationMessages"):
            termination = None  # fault: a runtime that does not return termination messages
        if termination is not None and termination.exists():
            # The kubelet keeps at most 4096 bytes of a container's termination message.
            message = termination.read_bytes()[-4096:].decode("utf-8", "replace")
            if message:
                terminated["message"] = message
        node = pod["spec"]["nodeName"]
        if record["restart_once"] and record["restarts"] == 0:
            # Fault: the node lost the pod sandbox and the kubelet started the container again.
            record["restarts"] = 1
            self.record_event(pod, "Normal", "SandboxChanged",
                              "Pod sandbox changed, it will be killed and re-created.", "kubelet", node)
            record["process"] = self.spawn(record["argv"], record["env"], record["workdir"], record["log_path"],
                                           truncate=True)
            status["lastState"] = {"terminated": terminated}
            status["restartCount"] = 1
            status["state"] = {"running": {"startedAt": now_rfc3339(self.node_now(node))}}
            record.pop("exit_seen", None)
            self.put("pods", pod)
            return
        status.update(ready=False, started=False, state={"terminated": terminated})
        succeeded = code == 0
        pod["status"]["phase"] = "Succeeded" if succeeded else "Failed"
        reason = "PodCompleted" if succeeded else "PodFailed"
        self.set_condition(pod, "PodReadyToStartContainers", "False")
        self.set_condition(pod, "Initialized", "True", "PodCompleted" if succeeded else None)
        self.set_condition(pod, "Ready", "False", reason)
        self.set_condition(pod, "ContainersReady", "False", reason)
        record["process"] = None
        self.put("pods", pod)

    def begin_pod_termination(self, pod, grace=None):
        """A graceful delete: deletionTimestamp is when the grace period ends. The runtime sends
        SIGTERM to the container's PID 1, which the kernel drops unless PID 1 handles it (a
        `python` that installs no handler keeps running), and SIGKILL when the period is over."""
        if not pod["metadata"].get("deletionTimestamp"):
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
            if not pod["spec"].get("nodeName"):
                grace = 0
            pod["metadata"]["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            pod["metadata"]["deletionGracePeriodSeconds"] = grace
            record = self.processes.get(pod["metadata"]["uid"])
            if record is not None:
                record["kill_at"] = time.time() + grace
                process = record.get("process")
                if process is not None and process.poll() is None and handles_sigterm(process.pid):
                    try:
                        os.kill(process.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

    def finish_pod_termination(self, pod, record):
        if (record or {}).get("starting"):  # deleted while its root was still being set up
            self.mark_running(pod, pod["spec"]["nodeName"], *record.pop("starting"))
        process = (record or {}).get("process")
        if process is not None and process.poll() is None:
            if time.time() < record.get("kill_at", 0):
                return  # still inside its grace period
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
        if process is not None:
            self.container_exited(pod, record)
        elif (record or {}).get("synthetic_end") is not None:
            self.container_exited(pod, record, code=143)
        elif (record or {}).get("synthetic_keepalive"):
            self.container_exited(pod, record, code=0)  # `trap 'exit 0' TERM`
        if pod["status"].get("phase") in ("Pending", "Running"):
            pod["status"]["phase"] = "Failed"
        # The Job controller counts a pod that ends while being deleted; drop it once counted.
        if any(f == "batch.kubernetes.io/job-tracking" for f in pod["metadata"].get("finalizers", [])):
            owner = pod["metadata"]["ownerReferences"][0]["uid"]
            book = self.job_books.get(owner)
            job = next((j for j in self.items("jobs", pod["metadata"]["namespace"])
                        if j["metadata"]["uid"] == owner), None)
            if book is not None and job is not None:
                self.count_finished_pod(job, pod, book)
            # Counted: the controller drops its finalizer, and only then can the pod go.
            pod["metadata"]["finalizers"] = [f for f in pod["metadata"]["finalizers"]
                                             if f != "batch.kubernetes.io/job-tracking"]
            self.put("pods", pod)
        self.remove("pods", pod)
        self.processes.pop(pod["metadata"]["uid"], None)
        shutil.rmtree(self.dir / "pods" / pod["metadata"]["uid"], ignore_errors=True)
        if self.mount_namespaces:  # its cgroup, empty now (else removed when the cluster stops)
            self.pod_cgroups.discard(pod["metadata"]["uid"])
            self.pod_cgroups |= remove_pod_cgroups([pod["metadata"]["uid"]])
