"""A simulated Kubernetes cluster: API server, Job controller, scheduler, kubelet, GC.

Run as `python server.py STATE_DIR`. It serves a small JSON RPC on 127.0.0.1 (the port is
written to STATE_DIR/server.json) that the fake `kubectl` (kubectl.py) calls. Controllers
run in real time in a background thread; every pod's container is a real local process.

Configuration: STATE_DIR/cluster.json (read at start), see DEFAULT_CONFIG. Everything
this simulation assumes about real Kubernetes is listed in tests/fakecluster/ASSUMPTIONS.md.
"""

import datetime
import hashlib
import http.server
import json
import os
from pathlib import Path
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import agentsandbox
from apitypes import parse_quantity, tolerates
import kueue

DEFAULT_CONFIG = {
    "kubernetesVersion": "v1.34.3",
    "nodes": [
        {"name": "kind-worker", "cpu": "8", "memory": "16Gi"},
        {"name": "kind-worker2", "cpu": "8", "memory": "16Gi"},
    ],
    "runtimeClasses": [{"name": "cube", "handler": "cube"}],
    # image reference -> the local program that plays the image's `python`
    "images": {"python:3.12-alpine": {"python": sys.executable}},
    # RBAC denials: [{"verb": "create", "resource": "namespaces"}]
    "forbid": [],
    # delays in seconds (real clusters take a moment; tests keep them short)
    "namespaceDeletionSeconds": 0.3,
    # The ServiceAccount controller makes `default` in a new namespace this long after it is
    # created; pods created before are refused (k8s-samples fact 26).
    "serviceAccountDelaySeconds": 0.2,
    # A ResourceQuota that a policy controller puts in every new namespace, e.g.
    # {"name": "pod-quota", "pods": 3}: pods over it are refused until quota frees (fact 26).
    "namespaceQuota": None,
    # Every kubectl watch ends after this many seconds: {"afterSeconds": 2, "with": "close"} (the
    # stream just ends) or "expired" (an ERROR event with a 410 Status first; fact 25).
    "watchEnds": None,
    # "auto": run each container in its own mount namespace with its volumes at their pod paths
    # (/workspace, /demo, /dev/termination-log) when this process may (root, unshare); "off":
    # translate paths instead (RL_WORKSPACE, RL_TERMINATION_LOG).
    "podMountNamespaces": "auto",
    # Timing: "default" (fast), or "vm-sandbox": sandbox start 2-5 s, the kubelet's ~1 s status
    # lag, the Job controller's 1 s batching (see PROFILES).
    "profile": "default",
    # kubernetes-sigs/agent-sandbox: None (not installed: the API serves no such kinds), or
    # {"version": "v0.5.6", "extensions": true} (false: CRDs installed, the controller without
    # --extensions, so pools and claims are never reconciled). See agentsandbox.py.
    "agentSandbox": None,
    # Seconds the first pod of an image on a node waits for the image's pull (0: every image cached).
    "imagePullSeconds": 0,
    # kubernetes-sigs/kueue: None, or {"version": "v0.19.2", "clusterQueues": [...], ...}; see kueue.py.
    "kueue": None,
}

PROFILES = {
    "default": {"sandboxStartSeconds": [0.0, 0.0], "kubeletStatusLagSeconds": 0.0, "jobSyncBatchSeconds": 0.0},
    # A VM-sandbox cluster (Kata, micro-VMs): the sandbox takes seconds to boot; the kubelet's
    # status manager reports a container's exit about a second later; the Job controller
    # batches pod updates for one second (syncJobBatchPeriod in job_controller.go).
    "vm-sandbox": {"sandboxStartSeconds": [2.0, 5.0], "kubeletStatusLagSeconds": 1.0, "jobSyncBatchSeconds": 1.0},
}

RESOURCES = {
    # resource: (apiVersion, kind, namespaced, printed group suffix)
    "namespaces": ("v1", "Namespace", False, ""),
    "nodes": ("v1", "Node", False, ""),
    "configmaps": ("v1", "ConfigMap", True, ""),
    "pods": ("v1", "Pod", True, ""),
    "events": ("v1", "Event", True, ""),
    "jobs": ("batch/v1", "Job", True, ".batch"),
    "runtimeclasses": ("node.k8s.io/v1", "RuntimeClass", False, ".node.k8s.io"),
    "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy", True, ".networking.k8s.io"),
    "deployments": ("apps/v1", "Deployment", True, ".apps"),
    **agentsandbox.RESOURCES,
    **kueue.RESOURCES,
}

PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
PSA_ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"


def compress_indexes(indexes):
    """{0, 1, 2, 4} -> "0-2,4", the Job status's interval notation."""
    ranges, ordered = [], sorted(indexes)
    for index in ordered:
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in ranges)


def quoted(names):
    return ", ".join('"%s"' % name for name in names)


def containers_phrase(names):
    return "%s %s" % ("container" if len(names) == 1 else "containers", quoted(names))


def restricted_violations(spec):
    """Pod Security Standards 'restricted' checks, worded as pod-security-admission words them.

    Subset: privileged, allowPrivilegeEscalation, capabilities, volume types, runAsNonRoot,
    runAsUser, seccompProfile (staging/src/k8s.io/pod-security-admission/policy/check_*.go).
    """
    containers = spec.get("initContainers", []) + spec.get("containers", [])
    pod_sc = spec.get("securityContext") or {}
    found = []
    privileged = [c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        found.append("privileged (%s must not set securityContext.privileged=true)" % containers_phrase(privileged))
    escalating = [c["name"] for c in containers
                  if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if escalating:
        found.append("allowPrivilegeEscalation != false (%s must set securityContext.allowPrivilegeEscalation=false)"
                     % containers_phrase(escalating))
    undropped = [c["name"] for c in containers
                 if "ALL" not in ((c.get("securityContext") or {}).get("capabilities") or {}).get("drop", [])]
    if undropped:
        found.append('unrestricted capabilities (%s must set securityContext.capabilities.drop=["ALL"])'
                     % containers_phrase(undropped))
    allowed_volumes = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret", "image"}
    bad_volumes = [v["name"] for v in spec.get("volumes", []) if not (set(v) - {"name"}) <= allowed_volumes]
    if bad_volumes:
        kinds = sorted({k for v in spec.get("volumes", []) for k in v if k != "name" and k not in allowed_volumes})
        found.append("restricted volume types (%s %s %s %s)" % (
            "volume" if len(bad_volumes) == 1 else "volumes", quoted(bad_volumes),
            "uses" if len(bad_volumes) == 1 else "use", "restricted volume type " + quoted(kinds)))
    if pod_sc.get("runAsNonRoot") is not True:
        not_nonroot = [c["name"] for c in containers if (c.get("securityContext") or {}).get("runAsNonRoot") is not True]
        if not_nonroot:
            found.append("runAsNonRoot != true (pod or %s must set securityContext.runAsNonRoot=true)"
                         % containers_phrase(not_nonroot))
    root_users = [c["name"] for c in containers if (c.get("securityContext") or {}).get("runAsUser") == 0]
    if pod_sc.get("runAsUser") == 0 or root_users:
        who = "pod" if pod_sc.get("runAsUser") == 0 else containers_phrase(root_users)
        found.append("runAsUser=0 (%s must not set runAsUser=0)" % who)
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    no_seccomp = [c["name"] for c in containers
                  if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type") not in (
                      "RuntimeDefault", "Localhost") and not pod_seccomp]
    if no_seccomp:
        found.append('seccompProfile (pod or %s must set securityContext.seccompProfile.type to "RuntimeDefault" '
                     'or "Localhost")' % containers_phrase(no_seccomp))
    return found

NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's generateName alphabet


def now_rfc3339(at=None):
    """metav1.Time: UTC, whole seconds (truncated), Z suffix."""
    at = time.time() if at is None else at
    return datetime.datetime.fromtimestamp(int(at), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# Field selectors the API server supports, beyond metadata.name/namespace (events: the
# fields of pkg/registry/core/event/strategy.go ToSelectableFields; pods: a subset).
FIELD_LABELS = {
    "events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
               "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
               "reason", "reportingComponent", "source", "type"),
    "pods": ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
             "status.phase", "status.podIP", "status.nominatedNodeName"),
}


def field_of(obj, path):
    if path == "source":
        return (obj.get("source") or {}).get("component", "")
    value = obj
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return value


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


# Run as `sh -c POD_ROOT_SCRIPT pod-root ROOT BINDS COMMAND...` inside `unshare --mount`: a
# tmpfs root holding the host's top-level directories (bind-mounted), a minimal /dev, and the
# BINDS (lines "rw|ro<TAB>source<TAB>path"); then the command runs chrooted there, cwd /.
POD_ROOT_SCRIPT = r"""set -e
root=$1; binds=$2; shift 2
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


def field_value(pod, path, node):
    """The downward API: metadata.name, .namespace, .uid, spec.nodeName, labels['k'], annotations['k']."""
    match = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
    if match:
        return pod["metadata"].get(match.group(1), {}).get(match.group(2), "")
    return {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": node}.get(path, "")


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


class ApiError(Exception):
    """A metav1.Status failure."""

    def __init__(self, code, reason, message):
        super().__init__(message)
        self.status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}


def not_found(resource, name):
    return ApiError(404, "NotFound", '%s%s "%s" not found' % (resource, RESOURCES[resource][3], name))


class Cluster:
    def __init__(self, state_dir, config):
        self.dir = Path(state_dir)
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every write, for watches
        self.faults = [dict(f) for f in config.get("transientFailures", [])]
        self.objects = {}  # resource -> {(namespace or "", name) -> object}
        self.resource_version = 1000
        self.processes = {}  # pod uid -> runtime record
        self.job_books = {}  # job uid -> {"succeeded": set(), "failed": set(), ...}
        self.history = []  # (resourceVersion, resource, state) of every write and removal, for watches
        self.evicted_nodes = set()
        self.event_index = {}  # (namespace, object uid, reason, message) -> event, to aggregate repeats
        self.namespace_born = {}  # namespace -> when it was created (its ServiceAccount comes later)
        self.timing = dict(PROFILES[config.get("profile", "default")], **config.get("timing", {}))
        self.job_synced = {}  # job uid -> when the Job controller last synced it (batching)
        self.image_pulled = {}  # (node, image) -> when its pull is done (imagePullSeconds)
        self.mount_namespaces = pod_mount_namespaces_available(config.get("podMountNamespaces", "auto"))
        self.agent_sandbox = agentsandbox.AgentSandbox(self)
        self.kueue = kueue.Kueue(self)
        self.stop = threading.Event()
        with self.lock:
            self.seed_objects()

    # ---------------------------------------------------------------- storage

    def next_rv(self):
        self.resource_version += 1
        return str(self.resource_version)

    def put(self, resource, obj):
        obj["metadata"]["resourceVersion"] = self.next_rv()
        self.objects.setdefault(resource, {})[(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])] = obj
        self.remember(resource, obj)

    def get(self, resource, namespace, name):
        return self.objects.get(resource, {}).get((namespace or "", name))

    def items(self, resource, namespace=None):
        found = [obj for (ns, _), obj in self.objects.get(resource, {}).items()
                 if namespace is None or ns == namespace]
        return sorted(found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def remove(self, resource, obj):
        self.objects.get(resource, {}).pop((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]), None)
        obj["metadata"]["resourceVersion"] = self.next_rv()
        self.remember(resource, obj)

    def remember(self, resource, obj):
        """Every state an object passes through, as a watch delivers them (not only the latest)."""
        self.history.append((int(obj["metadata"]["resourceVersion"]), resource, json.loads(json.dumps(obj))))
        if len(self.history) > 200000:
            del self.history[:50000]
        self.changed.notify_all()

    def node_now(self, node):
        """The node's own clock (kubelet timestamps): the API server's plus the node's offset."""
        return time.time() + float(self.node_config(node).get("clockOffsetSeconds", 0) or 0)

    def new_metadata(self, metadata, namespace):
        meta = dict(metadata)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choice(NAME_CHARS) for _ in range(5))
        if namespace:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        return meta

    def seed_objects(self):
        for node in self.config["nodes"]:
            meta = self.new_metadata({"name": node["name"], "labels": {
                # usually the node's name, but not always (--hostname-override; fact 31)
                "kubernetes.io/hostname": node.get("hostname", node["name"]), "kubernetes.io/os": "linux",
                **node.get("labels", {})}}, "")
            allocatable = {"cpu": node.get("cpu", "8"), "memory": node.get("memory", "16Gi"),
                           "pods": str(node.get("pods", 110))}
            spec = {"unschedulable": True} if node.get("unschedulable") else {}
            if node.get("taints"):
                spec["taints"] = node["taints"]
            obj = {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
                   "status": {"allocatable": allocatable, "capacity": dict(allocatable),
                              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                              "message": "kubelet is posting ready status",
                                              "lastHeartbeatTime": meta["creationTimestamp"],
                                              "lastTransitionTime": meta["creationTimestamp"]}],
                              "nodeInfo": {"kernelVersion": os.uname().release,
                                           "osImage": "Debian GNU/Linux 12 (bookworm)",
                                           "containerRuntimeVersion": "containerd://2.1.1",
                                           "kubeletVersion": self.config["kubernetesVersion"],
                                           "kubeProxyVersion": "", "operatingSystem": "linux",
                                           "architecture": "amd64"}}}
            self.put("nodes", obj)
        for rc in self.config["runtimeClasses"]:
            obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                   "metadata": self.new_metadata({"name": rc["name"]}, ""), "handler": rc["handler"]}
            for key in ("overhead", "scheduling"):
                if key in rc:
                    obj[key] = rc[key]
            self.put("runtimeclasses", obj)
        for name in ("default", "kube-system"):
            self.create_namespace({"metadata": {"name": name}})
            self.namespace_born[name] = 0.0
        if agentsandbox.installed(self.config):
            self.create_namespace({"metadata": {"name": agentsandbox.CONTROLLER_NAMESPACE}})
            self.namespace_born[agentsandbox.CONTROLLER_NAMESPACE] = 0.0
            self.put("deployments", agentsandbox.controller_deployment(self.config, self.new_metadata))
        if kueue.installed(self.config):
            self.kueue.seed(self.new_metadata)

    def served(self, resource):
        """Whether the API server serves the resource (CRDs only once installed)."""
        if resource not in RESOURCES:
            return False
        if resource in kueue.RESOURCES:
            return kueue.installed(self.config)
        return resource not in agentsandbox.RESOURCES or agentsandbox.installed(self.config)

    def discovery(self):
        return sorted(resource for resource in RESOURCES if self.served(resource))

    # ---------------------------------------------------------------- API verbs

    def check_rbac(self, verb, resource, namespace, name=None):
        """Denials worded as the API server words them (apiserver responsewriters.forbiddenMessage
        wrapped in errors.NewForbidden: `<resource>[.<group>] ["<name>"] is forbidden: ...`)."""
        for rule in self.config.get("forbid", []):
            if rule.get("verb") == verb and rule.get("resource") == resource:
                group = RESOURCES[resource][3].lstrip(".")
                scope = ('in the namespace "%s"' % namespace) if namespace and RESOURCES[resource][2] \
                    else "at the cluster scope"
                qualified = resource + RESOURCES[resource][3] + (' "%s"' % name if name else "")
                raise ApiError(403, "Forbidden", '%s is forbidden: User "kind-user" cannot %s resource "%s" in '
                               'API group "%s" %s' % (qualified, verb, resource, group, scope))

    def api_create(self, resource, namespace, body):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api_version, kind, namespaced, _ = RESOURCES[resource]
        namespace = (namespace or body.get("metadata", {}).get("namespace") or "default") if namespaced else ""
        self.check_rbac("create", resource, namespace)
        if body.get("kind") != kind:
            raise ApiError(400, "BadRequest", "the object kind %r does not match %s" % (body.get("kind"), kind))
        name = body.get("metadata", {}).get("name")
        if namespaced:
            ns = self.get("namespaces", "", namespace)
            if ns is None:
                raise not_found("namespaces", namespace)
            if ns["metadata"].get("deletionTimestamp"):
                raise ApiError(403, "Forbidden", '%s "%s" is forbidden: unable to create new content in '
                               'namespace %s because it is being terminated' % (resource, name, namespace))
        if name and self.get(resource, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", '%s%s "%s" already exists' % (resource, RESOURCES[resource][3], name))
        if resource == "namespaces":
            created = self.create_namespace(body)
            self.namespace_born[created["metadata"]["name"]] = time.time()
            return created
        obj = json.loads(json.dumps(body))
        obj["apiVersion"], obj["kind"] = api_version, kind
        # Mutating admission runs before the name is generated, so its refusals name the pod by
        # its generateName prefix (`pods "rollout-" is forbidden`, k8s-samples fact 26).
        requested_name = name or obj.get("metadata", {}).get("generateName", "")
        obj["metadata"] = self.new_metadata(obj.get("metadata", {}), namespace)
        if resource == "jobs":
            if kueue.installed(self.config):
                self.kueue.webhook(obj)
            self.default_job(obj)
        elif resource in kueue.RESOURCES:
            obj["metadata"]["generation"] = 1
        elif resource in agentsandbox.RESOURCES:
            if resource == "sandboxclaims" and not (obj.get("spec", {}).get("warmPoolRef") or {}).get("name"):
                raise ApiError(422, "Invalid", 'SandboxClaim.extensions.agents.x-k8s.io "%s" is invalid: '
                               'spec.warmPoolRef.name: Required value' % obj["metadata"]["name"])
            obj["metadata"]["generation"] = 1
        elif resource == "pods":
            self.mutate_pod(obj)
            self.admit_pod(obj, requested_name)
        self.put(resource, obj)
        return obj

    def mutate_pod(self, pod):
        """Mutating admission webhooks configured on the cluster (e.g. a sidecar injector)."""
        sidecar = self.config.get("injectSidecar")
        if sidecar:
            pod["spec"]["containers"].append(dict(sidecar))

    def create_namespace(self, body):
        meta = self.new_metadata(body.get("metadata", {}), "")
        meta["labels"] = {**meta.get("labels", {}), "kubernetes.io/metadata.name": meta["name"]}
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
        self.put("namespaces", obj)
        return obj

    def default_job(self, job):
        """What the API server's Job strategy and defaulting add at creation."""
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                  "controller-uid": uid, "job-name": name}
        job["metadata"]["generation"] = 1
        job["metadata"]["labels"] = {**labels, **job["metadata"].get("labels", {})}
        spec = job.setdefault("spec", {})
        # With backoffLimitPerIndex the global backoffLimit defaults to the maximum int32.
        spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("completions", 1)
        spec.setdefault("manualSelector", False)
        spec.setdefault("parallelism", 1)
        # With a podFailurePolicy only `Failed` is allowed, and it is the default (job validation,
        # KEP-3939): a terminating pod is replaced only once it has failed. Otherwise at once.
        spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        spec.setdefault("suspend", False)
        template = spec.setdefault("template", {})
        template_meta = template.setdefault("metadata", {})
        template_meta["labels"] = {**template_meta.get("labels", {}), **labels}
        pod_spec = template.setdefault("spec", {})
        for container in pod_spec.get("containers", []):
            image = container.get("image", "")
            default_policy = "Always" if image.endswith(":latest") or ":" not in image.split("/")[-1] else "IfNotPresent"
            container.setdefault("imagePullPolicy", default_policy)
            container.setdefault("resources", {})
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
        pod_spec.setdefault("dnsPolicy", "ClusterFirst")
        pod_spec.setdefault("schedulerName", "default-scheduler")
        pod_spec.setdefault("securityContext", {})
        pod_spec.setdefault("terminationGracePeriodSeconds", 30)
        for volume in pod_spec.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"].setdefault("defaultMode", 420)
        job["status"] = {}
        self.job_books[uid] = {"succeeded": set(), "failed": set(), "ignored": set(), "create_backoff_until": 0.0,
                               "create_failures": 0, "indexes_succeeded": set(), "indexes_failed": set(),
                               "index_failures": {}, "index_retry_at": {}}

    def admit_pod(self, pod, requested_name):
        """The admission chain for a pod, in the API server's plugin order: ServiceAccount,
        RuntimeClass (both mutating: refusals name the generateName prefix), PodSecurity
        (validating: the generated name), ResourceQuota (prefix, as recorded in fact 26)."""
        spec, namespace = pod["spec"], pod["metadata"]["namespace"]
        born = self.namespace_born.get(namespace, 0.0)
        if time.time() - born < self.config.get("serviceAccountDelaySeconds", 0):
            raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: error looking up service account %s/default: '
                           'serviceaccount "default" not found' % (requested_name, namespace))
        rc_name = spec.get("runtimeClassName")
        if rc_name:
            rc = self.get("runtimeclasses", "", rc_name)
            if rc is None:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: pod rejected: RuntimeClass "%s" '
                               'not found' % (requested_name, rc_name))
            if "overhead" in rc:
                spec["overhead"] = dict(rc["overhead"].get("podFixed", {}))
            selector = rc.get("scheduling", {}).get("nodeSelector")
            if selector:
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **selector}
            # setScheduling: the class's tolerations are added to the pod's (fact 31)
            for toleration in rc.get("scheduling", {}).get("tolerations") or []:
                if toleration not in spec.setdefault("tolerations", []):
                    spec["tolerations"].append(dict(toleration))
        ns_labels = self.get("namespaces", "", namespace)["metadata"].get("labels", {})
        level = ns_labels.get(PSA_ENFORCE)
        if level == "restricted":
            violations = restricted_violations(spec)
            if violations:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: violates PodSecurity "restricted:%s": %s'
                               % (pod["metadata"]["name"], ns_labels.get(PSA_ENFORCE_VERSION, "latest"),
                                  ", ".join(violations)))
        quota = self.config.get("namespaceQuota")
        if quota and born:
            used = sum(1 for other in self.items("pods", namespace)
                       if other["status"].get("phase") not in ("Succeeded", "Failed"))
            if used + 1 > quota["pods"]:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: exceeded quota: %s, requested: pods=1, '
                               'used: pods=%d, limited: pods=%d' % (requested_name, quota.get("name", "pod-quota"),
                                                                    used, quota["pods"]))
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        spec.setdefault("serviceAccount", "default")
        spec.setdefault("serviceAccountName", "default")
        # DefaultTolerationSeconds: not-ready/unreachable for 300 s, unless already tolerated
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"effect": "NoExecute", "key": key, "operator": "Exists",
                                    "tolerationSeconds": 300})
        pod["metadata"]["generation"] = 1
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}

    def api_get(self, resource, namespace, name):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.check_rbac("get", resource, namespace, name)
        obj = self.get(resource, namespace if RESOURCES[resource][2] else "", name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def api_list(self, resource, namespace, selector, field_selector=None):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.check_rbac("list", resource, namespace)
        fields = [part.split("=", 1) for part in (field_selector or "").split(",") if part]
        for key, _ in fields:
            if key not in FIELD_LABELS.get(resource, ()) and key not in ("metadata.name", "metadata.namespace"):
                raise ApiError(400, "BadRequest", 'Unable to find "%s, Resource=%s" that match label selector "%s", '
                               'field selector "%s": field label not supported: %s' % (
                                   ("" if "/" in RESOURCES[resource][0] else "/") + RESOURCES[resource][0], resource,
                                   selector or "", field_selector, key))
        terms = [part.split("=", 1) if "=" in part else [part, None] for part in (selector or "").split(",") if part]
        scope = None if namespace == "*" or not RESOURCES[resource][2] else namespace
        found = self.items(resource, scope)

        def matches(obj):
            labels = obj["metadata"].get("labels", {})
            return all(key in labels if value is None else labels.get(key) == value for key, value in terms) and \
                all(str(field_of(obj, key)) == value for key, value in fields)
        return [obj for obj in found if matches(obj)]

    def api_delete(self, resource, namespace, name, propagation):
        self.check_rbac("delete", resource, namespace, name)
        obj = self.api_get(resource, namespace, name)
        if obj["metadata"].get("deletionTimestamp") and resource == "namespaces":
            # A second DELETE of a Terminating namespace is refused (k8s-samples fact 24).
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on namespaces "%s": The system is ensuring '
                           'all content is removed from this namespace.  Upon completion, this namespace will '
                           'automatically be purged by the system.' % name)
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        obj["metadata"]["deletionTimestamp"] = now_rfc3339()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        if resource == "namespaces":
            obj["status"]["phase"] = "Terminating"
            self.job_books.setdefault("ns:" + obj["metadata"]["uid"], {"deleted_at": time.time()})
        elif resource == "jobs" and propagation == "Foreground":
            obj["metadata"]["finalizers"] = obj["metadata"].get("finalizers", []) + ["foregroundDeletion"]
        elif resource == "pods":
            self.begin_pod_termination(obj)
        else:
            self.remove(resource, obj)
            return obj
        self.put(resource, obj)
        return obj

    def api_label(self, resource, namespace, name, labels, overwrite):
        obj = self.api_get(resource, namespace, name)
        current = obj["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
                continue
            if key in current and current[key] != value and not overwrite:
                raise ApiError(400, "BadRequest", "'%s' already has a value (%s), and --overwrite is false"
                               % (key, current[key]))
            current[key] = value
        self.put(resource, obj)
        return obj

    def api_logs(self, namespace, name, container):
        """The kubelet serves logs: the API server only looks the pod up (briefly, under the
        lock); the file is read outside it, so that reading 10,000 logs waits for no controller."""
        with self.lock:
            pod = self.get("pods", namespace, name)
            if pod is None:
                raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
            record = dict(self.processes.get(pod["metadata"]["uid"]) or {})
            if not record.get("log_path"):
                reason = "ContainerCreating"
                for status in pod.get("status", {}).get("containerStatuses", []):
                    reason = status.get("state", {}).get("waiting", {}).get("reason", reason)
                if reason in ("ErrImagePull", "ImagePullBackOff"):
                    reason = "image can't be pulled"
                raise ApiError(400, "BadRequest", 'container "%s" in pod "%s" is waiting to start: %s'
                               % (container, name, reason))
        try:
            text = Path(record["log_path"]).read_text(errors="replace")
        except FileNotFoundError:  # the pod was deleted meanwhile (its folder goes with it)
            raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
        drop = record.get("log_drop_first_lines", 0)
        if drop:
            text = "".join(text.splitlines(keepends=True)[drop:])
        return text

    def api_exec(self, namespace, name, container, command, stdin):
        """`kubectl exec`: the kubelet runs the command in the running container (its mount
        namespace and root, the container's environment), streams stdout and stderr, and
        reports the exit code. Errors as the kubelet words them (see ASSUMPTIONS.md)."""
        with self.lock:
            pod = self.get("pods", namespace, name)
            if pod is None:
                raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
            record = self.processes.get(pod["metadata"]["uid"]) or {}
            names = [c["name"] for c in pod["spec"]["containers"]]
            container = container or names[0]
            running = record.get("synthetic_keepalive") or (
                record.get("process") is not None and record["process"].poll() is None)
            if container not in names or not running or pod["metadata"].get("deletionTimestamp"):
                raise ApiError(500, "InternalError", 'Internal error occurred: unable to upgrade connection: '
                               'container not found ("%s")' % container)
            env = dict(record.get("env") or {})
            argv = list(command)
            if record.get("synthetic_keepalive"):
                seconds = (self.config.get("syntheticEpisodes") or {}).get("seconds", 0.5)
                process = None
            elif self.mount_namespaces:
                argv = [shutil.which("nsenter"), "--target", str(record["process"].pid), "--mount", "--root",
                        "--wd"] + argv
                process = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, start_new_session=True)
            else:
                mounts = record["mounts"]
                translated = translated_argv(argv, mounts, record["bin_dir"])
                process = subprocess.Popen(translated, env=env, cwd=str(mounts.get("/workspace", self.dir)),
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
            if process is not None:
                record.setdefault("execs", []).append(process)
        if process is None:
            return self.synthetic_exec(command, seconds)
        stdout, stderr = process.communicate(stdin.encode() if stdin else None)
        with self.lock:
            if process in record.get("execs", []):
                record["execs"].remove(process)
        code = process.returncode if process.returncode >= 0 else 128 - process.returncode
        return {"stdout": stdout.decode("utf-8", "replace"), "stderr": stderr.decode("utf-8", "replace"),
                "code": code}

    @staticmethod
    def synthetic_exec(command, seconds):
        """Benchmark mode: the events an episode would print, made up, after `seconds`."""
        env = dict(arg.split("=", 1) for arg in command[1:] if "=" in arg) if command[:1] == ["env"] else {}
        start = time.time()
        time.sleep(seconds)
        name = env.get("EPISODE_ID", "")
        ready = {"event": "ready", "at": start + 0.02, "episode_id": name, "started_at": start + 0.005,
                 "imports_done_at": start + 0.015, "synthetic": True}
        reward = {"event": "reward", "at": time.time() - 0.01, "episode_id": name, "reward": 1, "baseline_exit": 1,
                  "tests_exit": 0, "tests_output": "synthetic episode: no tests ran\n", "synthetic": True}
        return {"stdout": json.dumps(ready) + "\n" + json.dumps(reward) + "\n", "stderr": "", "code": 0}

    # ---------------------------------------------------------------- events

    def record_event(self, obj, type_, reason, message, component="job-controller", host=None):
        namespace = obj["metadata"].get("namespace", "default")
        involved = {"kind": obj["kind"], "namespace": namespace, "name": obj["metadata"]["name"],
                    "uid": obj["metadata"]["uid"], "apiVersion": obj["apiVersion"],
                    "resourceVersion": obj["metadata"].get("resourceVersion", "")}
        if obj["kind"] == "Pod" and component == "kubelet" and reason not in ("SandboxChanged",):
            involved["fieldPath"] = "spec.containers{%s}" % obj["spec"]["containers"][0]["name"]
        stamp = now_rfc3339()
        key = (namespace, involved["uid"], reason, message)
        existing = self.event_index.get(key)
        if existing is not None and self.get("events", namespace, existing["metadata"]["name"]) is existing:
            existing["count"] += 1
            existing["lastTimestamp"] = stamp
            self.put("events", existing)
            return
        source = {"component": component}
        if host:
            source["host"] = host
        # client-go names events <object>.<UnixNano in hex>, so a list by name is chronological
        event = {"metadata": {"name": "%s.%x" % (involved["name"], time.time_ns()),
                              "namespace": namespace, "uid": str(uuid.uuid4()),
                              "creationTimestamp": stamp},
                 "involvedObject": involved, "reason": reason, "message": message, "source": source,
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1, "type": type_,
                 "eventTime": None, "reportingComponent": component, "reportingInstance": host or "",
                 "apiVersion": "v1", "kind": "Event"}
        self.event_index[key] = event
        self.put("events", event)

    # ---------------------------------------------------------------- controllers

    def mark(self, record):
        """Precise wall-clock moments (benchmarks read them; the API's own times are whole seconds)."""
        with open(self.dir / "marks.jsonl", "a") as marks:
            marks.write(json.dumps(record) + "\n")

    def reconcile(self):
        with self.lock:
            self.job_controller()
            self.scheduler()
            self.kubelet()
            self.garbage_collector()
            self.agent_sandbox.reconcile()
            if kueue.installed(self.config):
                self.kueue.reconcile()
            self.namespace_controller()

    def owned_pods(self, job):
        uid = job["metadata"]["uid"]
        return [pod for pod in self.items("pods", job["metadata"]["namespace"])
                if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences", []))]

    def failure_policy_action(self, job, pod):
        """The podFailurePolicy rule that matches a failed pod: Ignore, FailIndex, FailJob or Count."""
        status = (pod["status"].get("containerStatuses") or [{}])[0]
        exit_code = ((status.get("state") or {}).get("terminated") or {}).get("exitCode")
        conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions", [])}
        for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules", []):
            codes = rule.get("onExitCodes")
            if codes and exit_code is not None and exit_code != 0:
                inside = exit_code in codes.get("values", [])
                if inside == (codes.get("operator") == "In"):
                    return rule["action"]
            for pattern in rule.get("onPodConditions") or []:
                if (pattern["type"], pattern.get("status", "True")) in conditions:
                    return rule["action"]
        return "Count"

    def count_finished_pod(self, job, pod, book):
        """What the controller learns from a pod that has just finished."""
        uid, spec = pod["metadata"]["uid"], job["spec"]
        index = pod["metadata"].get("annotations", {}).get("batch.kubernetes.io/job-completion-index")
        index = int(index) if index is not None else None
        if pod["status"]["phase"] == "Succeeded":
            book["succeeded"].add(uid)
            if index is not None:
                book["indexes_succeeded"].add(index)
            return
        action = self.failure_policy_action(job, pod)
        if action == "Ignore":
            book["ignored"].add(uid)  # not counted: a replacement is created at once
            return
        book["failed"].add(uid)
        if action == "FailJob":
            book["fail_job"] = "PodFailurePolicy"
        if index is not None and spec.get("backoffLimitPerIndex") is not None:
            failures = book["index_failures"].get(index, 0) + 1
            book["index_failures"][index] = failures
            if action == "FailIndex" or failures > spec["backoffLimitPerIndex"]:
                book["indexes_failed"].add(index)
            else:
                # the Job controller's pod-failure backoff, per index: 10 s, doubling, at most 10 min
                book["index_retry_at"][index] = time.time() + min(600.0, 10.0 * 2 ** (failures - 1))

    def job_controller(self):
        for job in self.items("jobs"):
            if job["metadata"].get("deletionTimestamp"):
                continue
            book = self.job_books[job["metadata"]["uid"]]
            batch = self.timing["jobSyncBatchSeconds"]
            if batch and time.time() - self.job_synced.get(job["metadata"]["uid"], 0.0) < batch:
                continue  # pod updates wait for the next batched sync of their Job
            self.job_synced[job["metadata"]["uid"]] = time.time()
            spec, status = job["spec"], job["status"]
            indexed = spec.get("completionMode") == "Indexed"
            conditions = status.get("conditions", [])
            types = {c["type"] for c in conditions}
            if "Complete" in types or "Failed" in types:
                continue
            changed = False
            pods = self.owned_pods(job)
            if self.suspension(job, book, pods):
                continue
            if "startTime" not in status:
                status["startTime"] = now_rfc3339()
                book["started"] = time.time()
                changed = True
            for pod in pods:
                phase = pod["status"].get("phase")
                uid = pod["metadata"]["uid"]
                if phase not in ("Succeeded", "Failed") or uid in book["succeeded"] | book["failed"] | book["ignored"]:
                    continue
                self.count_finished_pod(job, pod, book)
                pod["metadata"]["finalizers"] = [f for f in pod["metadata"].get("finalizers", [])
                                                 if f != "batch.kubernetes.io/job-tracking"]
                self.put("pods", pod)
                changed = True
            active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")
                      and not p["metadata"].get("deletionTimestamp")]
            terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")
                           and p["status"].get("phase") in ("Pending", "Running")]
            succeeded, failed = len(book["succeeded"]), len(book["failed"])
            if "FailureTarget" not in types and "SuccessCriteriaMet" not in types:
                deadline = spec.get("activeDeadlineSeconds")
                terminal_indexes = book["indexes_succeeded"] | book["indexes_failed"]
                if book.get("fail_job"):
                    self.add_condition(job, "FailureTarget", "PodFailurePolicy",
                                       "Pod failure policy rule matched a failed pod")
                elif failed > spec["backoffLimit"]:
                    self.add_condition(job, "FailureTarget", "BackoffLimitExceeded",
                                       "Job has reached the specified backoff limit")
                elif deadline is not None and time.time() - book["started"] >= deadline:
                    self.add_condition(job, "FailureTarget", "DeadlineExceeded",
                                       "Job was active longer than specified deadline")
                elif indexed and book["indexes_failed"] and len(terminal_indexes) >= spec["completions"]:
                    self.add_condition(job, "FailureTarget", "FailedIndexes", "Job has failed indexes")
                elif (len(book["indexes_succeeded"]) if indexed else succeeded) >= spec["completions"]:
                    self.add_condition(job, "SuccessCriteriaMet", "CompletionsReached",
                                       "Reached expected number of succeeded pods")
                changed = True
            types = {c["type"] for c in job["status"].get("conditions", [])}
            if "FailureTarget" in types:
                for pod in active:
                    self.begin_pod_termination(pod)
                    self.put("pods", pod)
                    self.record_event(job, "Normal", "SuccessfulDelete", "Deleted pod: " + pod["metadata"]["name"])
                if not active and not terminating:
                    target = [c for c in job["status"]["conditions"] if c["type"] == "FailureTarget"][0]
                    self.add_condition(job, "Failed", target["reason"], target["message"])
                    self.record_event(job, "Warning", target["reason"], target["message"])
                changed = True
            elif "SuccessCriteriaMet" in types:
                if not active and not terminating:
                    self.add_condition(job, "Complete", "CompletionsReached",
                                       "Reached expected number of succeeded pods")
                    self.mark({"job": job["metadata"]["name"], "namespace": job["metadata"]["namespace"],
                               "complete_at": time.time()})
                    job["status"]["completionTime"] = now_rfc3339()
                    self.record_event(job, "Normal", "Completed", "Job completed")
                    changed = True
            elif time.time() >= book["create_backoff_until"]:
                # TerminatingOrFailed replaces a terminating pod at once; Failed waits for it.
                occupying = active + (terminating if spec["podReplacementPolicy"] == "Failed" else [])
                if indexed:
                    busy = {int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
                            for p in occupying}
                    ready = [i for i in range(spec["completions"]) if i not in book["indexes_succeeded"]
                             and i not in book["indexes_failed"] and i not in busy
                             and time.time() >= book["index_retry_at"].get(i, 0)]
                    indexes = ready[:max(0, spec["parallelism"] - len(occupying))]
                else:
                    want = min(spec["parallelism"], spec["completions"] - succeeded) - len(occupying)
                    indexes = [None] * max(0, want)
                if indexes:
                    self.create_job_pods(job, indexes, book)
                    active = [p for p in self.owned_pods(job) if p["status"].get("phase") in ("Pending", "Running")
                              and not p["metadata"].get("deletionTimestamp")]
                    changed = True
            new_status = self.job_status(job, active, terminating, book)
            if new_status != job["status"] or changed:
                job["status"] = new_status
                self.put("jobs", job)

    def suspension(self, job, book, pods):
        """spec.suspend (KEP-2232): a suspended Job has condition Suspended=True (JobSuspended),
        no active pods (they are deleted) and no startTime, and its deadline does not run; on
        resume the condition turns False (JobResumed) and startTime is reset to now, so the
        deadline starts again (job_controller.go syncJob). True while the Job is suspended."""
        status = job["status"]
        suspended = job["spec"].get("suspend", False)
        current = next((c for c in status.get("conditions", []) if c["type"] == "Suspended"), None)
        if suspended:
            changed = False
            if current is None or current["status"] != "True":
                stamp = now_rfc3339()
                status["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "Suspended"] + [
                    {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended",
                     "lastProbeTime": stamp, "lastTransitionTime": stamp}]
                self.record_event(job, "Normal", "Suspended", "Job suspended")
                status.pop("startTime", None)
                changed = True
            for pod in pods:
                if pod["status"].get("phase") in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                    self.begin_pod_termination(pod)
                    self.put("pods", pod)
                    self.record_event(job, "Normal", "SuccessfulDelete", "Deleted pod: " + pod["metadata"]["name"])
                    changed = True
            for pod in pods:  # pods that end meanwhile are still counted
                if pod["status"].get("phase") in ("Succeeded", "Failed") and pod["metadata"]["uid"] not in \
                        book["succeeded"] | book["failed"] | book["ignored"]:
                    self.count_finished_pod(job, pod, book)
                    changed = True
            terminating = [p for p in self.owned_pods(job) if p["metadata"].get("deletionTimestamp")
                           and p["status"].get("phase") in ("Pending", "Running")]
            new_status = dict(self.job_status(job, [], terminating, book))
            new_status.pop("ready", None)
            if changed or new_status != status:
                job["status"] = new_status
                self.put("jobs", job)
            # The backoff limit is judged while suspended too: the pods deleted at suspension
            # count as failed (isPodFailed: deleted and not Succeeded).
            return len(book["failed"]) <= job["spec"]["backoffLimit"]
        if current is not None and current["status"] == "True":
            stamp = now_rfc3339()
            current.update(status="False", reason="JobResumed", message="Job resumed", lastProbeTime=stamp,
                           lastTransitionTime=stamp)
            self.record_event(job, "Normal", "Resumed", "Job resumed")
            status["startTime"] = stamp
            book["started"] = time.time()
        return False

    def job_status(self, job, active, terminating, book):
        old = job["status"]
        status = {}
        if active:
            status["active"] = len(active)
        for key in ("completionTime", "conditions"):
            if key in old:
                status[key] = old[key]
        if book["failed"]:
            status["failed"] = len(book["failed"])
        status["ready"] = sum(1 for p in active if any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
        if "startTime" in old:
            status["startTime"] = old["startTime"]
        if book["succeeded"]:
            status["succeeded"] = len(book["succeeded"])
        status["terminating"] = len(terminating)
        status["uncountedTerminatedPods"] = {}
        if job["spec"].get("completionMode") == "Indexed":
            if book["indexes_succeeded"]:
                status["completedIndexes"] = compress_indexes(book["indexes_succeeded"])
            if job["spec"].get("backoffLimitPerIndex") is not None:
                status["failedIndexes"] = compress_indexes(book["indexes_failed"])
        return status

    def add_condition(self, job, type_, reason, message):
        stamp = now_rfc3339()
        job["status"].setdefault("conditions", []).append(
            {"type": type_, "status": "True", "lastProbeTime": stamp, "lastTransitionTime": stamp,
             "reason": reason, "message": message})

    def create_job_pods(self, job, indexes, book):
        """Create pods in slow-start batches (1, 2, 4, ...) as the Job controller does; in Indexed
        mode each carries its completion index (annotation, label, JOB_COMPLETION_INDEX, hostname)."""
        template = job["spec"]["template"]
        batch, created = 1, 0
        while created < len(indexes):
            for index in indexes[created:created + batch]:
                name = job["metadata"]["name"]
                meta = {"generateName": name + "-",
                        "labels": dict(template["metadata"].get("labels", {})),
                        "annotations": dict(template["metadata"].get("annotations", {})),
                        "finalizers": ["batch.kubernetes.io/job-tracking"],
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                             "uid": job["metadata"]["uid"], "controller": True,
                                             "blockOwnerDeletion": True}]}
                spec = json.loads(json.dumps(template["spec"]))
                if index is not None:
                    meta["generateName"] = "%s-%d-" % (name, index)
                    meta["annotations"]["batch.kubernetes.io/job-completion-index"] = str(index)
                    meta["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
                    spec["hostname"] = "%s-%d" % (name, index)
                    for container in spec.get("containers", []):
                        if not any(v["name"] == "JOB_COMPLETION_INDEX" for v in container.get("env", [])):
                            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                                "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}}})
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
                try:
                    pod = self.api_create("pods", job["metadata"]["namespace"], pod)
                except ApiError as error:
                    self.record_event(job, "Warning", "FailedCreate", "Error creating: " + str(error))
                    book["create_failures"] += 1
                    book["create_backoff_until"] = time.time() + min(10.0, 0.5 * 2 ** book["create_failures"])
                    return
                self.record_event(job, "Normal", "SuccessfulCreate", "Created pod: " + pod["metadata"]["name"])
                created += 1
            batch *= 2

    def pod_requests(self, pod):
        """Container requests plus Pod overhead: what the scheduler reserves for a pod."""
        cpu = memory = 0.0
        for container in pod["spec"].get("containers", []):
            requests = container.get("resources", {}).get("requests", {})
            cpu += parse_quantity(requests.get("cpu", 0))
            memory += parse_quantity(requests.get("memory", 0))
        overhead = pod["spec"].get("overhead", {})
        return cpu + parse_quantity(overhead.get("cpu", 0)), memory + parse_quantity(overhead.get("memory", 0))

    def node_fits(self, node, pod, reserved):
        """None when the pod fits the node, else the scheduler's reason for this node."""
        if node.get("spec", {}).get("unschedulable"):
            return "node(s) were unschedulable"
        for taint in node.get("spec", {}).get("taints", []):
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                    pod["spec"].get("tolerations"), taint):
                return "node(s) had untolerated taint {%s: %s}" % (taint["key"], taint.get("value", ""))
        labels = node["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in pod["spec"].get("nodeSelector", {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        cpu, memory = self.pod_requests(pod)
        used_cpu, used_memory, used_pods = reserved.get(node["metadata"]["name"], (0.0, 0.0, 0))
        allocatable = node["status"]["allocatable"]
        if used_pods + 1 > int(allocatable.get("pods", 110)):
            return "Too many pods"
        if used_cpu + cpu > parse_quantity(allocatable["cpu"]) + 1e-9:
            return "Insufficient cpu"
        if used_memory + memory > parse_quantity(allocatable["memory"]):
            return "Insufficient memory"
        return None

    def scheduler(self):
        nodes = self.items("nodes")
        reserved = {}  # node -> (cpu, memory, pods) held by its non-terminal pods
        pods = self.items("pods")
        for other in pods:
            if other["spec"].get("nodeName") and other["status"].get("phase") in ("Pending", "Running"):
                cpu, memory = self.pod_requests(other)
                used = reserved.get(other["spec"]["nodeName"], (0.0, 0.0, 0))
                reserved[other["spec"]["nodeName"]] = (used[0] + cpu, used[1] + memory, used[2] + 1)
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            reasons = {n["metadata"]["name"]: self.node_fits(n, pod, reserved) for n in nodes}
            candidates = [n for n in nodes if reasons[n["metadata"]["name"]] is None]
            if not candidates:
                counts = {}
                for reason in reasons.values():
                    counts[reason] = counts.get(reason, 0) + 1
                message = "0/%d nodes are available: %s." % (len(nodes), ", ".join(
                    "%d %s" % (n, reason) for reason, n in sorted(counts.items())))
                if not any(c["type"] == "PodScheduled" for c in pod["status"].get("conditions", [])):
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                    "lastProbeTime": None,
                                                    "lastTransitionTime": now_rfc3339(),
                                                    "reason": "Unschedulable", "message": message}]
                    self.put("pods", pod)
                    self.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
                continue
            node = min(candidates, key=lambda n: (reserved.get(n["metadata"]["name"], (0, 0, 0))[2],
                                                  n["metadata"]["name"]))
            name = node["metadata"]["name"]
            cpu, memory = self.pod_requests(pod)
            used = reserved.get(name, (0.0, 0.0, 0))
            reserved[name] = (used[0] + cpu, used[1] + memory, used[2] + 1)
            pod["spec"]["nodeName"] = name
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": now_rfc3339()}]
            self.put("pods", pod)
            self.record_event(pod, "Normal", "Scheduled", "Successfully assigned %s/%s to %s" % (
                pod["metadata"]["namespace"], pod["metadata"]["name"], name), "default-scheduler")

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
            registry = 'failed to pull and unpack image "%s": failed to resolve reference "%s": %s: not found' % (
                self.normalized_image(image), self.normalized_image(image), self.normalized_image(image))
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
        env = {"PATH": "%s:/usr/bin:/bin" % bin_dir, "HOME": str(pod_dir), "LANG": "C.UTF-8"}
        defined = {}
        for var in container.get("env", []):
            if "value" in var:
                # $(NAME) expands to an earlier variable of the container; $$ escapes.
                value = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: "$" if m.group(0) == "$$" else defined.get(m.group(1), m.group(0)),
                               var["value"])
            elif "fieldRef" in var.get("valueFrom", {}):
                value = field_value(pod, var["valueFrom"]["fieldRef"]["fieldPath"], node)
            else:
                continue
            defined[var["name"]] = env[var["name"]] = value
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
            binds = [(str(bin_dir), "/.kubelet/bin", True)]
            if offset:
                binds.append((str(pod_dir / "clock"), "/.kubelet/clock", True))
            binds += [(str(local), path, path in read_only) for path, local in mounts.items()]
            binds.append((str(termination_path), container.get("terminationMessagePath", "/dev/termination-log"),
                          False))
            (pod_dir / "root").mkdir(exist_ok=True)
            lines = "\n".join("%s\t%s\t%s" % ("ro" if ro else "rw", source, path) for source, path, ro in binds)
            argv = [shutil.which("unshare"), "--mount", "--propagation", "private", "/bin/sh", "-c", POD_ROOT_SCRIPT,
                    "pod-root", str(pod_dir / "root"), lines] + argv
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
        self.processes[uid] = {"process": process, "log_path": log_path, "argv": argv, "env": env,
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

    def garbage_collector(self):
        job_uids = {job["metadata"]["uid"]: job for job in self.items("jobs")}
        for pod in self.items("pods"):
            owners = [ref for ref in pod["metadata"].get("ownerReferences", []) if ref.get("kind") == "Job"]
            if not owners:
                continue
            owner = job_uids.get(owners[0]["uid"])
            orphaned = owner is None
            foreground = owner is not None and "foregroundDeletion" in owner["metadata"].get("finalizers", [])
            if (orphaned or foreground) and not pod["metadata"].get("deletionTimestamp"):
                self.begin_pod_termination(pod)
                self.put("pods", pod)
        for job in job_uids.values():
            if "foregroundDeletion" in job["metadata"].get("finalizers", []) and not self.owned_pods(job):
                self.remove("jobs", job)
                self.job_books.pop(job["metadata"]["uid"], None)

    def namespace_controller(self):
        for ns in self.items("namespaces"):
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            name = ns["metadata"]["name"]
            contents = [(res, obj) for res, stored in list(self.objects.items())
                        for (namespace, _), obj in list(stored.items()) if namespace == name]
            for resource, obj in contents:
                if resource == "pods":
                    self.begin_pod_termination(obj)
                elif resource == "jobs":
                    self.remove("jobs", obj)
                elif resource != "events" or not any(r == "pods" for r, _ in contents):
                    self.remove(resource, obj)
            book = self.job_books.get("ns:" + ns["metadata"]["uid"], {})
            if not contents and time.time() - book.get("deleted_at", 0) >= self.config["namespaceDeletionSeconds"]:
                self.remove("namespaces", ns)

    def shutdown(self):
        with self.lock:
            for record in self.processes.values():
                process = record.get("process")
                if process is not None and process.poll() is None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


# -------------------------------------------------------------------- RPC server


FAULTS = {
    # kind: (HTTP code, Status reason, message); "" reason prints as `Error from server: ...`
    "internal": (500, "InternalError", 'an error on the server ("") has prevented the request from succeeding'),
    "timeout": (504, "Timeout", "the server was unable to return a response in the time allotted, but may still "
                                "be processing the request"),
    "etcd-leader-changed": (500, "", "etcdserver: leader changed"),
    "etcd-timeout": (500, "", "etcdserver: request timed out"),
    "etcd-too-many-requests": (429, "", "etcdserver: too many requests"),
}


def inject_fault(cluster, request):
    """Transient failures configured in cluster.json (`transientFailures`), consumed in order:
    {"verb": "get", "resource": "jobs", "times": 2, "kind": "etcd-leader-changed",
     "afterCommit": false, "afterJobComplete": false}. afterCommit: a write is carried out and
    then answered with the error (the client cannot tell). afterJobComplete: armed only once a
    Job has its Complete or Failed condition. Returns (kind, after_commit) or None."""
    for fault in cluster.faults:
        if fault.get("times", 0) <= 0 or fault.get("verb") not in (None, request["verb"]) or \
                fault.get("resource") not in (None, request.get("resource")):
            continue
        if fault.get("afterJobComplete") and not any(
                c.get("type") in ("Complete", "Failed") for job in cluster.items("jobs")
                for c in job.get("status", {}).get("conditions", [])):
            continue
        fault["times"] -= 1
        kind = fault.get("kind", "internal")
        if kind == "timeout-after-commit":  # the original spelling
            return "timeout", True
        return kind, bool(fault.get("afterCommit"))
    return None


def fault_error(kind, request):
    code, reason, message = FAULTS[kind]
    if kind == "timeout" and request.get("resource"):
        message += " (%s %s%s)" % ({"create": "post", "delete": "delete"}.get(request["verb"], "get"),
                                   request["resource"], RESOURCES[request["resource"]][3])
    return ApiError(code, reason, message)


def watch(cluster, request):
    """Objects changed (or deleted) after resourceVersion `since`, waiting up to 20 s for one."""
    resource, namespace = request["resource"], request.get("namespace")
    since = int(request.get("since") or 0)

    terms = [part.split("=", 1) for part in (request.get("selector") or "").split(",") if part]

    def matching():
        found = []
        for rv, res, obj in reversed(cluster.history):
            if rv <= since:
                break
            meta = obj["metadata"]
            if res != resource or (RESOURCES[resource][2] and meta.get("namespace") != namespace):
                continue
            if request.get("name") and meta["name"] != request["name"]:
                continue
            if any(meta.get("labels", {}).get(key) != value for key, value in terms):
                continue
            found.append(obj)
        return found[::-1]

    deadline = time.time() + 20
    ends = cluster.config.get("watchEnds")
    end_at = request.get("started", time.time()) + ends["afterSeconds"] if ends else None
    if end_at is not None:
        deadline = min(deadline, end_at)
    with cluster.lock:
        items = matching()
        while not items and time.time() < deadline and not cluster.stop.is_set():
            cluster.changed.wait(timeout=max(0.0, deadline - time.time()))
            items = matching()
        answer = {"items": items, "resourceVersion": str(cluster.resource_version)}
        if end_at is not None and time.time() >= end_at:
            # The server ends the watch: silently, or with an ERROR event (fact 25).
            answer["ended"] = ends.get("with", "close")
            if answer["ended"] == "expired":
                answer["items"].append({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "too old resource version: %d (%d)" % (
                                            since, cluster.resource_version), "reason": "Expired", "code": 410})
        return answer


def dispatch(cluster, request):
    verb = request["verb"]
    with cluster.lock:
        fault = inject_fault(cluster, request) if verb != "config" else None
    if fault and not fault[1]:
        raise fault_error(fault[0], request)
    if verb == "watch":
        answer = watch(cluster, request)
    elif verb == "logs":
        answer = {"log": cluster.api_logs(request.get("namespace"), request.get("name"), request.get("container"))}
    elif verb == "exec":
        answer = cluster.api_exec(request.get("namespace"), request["name"], request.get("container"),
                                  request["command"], request.get("stdin"))
    elif verb == "logs_many":
        # The fake kubectl's shortcut for many concurrent log requests (real kubectl multiplexes
        # them over one HTTP/2 connection): one RPC, each pod's log or its error Status.
        answer = {}
        for name in request["names"]:
            try:
                answer[name] = {"log": cluster.api_logs(request.get("namespace"), name, request.get("container"))}
            except ApiError as error:
                answer[name] = {"error": error.status}
    else:
        with cluster.lock:
            answer = serve_verb(cluster, request)
    if fault:  # after the commit: the change is made, the client hears an error
        raise fault_error(fault[0], request)
    return answer


def serve_verb(cluster, request):
    verb = request["verb"]
    resource, namespace, name = request.get("resource"), request.get("namespace"), request.get("name")
    if verb == "create":
        return cluster.api_create(resource, namespace, request["body"])
    if verb == "get":
        return cluster.api_get(resource, namespace, name)
    if verb == "list":
        return {"items": cluster.api_list(resource, namespace, request.get("selector"),
                                          request.get("fieldSelector")),
                "resourceVersion": str(cluster.resource_version)}
    if verb == "delete":
        return cluster.api_delete(resource, namespace, name, request.get("propagation", "Background"))
    if verb == "label":
        return cluster.api_label(resource, namespace, name, request["labels"], request.get("overwrite"))
    if verb == "logs":
        return {"log": cluster.api_logs(namespace, name, request.get("container"))}
    if verb == "version":
        return {"gitVersion": cluster.config["kubernetesVersion"]}
    if verb == "discovery":
        return {"resources": cluster.discovery()}
    if verb == "config":
        return cluster.config
    raise ApiError(400, "BadRequest", "unknown verb %r" % verb)


def serve(state_dir):
    state_dir = Path(state_dir)
    config = dict(DEFAULT_CONFIG)
    config_path = state_dir / "cluster.json"
    if config_path.exists():
        config.update(json.loads(config_path.read_text()))
    cluster = Cluster(state_dir, config)
    print("pod mount namespaces: %s" % ("on" if cluster.mount_namespaces else "off"), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                body, code = dispatch(cluster, request), 200
            except ApiError as error:
                body, code = error.status, error.status["code"]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        # Real kubectl multiplexes its requests over one HTTP/2 connection; the fake opens one
        # connection per request, so the listen backlog must take a burst of them.
        request_queue_size = 512

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True

    def control_loop():
        while not cluster.stop.is_set():
            try:
                cluster.reconcile()
            except Exception as error:  # keep the cluster alive; the log shows the bug
                print("controller error: %r" % error, file=sys.stderr, flush=True)
                import traceback
                traceback.print_exc()
            time.sleep(0.02)

    threading.Thread(target=control_loop, daemon=True).start()

    def stop(*_):
        cluster.stop.set()
        cluster.shutdown()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    info = {"port": server.server_address[1], "pid": os.getpid()}
    partial = state_dir / "server.json.partial"
    partial.write_text(json.dumps(info))
    os.replace(partial, state_dir / "server.json")
    server.serve_forever()
    cluster.shutdown()


if __name__ == "__main__":
    serve(sys.argv[1])
