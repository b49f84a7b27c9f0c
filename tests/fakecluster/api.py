"""What every part of the simulated cluster shares: its configuration and timing profiles, the
kinds the API serves, API errors, and small helpers over objects."""

import datetime
import sys
import time

import agentsandbox
import kueue


DEFAULT_CONFIG = {
    "kubernetesVersion": "v1.32.4",
    "nodes": [
        {"name": "kind-worker", "cpu": "8", "memory": "16Gi"},
        {"name": "kind-worker2", "cpu": "8", "memory": "16Gi"},
    ],
    "runtimeClasses": [{"name": "cube", "handler": "cube"}],
    # image reference -> the local program that plays the image's `python`
    "images": {"python:3.12-alpine": {"python": sys.executable}},
    # RBAC denials: [{"verb": "create", "resource": "namespaces"}]
    "forbid": [],
    # The namespace controller first works on a Terminating namespace this long after its deletion
    # (upstream's namespaceDeletionGracePeriod, 5 s; ASSUMPTIONS.md "Namespace deletion"). The
    # suite's clusters shorten it (tests/conftest.py); the benchmarks keep the real value.
    "namespaceDeletionSeconds": 5.0,
    # The ServiceAccount controller makes `default` in a new namespace this long after it is
    # created; pods created before are refused (ASSUMPTIONS.md fact 26).
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
    # Client-side rate limits of the controllers' API clients: "default-installation" (what a cluster
    # installed with default flags has, see CLIENT_RATES), "unlimited" (no limits: flatters the Job
    # baseline, kept for contrast), or {"jobController": [qps, burst] or None, ...}.
    "clientRates": "default-installation",
    # The API server unreachable for a while (a control-plane upgrade, a restarted single API
    # server): {"afterJobCreatedSeconds": 1.0, "seconds": 20}, counted from the first Job's
    # creation. Every request is refused at the TCP level (kubectl: "The connection to the server
    # HOST was refused"), open watches break, and the controllers, which reach etcd only through
    # the API server, stand still until it is back.
    "apiOutage": None,
    # The API server's dial of the kubelet fails for the first N execs, after the client's
    # WebSocket was upgraded (an overloaded kubelet endpoint): {"execs": N, "started": false},
    # "started": the kubelet had begun the command. See kubelet_dial_failure in httpapi.py.
    "kubeletDialFailures": None,
    # Execs whose command holds every one of these words stall: the stream opens and nothing comes,
    # not even an exit status, until the client closes it (a command hung in the container, a node
    # too loaded to answer): {"words": ["sandbox-reset.py", "check"], "times": 1}; with "stallAt": TEXT
    # the command runs and its output is sent up to TEXT, then nothing more. See exec_stalls.
    "execStalls": None,
    # Watches of these resources stay open and deliver nothing (a watch stuck behind a broken
    # proxy or load balancer): ["sandboxwarmpools"].
    "watchStalls": [],
}

# client-go token buckets (qps, burst) of each simulated controller's API client, by profile.
# kube-controller-manager: --kube-api-qps 20, --kube-api-burst 30 (kubernetes/kubernetes
# pkg/controller/apis/config/v1alpha1/defaults.go, SetDefaults_KubeControllerManagerConfiguration);
# kube-scheduler: 50 / 100 (pkg/scheduler/apis/config/v1/defaults.go); agent-sandbox-controller:
# --kube-api-qps -1, no client-side limit (cmd/agent-sandbox-controller/main.go, v0.5.6).
CLIENT_RATES = {
    "default-installation": {"jobController": (20.0, 30), "scheduler": (50.0, 100), "agentSandbox": None},
    "unlimited": {"jobController": None, "scheduler": None, "agentSandbox": None},
}


class ClientRateLimiter:
    """client-go's token bucket (flowcontrol.NewTokenBucketRateLimiter): `burst` tokens, refilled at
    `qps` a second; each API call takes one. A controller that finds none defers the call to its
    next pass, as a real one waits for a token: the same throughput, without blocking the loop."""

    def __init__(self, qps, burst):
        self.qps, self.burst = qps, burst
        self.tokens, self.last = float(burst), time.monotonic()

    def take(self):
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def client_rate_limiters(config):
    """{controller: ClientRateLimiter or None (unlimited)} from the configuration."""
    rates = config.get("clientRates", "default-installation")
    rates = dict(CLIENT_RATES["default-installation"], **rates) if isinstance(rates, dict) else CLIENT_RATES[rates]
    return {name: ClientRateLimiter(*rate) if rate else None for name, rate in rates.items()}


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


class ApiError(Exception):
    """A metav1.Status failure."""

    def __init__(self, code, reason, message):
        super().__init__(message)
        self.status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}


def not_found(resource, name):
    return ApiError(404, "NotFound", '%s%s "%s" not found' % (resource, RESOURCES[resource][3], name))
