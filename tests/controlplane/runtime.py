"""The episode runtime of the real-control-plane tier: kwok fakes nodes and kubelets but runs no
container, so this process does what a container runtime would for each pod the real scheduler
binds to a kwok node, through the real API server only:

- runs the pod's first container's command as a local process: its env (values and the downward
  API's name/namespace/uid/nodeName), its ConfigMap volumes as files, its emptyDirs as folders,
  its working folder; an image whose name starts with `python` is this machine's Python;
- writes its stdout and stderr as CRI-format lines (`<RFC3339Nano> stdout F <line>`) to a file
  that a kwok `Logs` object names for that pod, so `pods/NAME/log` goes through the real API
  server to kwok's kubelet endpoint;
- when the process exits, sets the annotations `runtime.rl-batch-demo.test/{exit-code,message,
  started-at,finished-at}`, which the Stage `stages/pod-complete.yaml` turns into the pod's
  terminated container status and phase;
- writes a kwok `Exec` object for the pod, so that `kubectl exec` (and the tool's exec channel)
  goes through the real API server to kwok, which runs the command as a local process with the
  container's env in its working folder; exec_shim.py translates the mount paths and logs it;
- tells kwok's pod-ready stage that the container runs (the annotation `.../running`);
- a pod that is being deleted has its process sent SIGTERM, then SIGKILL after its grace period.

Where it differs from a kubelet (tests/fakecluster/ASSUMPTIONS.md, "The real-control-plane tier"):
no image pull, no mount namespace (paths under a volume's mount path, in the command and the
environment, are translated to the volume's folder, as the simulated kubelet does without
`unshare`), no user switch, no cgroup limits, one container per pod, no restarts.

For the benchmarks, RL_RUNTIME_SYNTHETIC_SECONDS=S runs no process: an episode pod's log and
termination message get the events an episode would write, made up (each marked "synthetic"),
S seconds after it started; a sandbox's keep-alive pod runs nothing until it is deleted; an
exec of the episode program prints the same made-up events after S seconds (exec_shim.py).

It talks to the API server directly (the kubeconfig's client certificate; one connection per
thread), not through a kubectl process per call: a batch of 1,000 pods would otherwise start
5,000 kubectl processes on the machine it measures. Only its pod watch is a kubectl.

Usage: runtime.py KUBECONFIG STATE_DIR (KUBECTL names kubectl; default the one on PATH)."""

import datetime
import http.client
import json
import os
from pathlib import Path
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fakecluster"))
from containerenv import container_env  # noqa: E402  (the kubelet's env rules, shared)

ANNOTATION = "runtime.rl-batch-demo.test/"
KWOK_PLURALS = {"Logs": "logs", "Exec": "execs"}  # kwok v0.8.0's CRDs (kwok.x-k8s.io_logs.yaml, _execs.yaml)


def rfc3339(at=None, nano=False):
    moment = datetime.datetime.fromtimestamp(at if at is not None else time.time(), datetime.timezone.utc)
    if nano:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Api:
    """The API server over HTTPS with the kubeconfig's client certificate, a connection per
    thread; every call returns (status, parsed body or None)."""

    def __init__(self, kubectl_program, kubeconfig):
        view = json.loads(subprocess.run([kubectl_program, "--kubeconfig", kubeconfig, "config", "view", "--raw",
                                          "--minify", "-o", "json"], capture_output=True, text=True,
                                         check=True, timeout=60).stdout)
        cluster, user = view["clusters"][0]["cluster"], view["users"][0]["user"]
        server = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port = server.hostname, server.port or 443
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])
        self.local = threading.local()

    def call(self, method, path, body=None, content_type="application/json"):
        for attempt in range(30):  # an API server being restarted (a fault test) answers again soon
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = self.local.connection = http.client.HTTPSConnection(
                    self.host, self.port, context=self.context, timeout=60)
            try:
                connection.request(method, path, body=None if body is None else json.dumps(body).encode(),
                                   headers={"Content-Type": content_type, "Accept": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
            except (OSError, http.client.HTTPException):
                connection.close()
                self.local.connection = None
                time.sleep(1)
                continue
            try:
                return answer.status, json.loads(data) if data else None
            except ValueError:
                return answer.status, None
        return 0, None


class Runtime:
    def __init__(self, kubeconfig, state):
        self.kubectl_program = os.environ.get("KUBECTL", "kubectl")
        self.kubeconfig, self.state = kubeconfig, Path(state)
        self.api = Api(self.kubectl_program, kubeconfig)
        synthetic = os.environ.get("RL_RUNTIME_SYNTHETIC_SECONDS")
        self.synthetic = float(synthetic) if synthetic else None
        self.pods = {}  # uid -> {"process", "pod", ...}
        # containers are started 8 at a time, as kubelets on several nodes start theirs at once:
        # one after another, a batch of 1,000 waited for the runtime, not for Kubernetes
        import concurrent.futures
        self.starter = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self.lock = threading.Lock()
        self.log = open(self.state / "runtime.log", "a", buffering=1)

    def say(self, line):
        self.log.write("%s %s\n" % (rfc3339(nano=True), line))

    def request(self, what, method, path, body=None, content_type="application/json", ok=(200, 201)):
        status, answer = self.api.call(method, path, body, content_type)
        if status not in ok:
            self.say("%s failed: HTTP %s %s" % (what, status, (answer or {}).get("message", "")))
        return status, answer

    def patch_pod(self, namespace, name, annotations):
        self.request("patch pod %s/%s" % (namespace, name), "PATCH", "/api/v1/namespaces/%s/pods/%s" % (namespace, name),
                     {"metadata": {"annotations": annotations}}, "application/merge-patch+json")

    def create_kwok(self, obj):
        """A kwok Logs or Exec object (one already there, from before a restart, is kept)."""
        self.request("create %s %s" % (obj["kind"], obj["metadata"]["name"]), "POST",
                     "/apis/kwok.x-k8s.io/v1alpha1/namespaces/%s/%s" % (obj["metadata"]["namespace"],
                                                                      KWOK_PLURALS[obj["kind"]]), obj, ok=(201, 409))

    # --- the watch

    def watch(self):
        """Every pod state, from `kubectl get pods -A --watch -o json` (restarted when it ends)."""
        while True:
            process = subprocess.Popen([self.kubectl_program, "--kubeconfig", self.kubeconfig, "get", "pods", "-A",
                                        "--watch", "-o", "json"], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
            lines = []
            for line in process.stdout:
                lines.append(line)
                if line.rstrip("\n") == "}":
                    try:
                        pod = json.loads("".join(lines))
                    except ValueError:
                        continue
                    lines = []
                    # kubectl v1.32.4 prints the watch's initial state as one PodList (checked
                    # with it: `get pods -A --watch -o json`), then each change as a Pod: a
                    # restarted watch (the API server closes a slow watcher's) lists what changed
                    # meanwhile, pods bound while it was down among them
                    for item in pod.get("items", []) if pod.get("kind") == "PodList" else [pod]:
                        try:
                            self.seen(item)
                        except Exception as error:  # one pod's trouble never stops the runtime
                            self.say("pod %s: %r" % (item.get("metadata", {}).get("name"), error))
            process.wait()
            time.sleep(0.2)

    def seen(self, pod):
        meta, uid = pod["metadata"], pod["metadata"]["uid"]
        with self.lock:
            record = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if record is not None:
                self.stop(record, pod)
            return
        if record is None and pod["spec"].get("nodeName") and pod["status"].get("phase") in (None, "Pending", "Running"):
            with self.lock:
                self.pods[uid] = record = {"pod": pod}
            self.starter.submit(self.start_logged, record, pod)

    # --- a container

    def start_logged(self, record, pod):
        try:
            self.start(record, pod)
        except Exception as error:  # one pod's trouble never stops the runtime
            self.say("pod %s: %r" % (pod["metadata"].get("name"), error))

    def start(self, record, pod):
        meta = pod["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        container = pod["spec"]["containers"][0]
        folder = self.state / "pods" / uid
        (folder / "bin").mkdir(parents=True, exist_ok=True)
        if not container["image"].split("/")[-1].startswith("python"):
            self.say("pod %s/%s: image %s is not one this runtime runs; left as it is" % (namespace, name,
                                                                                         container["image"]))
            return
        os.symlink(sys.executable, folder / "bin" / "python")
        volumes = {}
        for volume in pod["spec"].get("volumes", []):
            path = folder / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                status, configmap = self.request("get configmap", "GET", "/api/v1/namespaces/%s/configmaps/%s" % (
                    namespace, volume["configMap"]["name"]))
                if status == 200:
                    for key, value in (configmap.get("data") or {}).items():
                        (path / key).write_text(value)
            volumes[volume["name"]] = path
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])
                  if m["name"] in volumes}
        # the container's own HOME and TMPDIR, and the mark by which the tool's reset check finds this
        # sandbox's processes in the machine's /proc (RL_SANDBOX_ID)
        for own in ("home", "tmp"):
            (folder / own).mkdir(exist_ok=True)
        env = {"PATH": "%s:/usr/bin:/bin" % (folder / "bin"), "HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"),
               "RL_SANDBOX_ID": uid, "LANG": "C.UTF-8"}
        for var, value in container_env(container, pod, pod["spec"]["nodeName"]):
            env[var] = translated(value, mounts)
        termination = folder / "termination-log"
        termination.write_text("")
        env["RL_TERMINATION_LOG"] = str(termination)
        if "/workspace" in mounts:
            env["RL_WORKSPACE"] = str(mounts["/workspace"])
        env["RL_CGROUP"] = str(folder / "no-cgroup")
        argv = [translated(arg, mounts) for arg in container.get("command", []) + container.get("args", [])]
        if argv and argv[0] == "python":
            argv[0] = str(folder / "bin" / "python")
        log_path = folder / "container.log"
        log_path.write_text("")
        logs = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Logs",
                # owned by its pod: the garbage collector removes it with the pod, and cleanup counts it
                # as the run's (a child of the run's pod), as it would the kubelet's own bookkeeping
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]},
                "spec": {"logs": [{"containers": [container["name"]], "logsFile": str(log_path), "follow": True}]}}
        self.create_kwok(logs)
        # `kubectl exec` into this pod: kwok runs the command as a local process with this env (the
        # container's, as in a container) and folder; the `env`/`sh` shim on kwok's PATH translates
        # the mount paths (exec_shim.py)
        exec_env = dict(env, RL_RUNTIME_MOUNTS=json.dumps({path: str(local) for path, local in mounts.items()}),
                        RL_TERMINATION_LOG=str(folder / "exec-termination-log"),
                        RL_RUNTIME_EXEC_LOG=str(folder / "execs.jsonl"))
        if self.synthetic is not None:
            exec_env["RL_RUNTIME_SYNTHETIC_SECONDS"] = str(self.synthetic)
        (folder / "pod-name").write_text("%s/%s" % (namespace, name))
        execs = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Exec",
                 "metadata": {"name": name, "namespace": namespace, "ownerReferences": [
                     {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}]},
                 "spec": {"execs": [{"containers": [container["name"]], "local": {
                     "workDir": str(mounts.get("/workspace", folder)),
                     "envs": [{"name": key, "value": value} for key, value in sorted(exec_env.items())]}}]}}
        self.create_kwok(execs)
        started = time.time()
        if self.synthetic is not None:
            self.start_synthetic(record, pod, argv, log_path, started)
            return
        process = subprocess.Popen(argv, cwd=str(mounts.get("/workspace", folder)), env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        record.update(process=process, started=started, termination=termination,
                      grace=pod["spec"].get("terminationGracePeriodSeconds", 30))
        if record.get("stopping"):  # its pod was deleted while it was being started
            os.killpg(process.pid, signal.SIGKILL)
        self.say("pod %s/%s: started %s" % (namespace, name, " ".join(argv)))
        writer = threading.Lock()
        log = open(log_path, "a", buffering=1)  # closed by finish() once both streams have ended
        readers = [threading.Thread(target=self.copy, args=(stream, kind, log, writer), daemon=True)
                   for stream, kind in ((process.stdout, "stdout"), (process.stderr, "stderr"))]
        for reader in readers:
            reader.start()
        threading.Thread(target=self.finish, args=(record, pod, readers, log), daemon=True).start()
        # now kwok's pod-ready stage may report it Running and Ready (cluster.POD_READY_STAGE)
        self.patch_pod(namespace, name, {ANNOTATION + "running": rfc3339(started)})

    def start_synthetic(self, record, pod, argv, log_path, started):
        """Benchmark mode: no process. An episode (its command runs episode.py) ends after the
        synthetic seconds with made-up events; anything else (a sandbox's keep-alive) runs until
        its pod is deleted."""
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        record.update(started=started, grace=0)
        self.patch_pod(namespace, name, {ANNOTATION + "running": rfc3339(started)})
        if not any(arg.endswith("episode.py") for arg in argv):
            return

        def finish():
            time.sleep(self.synthetic)
            events = synthetic_events(name, started, time.time())
            with open(log_path, "a") as log:
                for line in events.splitlines():
                    log.write("%s stdout F %s\n" % (rfc3339(nano=True), line))
            if record.get("stopping"):
                return
            self.patch_pod(namespace, name, {ANNOTATION + "exit-code": "0", ANNOTATION + "message": events,
                                             ANNOTATION + "started-at": rfc3339(started),
                                             ANNOTATION + "finished-at": rfc3339(time.time())})
        threading.Thread(target=finish, daemon=True).start()

    def copy(self, stream, kind, log, writer):
        """The process's output as CRI lines: a line ending in a newline is full (F); what is
        left without one at the end is partial (P)."""
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace")
            full = text.endswith("\n")
            with writer:
                log.write("%s %s %s %s\n" % (rfc3339(nano=True), kind, "F" if full else "P", text.rstrip("\n")))

    def finish(self, record, pod, readers, log):
        code = record["process"].wait()
        for reader in readers:
            reader.join()
        log.close()
        finished = time.time()
        meta = pod["metadata"]
        if record.get("stopping"):
            return  # the pod is being deleted: kwok's pod-delete stage ends it
        message = record["termination"].read_text()[-4096:]
        patch = {"metadata": {"annotations": {
            ANNOTATION + "exit-code": str(code if code >= 0 else 128 - code),
            ANNOTATION + "message": message,
            ANNOTATION + "started-at": rfc3339(record["started"]),
            ANNOTATION + "finished-at": rfc3339(finished)}}}
        self.patch_pod(meta["namespace"], meta["name"], patch["metadata"]["annotations"])
        self.say("pod %s/%s: exited %s" % (meta["namespace"], meta["name"], code))

    def stop(self, record, pod):
        process = record.get("process")
        if process is None:  # synthetic, or not started yet: start() sees this and starts nothing
            record["stopping"] = True
            return
        if record.get("stopping") or process.poll() is not None:
            return
        record["stopping"] = True
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except OSError:
            return

        def kill_after_grace():
            try:
                process.wait(record["grace"])
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except OSError:
                    pass
        threading.Thread(target=kill_after_grace, daemon=True).start()

    def stop_all(self, *_):
        with self.lock:
            records = list(self.pods.values())
        for record in records:
            if record.get("process") is not None and record["process"].poll() is None:
                try:
                    os.killpg(record["process"].pid, signal.SIGKILL)
                except OSError:
                    pass
        os._exit(0)


def synthetic_events(episode_id, start, end):
    """The ready and reward events an episode would write (its protocol), made up and marked."""
    ready = {"event": "ready", "at": start + 0.02, "episode_id": episode_id, "started_at": start + 0.005,
             "imports_done_at": start + 0.015, "synthetic": True}
    reward = {"event": "reward", "at": end - 0.01, "episode_id": episode_id, "reward": 1, "baseline_exit": 1,
              "tests_exit": 0, "tests_output": "synthetic episode: no tests ran\n", "synthetic": True}
    return json.dumps(ready) + "\n" + json.dumps(reward) + "\n"


def translated(value, mounts):
    """A path under a volume's mount path, as the volume's local folder (no mount namespace here)."""
    for mount_path, local in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path):]
    return value


def main():
    runtime = Runtime(sys.argv[1], sys.argv[2])
    signal.signal(signal.SIGTERM, runtime.stop_all)
    signal.signal(signal.SIGINT, runtime.stop_all)
    (Path(sys.argv[2]) / "runtime.ready").write_text(str(os.getpid()))
    runtime.watch()


if __name__ == "__main__":
    main()
