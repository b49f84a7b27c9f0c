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
import concurrent.futures
import datetime
import json
import math
import os
from pathlib import Path
import shlex
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
# lines on stdout: {"event": "ready"|"reward", "at": <unix seconds, node clock>,
# "episode_id": <pod name>, ...}. RL_WORKSPACE exists only so that a simulated cluster
# can give each local process its own folder; in a pod it is unset and /workspace (an
# emptyDir) is used.

EPISODE_PROGRAM = r'''import json, os, pathlib, subprocess, time
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


emit('ready')
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
# Clocks and precision. Kubernetes timestamps (Job and pod creationTimestamp) come from
# the API server's clock with whole-second precision (RFC 3339, truncated). Episode
# events (`at`) come from the node's clock, sub-millisecond. Every metric below mixes
# the two, so it is good to about one second and needs synchronised clocks.


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


def validate_episode(pod, log, job_created):
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
    return {
        "pod": name,
        "node": pod["spec"].get("nodeName"),
        "image_id": status.get("imageID"),
        "reward": reward["reward"],
        # Metric definitions (seconds; API clock whole seconds vs node clock, see above):
        "pod_to_ready_seconds": ready_at - pod_created,
        "batch_to_ready_seconds": ready_at - job_created,
        "batch_to_reward_seconds": reward_at - job_created,
    }


def collect(pods, logs, job, count):
    """Validate every episode; return the results (summary + per-episode rows).

    Raises EpisodeInvalid listing every failed check: a partial batch is never a result.
    """
    if len(pods) != count:
        raise EpisodeInvalid("expected %d pods for %d episodes, found %d; inspect pods.json for "
                             "failures or replacements" % (count, count, len(pods)))
    job_created = parse_k8s_time(job["metadata"]["creationTimestamp"])
    rows, problems = [], []
    for pod, log in zip(pods, logs):
        try:
            rows.append(validate_episode(pod, log, job_created))
        except EpisodeInvalid as problem:
            problems.append(str(problem))
    if problems:
        raise EpisodeInvalid("\n".join(problems))
    startup = [row["pod_to_ready_seconds"] for row in rows]
    nodes = {}
    for row in rows:
        nodes[row["node"]] = nodes.get(row["node"], 0) + 1
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
        "pods": rows,
    }


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


def cleanup_command(output):
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "rl-batch-demo.py"
    if program.endswith(".py"):
        program = "python3 " + shlex.quote(sys.argv[0])
    return "%s cleanup --output %s" % (program, shlex.quote(str(output)))


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
    if runtime is not None:
        try:
            cluster.kubectl("get", "runtimeclass", runtime)
        except KubectlError as error:
            if not error.not_found:
                raise
            raise DemoError("RuntimeClass %r not found on context %s; list them with `kubectl "
                            "--context %s get runtimeclass`, then pass --runtime NAME (or "
                            "--no-runtime-class for the cluster's default runtime)"
                            % (runtime, cluster.context, cluster.context)) from None

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
    observed = time.monotonic() - started
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
    try:
        report = collect(pods, logs, live, args.count)
    except EpisodeInvalid as problem:
        problems = str(problem).splitlines()
        (output / "validation-errors.txt").write_text(str(problem) + "\n")
        more = " (and %d more in validation-errors.txt)" % (len(problems) - 1) if len(problems) > 1 else ""
        raise BatchFailed("validation failed, no results.json written: %s%s; %s"
                          % (problems[0], more, where)) from None
    report.update(context=cluster.context, namespace=namespace, image=args.image, runtime=runtime,
                  parallelism=args.parallelism, cache_state="uncontrolled",
                  client_job_complete_seconds=observed)
    write_json(output / "results.json", report)
    print(json.dumps({key: value for key, value in report.items() if key != "pods"}, indent=2))
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
