#!/usr/bin/env python3
"""rl-batch-demo: launch a batch of isolated sandbox episodes for RL rollouts on Kubernetes.

What it does
    `run` submits one batch/v1 Job whose pods are sandboxes (one episode each, on the
    RuntimeClass you name). Every episode fixes a small bug, runs its tests and emits a
    reward. The tool waits for the Job, saves the Job, pods, events and every episode log,
    checks that every episode really succeeded, and only then writes results.json with
    how fast the batch became ready and returned its rewards.
    `cleanup` deletes what one `run` created, after proving it owns it.

How to run
    python3 rl-batch-demo.py run --count 10 --output rl-parallel-10
    python3 rl-batch-demo.py run --count 10 --parallelism 1 --output rl-sequential-10
    python3 rl-batch-demo.py cleanup --output rl-parallel-10

    Only the Python standard library (3.9+) and `kubectl` are needed. Set KUBECTL to use
    another kubectl program. Every kubectl call names the context explicitly.

The safety promise
    * `run` creates a fresh namespace `agc-rl-<run id>` and writes receipt.json (context,
      namespace, run id) into the output folder BEFORE it changes the cluster, then adds
      the namespace UID and the Job UID as soon as the API server returns them.
    * `cleanup` deletes nothing unless the live namespace's UID and `agc-demo-run` label,
      and the live Job's UID, equal what the receipt (or the saved job.json) recorded.
      It never removes finalizers. Local output is never deleted.
    * An existing output folder is never overwritten.

Exit codes
    0 success; 1 error (kubectl, cluster, prerequisites, refused cleanup); 2 bad command
    line; 3 timed out (the Job's deadline or the client's wait); 4 the batch failed or an
    episode did not pass validation; 130 interrupted.
"""

import argparse
import collections
import concurrent.futures
import datetime
import json
import math
import os
from pathlib import Path
import shlex
import statistics
import subprocess
import sys
import time
import uuid

__version__ = "0.1.0"

# ============================================================================
# Constants and defaults
# ============================================================================

DEFAULT_COUNT = 10
MAX_COUNT = 20  # the tutorial's bound to keep first trials small; not a capacity limit
DEFAULT_IMAGE = "python:3.12-alpine"
DEFAULT_RUNTIME = "cube"

TOOL_NAME = "rl-batch-demo"
RUN_LABEL = "agc-demo-run"  # namespace label holding the run id: the ownership proof
NAMESPACE_PREFIX = "agc-rl-"
JOB_NAME = "rollout"
CONFIGMAP_NAME = "episode"
CONTAINER_NAME = "episode"

DEFAULT_TIMEOUT_SECONDS = 240  # the Job's activeDeadlineSeconds: the Job controller fails it after this
CLIENT_GRACE_SECONDS = 30  # the client waits the Job's deadline plus this (240 + 30 = the seed's 270)
POLL_INTERVAL_SECONDS = 1.0
STALL_CHECK_SECONDS = 3.0  # no progress this long: look for a reason the pods cannot start
LOG_FETCH_WORKERS = 4
CLEANUP_WAIT_SECONDS = 120  # for the Job (and its pods), then again for the namespace
KUBECTL_REQUEST_TIMEOUT = "30s"  # passed to kubectl: one API request
KUBECTL_PROCESS_TIMEOUT_SECONDS = 60  # one kubectl process, all its requests

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_TIMEOUT, EXIT_BATCH_FAILED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130

# ============================================================================
# The episode program (runs inside each sandbox)
# ============================================================================
# Shipped in the ConfigMap `episode`, run as `python -B /demo/episode.py`. Its start-up
# is part of what is measured, so it imports only cheap standard modules. It emits JSON
# lines on stdout: {"event": "ready"|"reward", "at": <unix seconds, sandbox clock>,
# "episode_id": <pod name>, ...}; `ready` also carries `started_at` (the first statement)
# and `imports_done_at`, so that interpreter start and module import can be told apart.
# RL_WORKSPACE exists only so that a simulated cluster can give each local process its
# own folder; in a pod it is unset and /workspace (an emptyDir) is used.

EPISODE_PROGRAM = r'''import time
started_at = time.time()  # the process's first statement, before its other imports
import json, os, pathlib, subprocess
imports_done_at = time.time()
p = pathlib.Path(os.environ.get('RL_WORKSPACE', '/workspace'))
os.chdir(p)
p.joinpath('shipping.py').write_text('def shipping(total):\n    return 0 if total > 99 else 10\n')
p.joinpath('test_shipping.py').write_text("""import unittest
from shipping import shipping


class ShippingTest(unittest.TestCase):
    def test_below(self):
        self.assertEqual(shipping(98), 10)

    def test_boundary(self):
        self.assertEqual(shipping(99), 0)

    def test_above(self):
        self.assertEqual(shipping(100), 0)


if __name__ == '__main__':
    unittest.main()
""")


def emit(event, **data):
    print(json.dumps(dict(event=event, at=time.time(), episode_id=os.environ['EPISODE_ID'], **data)), flush=True)


def test():
    result = subprocess.run(['python', '-B', 'test_shipping.py'], text=True, capture_output=True, timeout=20)
    return result.returncode, result.stderr


emit('ready', started_at=started_at, imports_done_at=imports_done_at)
before, before_output = test()
if before == 0:
    raise RuntimeError('baseline must fail the boundary test')
# Deterministic stand-in for a coding Agent's action; no external model call.
p.joinpath('shipping.py').write_text(p.joinpath('shipping.py').read_text().replace('total > 99', 'total >= 99'))
after, after_output = test()
emit('reward', reward=int(after == 0), baseline_exit=before, tests_exit=after, tests_output=after_output)
if after != 0:
    raise RuntimeError('patched code failed its tests')
'''

# ============================================================================
# Errors: one type per exit code; main() turns each into one line on stderr
# ============================================================================


class DemoError(Exception):
    """An expected failure: its message is what the user reads after 'Error: '."""

    exit_code = EXIT_ERROR


class KubectlError(DemoError):
    """A kubectl command failed; carries kubectl's own stderr."""

    def __init__(self, args, returncode, stderr):
        self.args_list = list(args)
        self.returncode = returncode
        self.stderr = (stderr or "").strip()
        detail = last_line(self.stderr) or "no error message (exit code %s)" % returncode
        words = [word for word in args if not word.startswith("--request-timeout")]
        if words[:1] == ["--context"]:
            words = words[2:]
        super().__init__("kubectl %s failed: %s" % (" ".join(words[:4]), detail))

    @property
    def not_found(self):
        return "(NotFound)" in self.stderr


class BatchTimeout(DemoError):
    exit_code = EXIT_TIMEOUT


class BatchFailed(DemoError):
    exit_code = EXIT_BATCH_FAILED


def last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ============================================================================
# Manifests: pure functions returning the objects `run` creates
# ============================================================================


def object_labels(run_id, component):
    """Labels on every object the tool creates: the seed's run label plus the recommended
    app.kubernetes.io set, so `list` and other tools can find a run and its owner."""
    return {RUN_LABEL: run_id,
            "app.kubernetes.io/name": TOOL_NAME,
            "app.kubernetes.io/instance": run_id,
            "app.kubernetes.io/version": __version__,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": TOOL_NAME}


def namespace_manifest(namespace, run_id):
    # Pod Security Admission enforces `restricted` here: the cluster, not only this file,
    # then guarantees the sandboxes' posture (non-root, no escalation, no capabilities).
    labels = {**object_labels(run_id, "run"), "pod-security.kubernetes.io/enforce": "restricted"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}


def configmap_manifest(namespace, run_id):
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace,
                         "labels": object_labels(run_id, "episode-program")},
            "data": {"episode.py": EPISODE_PROGRAM}}


def network_policy_manifest(namespace, run_id):
    """Default deny, ingress and egress, for every pod of the namespace."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny-all", "namespace": namespace,
                         "labels": object_labels(run_id, "network-isolation")},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}


def job_manifest(namespace, run_id, count, parallelism, image, runtime,
                 deadline=DEFAULT_TIMEOUT_SECONDS):
    """The batch: `count` episodes, `parallelism` at a time; runtime None = cluster default."""
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", "/demo/episode.py"],
        "env": [{"name": "EPISODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
        "volumeMounts": [{"name": "script", "mountPath": "/demo", "readOnly": True},
                         {"name": "workspace", "mountPath": "/workspace"}],
    }
    pod_spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                            "runAsNonRoot": True},
        "containers": [container],
        "volumes": [{"name": "script", "configMap": {"name": CONFIGMAP_NAME}},
                    {"name": "workspace", "emptyDir": {}}],
    }
    if runtime is not None:
        pod_spec = {"runtimeClassName": runtime, **pod_spec}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": JOB_NAME, "namespace": namespace, "labels": object_labels(run_id, "batch")},
        "spec": {"completions": count, "parallelism": parallelism, "backoffLimit": 0,
                 "activeDeadlineSeconds": deadline,
                 "template": {"metadata": {"labels": {"app": "rl-batch-demo",
                                                      **object_labels(run_id, "episode")}},
                              "spec": pod_spec}},
    }


def run_manifests(args, namespace, run_id):
    """Every object of one run, in creation order (the namespace first, the Job last)."""
    objects = [namespace_manifest(namespace, run_id), configmap_manifest(namespace, run_id)]
    if args.network == "none":
        objects.append(network_policy_manifest(namespace, run_id))
    runtime = None if args.no_runtime_class else args.runtime
    objects.append(job_manifest(namespace, run_id, args.count, args.parallelism, args.image, runtime,
                                args.timeout))
    return objects


# ============================================================================
# The one kubectl wrapper
# ============================================================================


def kubectl_program():
    return os.environ.get("KUBECTL") or "kubectl"


def run_kubectl(argv, stdin_text=None):
    """Run kubectl with an argument list; return stdout or raise KubectlError."""
    program = kubectl_program()
    try:
        done = subprocess.run([program, *argv], input=stdin_text, text=True,
                              capture_output=True, timeout=KUBECTL_PROCESS_TIMEOUT_SECONDS)
    except FileNotFoundError:
        raise DemoError("kubectl not found (looked for %r on PATH); install kubectl or set "
                        "KUBECTL to its path" % program) from None
    except subprocess.TimeoutExpired:
        raise KubectlError(argv, None, "kubectl did not finish within %d s"
                           % KUBECTL_PROCESS_TIMEOUT_SECONDS) from None
    if done.returncode != 0:
        raise KubectlError(argv, done.returncode, done.stderr)
    return done.stdout


def current_context():
    try:
        context = run_kubectl(["config", "current-context"]).strip()
    except KubectlError as error:
        raise DemoError("no current kubectl context (%s); choose one with `kubectl config "
                        "use-context NAME` or pass --context NAME" % error.stderr) from None
    if not context:
        raise DemoError("no current kubectl context; pass --context NAME")
    return context


class Cluster:
    """kubectl bound to one context: every call carries --context and a request timeout."""

    def __init__(self, context):
        self.context = context

    def kubectl(self, *parts, data=None):
        argv = ["--context", self.context, "--request-timeout=" + KUBECTL_REQUEST_TIMEOUT,
                *parts]
        return run_kubectl(argv, json.dumps(data) if data is not None else None)

    def create(self, obj):
        return json.loads(self.kubectl("create", "-f", "-", "-o", "json", data=obj))

    def get_json(self, *parts):
        """The object as a dict, or None when it does not exist."""
        raw = self.kubectl("get", *parts, "--ignore-not-found", "-o", "json")
        return json.loads(raw) if raw.strip() else None

    def exists(self, *parts):
        return bool(self.kubectl("get", *parts, "--ignore-not-found", "-o", "name").strip())


# ============================================================================
# Files in the output folder
# ============================================================================


def write_json(path, obj):
    """Write atomically, so an interrupted write never leaves half a receipt."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(partial, path)


def read_json(path, what):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DemoError("no %s in %s" % (path.name, path.parent)) from None
    except (OSError, ValueError) as error:
        raise DemoError("cannot read %s (%s): %s" % (what, path, error)) from None


# ============================================================================
# Collection and validation: pure functions over saved JSON and logs
# ============================================================================
# Clocks and precision. Every time below is Unix seconds from one of four clocks:
#   api-server  metadata.creationTimestamp           whole seconds (truncated)
#   scheduler   the PodScheduled condition           whole seconds (control plane)
#   kubelet     PodReadyToStartContainers, container startedAt/finishedAt: the node's
#               clock, whole seconds
#   episode     the episode's own time.time() inside the sandbox: sub-microsecond, but
#               a VM sandbox has its own guest clock
# A delta between two clocks is good to about one second and needs synchronised clocks.

# The points of an episode's life, in order: name -> (clock, resolution in seconds, source).
TIME_POINTS = {
    "pod_created": ("api-server", 1.0, "pod metadata.creationTimestamp"),
    "scheduled": ("scheduler", 1.0, "PodScheduled=True lastTransitionTime"),
    "sandbox_ready": ("kubelet", 1.0, "PodReadyToStartContainers=True lastTransitionTime"),
    "container_started": ("kubelet", 1.0, "containerStatuses[0].state.terminated.startedAt"),
    "process_start": ("episode", 1e-6, "ready event started_at (first statement)"),
    "imports_done": ("episode", 1e-6, "ready event imports_done_at"),
    "ready": ("episode", 1e-6, "ready event at"),
    "reward": ("episode", 1e-6, "reward event at"),
    "container_finished": ("kubelet", 1.0, "containerStatuses[0].state.terminated.finishedAt"),
}

# Per-episode phases: name -> (from point, to point). pod_to_ready is the seed's metric.
PHASES = {
    "scheduling": ("pod_created", "scheduled"),
    "sandbox_start": ("scheduled", "sandbox_ready"),
    "container_start": ("sandbox_ready", "container_started"),
    "scheduled_to_container_started": ("scheduled", "container_started"),
    "interpreter_start": ("container_started", "process_start"),
    "module_import": ("process_start", "imports_done"),
    "import_done_to_ready": ("imports_done", "ready"),
    "ready_to_reward": ("ready", "reward"),
    "reward_to_container_finished": ("reward", "container_finished"),
    "pod_to_ready": ("pod_created", "ready"),
}
SKEW_TOLERANCE_SECONDS = 1.0  # the API timestamps' resolution


def parse_k8s_time(value):
    """RFC 3339 'YYYY-MM-DDTHH:MM:SSZ' -> Unix seconds (float)."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def percentile(values, q):
    """Linear interpolation between order statistics (the tutorial's definition).

    q in [0, 1]; rank (n - 1) * q, as numpy's default and R's type 7.
    """
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def phase_definition(name):
    """What a phase measures: its endpoints, clocks, resolution and unit (for results.json)."""
    start, end = PHASES[name]
    clocks = [TIME_POINTS[start][0], TIME_POINTS[end][0]]
    return {"from": start, "to": end, "from_source": TIME_POINTS[start][2], "to_source": TIME_POINTS[end][2],
            "clocks": clocks if clocks[0] != clocks[1] else clocks[:1], "mixed_clocks": clocks[0] != clocks[1],
            "resolution_seconds": max(TIME_POINTS[start][1], TIME_POINTS[end][1]), "unit": "seconds"}


def batch_stats(values):
    """P50/P95/P99 (the tutorial's linear interpolation), min, max, mean; None when empty."""
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "min": None, "max": None, "mean": None}
    return {"count": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
            "p99": percentile(values, 0.99), "min": min(values), "max": max(values),
            "mean": statistics.fmean(values)}


def condition_time(pod, kind):
    """lastTransitionTime of a True condition, or (None, reason)."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            if condition.get("status") == "True" and condition.get("lastTransitionTime"):
                return parse_k8s_time(condition["lastTransitionTime"]), None
            return None, ("%s is %s in the saved pod; the API keeps only its last transition"
                          % (kind, condition.get("status")))
    return None, "the cluster does not report the %s condition" % kind


def episode_times(pod, ready, reward, observed=None):
    """Every TIME_POINT of one episode: ({point: unix seconds or None}, {point: why None}).

    `observed` may supply times seen while the pod ran (a watch), e.g. sandbox_ready,
    which a finished pod no longer shows.
    """
    times, missing = {}, {}
    times["pod_created"] = parse_k8s_time(pod["metadata"]["creationTimestamp"])
    times["scheduled"], missing["scheduled"] = condition_time(pod, "PodScheduled")
    times["sandbox_ready"], missing["sandbox_ready"] = condition_time(pod, "PodReadyToStartContainers")
    if times["sandbox_ready"] is None and (observed or {}).get("sandbox_ready") is not None:
        times["sandbox_ready"], missing["sandbox_ready"] = observed["sandbox_ready"], None
    terminated = ((pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {}).get(
        "terminated") or {}
    for point, key in (("container_started", "startedAt"), ("container_finished", "finishedAt")):
        times[point] = parse_k8s_time(terminated[key]) if terminated.get(key) else None
        missing[point] = None if times[point] is not None else "the container status has no %s" % key
    for point, event, key in (("process_start", ready, "started_at"), ("imports_done", ready, "imports_done_at"),
                              ("ready", ready, "at"), ("reward", reward, "at")):
        value = event.get(key)
        times[point] = float(value) if isinstance(value, (int, float)) else None
        missing[point] = None if times[point] is not None else "the %s event has no %s" % (event.get("event"), key)
    return times, {point: why for point, why in missing.items() if why}


def episode_phases(times, missing):
    """{phase: seconds or None} and {phase: why None} from one episode's times."""
    phases, notes = {}, {}
    for name, (start, end) in PHASES.items():
        if times.get(start) is None or times.get(end) is None:
            phases[name] = None
            notes[name] = missing.get(start) or missing.get(end)
        else:
            phases[name] = times[end] - times[start]
    return phases, notes


def clock_skew(pod_name, times):
    """Episode events earlier than an API time they must follow, beyond its resolution."""
    found = []
    for api_point in ("pod_created", "container_started"):
        api_time = times.get(api_point)
        for point in ("process_start", "ready"):
            if api_time is not None and times.get(point) is not None:
                early = api_time - times[point]
                if early > SKEW_TOLERANCE_SECONDS:
                    found.append({"pod": pod_name, "event": point, "earlier_than": api_point,
                                  "by_seconds": early})
    return found


class EpisodeInvalid(Exception):
    """One episode failed one check; the message names the pod and the check."""


def parse_events(pod_name, log):
    events = []
    for number, line in enumerate(log.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            raise EpisodeInvalid("pod %s: log line %d is not a JSON event: %.80s"
                                 % (pod_name, number, line)) from None
        if not isinstance(event, dict):
            raise EpisodeInvalid("pod %s: log line %d is not a JSON object" % (pod_name, number))
        events.append(event)
    return events


def the_event(pod_name, events, kind):
    found = [event for event in events if event.get("event") == kind]
    if len(found) != 1:
        raise EpisodeInvalid("pod %s: expected exactly one %s event, found %d"
                             % (pod_name, kind, len(found)))
    return found[0]


def validate_episode(pod, log, job_created, observed=None):
    """Check one episode (pod + its log) and return its per-episode row."""
    name = pod["metadata"]["name"]
    phase = pod.get("status", {}).get("phase")
    if phase != "Succeeded":
        raise EpisodeInvalid("pod %s: phase is %s, expected Succeeded" % (name, phase))
    events = parse_events(name, log)
    ready = the_event(name, events, "ready")
    reward = the_event(name, events, "reward")
    for kind, event in (("ready", ready), ("reward", reward)):
        if event.get("episode_id") != name:
            raise EpisodeInvalid("pod %s: %s event has episode_id %r, expected the pod name"
                                 % (name, kind, event.get("episode_id")))
    if reward.get("reward") != 1:
        raise EpisodeInvalid("pod %s: reward is %r, expected 1" % (name, reward.get("reward")))
    if reward.get("tests_exit") != 0:
        raise EpisodeInvalid("pod %s: tests_exit is %r, expected 0 (the patched code must pass)"
                             % (name, reward.get("tests_exit")))
    if reward.get("baseline_exit") in (0, None):
        raise EpisodeInvalid("pod %s: baseline_exit is %r, expected non-zero (the unpatched code "
                             "must fail its boundary test)" % (name, reward.get("baseline_exit")))
    try:
        ready_at, reward_at = float(ready["at"]), float(reward["at"])
    except (KeyError, TypeError, ValueError):
        raise EpisodeInvalid("pod %s: ready or reward event has no numeric 'at' time" % name) from None
    pod_created = parse_k8s_time(pod["metadata"]["creationTimestamp"])
    if not job_created <= pod_created <= ready_at <= reward_at:
        raise EpisodeInvalid(
            "pod %s: time order job created (%.3f) <= pod created (%.3f) <= ready (%.3f) <= "
            "reward (%.3f) does not hold; check clock synchronization between the nodes and "
            "the API server, and that the log is complete"
            % (name, job_created, pod_created, ready_at, reward_at))
    statuses = pod["status"].get("containerStatuses") or []
    if len(statuses) != 1:
        raise EpisodeInvalid("pod %s: expected one container status, found %d" % (name, len(statuses)))
    status = statuses[0]
    if status.get("restartCount") != 0:
        raise EpisodeInvalid("pod %s: container restarted %s times, expected 0"
                             % (name, status.get("restartCount")))
    exit_code = status.get("state", {}).get("terminated", {}).get("exitCode")
    if exit_code != 0:
        raise EpisodeInvalid("pod %s: container exit code is %r, expected 0" % (name, exit_code))
    times, missing = episode_times(pod, ready, reward, observed)
    phases, notes = episode_phases(times, missing)
    return {
        "pod": name,
        "node": pod["spec"].get("nodeName"),
        "image_id": status.get("imageID"),
        "reward": reward["reward"],
        # The seed's metrics (seconds; api-server clock, whole seconds, vs episode clock):
        "pod_to_ready_seconds": ready_at - pod_created,
        "batch_to_ready_seconds": ready_at - job_created,
        "batch_to_reward_seconds": reward_at - job_created,
        "phases": phases,
        "phase_notes": notes,
        "times": times,
    }


def collect(pods, logs, job, count, observed=None):
    """Validate every episode; return the results (summary + per-episode rows).

    Raises EpisodeInvalid listing every failed check: a partial batch is never a result.
    `observed` maps pod names to times seen while the pods ran (see episode_times).
    """
    observed = observed or {}
    if len(pods) != count:
        raise EpisodeInvalid("expected %d pods for %d episodes, found %d; inspect pods.json for "
                             "failures or replacements" % (count, count, len(pods)))
    job_created = parse_k8s_time(job["metadata"]["creationTimestamp"])
    rows, problems = [], []
    for pod, log in zip(pods, logs):
        try:
            rows.append(validate_episode(pod, log, job_created, observed.get(pod["metadata"]["name"])))
        except EpisodeInvalid as problem:
            problems.append(str(problem))
    if problems:
        raise EpisodeInvalid("\n".join(problems))
    startup = [row["pod_to_ready_seconds"] for row in rows]
    nodes = collections.Counter(row["node"] for row in rows)
    phases = {}
    for name in PHASES:
        values = [row["phases"][name] for row in rows if row["phases"][name] is not None]
        reasons = collections.Counter(row["phase_notes"][name] for row in rows if name in row["phase_notes"])
        phases[name] = {**phase_definition(name), **batch_stats(values),
                        "missing": sum(reasons.values()), "missing_reasons": dict(reasons)}
    skew = [finding for row in rows for finding in clock_skew(row["pod"], row["times"])]
    return {
        "episodes": count,
        "successful_episodes": len(rows),
        "reward_sum": sum(row["reward"] for row in rows),
        "batch_to_all_ready_seconds": max(row["batch_to_ready_seconds"] for row in rows),
        "batch_to_all_rewards_seconds": max(row["batch_to_reward_seconds"] for row in rows),
        "pod_to_ready_p50_seconds": percentile(startup, 0.5),
        "pod_to_ready_p95_seconds": percentile(startup, 0.95),
        "pod_to_ready_max_seconds": max(startup),
        "nodes": dict(sorted(nodes.items())),
        "image_ids": sorted({str(row["image_id"]) for row in rows}),
        "phases": phases,
        "clock_skew": {"tolerance_seconds": SKEW_TOLERANCE_SECONDS, "findings": skew,
                       "max_seconds": max((f["by_seconds"] for f in skew), default=None)},
        "pods": rows,
    }


def node_summary(node):
    """What a node contributes to a result's meaning: versions, kernel, OS, capacity."""
    info = node.get("status", {}).get("nodeInfo", {})
    return {"name": node["metadata"]["name"], "kubelet": info.get("kubeletVersion"),
            "container_runtime": info.get("containerRuntimeVersion"), "kernel": info.get("kernelVersion"),
            "os": info.get("osImage"), "architecture": info.get("architecture"),
            "allocatable": node.get("status", {}).get("allocatable")}


def run_metadata(run_info, version, runtime_class, nodes):
    """Everything needed to reproduce and compare a run; None with a reason where unknown."""
    def unknown(saved, what):
        return None if saved is None or "error" not in saved else "%s unknown: %s" % (what, saved["error"])
    version = version or {}
    flags = run_info.get("flags", {})
    return {
        "tool_version": run_info.get("tool_version"),
        "started_at": run_info.get("started_at"),
        "flags": flags,
        "kubectl_client_version": version.get("clientVersion", {}).get("gitVersion"),
        "server_version": version.get("serverVersion", {}).get("gitVersion"),
        "versions_note": unknown(version, "versions"),
        "runtime_class": None if runtime_class is None else {
            "name": runtime_class["metadata"]["name"], "handler": runtime_class.get("handler"),
            "overhead": runtime_class.get("overhead"), "scheduling": runtime_class.get("scheduling")},
        "nodes": nodes if isinstance(nodes, list) else None,
        "nodes_note": unknown(nodes if isinstance(nodes, dict) else None, "nodes"),
        "cache_state": {"state": "uncontrolled",
                        "detail": "no pre-pull or prewarm; whether the image was cached on each node is not known"},
    }


def read_saved(path):
    return json.loads(path.read_text()) if path.exists() else None


def results_from_folder(output):
    """The whole results.json from the files saved in an output folder, and nothing else.

    Raises EpisodeInvalid when an episode fails validation.
    """
    job = read_json(output / "job.json", "the saved Job")
    pods = read_json(output / "pods.json", "the saved pods")
    logs = [(output / (pod["metadata"]["name"] + ".log")).read_text()
            if (output / (pod["metadata"]["name"] + ".log")).exists() else "" for pod in pods]
    run_info = read_json(output / "run.json", "the run record")
    flags = run_info["flags"]
    report = collect(pods, logs, job, flags["count"])
    report.update(context=run_info["context"], namespace=run_info["namespace"], image=flags["image"],
                  runtime=flags["runtime"], parallelism=flags["parallelism"], cache_state="uncontrolled",
                  client_job_complete_seconds=run_info.get("client_job_complete_seconds"))
    report["run"] = run_metadata(run_info, read_saved(output / "version.json"),
                                 read_saved(output / "runtimeclass.json"), read_saved(output / "nodes.json"))
    pod_rows = report.pop("pods")
    report["pods"] = pod_rows  # per-episode rows last, as in the seed
    return report


def summary_view(report):
    """What `run` prints: the seed's summary keys and the per-phase medians."""
    keys = ("episodes", "successful_episodes", "reward_sum", "batch_to_all_ready_seconds",
            "batch_to_all_rewards_seconds", "pod_to_ready_p50_seconds", "pod_to_ready_p95_seconds",
            "pod_to_ready_max_seconds", "nodes", "image_ids", "context", "namespace", "image", "runtime",
            "parallelism", "cache_state", "client_job_complete_seconds")
    view = {key: report[key] for key in keys}
    view["phase_p50_seconds"] = {name: phase["p50"] for name, phase in report["phases"].items()}
    return view


def job_outcome(job):
    """'Complete', 'Failed' or None (still running), from the Job's conditions."""
    conditions = {c.get("type"): c for c in (job or {}).get("status", {}).get("conditions", [])}
    for kind in ("Complete", "Failed"):
        if conditions.get(kind, {}).get("status") == "True":
            return kind
    return None


def job_condition(job, kind):
    for condition in job.get("status", {}).get("conditions", []):
        if condition.get("type") == kind:
            return condition
    return {}


def describe_failed_pods(pods, logs):
    """One phrase per failed pod: name, exit code and the last line of its log."""
    phrases = []
    for pod, log in zip(pods, logs):
        if pod.get("status", {}).get("phase") != "Failed":
            continue
        statuses = pod["status"].get("containerStatuses") or [{}]
        terminated = statuses[0].get("state", {}).get("terminated", {})
        phrase = "pod %s exited %s" % (pod["metadata"]["name"], terminated.get("exitCode", "?"))
        if last_line(log):
            phrase += " (%s)" % last_line(log)
        phrases.append(phrase)
    return phrases


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def flags_of(args):
    """Every flag of the command line, as given or defaulted (for run.json)."""
    flags = {key: value for key, value in vars(args).items() if key not in ("handler", "subparser")}
    flags["runtime"] = None if flags.get("no_runtime_class") else flags.get("runtime")
    return flags


def save_optional(path, fetch):
    """Save what fetch() returns; on a kubectl error save {"error": ...}: metadata must not fail a run."""
    try:
        write_json(path, fetch())
    except KubectlError as error:
        write_json(path, {"error": last_line(error.stderr) or str(error)})


def cleanup_command(output):
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "rl-batch-demo.py"
    if program.endswith(".py"):
        program = "python3 " + shlex.quote(sys.argv[0])
    return "%s cleanup --output %s" % (program, shlex.quote(str(output)))


# ============================================================================
# Presentation: the comparison table and the timeline picture (pure functions)
# ============================================================================

# Report rows: (label, kind, key). kind "phase": P50 / P95 of a phase; "batch": a batch
# time in seconds (with a ratio against the first column); "count": episodes / rewards.
REPORT_ROWS = [
    ("tasks / rewards", "count", None),
    ("pod created -> scheduled P50 / P95", "phase", "scheduling"),
    ("scheduled -> sandbox ready (PodReadyToStartContainers) P50 / P95", "phase", "sandbox_start"),
    ("sandbox ready -> container started P50 / P95", "phase", "container_start"),
    ("scheduled -> container started P50 / P95", "phase", "scheduled_to_container_started"),
    ("container started -> first statement P50 / P95", "phase", "interpreter_start"),
    ("Python module import P50 / P95", "phase", "module_import"),
    ("import done -> ready P50 / P95", "phase", "import_done_to_ready"),
    ("batch all ready", "batch", "batch_to_all_ready_seconds"),
    ("pod created -> ready P50 / P95", "phase", "pod_to_ready"),
    ("ready -> reward P50 / P95", "phase", "ready_to_reward"),
    ("batch all rewards", "batch", "batch_to_all_rewards_seconds"),
    ("reward -> container finished P50 / P95", "phase", "reward_to_container_finished"),
    ("client sees Job complete", "batch", "client_job_complete_seconds"),
]


def format_seconds(value):
    if value is None:
        return "n/a"
    return "%.1f ms" % (value * 1000) if abs(value) < 1 else "%.2f s" % value


def report_table(columns):
    """columns: [(label, results)] -> {"columns": [...], "rows": [{"measure", "values", "ratios"}]}."""
    rows = []
    for label, kind, key in REPORT_ROWS:
        values, ratios = [], []
        for _, results in columns:
            if kind == "count":
                values.append("%d/%d" % (results["successful_episodes"], results["reward_sum"]))
                ratios.append(None)
            elif kind == "phase":
                phase = results.get("phases", {}).get(key)
                values.append(None if phase is None or phase["count"] == 0 else
                              "%s / %s" % (format_seconds(phase["p50"]), format_seconds(phase["p95"])))
                ratios.append(None)
            else:
                value, base = results.get(key), columns[0][1].get(key)
                values.append(format_seconds(value) if value is not None else None)
                ratios.append(value / base if value is not None and base else None)
        coarse = (kind == "phase" and phase_definition(key)["resolution_seconds"] >= 1) or key in (
            "batch_to_all_ready_seconds", "batch_to_all_rewards_seconds")
        if any(value is not None for value in values):
            rows.append({"measure": label, "values": values, "ratios": ratios, "whole_second_resolution": coarse})
    return {"columns": [label for label, _ in columns], "rows": rows}


def report_markdown(table):
    lines = ["| measure | %s |" % " | ".join(table["columns"]),
             "|---|%s" % ("---|" * len(table["columns"]))]
    for row in table["rows"]:
        cells = []
        for index, (value, ratio) in enumerate(zip(row["values"], row["ratios"])):
            cell = value or "n/a"
            if ratio is not None and index > 0:
                cell += " (%.2fx)" % ratio
            cells.append(cell)
        marker = " *" if row["whole_second_resolution"] else ""
        lines.append("| %s%s | %s |" % (row["measure"], marker, " | ".join(cells)))
    lines.append("")
    lines.append("\\* uses Kubernetes timestamps (whole seconds, another clock than the episode's): read to "
                 "about one second; small or negative values are within that resolution.")
    return "\n".join(lines) + "\n"


# Timeline segments, in order: (phase, colour, legend text).
TIMELINE_SEGMENTS = [
    ("scheduling", "#bdbdbd", "pod created -> scheduled"),
    ("sandbox_start", "#8e6bbf", "scheduled -> sandbox ready"),
    ("container_start", "#4c72b0", "sandbox ready -> container started"),
    ("scheduled_to_container_started", "#6a8fcf", "scheduled -> container started (sandbox time unknown)"),
    ("interpreter_start", "#dd8452", "container started -> first statement"),
    ("module_import", "#c44e52", "Python module import"),
    ("import_done_to_ready", "#937860", "import done -> ready"),
    ("ready_to_reward", "#55a868", "ready -> reward (tests, fix, tests)"),
    ("reward_to_container_finished", "#8c8c8c", "reward -> container finished"),
]


def timeline_svg(runs):
    """One SVG stacking each run: a row per episode in pod-creation order, a segment per phase,
    x in seconds since the run's Job creation. runs: [(label, results)]."""
    from xml.sax.saxutils import escape
    width, left, right = 1000, 10, 10
    plot = width - left - right
    spans = []
    for _, results in runs:
        origin = results["pods"][0]["times"]["ready"] - results["pods"][0]["batch_to_ready_seconds"]  # Job created
        ends = [row["times"][point] for row in results["pods"] for point in TIME_POINTS if row["times"][point]]
        spans.append((origin, max(ends) - origin))
    horizon = max(span for _, span in spans) or 1.0
    step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
                if horizon / s <= 12)
    scale = plot / (math.ceil(horizon / step) * step)
    parts, y = [], 10
    for (label, results), (origin, _) in zip(runs, spans):
        rows = sorted(results["pods"], key=lambda row: (row["times"]["pod_created"], row["pod"]))
        height = max(2, min(14, 600 // max(1, len(rows))))
        title = "%s: %d episodes, parallelism %s, runtime %s, image %s, context %s" % (
            label, results["episodes"], results["parallelism"], results["runtime"], results["image"],
            results["context"])
        parts.append('<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>' % (left, y + 12, escape(title)))
        y += 22
        top = y
        for row in rows:
            parts.append('<g class="episode" data-pod="%s">' % escape(row["pod"]))
            times = row["times"]
            for phase, colour, _ in TIMELINE_SEGMENTS:
                start, end = PHASES[phase]
                if phase == "scheduled_to_container_started" and times["sandbox_ready"] is not None:
                    continue
                if times.get(start) is None or times.get(end) is None:
                    continue
                x0 = left + (times[start] - origin) * scale
                x1 = left + (times[end] - origin) * scale
                parts.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %s: %s</title></rect>'
                             % (x0, y, max(0.0, x1 - x0), max(1, height - 1), colour, escape(row["pod"]), phase,
                                format_seconds(times[end] - times[start])))
            parts.append("</g>")
            y += height
        ticks = []
        for index in range(int(math.ceil(horizon / step)) + 1):
            x = left + index * step * scale
            ticks.append('<line x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="#e0e0e0"/>' % (x, top, x, y))
            ticks.append('<text x="%.2f" y="%d" font-size="10" text-anchor="middle">%g</text>' % (x, y + 12, index * step))
        parts.extend(ticks)
        parts.append('<text x="%d" y="%d" font-size="10">seconds since the Job was created (API times are whole '
                     'seconds)</text>' % (left, y + 26))
        y += 40
    for index, (phase, colour, text) in enumerate(TIMELINE_SEGMENTS):
        column, line = index % 3, index // 3
        x, ly = left + column * 330, y + line * 16
        parts.append('<rect x="%d" y="%d" width="12" height="10" fill="%s"/>' % (x, ly, colour))
        parts.append('<text x="%d" y="%d" font-size="11">%s</text>' % (x + 16, ly + 9, escape(text)))
    y += 16 * math.ceil(len(TIMELINE_SEGMENTS) / 3) + 10
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            'font-family="sans-serif">\n<rect width="100%%" height="100%%" fill="white"/>\n%s\n</svg>\n'
            % (width, y, width, y, "\n".join(parts)))


# ============================================================================
# Subcommands
# ============================================================================


def blocking_reason(events, pods):
    """Why the episode pods cannot start, when waiting will not help; None otherwise.

    Admission refusals (PodSecurity, RuntimeClass) show only as the Job controller's
    FailedCreate events; a container the kubelet refuses to start shows as
    CreateContainerConfigError. Both persist until someone changes the cluster or the spec.
    """
    for event in events:
        message = event.get("message") or ""
        if event.get("reason") == "FailedCreate" and "forbidden" in message:
            return "the cluster refused to create the episode pods: " + message.replace("Error creating: ", "", 1)
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = status.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CreateContainerConfigError":
                return "pod %s cannot start its container (CreateContainerConfigError: %s)" % (
                    pod["metadata"]["name"], waiting.get("message"))
    return None


def wait_for_job(cluster, namespace, started, wait_seconds):
    """Poll the Job about once a second until Complete/Failed or the client deadline.

    While the Job makes no progress for STALL_CHECK_SECONDS, also look for a reason the
    pods can never start, so such a run stops early with that reason.
    Returns (job, 'Complete'|'Failed'|None, blocking reason or None).
    """
    deadline = started + wait_seconds
    show_progress = sys.stderr.isatty()
    progress, progress_at = None, time.monotonic()
    while True:
        live = json.loads(cluster.kubectl("-n", namespace, "get", "job", JOB_NAME, "-o", "json"))
        outcome = job_outcome(live)
        status = live.get("status", {})
        counts = tuple(status.get(key, 0) for key in ("active", "ready", "succeeded", "failed"))
        if show_progress:
            sys.stderr.write("\rwaiting: active %d, ready %d, succeeded %d, failed %d, %.0f s   "
                             % (counts + (time.monotonic() - started,)))
            sys.stderr.flush()
        blocked = None
        if counts != progress:
            progress, progress_at = counts, time.monotonic()
        elif not outcome and time.monotonic() - progress_at >= STALL_CHECK_SECONDS:
            events = json.loads(cluster.kubectl("-n", namespace, "get", "events", "-o", "json"))["items"]
            pods = []
            if counts[0]:
                pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", "job-name=" + JOB_NAME,
                                                  "-o", "json"))["items"]
            blocked = blocking_reason(events, pods)
            progress_at = time.monotonic()
        if outcome or blocked or time.monotonic() > deadline:
            if show_progress:
                sys.stderr.write("\n")
            return live, outcome, blocked
        time.sleep(POLL_INTERVAL_SECONDS)


def save_diagnostics(cluster, namespace, output, job):
    """Save job.json, pods.json, events.txt and one <pod>.log per pod; return (pods, logs)."""
    pods = json.loads(cluster.kubectl("-n", namespace, "get", "pods", "-l", "job-name=" + JOB_NAME,
                                      "-o", "json"))["items"]
    write_json(output / "job.json", job)
    write_json(output / "pods.json", pods)
    (output / "events.txt").write_text(
        cluster.kubectl("-n", namespace, "get", "events", "--sort-by=.metadata.creationTimestamp"))

    def fetch_log(pod):
        name = pod["metadata"]["name"]
        try:
            log = cluster.kubectl("-n", namespace, "logs", name, "-c", CONTAINER_NAME)
        except KubectlError as error:
            print("warning: no log for pod %s: %s" % (name, last_line(error.stderr)), file=sys.stderr)
            log = ""
        (output / (name + ".log")).write_text(log)
        return log

    with concurrent.futures.ThreadPoolExecutor(max_workers=LOG_FETCH_WORKERS) as pool:
        logs = list(pool.map(fetch_log, pods))
    return pods, logs


def cmd_run(args):
    if args.dry_run:
        # Exactly what a run would create, as one List `kubectl create -f -` accepts;
        # neither the cluster nor the output folder is touched.
        run_id = uuid.uuid4().hex[:12]
        objects = run_manifests(args, NAMESPACE_PREFIX + run_id, run_id)
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        return EXIT_OK
    output = Path(args.output)
    if output.exists():
        raise DemoError("output folder %s already exists; choose a new --output so that no "
                        "experiment record is overwritten" % output)
    context = args.context or current_context()
    cluster = Cluster(context)
    try:
        output.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise DemoError("output folder %s already exists; choose a new --output" % output) from None
    except OSError as error:
        raise DemoError("cannot create output folder %s: %s" % (output, error.strerror)) from None

    run_id = uuid.uuid4().hex[:12]
    namespace = NAMESPACE_PREFIX + run_id
    receipt = {"context": context, "namespace": namespace, "run_id": run_id}
    # The receipt names the namespace before any cluster change, so every failure after
    # this line leaves something `cleanup` can finish.
    write_json(output / "receipt.json", receipt)
    try:
        return run_batch(args, cluster, output, receipt)
    except DemoError as error:
        error.args = ("%s. Clean up with: %s" % (str(error).rstrip("."), cleanup_command(output)),)
        raise
    except KeyboardInterrupt:
        print("Interrupted. Clean up with: %s" % cleanup_command(output), file=sys.stderr)
        raise


def run_batch(args, cluster, output, receipt):
    namespace = receipt["namespace"]
    runtime = None if args.no_runtime_class else args.runtime
    run_info = {"tool_version": __version__, "started_at": utc_now(), "context": cluster.context,
                "namespace": namespace, "flags": flags_of(args)}
    write_json(output / "run.json", run_info)
    save_optional(output / "version.json", lambda: json.loads(cluster.kubectl("version", "-o", "json")))
    if runtime is not None:
        try:
            runtime_class = json.loads(cluster.kubectl("get", "runtimeclass", runtime, "-o", "json"))
        except KubectlError as error:
            if not error.not_found:
                raise
            raise DemoError("RuntimeClass %r not found on context %s; list them with `kubectl "
                            "--context %s get runtimeclass`, then pass --runtime NAME (or "
                            "--no-runtime-class for the cluster's default runtime)"
                            % (runtime, cluster.context, cluster.context)) from None
        write_json(output / "runtimeclass.json", runtime_class)

    namespace_obj, *supporting, job = run_manifests(args, namespace, receipt["run_id"])
    created = cluster.create(namespace_obj)
    receipt["uid"] = created["metadata"]["uid"]
    write_json(output / "receipt.json", receipt)
    print("Test namespace:", namespace, flush=True)
    for obj in supporting:
        cluster.create(obj)

    write_json(output / "job-submitted.json", job)
    started = time.monotonic()
    created_job = cluster.create(job)
    receipt["job_uid"] = created_job["metadata"]["uid"]
    write_json(output / "receipt.json", receipt)

    wait_seconds = args.timeout + CLIENT_GRACE_SECONDS
    live, outcome, blocked = wait_for_job(cluster, namespace, started, wait_seconds)
    # client_job_complete_seconds: client monotonic clock, from just before the Job's
    # create request to the poll that saw the Complete condition (includes polling).
    run_info["client_job_complete_seconds"] = time.monotonic() - started
    write_json(output / "run.json", run_info)
    pods, logs = save_diagnostics(cluster, namespace, output, live)
    where = "diagnostics saved in %s (job.json, pods.json, events.txt, pod logs)" % output
    if blocked:
        raise DemoError("%s; stopped early instead of waiting for the deadline; %s" % (blocked, where))
    if outcome is None:
        raise BatchTimeout("Job %s did not finish within the client's %d s wait; %s"
                           % (JOB_NAME, wait_seconds, where))
    if outcome == "Failed":
        failed = job_condition(live, "Failed")
        message = "Job %s failed (%s: %s)" % (JOB_NAME, failed.get("reason"), failed.get("message"))
        details = describe_failed_pods(pods, logs)
        if details:
            message += "; " + "; ".join(details[:3])
            if len(details) > 3:
                message += "; and %d more failed pods" % (len(details) - 3)
        error_type = BatchTimeout if failed.get("reason") == "DeadlineExceeded" else BatchFailed
        raise error_type("%s; %s" % (message, where))
    used_nodes = sorted({pod["spec"].get("nodeName") for pod in pods if pod["spec"].get("nodeName")})
    save_optional(output / "nodes.json", lambda: [
        node_summary(json.loads(cluster.kubectl("get", "node", name, "-o", "json"))) for name in used_nodes])
    try:
        report = results_from_folder(output)
    except EpisodeInvalid as problem:
        problems = str(problem).splitlines()
        (output / "validation-errors.txt").write_text(str(problem) + "\n")
        more = " (and %d more in validation-errors.txt)" % (len(problems) - 1) if len(problems) > 1 else ""
        raise BatchFailed("validation failed, no results.json written: %s%s; %s"
                          % (problems[0], more, where)) from None
    write_json(output / "results.json", report)
    (output / "timeline.svg").write_text(timeline_svg([(output.name, report)]))
    print(json.dumps(summary_view(report), indent=2))
    for finding in report["clock_skew"]["findings"]:
        print("warning: clock skew: pod %s: %s is %.3f s earlier than %s" % (
            finding["pod"], finding["event"], finding["by_seconds"], finding["earlier_than"]), file=sys.stderr)
    return EXIT_OK


def ownership_mismatches(kind, live, expected):
    """Compare live metadata with the receipt; one sentence per key that differs."""
    problems = []
    for key, want in expected.items():
        if key.startswith("label "):
            have = live.get("metadata", {}).get("labels", {}).get(key[len("label "):])
        else:
            have = live.get("metadata", {}).get(key)
        if have != want:
            problems.append("%s %s must equal %s: current value is %s" % (kind, key, want, have))
    return problems


def wait_until_gone(cluster, what, parts, timeout):
    deadline = time.monotonic() + timeout
    delay = 0.25
    while cluster.exists(*parts):
        if time.monotonic() > deadline:
            raise BatchTimeout("%s still terminating after %d s; inspect it with `kubectl --context "
                               "%s get %s` and run cleanup again" % (what, timeout, cluster.context,
                                                                     " ".join(parts)))
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def cmd_cleanup(args):
    """Clean up each folder in turn; one folder's refusal does not stop the others."""
    if len(args.output) == 1:
        return cleanup_one(Path(args.output[0]))
    first_failure = EXIT_OK
    for folder in args.output:
        try:
            cleanup_one(Path(folder))
        except DemoError as error:
            print("Error: %s: %s" % (folder, error), file=sys.stderr)
            first_failure = first_failure or error.exit_code
    return first_failure


def cleanup_one(output):
    receipt = read_json(output / "receipt.json", "the receipt")
    try:
        cluster, namespace, run_id = Cluster(receipt["context"]), receipt["namespace"], receipt["run_id"]
    except (KeyError, TypeError):
        raise DemoError("%s lacks context, namespace or run_id; refusing cleanup"
                        % (output / "receipt.json")) from None
    live = cluster.get_json("namespace", namespace)
    if live is None:
        print("Namespace already absent:", namespace)
        return EXIT_OK
    if not receipt.get("uid"):
        raise DemoError("receipt.json has no namespace uid (the run stopped before the namespace's "
                        "creation was confirmed), so ownership of %s cannot be proven; check it and "
                        "delete it yourself with `kubectl --context %s delete namespace %s`"
                        % (namespace, cluster.context, namespace))
    problems = ownership_mismatches("namespace " + namespace, live,
                                    {"uid": receipt["uid"], "label " + RUN_LABEL: run_id})
    if problems:
        raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))

    live_job = cluster.get_json("-n", namespace, "job", JOB_NAME)
    if live_job is not None:
        expected_uid = receipt.get("job_uid")
        if expected_uid is None and (output / "job.json").exists():
            expected_uid = read_json(output / "job.json", "the saved Job").get("metadata", {}).get("uid")
        if expected_uid is None:
            raise DemoError("Job %s exists in %s but neither receipt.json nor job.json records its "
                            "uid; refusing cleanup" % (JOB_NAME, namespace))
        problems = ownership_mismatches("job " + JOB_NAME, live_job, {"uid": expected_uid})
        if problems:
            raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))
        cluster.kubectl("-n", namespace, "delete", "job", JOB_NAME, "--cascade=foreground",
                        "--wait=false")
        print("Deleting Job %s and its pods..." % JOB_NAME, file=sys.stderr, flush=True)
        wait_until_gone(cluster, "Job %s or its pods" % JOB_NAME, ("-n", namespace, "job", JOB_NAME),
                        CLEANUP_WAIT_SECONDS)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    print("Deleting namespace %s..." % namespace, file=sys.stderr, flush=True)
    wait_until_gone(cluster, "Namespace %s (inspect its finalizers)" % namespace,
                    ("namespace", namespace), CLEANUP_WAIT_SECONDS)
    print("Deleted test namespace:", namespace)
    return EXIT_OK


def cmd_report(args):
    labels = args.label or [Path(folder).name or str(folder) for folder in args.folders]
    if len(labels) != len(args.folders):
        raise DemoError("give one --label per folder (%d folders, %d labels)" % (len(args.folders), len(labels)))
    columns = []
    for label, folder in zip(labels, args.folders):
        path = Path(folder) / "results.json"
        if not path.exists():
            raise DemoError("%s has no results.json (the run failed, was interrupted, or is not an output "
                            "folder)" % folder)
        columns.append((label, read_json(path, "the results")))
    table = report_table(columns)
    print(json.dumps(table, indent=2) if args.json else report_markdown(table), end="" if not args.json else "\n")
    if args.timeline:
        Path(args.timeline).write_text(timeline_svg(columns))
    return EXIT_OK


def find_receipts(folders):
    """{namespace: (folder, receipt)} for every receipt.json in the folders or one level below."""
    found = {}
    for folder in folders:
        folder = Path(folder)
        for path in [folder / "receipt.json", *sorted(folder.glob("*/receipt.json"))]:
            try:
                receipt = json.loads(path.read_text())
                found[receipt["namespace"]] = (path.parent, receipt)
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return found


def run_row(namespace, job, receipts, now):
    """One line of `list`: what the cluster says about a run, and which receipt names it."""
    meta = namespace["metadata"]
    name = meta["name"]
    status = (job or {}).get("status", {})
    if meta.get("deletionTimestamp"):
        state = "Terminating"
    elif job is None:
        state = "no Job"
    else:
        state = job_outcome(job) or "Running"
    receipt = "-"
    if name in receipts:
        folder, saved = receipts[name]
        receipt = str(folder)
        if saved.get("uid") != meta.get("uid"):
            receipt += " (uid differs: not this namespace)"
    return {"namespace": name, "run_id": meta.get("labels", {}).get(RUN_LABEL),
            "age_seconds": int(now - parse_k8s_time(meta["creationTimestamp"])), "state": state,
            "completions": (job or {}).get("spec", {}).get("completions"),
            "succeeded": status.get("succeeded", 0), "failed": status.get("failed", 0),
            "active": status.get("active", 0), "receipt": receipt}


def human_age(seconds):
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return "%d%s" % (seconds // size, unit)
    return "%ds" % seconds


def cmd_list(args):
    cluster = Cluster(args.context or current_context())
    namespaces = json.loads(cluster.kubectl("get", "namespaces", "-l", RUN_LABEL, "-o", "json"))["items"]
    receipts = find_receipts(args.search or ["."])
    now = time.time()
    rows = [run_row(ns, cluster.get_json("-n", ns["metadata"]["name"], "job", JOB_NAME), receipts, now)
            for ns in namespaces]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("No runs of %s on context %s." % (TOOL_NAME, cluster.context))
        return EXIT_OK
    table = [("NAMESPACE", "AGE", "STATE", "EPISODES", "RECEIPT")]
    for row in rows:
        episodes = "%s/%s done, %s failed" % (row["succeeded"], row["completions"] or "?", row["failed"])
        table.append((row["namespace"], human_age(row["age_seconds"]), row["state"], episodes, row["receipt"]))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print("   ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    return EXIT_OK


# ============================================================================
# Command line
# ============================================================================


def build_parser():
    parser = argparse.ArgumentParser(
        prog="rl-batch-demo.py",
        description="Launch a batch of isolated sandbox episodes (one Kubernetes Job) for RL\n"
                    "rollouts, measure batch readiness and reward latency, verify every episode,\n"
                    "and clean up only what was created.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n"
               "  0    ok\n"
               "  1    error (kubectl, cluster, prerequisites, refused cleanup)\n"
               "  2    bad command line\n"
               "  3    timed out (Job deadline, client wait, cleanup wait)\n"
               "  4    batch failed or validation failed\n"
               "  130  interrupted\n\n"
               "environment: KUBECTL overrides the kubectl program.",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    run = commands.add_parser("run", help="run one batch and write results.json",
                              description="Run COUNT episodes as one Job and validate them.")
    run.add_argument("--output", metavar="DIR",
                     help="new folder for receipt, diagnostics and results (must not exist); "
                          "required unless --dry-run")
    run.add_argument("--count", type=int, default=DEFAULT_COUNT,
                     help="episodes in the batch, 1..%d (default %d)" % (MAX_COUNT, DEFAULT_COUNT))
    run.add_argument("--parallelism", type=int,
                     help="episodes running at once, 1..COUNT (default: COUNT)")
    run.add_argument("--image", default=DEFAULT_IMAGE,
                     help="image with `python` (3.9+) runnable as UID/GID 1000 (default %s)"
                          % DEFAULT_IMAGE)
    runtime = run.add_mutually_exclusive_group()
    runtime.add_argument("--runtime", default=DEFAULT_RUNTIME, metavar="NAME",
                         help="RuntimeClass of the sandboxes (default %s)" % DEFAULT_RUNTIME)
    runtime.add_argument("--no-runtime-class", action="store_true",
                         help="set no RuntimeClass: pods use the nodes' default runtime (e.g. "
                              "runc on a kind cluster); results.json records runtime null")
    run.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
                     help="the Job's activeDeadlineSeconds (default %d); the client waits this plus "
                          "%d s" % (DEFAULT_TIMEOUT_SECONDS, CLIENT_GRACE_SECONDS))
    run.add_argument("--network", choices=("default", "none"), default="default",
                     help="`none`: a default-deny NetworkPolicy (ingress and egress) in the run's "
                          "namespace; needs a CNI that enforces NetworkPolicies (default: default)")
    run.add_argument("--dry-run", action="store_true",
                     help="print the objects a run would create (JSON for `kubectl create -f -`); "
                          "touch neither the cluster nor the output folder")
    run.add_argument("--context", metavar="NAME",
                     help="kubectl context (default: kubectl's current context)")
    run.set_defaults(handler=cmd_run, subparser=run)

    cleanup = commands.add_parser("cleanup", help="delete what one run created, after checking "
                                                  "ownership against its receipt.json")
    cleanup.add_argument("--output", required=True, metavar="DIR", nargs="+",
                         help="the run's output folder (its receipt.json names the context); "
                              "several folders are cleaned up in turn")
    cleanup.set_defaults(handler=cmd_cleanup)

    report = commands.add_parser("report", help="compare saved runs side by side (no cluster needed)",
                                 description="Print the tutorial's comparison table for saved output "
                                             "folders, one column each, with ratios against the first.")
    report.add_argument("folders", nargs="+", metavar="DIR", help="output folders with results.json")
    report.add_argument("--label", action="append", metavar="TEXT",
                        help="column label, once per folder in order (default: the folder names)")
    report.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    report.add_argument("--timeline", metavar="FILE.svg", help="also write one timeline stacking every run")
    report.set_defaults(handler=cmd_report)

    listing = commands.add_parser("list", help="list the runs of this tool on a context, and the local "
                                               "receipts that name them")
    listing.add_argument("--search", metavar="DIR", nargs="+",
                         help="folders holding output folders, searched for receipts (default: .)")
    listing.add_argument("--context", metavar="NAME",
                         help="kubectl context (default: kubectl's current context)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(handler=cmd_list)
    return parser


def parse_args(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        if not args.output and not args.dry_run:
            args.subparser.error("--output DIR is required (unless --dry-run)")
        if not 1 <= args.count <= MAX_COUNT:
            args.subparser.error("--count must be between 1 and %d (the demo's bound to keep first trials "
                         "small), got %d" % (MAX_COUNT, args.count))
        if args.timeout < 1:
            args.subparser.error("--timeout must be at least 1 second, got %d" % args.timeout)
        if args.parallelism is None:
            args.parallelism = args.count
        if not 1 <= args.parallelism <= args.count:
            args.subparser.error("--parallelism must be between 1 and --count (%d), got %d"
                         % (args.count, args.parallelism))
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return args.handler(args)
    except DemoError as error:
        print("Error: %s" % error, file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("Error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
