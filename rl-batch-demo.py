#!/usr/bin/env python3
"""rl-batch-demo: launch a batch of isolated sandbox episodes for RL rollouts on Kubernetes.

What it does
    `run` submits one batch/v1 Job whose pods are sandboxes (one episode each, on the
    RuntimeClass you name). Every episode fixes a small bug, runs its tests and emits a
    reward. The tool waits for the Job, saves the Job, pods, events and every episode log,
    checks that every episode really succeeded, and only then writes results.json with
    how fast the batch became ready and returned its rewards.
    `cleanup` deletes what one `run` created, after proving it owns it.
    `run --backend warm-pool` runs each episode in a sandbox claimed from a
    kubernetes-sigs/agent-sandbox warm pool (exec'd through the API server) instead, and
    `run --queue NAME` submits the Job through a Kueue LocalQueue, its queue wait apart.
    `run --stream` prints each episode's JSON line as soon as it is verified, and a training
    loop can call the same run from Python: rl_batch_demo.run_batch(...) (section Python API).
    `pool up` keeps one warm pool across a training loop's steps: each `run --backend warm-pool
    --pool POOLDIR` claims from it and deletes only its own claims; `pool down` removes it
    (from Python: `with rl_batch_demo.warm_pool(size=64, allow_large=True) as pool:
    pool.run_batch(..., allow_large=True)`).

    "The tutorial", wherever this file says it, is the one this tool started as a port of:
    Tencent Cloud Agent Runtime's RL batch tutorial (README, first section). Its choices are
    kept where a comparison depends on them: P50/P95 by linear interpolation, the `agc-`
    names, a 240 s deadline, at most 20 episodes without --allow-large.

How to run
    python3 rl-batch-demo.py run --count 10 --output rl-parallel-10
    python3 rl-batch-demo.py run --count 10 --parallelism 1 --output rl-sequential-10
    python3 rl-batch-demo.py report rl-parallel-10 rl-sequential-10
    python3 rl-batch-demo.py cleanup rl-parallel-10
    python3 rl-batch-demo.py list                 # runs of this tool left on the context
    python3 rl-batch-demo.py run --backend local --episode my_episode.py --tasks tasks.jsonl \
        --output trial                            # your own episodes, no cluster needed
    python3 rl-batch-demo.py run --backend warm-pool --count 10 --output warm-10
    python3 rl-batch-demo.py pool up --size 64 --allow-large --output pool  # a warm pool kept across steps
    python3 rl-batch-demo.py run --backend warm-pool --pool pool --count 64 --allow-large --output step-1
    python3 rl-batch-demo.py pool down pool
    python3 rl-batch-demo.py run --count 10 --queue team --cluster-queue team-cq --output queued-10

    Only the Python standard library (3.9+) and `kubectl` are needed. Set KUBECTL to use
    another kubectl program. Every kubectl call names the context explicitly.

The safety promise
    * `run` creates a fresh namespace `agc-rl-<run id>` and writes receipt.json (context,
      namespace, run id) into the output folder BEFORE it changes the cluster, then adds
      the namespace UID and the Job UID as soon as the API server returns them. Each create
      of an object cleanup proves is named in the receipt ("sent") before it is sent, so an
      object whose answer a signal cut off is adopted by cleanup when it carries the run's label.
    * `cleanup` deletes nothing unless the live namespace's UID and `agc-demo-run` label,
      and the live Job's UID, equal what the receipt recorded; for a
      warm-pool run, also every claim's label and the pool's and template's UIDs. It refuses
      while the namespace holds objects the run did not create, naming them (--delete-foreign
      deletes them too). It never removes finalizers. Local output is never deleted.
    * A step of a kept pool (`run --pool`) shares the pool's namespace: it creates, and at its
      end deletes, only its own claims (named and labelled with its run id); its cleanup proves
      the namespace is the pool's and deletes those claims only. `pool down` is `cleanup` of
      the pool's folder, with the same checks and refusals.
    * Every way out of a run saves what it saw before the error is reported; a receipt that
      can no longer be kept is printed, and `cleanup --receipt -` finishes from it.
    * An existing output folder is never overwritten.

    With --backend local the episodes run as local processes: no cluster, no kubectl.

Exit codes
    0 success; 1 error (kubectl, cluster, prerequisites, refused cleanup); 2 bad command
    line; 3 timed out (the Job's deadline or the client's wait); 4 the batch failed or an
    episode did not pass validation; 5 custom episodes only: results written, but some
    episodes are infrastructure failures; 130 interrupted (Ctrl-C); 143 terminated (SIGTERM).

Sections of this file, in order (each under a banner of the same name)
    Constants and defaults             what every backend shares (each backend keeps its own)
    The episode program                the built-in episode, the exec journal and the reset check,
                                       shipped in a ConfigMap
    Errors                             one exception type per exit code; kubectl's failure kinds
    kubectl                            the one subprocess wrapper, ApiPatience (the one retry policy),
                                       a context-bound Cluster, Resource (each kind's API path), and
                                       ApiChannel: the command's one channel to the API (one
                                       `kubectl proxy`: reads, lists, ObjectWatch, deletes)
    Exec channels                      a command in a running pod: a WebSocket through the command's
                                       channel, or one `kubectl exec` each
    Console and output files           where people's lines go; atomic JSON files; time stamps
    Manifests                          pure functions: the objects every backend creates
    Metrics and validation             pure: time points, phases, percentiles, episode checks
    Cost                               pure: reserved capacity per reward (results.json's `cost`)
    Preflight                          pure: how many episode pods fit the usable nodes at once
    The results folder                 results.json from the saved files, and nothing else
    Presentation                       the comparison table and the timeline picture
    Backend interface                  Admission, Gate, RunSpec, Run, Backend (the contract every
                                       backend declares), ClusterBackend, the start of every run,
                                       the summary
    The episode stream                 --stream: each episode on stdout once verified, and what a
                                       reader may rely on
    Pod logs                           each episode pod's log archived as it finishes
    Job backend                        one batch/v1 Job: its manifest, watches, rounds, prewarm, what a failed
                                       wait saves
    Kueue gate                         --queue: the Job's admission by Kueue, a plug-in of the Job backend
    Warm-pool backend                  agent-sandbox claims from a warm pool, episodes exec'd
    Kept pool                          `pool up/status/down`, and the steps of `run --pool`
    Recycled pool                      `pool up --recycle`: claims kept across steps, each sandbox
                                       reset-checked after every episode, a dirty one replaced
    Local backend                      local processes, no cluster
    Backend registry                   BACKENDS and GATES: the one place that lists the backends
                                       and the admission gates
    Cleanup, report and list           the other subcommands; foreign objects, --receipt
    Compare                            arms run interleaved, bootstrap intervals, verdicts, the
                                       ECDF picture
    Command line                       `run`'s parser (each other command's sits beside it), the
                                       RunSpec built once, the top parser, main()
    Python API                         run_batch(), stream_batch(), warm_pool() for a training loop
                                       (`import rl_batch_demo` once installed)
"""

import argparse
import base64
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import http.client
import io
import json
import math
import os
from pathlib import Path
import platform
import queue
import random
import re
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import weakref

__version__ = "0.1.0"

# ============================================================================
# Constants and defaults
# ============================================================================

DEFAULT_COUNT = 10
MAX_COUNT = 20  # the tutorial's bound to keep first trials small; not a capacity limit
MAX_LARGE_COUNT = 10000  # with --allow-large
DEFAULT_IMAGE = "python:3.12-alpine"
DEFAULT_RUNTIME = "cube"

TOOL_NAME = "rl-batch-demo"
RUN_LABEL = "agc-demo-run"  # namespace label holding the run id: the ownership proof
BACKEND_LABEL = "agc-demo-backend"  # on every run's namespace (none: an older run's, the Job backend's)
NAMESPACE_PREFIX = "agc-rl-"
JOB_NAME = "rollout"
CONFIGMAP_NAME = "episode"
CONTAINER_NAME = "episode"

DEFAULT_TIMEOUT_SECONDS = 240  # the tutorial's activeDeadlineSeconds: the Job controller fails the Job after it
CLIENT_GRACE_SECONDS = 30  # the client waits the Job's deadline plus this (240 + 30 = the tutorial's 270)
STALL_CHECK_SECONDS = 3.0  # no progress this long: look for a reason the pods cannot start
WATCH_WAIT_SECONDS = 0.2  # a wait loop's tick while its watch is quiet
FALLBACK_POLL_SECONDS = 5.0  # a poll now and then, in case a watch died
EPISODE_REQUESTS = {"cpu": "100m", "memory": "64Mi"}
EPISODE_LIMITS = {"cpu": "500m", "memory": "128Mi"}
CLEANUP_WAIT_SECONDS = 120  # for the Job (and its pods), then again for the namespace
# and this much more per object the deletion takes with it: the real garbage collector and
# namespace controller (kube-controller-manager v1.36.3 at its default 20 requests a second) took
# over 120 s for the pods of a 1,000-episode Job (benchmarks/real_control_plane.py)
CLEANUP_WAIT_SECONDS_PER_OBJECT = 0.25
# From this many objects in a run's namespace, cleanup deletes them itself once the namespace is
# Terminating (sweep_namespace); below it, the namespace controller's first pass is done in seconds.
SWEEP_OBJECTS = 100


def cleanup_wait_seconds(objects):
    """How long cleanup waits for a deletion that takes `objects` objects with it."""
    return CLEANUP_WAIT_SECONDS + CLEANUP_WAIT_SECONDS_PER_OBJECT * objects
KUBECTL_REQUEST_TIMEOUT = "30s"  # passed to kubectl: one API request
STDERR_NOTE_SECONDS = 10  # a background kubectl's stderr lines: at most one note this often
PROXY_START_SECONDS = 15  # for `kubectl proxy` to say it serves
API_PROXY_IN_FLIGHT = 32  # requests at once through the run's `kubectl proxy`
# A real `kubectl proxy` whose API server cannot be reached answers 500, text/plain: "dial tcp
# HOST: connect: connection refused", and "error dialing backend: ..." for an upgrade (checked
# with kubectl 1.32.4; tests/fakecluster/ASSUMPTIONS.md). Nothing was started.
# The proxy's 500 when it could not reach the API server, the request not sent (ASSUMPTIONS.md): no
# connection, or one whose TLS handshake timed out (an API server coming back, seen on the real plane)
PROXY_BACKEND_DOWN = ("connect: connection refused", "error dialing backend", "net/http: TLS handshake timeout")
KUBECTL_PROCESS_TIMEOUT_SECONDS = 60  # one kubectl process, all its requests
# The User-Agent of the tool's own requests through `kubectl proxy` (which passes it on), as the API
# server's audit log and its metrics name the client; a watch's requests are told apart.
USER_AGENT = "rl-batch-demo/" + __version__
WATCH_USER_AGENT = USER_AGENT + " watch"
# A call that fails in passing (the API server away, a 429 storm, etcd's errors) is sent again with
# this back-off (each delay drawn between 0 and its step: full jitter), then every
# RETRY_DELAYS_SECONDS[-1] s at most, until it has failed for API_PATIENCE_SECONDS
# (a control-plane upgrade or a single API server's restart takes tens of seconds); a 429's
# Retry-After is honoured up to RETRY_AFTER_MAX_SECONDS. One policy for every call: ApiPatience.
RETRY_DELAYS_SECONDS = (0.5, 1, 2, 4, 8)
API_PATIENCE_SECONDS = 90
RETRY_AFTER_MAX_SECONDS = 30
API_PATIENCE_NOTE_SECONDS = 15  # while many calls wait out an outage: one progress note this often

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_TIMEOUT, EXIT_BATCH_FAILED = 0, 1, 2, 3, 4
EXIT_INFRA_FAILURES = 5  # custom episodes: results written, but some episodes are infrastructure failures
EXIT_NOT_ISOLATED = 6  # --require-isolation: results written, but episodes ran on their node's own kernel
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), e.g. a CI runner or `timeout` stopping the tool
CONFIGMAP_MAX_BYTES = 1048576  # the API server's limit on a ConfigMap's data
TASKS_CONFIGMAP = "tasks"
INDEX_KEY = "batch.kubernetes.io/job-completion-index"  # an episode's index, on every backend's records

# ============================================================================
# The episode program, the exec journal and the reset check (run inside each sandbox)
# ============================================================================
# Shipped in the ConfigMap `episode`, run as `python -B /demo/episode.py`. Its start-up
# is part of what is measured, so it imports only cheap standard modules. It emits JSON
# lines on stdout: {"event": "ready"|"reward", "at": <unix seconds, sandbox clock>,
# "episode_id": <pod name>, ...}; `ready` also carries `started_at` (the first statement)
# and `imports_done_at`, so that interpreter start and module import can be told apart.
# At the end it also writes its events to the termination message, which the kubelet
# returns in the pod's status, so that one `get pods` carries every episode's result.
# RL_WORKSPACE and RL_TERMINATION_LOG exist only so that a simulated cluster can give each
# local process its own files; in a pod they are unset and /workspace (an emptyDir) and
# /dev/termination-log are used.

EPISODE_PROGRAM = r'''import time
started_at = time.time()  # the process's first statement, before its other imports
import os  # loaded already by the interpreter's start: no cost


def cgroup_cpu_usec():
    """This container's CPU time so far, in microseconds, from its cgroup (v2 cpu.stat, else v1
    cpuacct.usage in ns); None where no cgroup is visible, or RL_CGROUP is empty (a process with
    no cgroup of its own: what it would read is its machine's). One small file read."""
    root = os.environ.get('RL_CGROUP', '/sys/fs/cgroup')
    if not root:
        return None
    try:
        with open(root + '/cpu.stat') as stat:
            return int(stat.readline().split()[1])  # its first line: usage_usec N
    except (OSError, ValueError, IndexError):
        try:
            with open(root + '/cpuacct/cpuacct.usage') as usage:
                return int(usage.read()) // 1000
        except (OSError, ValueError):
            return None


cpu_at_start = cgroup_cpu_usec()
import json, pathlib, subprocess
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


events = []


def emit(event, **data):
    events.append(json.dumps(dict(event=event, at=time.time(), episode_id=os.environ['EPISODE_ID'], **data)))
    print(events[-1], flush=True)


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
cpu_now = cgroup_cpu_usec()
emit('reward', reward=int(after == 0), baseline_exit=before, tests_exit=after, tests_output=after_output,
     cpu_usec=cpu_now - cpu_at_start if cpu_now is not None and cpu_at_start is not None else None)
try:  # the kubelet returns this file in the pod status: one `get pods` collects every result
    pathlib.Path(os.environ.get('RL_TERMINATION_LOG', '/dev/termination-log')).write_text('\n'.join(events) + '\n')
except OSError:
    pass  # the client falls back to the log
if after != 0:
    raise RuntimeError('patched code failed its tests')
'''

# The exec journal, shipped beside the episode program (`exec-journal.py`) and exec'd into each
# warm sandbox in front of the episode: `start JOURNAL COMMAND...` makes the folder JOURNAL (made
# whole beside it, its lock taken, then renamed into place: the episode starts at most once,
# whatever is sent twice), runs COMMAND in a process that outlives the exec with its stdout, stderr
# and exit code kept in JOURNAL and, while the stream takes it, streamed as it comes; `follow
# JOURNAL` reads them again, from the start, after a stream was cut (an API outage). The runtime
# kills the exec'd process itself when its stream ends (kwok and containerd do), so `start` may be
# killed at any line: the start and the keeper hold JOURNAL's lock (flock) while they live, and the
# keeper writes `began` before it forks the episode, so `follow` tells a start killed before its
# episode began (the journal put aside: never-started) from an episode lost with its sandbox. Run
# with `python -S` (no site import: the journal costs one interpreter start, about 17 ms, before
# the episode's own). Either ends with the episode's own exit code, or with EXEC_JOURNAL_EXIT and
# one last stderr line MARK WORD: never-started (no journal, or one whose episode never began: the
# episode may be sent), started-before (`start` found the folder: follow it), lost (the episode
# began and ended without an exit code: the sandbox restarted). Python 3.9+, standard library only.
EXEC_JOURNAL_EXIT = 125
EXEC_JOURNAL_TURNS = 8  # never-started / started-before answers one episode may take before its last stands
EXEC_JOURNAL_FILE = "exec-journal.py"  # in the ConfigMap, so at /demo/exec-journal.py
EXEC_JOURNALS = "/workspace/.rl-batch-demo-exec"  # JOURNAL is this folder / the claim's name
EXEC_JOURNAL_MARK = "rl-batch-demo exec journal: "
EXEC_JOURNAL_PROGRAM = (r'''import fcntl
import os
import select
import sys
import time

MARK, EXIT = @MARK@, @EXIT@
mode, journal, command = sys.argv[1], sys.argv[2], sys.argv[3:]
folder, name = os.path.split(journal)


def say(word):
    sys.stderr.write(MARK + word + "\n")
    sys.stderr.flush()
    sys.exit(EXIT)


def path(file, where=journal):
    return os.path.join(where, file)


def aside(kind):
    """A name beside the journals for a journal being made or put aside (never a claim's name)."""
    return path(".%s-%s-%s" % (kind, name, os.urandom(6).hex()), folder)


def write_atomically(file, text):
    with open(path(file + ".new"), "w") as new:
        new.write(text)
    os.rename(path(file + ".new"), path(file))


def keep(files, status_out):
    """The keeper (a grandchild: nothing waits on the exec'd process): writes `began`, runs the
    episode, copies its output to the journal's `files` and, while the exec's stream takes it, to
    the stream; then its exit code."""
    write_atomically("began", str(os.getpid()))  # before the episode's fork: a journal without it ran none
    pipes = [os.pipe(), os.pipe()]
    episode = os.fork()
    if episode == 0:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(pipes[0][1], 1)
        os.dup2(pipes[1][1], 2)
        try:
            os.execvp(command[0], command)
        except OSError as error:
            os.write(2, ("%s: %s\n" % (command[0], error.strerror)).encode())
            os._exit(127)
    sinks = {pipes[0][0]: (files[0], 1), pipes[1][0]: (files[1], 2)}
    os.close(pipes[0][1])
    os.close(pipes[1][1])
    stream = True
    while sinks:
        for source in select.select(list(sinks), [], [])[0]:
            chunk = os.read(source, 65536)
            if not chunk:
                del sinks[source]
                continue
            kept, live = sinks[source]
            os.write(kept, chunk)
            if stream:
                try:
                    os.write(live, chunk)
                except OSError:  # the exec's stream was cut: the journal keeps it all, the stream goes
                    stream = False
                    os.close(1)
                    os.close(2)
    code = os.waitstatus_to_exitcode(os.waitpid(episode, 0)[1])
    code = 128 - code if code < 0 else code
    write_atomically("code", str(code))
    try:
        os.write(status_out, b"%d\n" % code)
    except OSError:
        pass


def start():
    os.makedirs(folder, exist_ok=True)
    if os.path.isdir(journal):
        say("started-before")
    # Made whole with its lock held before it is renamed into place: a journal is never seen whose
    # lock no process of its own holds unless they have all ended (the lock is not inherited by the
    # episode: Python's descriptors close on exec).
    making = aside("making")
    os.mkdir(making)
    lock = os.open(path("lock", making), os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    files = [os.open(path(file, making), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600) for file in ("stdout", "stderr")]
    try:
        os.rename(making, journal)  # atomic, and refused when another start's journal is there
    except OSError:
        for file in ("lock", "stdout", "stderr"):
            os.unlink(path(file, making))
        os.rmdir(making)
        say("started-before")
    status_in, status_out = os.pipe()
    child = os.fork()
    if child == 0:
        if os.fork():
            os._exit(0)
        os.close(status_in)
        try:
            keep(files, status_out)
        finally:
            os._exit(0)
    os.close(status_out)
    os.waitpid(child, 0)
    with os.fdopen(status_in) as status:
        told = status.read().strip()  # the episode's exit code, or nothing: the keeper died
    if told:
        sys.exit(int(told))
    if not os.path.exists(path("code")):
        say("lost")
    with open(path("code")) as code_file:
        sys.exit(int(code_file.read()))


def ended(lock):
    """Whether every process of the journal (its start, the keeper) has ended: then its lock is free.
    Taken, it stays this follow's until it exits."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def follow():
    try:
        lock = os.open(path("lock"), os.O_RDONLY)
    except FileNotFoundError:
        say("lost" if os.path.isdir(journal) else "never-started")  # a journal without a lock: an older one's
    sources = [open(path("stdout"), "rb"), open(path("stderr"), "rb")]
    sinks = [sys.stdout.buffer, sys.stderr.buffer]
    while True:
        done = os.path.exists(path("code"))  # read before the last output is copied
        for source, sink in zip(sources, sinks):
            for chunk in iter(lambda: source.read(65536), b""):
                sink.write(chunk)
            sink.flush()
        if done:
            with open(path("code")) as code_file:
                sys.exit(int(code_file.read()))
        if ended(lock):
            try:
                same = os.path.samestat(os.fstat(lock), os.stat(path("lock")))
            except FileNotFoundError:
                same = False
            if not same:  # another follow put this journal aside, and a start may have made a new one
                for source in sources:
                    source.close()
                os.close(lock)
                return follow()
            if os.path.exists(path("code")):
                continue  # the keeper ended meanwhile: its last output, then its code
            if os.path.exists(path("began")):
                say("lost")
            os.rename(journal, aside("never-began"))  # its start was killed first: it may be started again
            say("never-started")
        time.sleep(0.02)


start() if mode == "start" else follow()
''').replace("@MARK@", repr(EXEC_JOURNAL_MARK)).replace("@EXIT@", str(EXEC_JOURNAL_EXIT))

# The sandbox probe, shipped beside the episode (`sandbox.py`): every episode pod runs `python -B
# /demo/sandbox.py /demo/episode.py`, and the local backend the same with its own paths, so that
# custom episodes are probed too. It prints one event, {"event": "sandbox", "kernel_release":
# <uname -r>, "proc_version": <first line of /proc/version>}, as the sandbox's kernel reports
# itself (gVisor answers with its own, e.g. 4.4.0 or 4.19.0-gvisor; runc shares the node's), then
# runs the episode in the same interpreter (no second start, and without importing json, which
# the episode's import phase measures). The tool compares kernel_release with the node's
# status.nodeInfo.kernelVersion (isolation_summary). It goes to stdout (the log), and is appended
# to the termination message when the episode wrote one (so that one `get pods` still carries it;
# an episode that writes none is read from its log anyway).
SANDBOX_PROBE_FILE = "sandbox.py"
SANDBOX_PROBE_PROGRAM = r'''import os
import sys
import time


def text(value):
    if value is None:
        return "null"
    out = []
    for char in value:
        out.append("\\u%04x" % ord(char) if char < " " or char in "\\\"" or ord(char) > 126 else char)
    return '"' + "".join(out) + '"'


try:
    with open("/proc/version") as version:
        proc_version = version.readline().strip()
except OSError:
    proc_version = None
report = '{"event": "sandbox", "at": %r, "episode_id": %s, "kernel_release": %s, "proc_version": %s}' % (
    time.time(), text(os.environ.get("EPISODE_ID")), text(os.uname().release), text(proc_version))
print(report, flush=True)
# One Job of a batch across images runs some of its tasks: its completion index i is task indexes[i]
indexes = os.environ.get("RL_TASK_INDEXES")
if indexes and os.environ.get("TASK_INDEX", "").isdigit():
    os.environ["TASK_INDEX"] = indexes.split(",")[int(os.environ["TASK_INDEX"])]
    os.environ["TASK_FILE"] = "/tasks/task-%s.json" % os.environ["TASK_INDEX"]
program = sys.argv[1]
sys.argv = sys.argv[1:]
with open(program) as source:
    code = compile(source.read(), program, "exec")
try:
    exec(code, {"__name__": "__main__", "__file__": program, "__builtins__": __builtins__})
finally:
    # beside the events an episode wrote to its termination message (never a message of its own)
    termination_log = os.environ.get("RL_TERMINATION_LOG", "/dev/termination-log")
    try:
        if os.path.getsize(termination_log) > 0:
            with open(termination_log, "a") as message:
                message.write(report + "\n")
    except OSError:
        pass
'''

# The sandbox reset, shipped beside the episode (`sandbox-reset.py`): what makes a recycled kept
# pool's sandbox (`pool up --recycle`) serve another episode, proven in the sandbox rather than
# assumed. `baseline WORKSPACE`, exec'd once when a claim of the pool is first Ready (before any
# episode), prints one JSON line: the sandbox's processes (pid and start time, which together name
# a process for good, and its command line), every entry (path, kind, mode, size) under each
# writable place outside the workspace ($TMPDIR or /tmp, /var/tmp, /dev/shm, $HOME unless it is
# /), and the workspace's own mode. `check WORKSPACE JOURNAL BASELINE`, run after each episode
# with that line (in the episode's own exec: RESET_AFTER_EPISODE_SCRIPT), first waits for the episode's exec journal to end (its lock free: the keeper
# is gone), then compares: a process not in the baseline (every process the sandbox shows is
# looked at, so one that double-forked away from the episode is found too), a baseline process
# gone (the keep-alive), an entry added, removed, resized or of another mode, a workspace of
# another mode: each is a sentence of what the episode left. The workspace is then emptied (made
# writable first, its mode put back). It prints one JSON line {"clean": bool, "left": [...],
# "seconds": s} and exits 0 when clean, 1 when not; any other exit, or none in time, means the
# check itself could not run. A sandbox's processes are all that its /proc shows (a container
# has its own PID namespace); RL_SANDBOX_ID exists only so that a simulated cluster, whose
# sandboxes share the machine's /proc, can name its own: the processes whose environment holds
# the same RL_SANDBOX_ID. Python 3.9+, standard library only, run with -S -B (nothing written).
SANDBOX_RESET_FILE = "sandbox-reset.py"
SANDBOX_RESET_CLEAN, SANDBOX_RESET_DIRTY = 0, 1  # its exit codes; any other: the check broke
SANDBOX_RESET_PROGRAM = r'''import fcntl
import json
import os
import shutil
import stat
import sys
import time

started = time.monotonic()
LIMIT = 4000  # entries a baseline may list: more cannot be checked on one command line
JOURNAL_WAIT = 5.0  # seconds the exec journal's keeper may take to end after its episode


def processes():
    """{"pid:start": command line} of the sandbox's processes, less this one and its parents."""
    own = os.environ.get("RL_SANDBOX_ID")
    found, parents = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open("/proc/%d/stat" % pid) as status:
                line = status.read()
            with open("/proc/%d/cmdline" % pid, "rb") as command:
                words = command.read()
            if own is not None:
                with open("/proc/%d/environ" % pid, "rb") as environ:
                    if ("RL_SANDBOX_ID=" + own).encode() not in environ.read().split(b"\0"):
                        continue
        except OSError:
            continue  # ended meanwhile, or not ours to read
        fields = line[line.rindex(")") + 2:].split()
        parents[pid] = int(fields[1])
        if fields[0] in "ZX":
            continue  # ended: only its parent's wait is missing
        found[pid] = ("%d:%s" % (pid, fields[19]), words.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:160])
    mine, pid = set(), os.getpid()
    while pid and pid not in mine:
        mine.add(pid)
        pid = parents.get(pid, 0)
    return dict(value for pid, value in found.items() if pid not in mine)


def places(workspace):
    """The writable places outside the workspace (a simulated sandbox shares the machine's /var/tmp
    and /dev/shm with everything else: there, only its own TMPDIR and HOME)."""
    seen = []
    shared = ("/var/tmp", "/dev/shm") if os.environ.get("RL_SANDBOX_ID") is None else ()
    for place in (os.environ.get("TMPDIR") or "/tmp", *shared, os.environ.get("HOME") or "/"):
        real = os.path.realpath(place)
        if real != "/" and real not in seen and os.path.isdir(real) and real != workspace:
            seen.append(real)
    return seen


def entries(place, workspace):
    """{path: [kind, mode, size]} under `place` (itself included), the workspace left out."""
    listed = {}

    def add(path):
        try:
            info = os.lstat(path)
        except OSError:
            return
        kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else \
            "l" if stat.S_ISLNK(info.st_mode) else "o"
        listed[path] = [kind, "%04o" % stat.S_IMODE(info.st_mode), info.st_size if kind == "f" else 0]

    add(place)
    for folder, folders, files in os.walk(place, onerror=lambda error: listed.setdefault(
            error.filename, ["?", "", 0])):
        folders[:] = [name for name in folders if os.path.join(folder, name) != workspace]
        for name in folders + files:
            add(os.path.join(folder, name))
        if len(listed) > LIMIT:
            break
    return listed


def mode_of(path):
    try:
        return "%04o" % stat.S_IMODE(os.lstat(path).st_mode)
    except OSError:
        return None


def baseline(workspace):
    listed = {place: entries(place, workspace) for place in places(workspace)}
    count = sum(len(found) for found in listed.values())
    if count > LIMIT:
        print(json.dumps({"error": "%d entries in %s: more than the %d a check can carry" % (
            count, ", ".join(listed), LIMIT)}))
        sys.exit(3)
    print(json.dumps({"processes": processes(), "places": listed, "workspace": workspace,
                      "workspace_mode": mode_of(workspace)}, separators=(",", ":")))


def wait_for_journal(journal):
    try:
        lock = os.open(os.path.join(journal, "lock"), os.O_RDONLY)
    except OSError:
        return True  # no journal: nothing of it runs
    give_up = time.monotonic() + JOURNAL_WAIT
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() > give_up:
                return False
            time.sleep(0.01)


def some(left, more):
    return left + ["and %d more" % more] if more > 0 else left


def empty(workspace, mode):
    """The workspace emptied, its mode as at the baseline; what could not be removed, or None."""
    os.chmod(workspace, 0o700 | int(mode, 8))

    def writable(function, path, error):
        os.chmod(os.path.dirname(path), 0o700 | stat.S_IMODE(os.lstat(os.path.dirname(path)).st_mode))
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=writable)
        else:
            os.unlink(path)

    for name in os.listdir(workspace):
        path = os.path.join(workspace, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, onerror=writable)
        else:
            os.unlink(path)
    os.chmod(workspace, int(mode, 8))
    return None


def check(workspace, journal, before):
    before = json.loads(before)
    left = []
    if not wait_for_journal(journal):
        left.append("the episode's exec journal was still running %.0f s after the episode's exec returned "
                    "(a process holds its lock)" % JOURNAL_WAIT)
    now = processes()
    kept = dict(before["processes"])
    for key, command in sorted(now.items()):
        if key not in kept:
            left.append("process %s (%s) left running" % (key.split(":")[0], command))
    for key, command in sorted(kept.items()):
        if key not in now:
            left.append("the sandbox's process %s (%s) is gone" % (key.split(":")[0], command))
    changes = []
    for place in set(before["places"]) | set(places(workspace)):
        was, found = before["places"].get(place, {}), entries(place, workspace)
        for path in sorted(set(was) | set(found)):
            old, new = was.get(path), found.get(path)
            if old == new:
                continue
            kind = {"d": "directory", "f": "file", "l": "symlink"}.get((new or old)[0], "entry")
            if old is None:
                changes.append("%s %s left%s" % (kind, path, " (%d bytes)" % new[2] if new[0] == "f" else ""))
            elif new is None:
                changes.append("%s %s removed" % (kind, path))
            elif old[1] != new[1]:
                changes.append("mode of %s changed from %s to %s" % (path, old[1], new[1]))
            else:
                changes.append("%s %s changed (%d bytes, %d at the baseline)" % (kind, path, new[2], old[2]))
    left += some(changes[:5], len(changes) - 5)
    mode = mode_of(workspace)
    if mode != before["workspace_mode"]:
        left.append("mode of the workspace %s changed from %s to %s" % (workspace, before["workspace_mode"], mode))
    try:
        empty(workspace, before["workspace_mode"])
    except OSError as error:
        left.append("the workspace %s could not be emptied: %s: %s" % (workspace, error.filename, error.strerror))
    print(json.dumps({"clean": not left, "left": left, "seconds": round(time.monotonic() - started, 6)}))
    sys.exit(0 if not left else 1)


if sys.argv[1] == "baseline":
    baseline(os.path.realpath(sys.argv[2]))
else:
    check(os.path.realpath(sys.argv[2]), sys.argv[3], sys.argv[4])
'''

# ============================================================================
# Errors: one type per exit code; main() turns each into one line on stderr
# ============================================================================


class DemoError(Exception):
    """An expected failure: its message is what the user reads after 'Error: '."""

    exit_code = EXIT_ERROR


def with_context(error, more, joiner="; "):
    """`error` with `more` added to its message: the same type where its constructor takes just
    the message, else a DemoError with the same exit code (a KubectlError's constructor takes
    kubectl's argv and stderr: `type(error)(message)` raised a TypeError there)."""
    message = "%s%s%s" % (str(error).rstrip(".") if joiner.startswith(".") else error, joiner, more)
    plain = type(error).__init__ is DemoError.__init__
    wrapped = type(error)(message) if plain else DemoError(message)
    wrapped.exit_code = error.exit_code
    return wrapped


class NoSuchFolder(DemoError):
    """An output folder named on the command line does not exist (the message names it)."""


class BatchTimeout(DemoError):
    exit_code = EXIT_TIMEOUT


class BatchFailed(DemoError):
    exit_code = EXIT_BATCH_FAILED


class Terminated(KeyboardInterrupt):
    """SIGTERM: handled like Ctrl-C (save what is known, print the cleanup command), exit 143."""


# What kubectl's stderr says about a failure, by kind. Reasons in parentheses are the API
# server's Status reasons, which kubectl prints as "Error from server (Reason): ..."; etcd's
# errors reach kubectl as Status objects without a reason ("Error from server: etcdserver:
# leader changed"; tests/fakecluster/ASSUMPTIONS.md, fact 27).
TRANSIENT_MARKERS = ("(InternalError)", "(ServiceUnavailable)", "(Timeout)", "(ServerTimeout)",
                     "(TooManyRequests)", "etcdserver: ", "connection to the server", "Unable to connect to the server",
                     "i/o timeout", "TLS handshake timeout", "connection reset", "unexpected EOF", "http2:",
                     # kubectl's client-side validation could not read the OpenAPI document: nothing was sent
                     "connect: connection refused",
                     # Go's io.EOF: the connection closed before any answer (`Post "URL": EOF`, checked
                     # with the real kubectl 1.32.4 against a server that drops the connection)
                     '": EOF',
                     "context deadline exceeded", "did not finish within")
# A create answered with one of these was refused: nothing was made. Any other failure leaves
# its outcome unknown, so the tool looks before it tries again.
REFUSAL_MARKERS = ("(Forbidden)", "(Invalid)", "(BadRequest)", "(NotFound)", "(MethodNotAllowed)",
                   "(Unauthorized)", "(UnsupportedMediaType)", "(RequestEntityTooLarge)", "Error in configuration",
                   "error: ", "error parsing")
# The API serves no such kind: `get`/`delete` of an unknown resource, `create` of an unknown kind,
# and, where kubectl's discovery cache still lists a kind whose CRD was deleted, the API server's
# 404 for the path it no longer serves (tests/fakecluster/ASSUMPTIONS.md, Kueue, "Uninstall").
NO_SUCH_KIND_MARKERS = ("doesn't have a resource type", "resource mapping not found",
                        "the server could not find the requested resource")


class KubectlError(DemoError):
    """A kubectl command failed; carries kubectl's own stderr (and stdout: `kubectl exec`
    prints the command's output whatever its exit code) and knows what kind of failure it is,
    so that no caller matches stderr text."""

    def __init__(self, args, returncode, stderr, stdout=None):
        self.returncode = returncode
        self.stderr = (stderr or "").strip()
        self.stdout = stdout
        detail = meaningful_line(self.stderr) or "no error message (exit code %s)" % returncode
        words = [word for word in args if not word.startswith("--request-timeout")]
        if words[:1] == ["--context"]:
            words = words[2:]
        super().__init__("kubectl %s failed: %s" % (" ".join(words[:3]), detail))

    @property
    def not_found(self):
        return "(NotFound)" in self.stderr

    @property
    def forbidden(self):
        return "(Forbidden)" in self.stderr

    @property
    def invalid(self):
        return "(Invalid)" in self.stderr

    @property
    def conflict(self):
        return "(Conflict)" in self.stderr

    @property
    def already_exists(self):
        return "(AlreadyExists)" in self.stderr

    @property
    def no_such_kind(self):
        return any(marker in self.stderr for marker in NO_SUCH_KIND_MARKERS)

    @property
    def transient(self):
        """The API server, etcd or the network failed, not the request: try again."""
        return any(marker in self.stderr for marker in TRANSIENT_MARKERS)

    @property
    def refused(self):
        """A clear refusal of the request (nothing was done), as opposed to an unknown outcome: a
        transport error (`error: error when creating "STDIN": Post "...": unexpected EOF`) starts
        like a refusal, but the server may have committed the request before the answer was lost."""
        return (any(marker in self.stderr for marker in REFUSAL_MARKERS) and not self.already_exists
                and not self.transient)


def last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


# kubectl's own error lines, as opposed to client-go log lines ("E1130 06:46:07.123 memcache.go:265]
# ...") and warnings it may print first.
KUBECTL_ERROR_STARTS = ("Error from server", "error:", "Error in configuration", "The connection to the server",
                        "Unable to connect to the server")


def meaningful_line(text):
    """The line of kubectl's stderr that says what went wrong: the last of its own error
    lines, else the last line that is not a log or warning line."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    errors = [index for index, line in enumerate(lines) if line.startswith(KUBECTL_ERROR_STARTS)]
    if errors:
        # Several errors of one kind come as a heading and "* " lines (kubectl's MultilineError,
        # `Error in configuration: ` with a bullet per configuration error): one line of them all.
        heading, bullets = lines[errors[-1]], []
        for line in lines[errors[-1] + 1:]:
            if not line.startswith("* "):
                break
            bullets.append(line[2:])
        return "%s %s" % (heading.rstrip(), "; ".join(bullets)) if bullets else heading
    plain = [line for line in lines if not (line[:1] in "IWEF" and line[1:5].isdigit()) and
             not line.startswith("Warning:")]
    return (plain or lines or [""])[-1]

# ============================================================================
# kubectl: the one subprocess wrapper, ApiPatience, a context-bound Cluster, the ApiChannel
# (every read, list, watch and delete of a command through one `kubectl proxy`)
# ============================================================================


class ChildSpawner:
    """Every process this tool starts (kubectl, a local episode, a compare's batch) is started
    here, so that none outlives the tool however it ends, SIGKILL included. On Linux each child
    asks the kernel for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG). The kernel ties
    that to the thread that forked the child, not to the process, and a `kubectl proxy` outlives
    the worker thread that opened it; so every child is forked by one thread that lives as long
    as the process (`serve`). Elsewhere (macOS) children are started as usual and stopped on every
    way out but SIGKILL. A child that finds its parent gone already (between the fork and the
    prctl) exits before it runs."""

    PR_SET_PDEATHSIG = 1  # linux/prctl.h

    def __init__(self):
        self.requests = queue.Queue()
        self.thread = None
        self.lock = threading.Lock()

    def popen(self, argv, **options):
        """subprocess.Popen(argv, **options), forked by the spawner thread."""
        if not sys.platform.startswith("linux"):
            return subprocess.Popen(argv, **options)
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.serve, name="child-spawner", daemon=True)
                self.thread.start()
        answer = queue.Queue(maxsize=1)
        self.requests.put((argv, options, answer))
        started, value = answer.get()
        if not started:
            raise value
        return value

    def serve(self):
        import ctypes  # resolved here, before any fork: the child only calls it
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        parent = os.getpid()

        def die_with_parent():
            if prctl(self.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0 or os.getppid() != parent:
                os._exit(1)

        while True:
            argv, options, answer = self.requests.get()
            try:
                answer.put((True, subprocess.Popen(argv, preexec_fn=die_with_parent, **options)))
            except BaseException as error:  # the caller's to raise (OSError: no such program, ...)
                answer.put((False, error))


# One per process: the kernel's parent-death signal follows the forking thread, so the thread
# that forks every child must be one, and live as long as the process.
CHILDREN = ChildSpawner()


UNIX_SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path is 108 with its NUL, Linux)


def private_temp_folder(kind, socket_name=None):
    """A new folder (mode 0700) in the temp directory for this process's `kind` of scratch (a
    proxy's socket, a local batch's files), named with its pid; first removes this user's folders
    of the same kind whose process is gone: a tool ended by SIGKILL cannot remove its own. A
    folder for a socket `socket_name` is made in /tmp when TMPDIR is too deep for a socket's path."""
    root = Path(tempfile.gettempdir())
    prefix = "rl-batch-demo-%s-" % kind
    longest = len(os.fsencode(str(root / prefix))) + len("4194304-12345678/") + len(socket_name or "")
    if socket_name is not None and longest > UNIX_SOCKET_PATH_MAX and os.path.isdir("/tmp"):
        root = Path("/tmp")
    for stale in root.glob(prefix + "*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        try:
            if not pid.isdigit() or stale.stat().st_uid != os.getuid() or int(pid) == os.getpid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # alive under another user, or the folder went meanwhile
            continue
    return Path(tempfile.mkdtemp(prefix="%s%d-" % (prefix, os.getpid()), dir=str(root)))


class Kubectl:
    """The one way this tool starts kubectl. Every process is registered while it runs, and
    every channel until it is closed, so that an interrupt can stop them all and none outlives
    the tool; `stopping` refuses new processes while the running ones are being stopped."""

    def __init__(self, console, program=None):
        self.console = console
        self.program = program or os.environ.get("KUBECTL") or "kubectl"
        self.running = set()  # kubectl processes running now
        self.channels = []  # every ApiChannel open (its proxy and watches), closed by stop_background
        self.background = []  # long-running kubectl processes (a proxy) not yet stopped
        self.stopping = threading.Event()

    def run(self, argv, stdin_text=None, binary=False, timeout=KUBECTL_PROCESS_TIMEOUT_SECONDS, on_start=None):
        """Run kubectl with an argument list; return stdout (bytes if binary) or raise KubectlError.
        on_start(process) is told of the process as soon as it runs (BackgroundCall stops it)."""
        program = self.program
        if self.stopping.is_set():
            raise DemoError("interrupted")
        try:
            process = CHILDREN.popen([program, *argv], stdin=subprocess.PIPE if stdin_text is not None and not binary
                                     else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=not binary)
            self.running.add(process)
            if on_start is not None:
                on_start(process)
            try:
                stdout, stderr = process.communicate(stdin_text if not binary else None, timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                raise
            finally:
                self.running.discard(process)
        except FileNotFoundError:
            if os.sep in program:  # a path, from KUBECTL: not looked up on PATH
                raise DemoError("KUBECTL is set to %r, which does not exist; set it to the kubectl program, or unset "
                                "it to use kubectl from PATH" % program) from None
            raise DemoError("kubectl not found (looked for %r on PATH); install kubectl or set "
                            "KUBECTL to its path" % program) from None
        except PermissionError:
            what = "a directory" if os.path.isdir(program) else "not executable"
            raise DemoError("cannot run kubectl %r: it is %s; set KUBECTL to the kubectl program itself"
                            % (program, what)) from None
        except OSError as error:
            raise DemoError("cannot run kubectl %r: %s; set KUBECTL to the kubectl program"
                            % (program, error.strerror or error)) from None
        except subprocess.TimeoutExpired:
            raise KubectlError(argv, None, "kubectl did not finish within %d s" % timeout) from None
        if process.returncode != 0:
            raise KubectlError(argv, process.returncode, stderr.decode("utf-8", "replace") if binary else stderr,
                               stdout)
        return stdout

    def stop_running(self, executor):
        """After Ctrl-C: stop every running kubectl (and start none) until the worker threads of
        `executor` have ended, so that what is saved next does not change under the saving."""
        self.stopping.set()
        try:
            for process in list(self.running):
                try:
                    process.terminate()
                except OSError:
                    pass
            executor.shutdown(wait=True, cancel_futures=True)
        finally:
            self.stopping.clear()

    def start_background(self, argv, what="kubectl"):
        """A long-running kubectl (a proxy): stdout piped, stopped by stop_background at the latest.
        Its stderr is read all the time (a pipe nobody reads fills after ~64 KiB, and a real `kubectl
        proxy` logs a line for every request it fails, so it would hang after a few hundred): each
        line is kept in `process.stderr_lines` (the last 200) and said as a note, at most one
        every STDERR_NOTE_SECONDS with the count of those passed over."""
        if self.stopping.is_set():
            raise DemoError("interrupted")
        try:
            process = CHILDREN.popen([self.program, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        except OSError as error:
            raise DemoError("cannot run kubectl %r: %s" % (self.program, error.strerror or error)) from None
        process.stderr_lines = collections.deque(maxlen=200)
        process.stderr_done = threading.Thread(target=self.drain_stderr, args=(process, what), daemon=True)
        process.stderr_done.start()
        self.background.append(process)
        return process

    def drain_stderr(self, process, what):
        last_note, passed_over = 0.0, 0
        for raw in iter(process.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if not line.strip():
                continue
            process.stderr_lines.append(line)
            now = time.monotonic()
            if now - last_note >= STDERR_NOTE_SECONDS:
                more = " (and %d more lines since the last)" % passed_over if passed_over else ""
                self.console.note("%s: %s%s" % (what, line.strip(), more))
                last_note, passed_over = now, 0
            else:
                passed_over += 1

    def stderr_of(self, process):
        """Everything a background kubectl wrote to stderr (kept lines), once it has exited."""
        process.stderr_done.join(5)
        return "\n".join(process.stderr_lines)

    def stop_process(self, process):
        if process in self.background:
            self.background.remove(process)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_background(self):
        """Every channel (its watches and proxy) and every background kubectl of this invocation
        (every exit path ends here)."""
        for channel in list(self.channels):
            channel.close()
        for process in list(self.background):
            self.stop_process(process)

    def existing_context(self, name, advice="; list them with `kubectl config get-contexts`"):
        """`name`, once the kubeconfig is shown to have it: a --context that does not exist is refused
        in one line before anything is read, created or written, ending with `advice`."""
        try:
            self.run(["config", "get-contexts", name, "-o", "name"])
        except KubectlError as error:
            raise DemoError("context %s does not exist in the kubeconfig (%s)%s" % (
                name, meaningful_line(error.stderr) or "kubectl exited %s" % error.returncode, advice)) from None
        return name

    def current_context(self):
        try:
            context = self.run(["config", "current-context"]).strip()
        except KubectlError as error:
            if not (error.stderr or "").strip():
                # kubectl's own "current-context is not set" has words; silence is a kubectl that failed
                raise DemoError("kubectl failed: `%s config current-context` exited %s with no message; check "
                                "that %s is the kubectl program" % (self.program, error.returncode, self.program)
                                ) from None
            raise DemoError("no current kubectl context (%s); choose one with `kubectl config "
                            "use-context NAME` or pass --context NAME" % error.stderr.strip()) from None
        if not context:
            raise DemoError("no current kubectl context; pass --context NAME")
        return context


class ApiPatience:
    """The one retry policy of every API call (kubectl's, the proxy's, an exec's), and what is said
    of it. Each call that fails in passing asks `again` for its next delay: the back-off, a 429's
    Retry-After, and None once the call has failed for API_PATIENCE_SECONDS or would pass its
    deadline. One failing call is noted at each retry, as before; once several fail at once (an
    outage, a 429 storm: every sandbox's read fails together), their notes are folded into one
    line, a progress line every API_PATIENCE_NOTE_SECONDS, and one when every call is answered again."""

    def __init__(self, console, patience=API_PATIENCE_SECONDS, jitter=random.random):
        self.console, self.patience = console, patience
        # Full jitter (each delay drawn from 0 to its back-off step): 1,024 exec threads failing
        # together in an outage come back spread over the step, not all in the same instant.
        self.jitter = jitter
        self.lock = threading.Lock()
        self.failing = set()  # ids of the calls failing now
        self.outage_began = None  # when several calls began failing at once (time.monotonic())
        self.outage_noted = 0.0
        self.sent_again = 0  # calls sent again during that outage

    def tries(self):
        return ApiTries(self)

    def again(self, tries, what, line, retry_after=None, deadline=None):
        """The delay before `tries`' call is sent again, or None: give up (its failure stands)."""
        now = time.monotonic()
        if tries.first_failure is None:
            tries.first_failure = now
        delay = RETRY_DELAYS_SECONDS[min(tries.count, len(RETRY_DELAYS_SECONDS) - 1)] * self.jitter()
        if retry_after is not None:  # the server's own word on when to come back, as client-go takes it
            delay = min(retry_after, RETRY_AFTER_MAX_SECONDS)
        tries.count += 1
        if now + delay - tries.first_failure > self.patience or (deadline is not None and now + delay >= deadline):
            self.settled(tries)
            return None
        with self.lock:
            self.failing.add(id(tries))
            if self.outage_began is None and len(self.failing) > 1:
                self.outage_began, self.outage_noted, self.sent_again = now, now, len(self.failing)
                self.console.note("API calls fail in passing (%s); %d wait to be sent again, each for up to %d s"
                                  % (line, len(self.failing), self.patience))
            elif self.outage_began is not None:
                self.sent_again += 1
                if now - self.outage_noted >= API_PATIENCE_NOTE_SECONDS:
                    self.outage_noted = now
                    self.console.note("API calls still fail after %.0f s (%d waiting; the last: %s)"
                                      % (now - self.outage_began, len(self.failing), line))
            else:
                self.console.note("%s: %s; retrying in %s s" % (what, line, ("%.1f" % delay).rstrip("0").rstrip(".")))
        return delay

    def settled(self, tries):
        """`tries`' call was answered, or gave up."""
        with self.lock:
            if id(tries) not in self.failing:
                return
            self.failing.discard(id(tries))
            if self.failing or self.outage_began is None:
                return
            self.console.note("API calls are answered again, after %.0f s (%d sent again)"
                              % (time.monotonic() - self.outage_began, self.sent_again))
            self.outage_began = None


class ApiTries:
    """One call's tries under an ApiPatience."""

    def __init__(self, patience):
        self.patience = patience
        self.first_failure = None
        self.count = 0

    def again(self, what, line, retry_after=None, deadline=None):
        return self.patience.again(self, what, line, retry_after, deadline)

    def answered(self):
        if self.count:
            self.patience.settled(self)


class Cluster:
    """kubectl bound to one context, and the command's one API channel (`api`, an ApiChannel):
    every kubectl call carries --context and a request timeout; every read, list, watch and
    delete goes through `api`. What stays a kubectl process: creates (kubectl's own validation),
    exec's fallback, and `api`'s own fallback when its proxy would not serve."""

    def __init__(self, runner, context):
        self.runner, self.context = runner, context
        self.console = runner.console
        self.patience = ApiPatience(self.console)
        self.api = ApiChannel(self)  # opened by connect(): a Cluster made for a test opens none

    def kubectl(self, *parts, data=None, binary=False, timeout=KUBECTL_PROCESS_TIMEOUT_SECONDS,
                request_timeout=KUBECTL_REQUEST_TIMEOUT, on_start=None):
        argv = ["--context", self.context, "--request-timeout=" + request_timeout, *parts]
        return self.runner.run(argv, json.dumps(data) if data is not None else None, binary, timeout, on_start)

    def retrying(self, what, attempt):
        """attempt(), tried again under the ApiPatience while its failure is transient."""
        tries = self.patience.tries()
        while True:
            try:
                answer = attempt()
            except KubectlError as error:
                delay = tries.again("kubectl " + what, meaningful_line(error.stderr)) if error.transient else None
                if delay is None:
                    tries.answered()
                    raise
                time.sleep(delay)
            else:
                tries.answered()
                return answer

    def read(self, *parts, binary=False):
        """A read-only kubectl call, retried with backoff while the failure is transient."""
        return self.retrying(" ".join(parts), lambda: self.kubectl(*parts, binary=binary))

    def create_owned(self, obj, run_id):
        """Create obj; whenever the outcome is unknown, look before trying again.

        A create is never blindly repeated: the object may exist already (the API server
        committed it before the answer was lost). It is adopted only if it carries this run's
        label, and otherwise reported, not touched. Only a clear refusal (Forbidden, Invalid,
        ...) is taken as "nothing was created".
        """
        meta = obj["metadata"]
        kind = obj["kind"].lower()
        tries = self.patience.tries()
        while True:
            try:
                created = json.loads(self.kubectl("create", "-f", "-", "-o", "json", data=obj))
                tries.answered()
                return created
            except KubectlError as error:
                if error.refused:
                    raise
                try:
                    existing = self.api.get(Resource.of(obj), meta["name"], meta.get("namespace"))
                except KubectlError as look:
                    raise DemoError("kubectl create %s %s: %s; whether it was created is unknown, and looking "
                                    "failed too: %s" % (kind, meta["name"], meaningful_line(error.stderr),
                                                        meaningful_line(look.stderr))) from None
                if existing is not None:
                    tries.answered()
                    owner = existing["metadata"].get("labels", {}).get(RUN_LABEL)
                    if owner == run_id:
                        return existing
                    raise DemoError("%s %s already exists and is not this run's (label %s is %r, expected "
                                    "%r); refusing to use it" % (kind, meta["name"], RUN_LABEL, owner, run_id))
                delay = tries.again("kubectl create %s %s" % (kind, meta["name"]),
                                    "%s; it does not exist" % meaningful_line(error.stderr))
                if delay is None:
                    raise
                time.sleep(delay)


def connect(runner, context, also_serves=()):
    """The command's Cluster with its one API channel open (said in one line when it must fall
    back): every command that talks to a cluster starts here."""
    cluster = Cluster(runner, context)
    cluster.api.open(also_serves)
    return cluster


@contextlib.contextmanager
def connected(console, context, also_serves=()):
    """connect() for one command that has no Kubectl of its own yet: its channel, watches and
    proxy are closed on every way out."""
    runner = Kubectl(console)
    try:
        # the context comes from a receipt or a pool's record: the run was made on it
        runner.existing_context(context, ", which the run was made on; point KUBECONFIG at the kubeconfig that has "
                                         "it, then run this again")
        yield connect(runner, context, also_serves)
    finally:
        runner.stop_background()


class BackgroundCall:
    """One call in a thread of its own, so that a wait loop goes on taking its watches' news
    while the call runs: a call that hangs (a stuck connection) stalls nothing, and cancel()
    stops its kubectl process (when it is one) once the loop no longer needs the answer."""

    def __init__(self, call):
        self.process, self.value, self.error = None, None, None
        self.thread = threading.Thread(target=self.call, args=(call,), daemon=True)
        self.thread.start()

    def call(self, call):
        try:
            self.value = call(self.started)
        except DemoError as error:
            self.error = error

    def started(self, process):
        self.process = process

    def done(self):
        return not self.thread.is_alive()

    def result(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()


class ProxyUnavailable(DemoError):
    """`kubectl proxy` did not start serving (kubectl's own line, or how long it was given)."""


class ApiProxy:
    """The HTTP side of the command's ApiChannel: one `kubectl proxy --unix-socket` in a private
    folder (0700), limited to `accept_paths`. The real kubectl limits each process to 5 requests a second (client-go's QPS 5, burst
    10); what its proxy forwards is not limited (issue 31: 1,000 GETs at 32 in flight in 1.9 s).
    So this process limits itself, kindly to the API server's priority and fairness: at most
    API_PROXY_IN_FLIGHT requests at once, a 429's Retry-After and 503s honoured, 5xx backed off.
    kubectl keeps the authentication; the proxy's stderr is drained (Kubectl.start_background)."""

    def __init__(self, cluster, accept_paths):
        self.cluster = cluster
        self.accept_paths = list(accept_paths)
        self.folder = private_temp_folder("proxy", socket_name="api.sock")
        self.socket_path = str(self.folder / "api.sock")
        self.process = None
        self.in_flight = threading.BoundedSemaphore(API_PROXY_IN_FLIGHT)
        self.reviving = threading.Lock()
        self.starts = 0  # how often the proxy was started (revive() starts it again)
        self.closed = False  # close() was called: requests still in flight fail, none revives it

    def open(self):
        """Start the proxy; raise ProxyUnavailable with kubectl's own line when it does not serve."""
        self.starts += 1
        self.process = self.cluster.runner.start_background([
            "--context", self.cluster.context, "proxy", "--unix-socket=" + self.socket_path,
            "--accept-paths=" + ",".join(self.accept_paths), "--reject-paths="], what="kubectl proxy")
        deadline = time.monotonic() + PROXY_START_SECONDS
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                line = self.process.stdout.readline().decode("utf-8", "replace")
                if line.startswith("Starting to serve on"):
                    return self
                if not line:  # kubectl exited
                    self.process.wait()
                    raise ProxyUnavailable("`kubectl proxy` exited %s: %s" % (
                        self.process.returncode, meaningful_line(self.cluster.runner.stderr_of(self.process))
                        or "no message"))
        raise ProxyUnavailable("`kubectl proxy` did not start serving within %d s" % PROXY_START_SECONDS)

    def revive(self):
        """Start the proxy again if it has exited (once per exit, whoever asks first): True when it
        was started again, False when it runs; ProxyUnavailable when it will not serve."""
        with self.reviving:
            if self.closed:
                raise ProxyUnavailable("the run closed its `kubectl proxy`")
            if self.process is not None and self.process.poll() is None:
                return False
            if self.process is not None:
                said = last_line(self.cluster.runner.stderr_of(self.process)) or "no message"
                self.cluster.console.note("`kubectl proxy` exited (%s: %s); starting it again"
                                          % (self.process.returncode, said))
                self.cluster.runner.stop_process(self.process)
            self.open()
            return True

    def request(self, method, path, obj=None, retry=True, timeout=KUBECTL_PROCESS_TIMEOUT_SECONDS, headers=None):
        """(HTTP status, body bytes). With retry, a refusal that passes (429 after its Retry-After,
        503, 504, etcd's 500s, the proxy's "connection refused" while the API server is away) is
        sent again with the tool's back-off; a transport error too. The last answer is returned."""
        tries = self.cluster.patience.tries()
        while True:
            try:
                with self.in_flight:
                    connection = UnixHTTPConnection(self.socket_path, timeout)
                    try:
                        connection.request(method, path, json.dumps(obj) if obj is not None else None,
                                           dict({"Content-Type": "application/json", "Accept": "application/json",
                                                 "User-Agent": USER_AGENT}, **(headers or {})))
                        answer = connection.getresponse()
                        status, body, wait = answer.status, answer.read(), answer.getheader("Retry-After")
                    finally:
                        connection.close()
            except (OSError, http.client.HTTPException) as error:
                delay = tries.again("%s %s through `kubectl proxy`" % (method, path.split("?")[0]), str(error)) \
                    if retry and not self.closed else None
                if delay is None:
                    tries.answered()
                    raise ProxyUnavailable("the request through `kubectl proxy` failed: %s" % error) from None
                if self.process is not None and self.process.poll() is not None:
                    self.revive()  # the proxy died: start it again, then send the request again
                time.sleep(delay)
                continue
            delay = None
            # only a refusal's body is read for its words: a 200's may be a page of 500 pods or a log
            if retry and status >= 429 and refusal_passes(status, answer_message(body), path, answer_reason(body)):
                delay = tries.again("%s %s through `kubectl proxy`" % (method, path.split("?")[0]),
                                    "HTTP %d: %s" % (status, last_line(answer_message(body))),
                                    retry_after=retry_after_seconds(wait) if status == 429 else None)
            if delay is None:
                tries.answered()
                return status, body
            time.sleep(delay)

    def close(self):
        self.closed = True
        if self.process is not None:
            self.cluster.runner.stop_process(self.process)
        shutil.rmtree(self.folder, ignore_errors=True)


def retry_after_seconds(header):
    """A Retry-After header's seconds (the API server sends whole seconds), or None."""
    return float(header) if header and header.strip().isdigit() else None


def answer_message(body):
    """What an answer through `kubectl proxy` says: its Status's message (the API server's), else
    its text (the proxy's own, text/plain)."""
    text = body.decode("utf-8", "replace").strip() if isinstance(body, bytes) else str(body)
    try:
        return json.loads(text).get("message") or text
    except (ValueError, AttributeError):
        return text


# A pod's subresources the kubelet answers (through the API server): their 500s are the kubelet's
# word about the pod ("container not found" of a finished one), final, not the API server's.
KUBELET_SUBRESOURCES = ("/log", "/exec", "/attach", "/portforward")


def refusal_passes(status, message, path="", reason=""):
    """Whether an answer through `kubectl proxy` (its answer_message, and its Status's reason) is
    a refusal that passes on its own, before anything was done: 429, 503, 504, etcd's own 500s
    (fact 27), the proxy's word that the API server cannot be reached, or an object request's
    500 InternalError, which kubectl's own calls retry too (TRANSIENT_MARKERS); a 500 of a
    KUBELET_SUBRESOURCES `path` is final."""
    if status in (429, 503, 504):
        return True
    if status == 500 and reason == "InternalError" and \
            not path.split("?")[0].endswith(KUBELET_SUBRESOURCES):
        return True
    return status >= 500 and (message.startswith("etcdserver: ")
                              or any(marker in message for marker in PROXY_BACKEND_DOWN))


def answer_reason(body):
    """The reason of the Status an answer through `kubectl proxy` carries, or ""."""
    try:
        return json.loads(body).get("reason") or ""
    except (ValueError, AttributeError, TypeError):
        return ""


class ProxyAnswer(Exception):
    """A request through the proxy was answered, but not with 200."""

    def __init__(self, status, body):
        self.status, self.body, self.message = status, body, last_line(answer_message(body))
        super().__init__("HTTP %d: %s" % (status, self.message))


LIST_PAGE_SIZE = 500  # objects a page of every list through a proxy (list_pages), as kubectl's --chunk-size


def list_pages(proxy, path, query=None, headers=None, retry=True, decode=json.loads):
    """The collection at `path` (with `query`: selectors) through `proxy`, a decoded page at a
    time, LIST_PAGE_SIZE objects each, as kubectl lists: one page's raw answer is held at once,
    never the whole collection's (2,000 Sandboxes and 2,000 pods at 1,000 warm claims, in a
    watch's list and in the lists saved at a run's end, each with its managedFields until kept).
    `headers` go with every page's request. A page answered with anything but 200 raises
    ProxyAnswer: an expired continue token is 410, and the caller lists again from the start."""
    token = ""
    while True:
        page_query = dict(query or {}, limit=str(LIST_PAGE_SIZE), **({"continue": token} if token else {}))
        status, body = proxy.request("GET", path + "?" + urllib.parse.urlencode(page_query), retry=retry,
                                     headers=headers)
        if status != 200:
            raise ProxyAnswer(status, body)
        page = decode(body)
        del body
        yield page
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket (the proxy's); the Host is localhost, as its filter wants."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


WATCH_SERVER_SECONDS = 300  # a watch through the proxy asks the API server to end it after this long


def as_kubectl_shows(obj):
    """An object read through the proxy, as `kubectl get -o json` shows it: without
    metadata.managedFields (kubectl's --show-managed-fields=false). Kept, they were most of the
    memory of a warm pool's objects and of its saved files (benchmarks/README.md, "Warm pool")."""
    if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
        obj["metadata"].pop("managedFields", None)
    return obj


@dataclasses.dataclass(frozen=True)
class Resource:
    """A kind of the API as both transports name it: its REST path (the proxy's) and
    PLURAL.GROUP (kubectl's, for the fallback). `plural` is the API's (a CRD's spec.names.plural),
    never made up from the kind."""
    kind: str
    api_version: str  # "v1" for the core group
    plural: str
    namespaced: bool = True

    @property
    def group(self):
        return self.api_version.rpartition("/")[0]

    @property
    def kubectl_name(self):
        return self.plural + ("." + self.group if self.group else "")

    def path(self, namespace=None, name=None):
        base = "/api/v1" if self.api_version == "v1" else "/apis/" + self.api_version
        where = "/namespaces/" + urllib.parse.quote(namespace) if self.namespaced and namespace else ""
        return "%s%s/%s%s" % (base, where, self.plural, "/" + urllib.parse.quote(name, safe="") if name else "")

    def __post_init__(self):
        KNOWN_RESOURCES.setdefault((self.api_version, self.kind), self)  # the first declared stands

    def kubectl_where(self, namespace):
        return ("-n", namespace) if self.namespaced and namespace else ()

    @staticmethod
    def of(obj):
        """The Resource of an object (its apiVersion and kind), declared as every kind the tool
        makes is."""
        return KNOWN_RESOURCES[(obj["apiVersion"], obj["kind"])]


KNOWN_RESOURCES = {}  # (apiVersion, kind) -> Resource: every kind declared below and in the backends' sections


# The kinds every backend reads; each backend and gate declares its own beside its code.
PODS = Resource("Pod", "v1", "pods")
EVENTS = Resource("Event", "v1", "events")
NODES = Resource("Node", "v1", "nodes", namespaced=False)
NAMESPACES = Resource("Namespace", "v1", "namespaces", namespaced=False)
RUNTIME_CLASSES = Resource("RuntimeClass", "node.k8s.io/v1", "runtimeclasses", namespaced=False)
DEPLOYMENTS = Resource("Deployment", "apps/v1", "deployments")
CONFIGMAPS = Resource("ConfigMap", "v1", "configmaps")
NETWORK_POLICIES = Resource("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies")


@dataclasses.dataclass(frozen=True)
class Deletion:
    """One DELETE of ApiChannel.delete_all: the object `name` (on its `uid` when given), or the
    collection of label `selector`. `fallback`: sent with kubectl when the proxy could not send it
    (a claim by name beside its collection's DELETE needs none)."""
    resource: Resource
    namespace: str
    name: str = None
    selector: str = None
    uid: str = None
    fallback: bool = True

    def path(self):
        path = self.resource.path(self.namespace, self.name)
        return path + ("?" + urllib.parse.urlencode({"labelSelector": self.selector}) if self.selector else "")


def channel_accept_paths(also_serves=()):
    """What the command's `kubectl proxy` serves: discovery and cluster-scoped reads (nodes, the
    tool's namespaces' list, RuntimeClasses, Kueue's queues), and everything in namespaces this
    tool names (NAMESPACE_PREFIX); `also_serves`: a backend's reads beyond them."""
    ns = "%s[a-z0-9-]+" % re.escape(NAMESPACE_PREFIX)
    return ["^/version$", "^/api$", "^/api/v1$", "^/apis$", "^/apis/[^/]+/[^/]+$", "^/api/v1/(nodes|namespaces)$",
            "^/apis/[^/]+/[^/]+/[a-z0-9]+(/[^/]+)?$",
            "^/api/v1/namespaces/%s(/.*)?$" % ns, "^/apis/[^/]+/[^/]+/namespaces/%s(/.*)?$" % ns, *also_serves]


class ApiChannel:
    """The command's one channel to the API: one `kubectl proxy` (an ApiProxy), opened before the
    command reads anything, that carries every read, list (LIST_PAGE_SIZE a page), watch
    (ObjectWatch), delete (one at a time, or all at once on their uids) and a warm pool's
    creates and execs, API_PROXY_IN_FLIGHT at once. When the proxy will not serve (an old or
    locked-down kubectl), that is decided once, at open(), said in one line, and every call
    goes through a kubectl process of its own instead: the same answers, slower at scale.

    A refusal through the proxy is raised as the KubectlError kubectl would print
    ("Error from server (Reason): message"), so every caller handles one kind of failure."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.proxy = None  # the open ApiProxy; None: every call through kubectl
        self.fallback_reason = "not opened"  # why there is no proxy
        self.watches = []  # every ObjectWatch not yet stopped

    def open(self, also_serves=()):
        proxy = None
        try:
            # its socket's private folder is made first: a full disk is a reason to fall back too
            proxy = ApiProxy(self.cluster, channel_accept_paths(also_serves))
            self.proxy = proxy.open()
            self.fallback_reason = None
        except (ProxyUnavailable, OSError) as unavailable:
            if proxy is not None:
                proxy.close()
            if isinstance(unavailable, OSError):
                unavailable = ProxyUnavailable("cannot make the folder of `kubectl proxy`'s socket (%s)"
                                               % (unavailable.strerror or unavailable))
            self.fallback_reason = str(unavailable)
            self.cluster.console.warn("%s; falling back to one kubectl process per API call of this command (the "
                                      "same answers, slower at scale)" % unavailable)
        self.cluster.runner.channels.append(self)
        return self

    @property
    def serves(self):
        return self.proxy is not None and not self.proxy.closed

    def refusal(self, method, path, status, body):
        """The KubectlError kubectl prints for this answer."""
        reason = answer_reason(body) or http.client.responses.get(status, "HTTP %d" % status).replace(" ", "")
        message = answer_message(body)
        if status >= 500 and any(marker in message for marker in PROXY_BACKEND_DOWN):
            # the proxy's own word that it cannot reach the API server, not the server's answer
            return self.unreachable(method, path, status, last_line(message))
        if status == 404 and self.no_such_kind(body):
            message = "the server could not find the requested resource"  # as kubectl words it
        return KubectlError(["(through kubectl proxy)", method, path.split("?")[0]], status,
                            "Error from server (%s): %s" % (reason, message))

    @staticmethod
    def unreachable(method, path, status, why):
        """The KubectlError for a request the API server never answered (the proxy could not be
        reached, or could not reach the server): kubectl's transient "Unable to connect"."""
        return KubectlError(["(through kubectl proxy)", method, path.split("?")[0]], status,
                            "Unable to connect to the server: %s" % why)

    def send(self, method, path, obj=None, retry=True, headers=None, timeout=KUBECTL_PROCESS_TIMEOUT_SECONDS):
        """(status, body bytes) of one request through the proxy; a proxy that could not be
        reached after the ApiPatience is raised as kubectl's transient "Unable to connect"."""
        try:
            return self.proxy.request(method, path, obj, retry=retry, headers=headers, timeout=timeout)
        except ProxyUnavailable as unavailable:
            raise self.unreachable(method, path, None, unavailable) from None

    def get(self, resource, name, namespace=None, managed_fields=False, retry=True):
        """The object as a dict, or None when it does not exist; with metadata.managedFields (who
        set which field) only when `managed_fields`, as kubectl shows it. Without `retry`, a
        failure in passing is raised at once (a wait loop's poll: the loop is its retry)."""
        if not self.serves:
            parts = ("get", *resource.kubectl_where(namespace), resource.kubectl_name, name, "--ignore-not-found",
                     "-o", "json", *(["--show-managed-fields"] if managed_fields else []))
            raw = self.cluster.read(*parts) if retry else self.cluster.kubectl(*parts)
            return json.loads(raw) if raw.strip() else None
        path = resource.path(namespace, name)
        status, body = self.send("GET", path, retry=retry)
        if status == 404 and not self.no_such_kind(body):
            return None
        if status != 200:
            raise self.refusal("GET", path, status, body)
        obj = json.loads(body)
        return obj if managed_fields else as_kubectl_shows(obj)

    @staticmethod
    def no_such_kind(body):
        """A 404 for the path, not the object: the API serves no such kind (a CRD deleted)."""
        return any(marker in answer_message(body) for marker in NO_SUCH_KIND_MARKERS) or \
            answer_message(body).startswith("404 page not found")

    def get_later(self, resource, name, namespace=None):
        """get() in a BackgroundCall, sent once: a wait loop's poll that stalls nothing, whose
        failure in passing is the loop's to wait out (it says when the API server went away)."""
        if self.serves:
            return BackgroundCall(lambda started: self.get(resource, name, namespace, retry=False))
        parts = ("get", *resource.kubectl_where(namespace), resource.kubectl_name, name, "--ignore-not-found",
                 "-o", "json")
        return BackgroundCall(lambda started: load_json(self.cluster.kubectl(*parts, on_start=started) or "null"))

    def list(self, resource, namespace=None, selector=None, fields=None, managed_fields=False, retry=True,
             metadata_only=False):
        """The objects of `resource` (of label `selector`, field `fields`) now, each with its kind
        and apiVersion as `kubectl get -o json` shows them (the API's list leaves them out), a page
        at a time; an expired continue token (410) lists again from the start, twice at most.
        Without `retry`, as get(). `metadata_only`: through the proxy, each object's metadata alone
        (PartialObjectMetadata, for which objects exist: 10,000 pods' names without their specs
        and statuses); the fallback's are whole."""
        if not self.serves:
            parts = ("get", *resource.kubectl_where(namespace), resource.kubectl_name,
                     *(("-l", selector) if selector else ()), *(("--field-selector", fields) if fields else ()),
                     "-o", "json", *(["--show-managed-fields"] if managed_fields else []))
            return json.loads(self.cluster.read(*parts) if retry else self.cluster.kubectl(*parts))["items"]
        path = resource.path(namespace)
        query = dict({"labelSelector": selector} if selector else {}, **({"fieldSelector": fields} if fields else {}))
        for tries_left in reversed(range(3)):
            items = []
            try:
                for page in self.pages(path, query, {"Accept": METADATA_ONLY} if metadata_only else None, retry=retry,
                                       decode=json.loads if managed_fields else API_OBJECTS.decode):
                    items += [self.shown(item, page, resource.kind, managed_fields) for item in page.get("items") or []]
                return items
            except ProxyAnswer as answer:
                if answer.status != 410 or not tries_left:
                    raise self.refusal("GET", path, answer.status, answer.body) from None

    def pages(self, path, query=None, headers=None, retry=True, decode=json.loads):
        """list_pages through the proxy, its transport failures raised as kubectl's."""
        try:
            yield from list_pages(self.proxy, path, query, headers, retry, decode)
        except ProxyUnavailable as unavailable:
            raise self.unreachable("GET", path, None, unavailable) from None

    @staticmethod
    def shown(item, page, kind, managed_fields=False):
        item = dict({"kind": kind, "apiVersion": page.get("apiVersion")}, **item)
        return item if managed_fields else as_kubectl_shows(item)

    def create(self, resource, obj, namespace):
        """POST one object, sent once (a create is never blindly repeated): (status, decoded body).
        Only through the proxy; the caller falls back to kubectl create."""
        status, body = self.proxy.request("POST", resource.path(namespace), obj, retry=False)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {"message": body.decode("utf-8", "replace").strip()}

    def watch(self, resource, namespace=None, selector=None, name=None, timed=False):
        return ObjectWatch(self, resource, namespace, selector, name, timed)

    def delete(self, resource, name, namespace=None, propagation="Background"):
        """One DELETE, retried while its failure passes; NotFound is done (the object was checked
        just before, so another cleanup or a committed earlier attempt removed it)."""
        if not self.serves:
            def attempt():
                try:
                    return self.cluster.kubectl("delete", *resource.kubectl_where(namespace), resource.kubectl_name,
                                                name, "--wait=false", "--cascade=" + propagation.lower())
                except KubectlError as error:
                    if error.not_found:
                        return ""
                    raise
            return self.cluster.retrying("delete %s %s" % (resource.plural, name), attempt)
        path = resource.path(namespace, name)
        status, body = self.send("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1",
                                                   "propagationPolicy": propagation})
        if status not in (200, 202, 404) or (status == 404 and self.no_such_kind(body)):
            raise self.refusal("DELETE", path, status, body)

    def delete_all(self, deletions, best_effort=False):
        """The Deletions at once, API_PROXY_IN_FLIGHT in flight (one kubectl's 5-a-second bucket
        deleted 1,000 claims in 198 s, issue 31; kubectl has no deletecollection). 404 is done
        (someone else's deletion went first); a failed uid precondition (409) raises the ownership
        refusal: the object was replaced since it was proven, and it is never deleted by name
        without the condition. What the proxy could not send is sent with kubectl (those with a
        `fallback`), or, `best_effort`, left to the namespace's deletion."""
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}

        def send(deletion):
            body = dict(options, **({"preconditions": {"uid": deletion.uid}} if deletion.uid else {}))
            try:
                status, answer = self.proxy.request("DELETE", deletion.path(), body, retry=not best_effort)
            except ProxyUnavailable as unavailable:
                return deletion, last_line(str(unavailable))
            if status in (200, 202, 404):
                return None
            if status == 409 and deletion.uid and not best_effort:
                raise DemoError("ownership check failed, refusing cleanup: %s %s was replaced since it was checked "
                                "(%s)" % (deletion.resource.plural, deletion.name, last_line(answer_message(answer))))
            return deletion, "HTTP %d: %s" % (status, last_line(answer_message(answer)))

        if self.serves and deletions:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(deletions), API_PROXY_IN_FLIGHT)) as pool:
                failed = [failure for failure in pool.map(send, deletions) if failure is not None]
        else:
            failed = [(deletion, self.fallback_reason) for deletion in deletions]
        if best_effort:
            return
        for deletion, why in failed:
            if not deletion.fallback:
                continue
            if self.serves:
                self.cluster.console.note("deleting %s through `kubectl proxy` failed (%s); with kubectl instead"
                                          % (deletion.resource.plural, why))
            self.cluster.retrying("delete " + deletion.resource.plural, lambda deletion=deletion: self.kubectl_delete(
                deletion))

    def kubectl_delete(self, deletion):
        try:
            return self.cluster.kubectl("delete", *deletion.resource.kubectl_where(deletion.namespace),
                                        deletion.resource.kubectl_name,
                                        *([deletion.name] if deletion.name else ["-l", deletion.selector]),
                                        "--wait=false")
        except KubectlError as error:
            if error.not_found:
                return ""
            raise

    def wait_until_gone(self, what, resource, namespace=None, name=None, selector=None, timeout=None):
        """Until `resource` (the one `name`, or those of label `selector`) is gone, for `timeout`
        seconds: a watch wakes the wait at each change (a poll's back-off added up to 2 s to a
        5 s deletion; `kubectl wait --for=delete` was a process of its own) and a read each turn
        decides, so a watch that fails costs at most 2 s; the refusal names the wait and how to look."""
        started = time.monotonic()
        watch = self.watch(resource, namespace, selector, name)
        try:
            while (self.get(resource, name, namespace) is not None) if name else \
                    self.list(resource, namespace, selector):
                if time.monotonic() - started > timeout:
                    raise BatchTimeout("%s still terminating after %d s; inspect it with `kubectl --context %s get "
                                       "%s%s` and run cleanup again" % (
                                           what, time.monotonic() - started, self.cluster.context,
                                           " ".join(resource.kubectl_where(namespace) + (resource.kubectl_name,)),
                                           " " + name if name else " -l " + selector if selector else ""))
                watch.drain(timeout=min(2.0, max(0.05, timeout - (time.monotonic() - started))))
        finally:
            watch.stop()

    def served(self, *groups):
        """The resources (plural.group) the API serves in `groups`: its discovery, through the
        proxy (the group versions' lists), or `kubectl api-resources`, whose exit 1 after printing
        all the others when one aggregated API's discovery fails is read as what it printed
        (kubectl pkg/cmd/apiresources, RunAPIResources, filters after discovery)."""
        if not self.serves:
            try:
                names = self.cluster.read("api-resources", "-o", "name").split()
            except KubectlError as error:
                if "unable to retrieve the complete list of server APIs" not in error.stderr or \
                        not (error.stdout or "").strip():
                    raise
                names = error.stdout.split()
            return {name for name in names if name.split(".", 1)[-1] in groups}
        status, body = self.send("GET", "/apis")
        if status != 200:
            raise self.refusal("GET", "/apis", status, body)
        served = set()
        for group in json.loads(body).get("groups") or []:
            if group.get("name") not in groups:
                continue
            for version in group.get("versions") or []:
                status, body = self.send("GET", "/apis/" + version["groupVersion"])
                if status == 200:
                    served.update("%s.%s" % (item["name"], group["name"])
                                  for item in json.loads(body).get("resources") or [] if "/" not in item["name"])
        return served

    def close(self):
        for watch in list(self.watches):
            watch.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self in self.cluster.runner.channels:
            self.cluster.runner.channels.remove(self)


class ObjectWatch:
    """The one watch: a queue of the states of the objects of `resource` (those of label
    `selector`, or the one `name`) in `namespace`, drained by a wait loop. Through the channel's
    proxy, as client-go's reflector does: listed, 500 a page (its objects come first, as `kubectl
    get --watch` prints them), then watched from the list's resourceVersion, one JSON event a
    line, with bookmarks; when the server ends the watch (its timeout, a consumer it let go as
    too slow) it is watched again from the last resourceVersion seen, and listed again only after
    an ERROR event (410 Expired) or a refusal. Where the channel has no proxy, one `kubectl get
    --watch` process, started again (and so listing again) when it ends. Callers also poll now
    and then, so a dead watch costs latency, never correctness."""

    def __init__(self, channel, resource, namespace=None, selector=None, name=None, timed=False):
        self.channel, self.resource, self.namespace = channel, resource, namespace
        self.timed = timed  # drain() gives (arrival time on the client's clock, state) pairs
        self.selectors = dict({"labelSelector": selector} if selector else {},
                              **({"fieldSelector": "metadata.name=" + name} if name else {}))
        self.restarts = 0
        self.resource_version = None  # where the next watch through the proxy starts; None: list first
        self.states = queue.Queue()
        self.stopped = threading.Event()
        self.connection, self.process = None, None
        channel.watches.append(self)
        self.thread = threading.Thread(target=self.follow, daemon=True)
        self.thread.start()

    def put(self, obj):
        if isinstance(obj, dict) and obj.get("kind") == self.resource.kind and (obj.get("metadata") or {}).get("name"):
            self.states.put((time.time(), as_kubectl_shows(obj)) if self.timed else as_kubectl_shows(obj))

    def follow(self):
        while not self.stopped.is_set():
            proxy = self.channel.proxy
            if proxy is not None and proxy.closed:
                return
            try:
                if proxy is None:
                    self.follow_kubectl()
                else:
                    if self.resource_version is None:
                        self.list(proxy)
                    if self.resource_version is not None:
                        self.watch(proxy)
            except (OSError, ValueError, http.client.HTTPException, ProxyUnavailable):
                pass  # ended: watched again below from where it was
            self.restarts += 1
            self.stopped.wait(0.2 if self.restarts < 5 else 1.0)

    def list(self, proxy):
        version = None
        try:
            for page in list_pages(proxy, self.resource.path(self.namespace), self.selectors,
                                   {"User-Agent": WATCH_USER_AGENT}, retry=False, decode=API_OBJECTS.decode):
                version = version or (page.get("metadata") or {}).get("resourceVersion")
                for item in page.get("items") or []:
                    self.put(dict({"kind": self.resource.kind, "apiVersion": page.get("apiVersion")}, **item))
        except ProxyAnswer:
            return  # a continue token expired (410) or a refusal: listed again from the start
        self.resource_version = version

    def watch(self, proxy):
        query = dict(self.selectors, watch="1", resourceVersion=self.resource_version, allowWatchBookmarks="true",
                     timeoutSeconds=str(WATCH_SERVER_SECONDS))
        connection = UnixHTTPConnection(proxy.socket_path, WATCH_SERVER_SECONDS + 30)
        self.connection = connection
        try:
            if self.stopped.is_set():
                return
            connection.request("GET", self.resource.path(self.namespace) + "?" + urllib.parse.urlencode(query),
                               headers={"Accept": "application/json", "User-Agent": WATCH_USER_AGENT})
            answer = connection.getresponse()
            if answer.status != 200:
                self.resource_version = None
                return
            while not self.stopped.is_set():
                line = answer.readline()
                if not line:
                    return  # the server ended the watch: again from the last resourceVersion
                if not line.strip():
                    continue
                event = API_OBJECTS.decode(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    self.resource_version = None  # 410 Expired and the like: list again
                    return
                self.resource_version = (obj.get("metadata") or {}).get("resourceVersion") or self.resource_version
                if event.get("type") != "BOOKMARK":
                    self.put(obj)
        finally:
            connection.close()

    def follow_kubectl(self):
        """One `kubectl get --watch -o json` until it exits (fact 25: after a 410's Status, exit 0)."""
        cluster = self.channel.cluster
        name = self.selectors.get("fieldSelector", "").partition("metadata.name=")[2]
        argv = [cluster.runner.program, "--context", cluster.context, "--request-timeout=0", "get",
                *self.resource.kubectl_where(self.namespace), self.resource.kubectl_name, *([name] if name else []),
                *(["-l", self.selectors["labelSelector"]] if "labelSelector" in self.selectors else []),
                "--watch", "-o", "json"]
        self.process = CHILDREN.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      stdin=subprocess.DEVNULL, text=True)
        # kubectl indents each object, so an object ends at a line that is exactly "}".
        lines = []
        for line in self.process.stdout:
            lines.append(line)
            if line.rstrip("\n") == "}":
                try:
                    obj = API_OBJECTS.decode("".join(lines))
                except ValueError:
                    continue
                lines = []
                self.put(obj)  # an ERROR event's Status is not of the kind: not a state
        self.process.wait()

    def drain(self, timeout=0.0):
        """Every state received so far, waiting up to `timeout` for the first one."""
        states = []
        try:
            states.append(self.states.get(timeout=timeout) if timeout else self.states.get_nowait())
            while True:
                states.append(self.states.get_nowait())
        except queue.Empty:
            pass
        return states

    def stop(self):
        self.stopped.set()
        if self in self.channel.watches:
            self.channel.watches.remove(self)
        connection = self.connection
        if connection is not None and connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)  # ends the thread's read at once
            except OSError:
                pass
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()

# ============================================================================
# Exec channels: a command in a running pod's container, as a WebSocket through the command's
# ApiChannel (no process per command) or, as the fallback, one `kubectl exec` each
# ============================================================================

FALLBACK_EXEC_PROCESSES = 64  # `kubectl exec` processes at once when the channel falls back (tens of MB each)


@dataclasses.dataclass
class ExecResult:
    """What one exec returned: the exit code (None when the exec itself failed), stdout and
    stderr as bytes, the failure's reason and message, and when the request was sent and the
    stream opened (client clock, time.time(); None where the channel cannot tell).
    `refused_in_passing`: the API server refused the exec before the command started, for a
    reason that passes on its own (etcd, an overloaded or unreachable API server; fact 27):
    nothing ran, so the exec may be sent again."""

    code: "int | None"
    stdout: bytes = b""
    stderr: bytes = b""
    error: "str | None" = None
    reason: str = "ExecFailed"
    sent_at: "float | None" = None
    opened_at: "float | None" = None
    refused_in_passing: bool = False
    retry_after: "float | None" = None  # a 429's Retry-After, in seconds
    cut: bool = False  # sent, then the stream ended before the command's status: it may have run


class KubectlExecChannel:
    """The fallback: one `kubectl exec` process per episode (a process start, a TLS connection and
    a stream upgrade each, on this machine)."""

    kind = "kubectl-exec"

    def __init__(self, cluster, namespace, reason=None):
        self.cluster, self.namespace, self.fallback_reason = cluster, namespace, reason
        self.processes = threading.BoundedSemaphore(FALLBACK_EXEC_PROCESSES)

    def record(self):
        return {"kind": self.kind, "detail": "one `kubectl exec` process per episode",
                "fallback_reason": self.fallback_reason}

    def run(self, pod_name, command, seconds_left):
        argv = ["-n", self.namespace, "exec", pod_name, "-c", CONTAINER_NAME, "--", *command]
        with self.processes:
            return self.run_process(argv, seconds_left)

    def run_process(self, argv, seconds_left):
        sent_at = time.time()
        try:
            # No request timeout: an episode may run longer than one API request may take.
            stdout = self.cluster.kubectl(*argv, request_timeout="0", timeout=max(1.0, seconds_left), binary=True)
            return ExecResult(0, stdout, sent_at=sent_at)
        except KubectlError as error:
            stdout = error.stdout or b""
            exited = re.search(r"command terminated with exit code (\d+)", error.stderr)
            if exited:
                return ExecResult(int(exited.group(1)), stdout, error.stderr[:exited.start()].rstrip("\n").encode(),
                                  sent_at=sent_at)
            message = meaningful_line(error.stderr) or str(error)
            # kubectl reads the pod and opens the stream before the command runs; an API Status
            # there prints as "Error from server ...", an unreachable server as "The connection ...".
            # A pod that has gone is "(NotFound)" and an unknown failure "(InternalError)": final.
            passing = (error.transient and not stdout and "(InternalError)" not in message
                       and message.startswith(("Error from server", "The connection to the server")))
            timed_out = "did not finish within" in message
            return ExecResult(None, stdout, error.stderr.encode() if timed_out else b"", error=message, sent_at=sent_at,
                              refused_in_passing=passing,
                              reason="ExecTimedOut" if timed_out else "ExecFailed",
                              cut=error.transient and not passing and not timed_out)

    def close(self):
        pass


class ExecRefused(Exception):
    """The upgrade to an exec stream was refused for reasons no pod explains (policy, protocol)."""


class ExecChannelBroken(Exception):
    """The server answered 101 but the channel cannot be trusted (its handshake answer is wrong):
    the command may have started, so this episode is not sent again; later ones use the
    fallback. `result` is this episode's outcome."""

    def __init__(self, reason, result):
        super().__init__(reason)
        self.result = result


def websocket_accept(key):
    """Sec-WebSocket-Accept for a Sec-WebSocket-Key (RFC 6455 section 4.2.2, item 5.4)."""
    return base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()


# The exec channel's WebSocket: RFC 6455 framing, Kubernetes' remote-command subprotocols
# (client-go tools/remotecommand: v5 adds a close signal on channel 255; v4 carries the exit
# code as a metav1.Status on channel 3). Each message starts with its channel byte: 1 stdout,
# 2 stderr, 3 the Status (tests/fakecluster/ASSUMPTIONS.md, "kubectl proxy and exec over WebSocket").
# RFC 6455 section 1.3 (its example: key "dGhlIHNhbXBsZSBub25jZQ==" is accepted as
# "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; tests/test_warm_pool.py checks it against wsproto).
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
EXEC_PING_SECONDS = 5.0  # client-go's WebSocket executor pings this often (PingPeriod)



class ProxyExecChannel:
    """Every episode's exec a WebSocket through the command's one `kubectl proxy` (its ApiChannel's),
    from this process: kubectl keeps the authentication; no process is started per episode."""

    kind = "websocket"

    def __init__(self, cluster, namespace):
        self.cluster, self.namespace = cluster, namespace
        self.proxy = cluster.api.proxy
        self.socket_path = self.proxy.socket_path
        self.protocols = collections.Counter()

    def record(self):
        return {"kind": self.kind, "detail": "one `kubectl proxy --unix-socket` for the run; each exec a WebSocket "
                                             "stream from this process", "protocols": dict(self.protocols),
                "proxy_restarts": max(0, self.proxy.starts - 1), "fallback_reason": None}

    def run(self, pod_name, command, seconds_left):
        query = urllib.parse.urlencode([("container", CONTAINER_NAME), ("stdout", "true"), ("stderr", "true")] +
                                       [("command", part) for part in command])
        target = "/api/v1/namespaces/%s/pods/%s/exec?%s" % (self.namespace, urllib.parse.quote(pod_name), query)
        key = base64.b64encode(os.urandom(16)).decode()
        deadline = time.monotonic() + max(1.0, seconds_left)
        connection = UnixHTTPConnection(self.socket_path, max(1.0, seconds_left))
        try:
            sent_at = time.time()
            try:
                connection.connect()
            except OSError as error:
                # nothing was sent: the proxy is gone (it is started again) or not reachable
                try:
                    self.proxy.revive()
                except ProxyUnavailable as unavailable:
                    raise ExecRefused(str(unavailable)) from None
                return ExecResult(None, error="`kubectl proxy` could not be reached (%s); nothing was sent" % error,
                                  sent_at=sent_at, refused_in_passing=True)
            try:
                connection.request("GET", target, headers={
                    "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": key, "Sec-WebSocket-Protocol": ", ".join(EXEC_PROTOCOLS)})
                answer = connection.getresponse()  # 101: its body is the WebSocket, left unread here
            except (OSError, http.client.HTTPException) as error:
                # sent: the API server may have started the command before the answer was lost
                return ExecResult(None, error="the exec stream could not be opened: %s" % error, sent_at=sent_at,
                                  cut=True)
            if answer.status != 101:
                message = answer_message(answer.read())
                if answer.status == 400 and pod_name in message:
                    # that pod's own refusal ("pod X does not have a host assigned"): the channel is fine
                    return ExecResult(None, error="HTTP 400: %s" % last_line(message), sent_at=sent_at)
                if answer.status in (400, 403, 405, 426, 501):
                    raise ExecRefused("the API server (through `kubectl proxy`) refused the exec stream: HTTP %d: %s"
                                      % (answer.status, last_line(message)))
                passing = refusal_passes(answer.status, message)
                # a 5xx that is neither a refusal that passes nor the pod's own (a finished container):
                # the proxy lost the API server mid-upgrade (`unexpected EOF`), the command may have begun
                unknown = answer.status >= 500 and not passing and "container not found" not in message
                return ExecResult(None, error="HTTP %d: %s" % (answer.status, last_line(message)), sent_at=sent_at,
                                  refused_in_passing=passing, cut=unknown, retry_after=retry_after_seconds(
                                      answer.getheader("Retry-After")) if answer.status == 429 else None)
            if answer.getheader("Sec-WebSocket-Accept") != websocket_accept(key):
                # 101 came: the API server has started the command. Never run it again.
                reason = "the exec stream's handshake was answered wrongly (Sec-WebSocket-Accept)"
                raise ExecChannelBroken(reason, ExecResult(
                    None, error=reason + "; the command may have started, so it is not sent again", sent_at=sent_at,
                    opened_at=time.time()))
            self.protocols[answer.getheader("Sec-WebSocket-Protocol", "")] += 1
            opened_at = time.time()
            try:
                # the frames follow the headers on the same buffered stream
                return read_exec_stream(connection.sock, answer.fp, deadline, sent_at, opened_at)
            except socket.timeout as timed_out:
                # what the command said before its time ran out (a recycled episode's exit code
                # before a reset check that hung)
                return ExecResult(None, getattr(timed_out, "stdout", b""), getattr(timed_out, "stderr", b""),
                                  error="the exec did not finish within %.0f s" % seconds_left,
                                  reason="ExecTimedOut", sent_at=sent_at, opened_at=opened_at)
            except (OSError, ValueError) as error:
                return ExecResult(None, error="the exec stream was cut after it opened (%s); the command may have "
                                  "run, so it is not sent again" % error, sent_at=sent_at, opened_at=opened_at)
        finally:
            connection.close()


def websocket_frame(opcode, payload):
    """One client frame: FIN set, masked as RFC 6455 5.3 requires of a client."""
    mask = os.urandom(4)
    length = len(payload)
    header = bytes([0x80 | opcode])
    if length < 126:
        header += bytes([0x80 | length])
    elif length < 65536:
        header += bytes([0x80 | 126]) + length.to_bytes(2, "big")
    else:
        header += bytes([0x80 | 127]) + length.to_bytes(8, "big")
    return header + mask + bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))


def keep_alive(connection, writing, stopped):
    """Ping the server every EXEC_PING_SECONDS while an exec stream is open, as client-go does
    (its WebSocket executor's PingPeriod, 5 s): an episode may print nothing for minutes, and a
    silent connection is what proxies and load balancers cut."""
    while not stopped.wait(EXEC_PING_SECONDS):
        try:
            with writing:
                connection.sendall(websocket_frame(0x9, b""))
        except OSError:
            return


def read_exec_stream(connection, stream, deadline, sent_at, opened_at):
    """Read messages until the server closes: stdout, stderr, and the Status with the exit code."""
    writing, stopped = threading.Lock(), threading.Event()
    threading.Thread(target=keep_alive, args=(connection, writing, stopped), daemon=True).start()
    try:
        return read_exec_messages(connection, stream, deadline, sent_at, opened_at, writing)
    finally:
        stopped.set()


class ExecStreamTimedOut(socket.timeout):
    """The exec's time ran out with its stream open: what its stdout and stderr had said by then."""

    def __init__(self, stdout, stderr):
        super().__init__("timed out")
        self.stdout, self.stderr = stdout, stderr


def read_exec_messages(connection, stream, deadline, sent_at, opened_at, writing):
    out, err = bytearray(), bytearray()
    try:
        return read_exec_frames(connection, stream, deadline, sent_at, opened_at, writing, out, err)
    except socket.timeout:
        raise ExecStreamTimedOut(bytes(out), bytes(err)) from None


def read_exec_frames(connection, stream, deadline, sent_at, opened_at, writing, out, err):
    status, message = None, bytearray()
    while True:
        connection.settimeout(max(0.05, deadline - time.monotonic()))
        head = stream.read(2)
        if len(head) < 2:
            break  # the connection ended without a close frame
        fin, opcode, length = head[0] & 0x80, head[0] & 0x0F, head[1] & 0x7F
        if length == 126:
            length = int.from_bytes(stream.read(2), "big")
        elif length == 127:
            length = int.from_bytes(stream.read(8), "big")
        mask = stream.read(4) if head[1] & 0x80 else None
        payload = stream.read(length)
        if mask:
            payload = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        if opcode == 0x8:  # close: answer it, then the stream is over
            try:
                with writing:
                    connection.sendall(websocket_frame(0x8, payload[:2]))
            except OSError:
                pass
            break
        if opcode == 0x9:  # ping
            with writing:
                connection.sendall(websocket_frame(0xA, payload))
            continue
        if opcode == 0xA:
            continue
        message += payload  # a data frame, or a continuation of one
        if not fin:
            continue
        if message:
            channel, data = message[0], bytes(message[1:])
            if channel == 1:
                out += data
            elif channel == 2:
                err += data
            elif channel == 3 and data:
                status = json.loads(data.decode("utf-8", "replace"))
        message = bytearray()
    return exec_outcome(status, bytes(out), bytes(err), sent_at, opened_at)


def exec_outcome(status, stdout, stderr, sent_at, opened_at):
    """The exit code from the v4/v5 Status (client-go errorDecoderV4): Success is 0; a Failure with
    reason NonZeroExitCode carries the code in its ExitCode cause; any other Failure is an error."""
    if status is None:
        return ExecResult(None, stdout, stderr, error="the exec stream was cut before the command's status came (the "
                          "API server or `kubectl proxy` closed it: an outage, a restart)", sent_at=sent_at,
                          opened_at=opened_at, cut=True)
    if status.get("status") == "Success":
        return ExecResult(0, stdout, stderr, sent_at=sent_at, opened_at=opened_at)
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            # metav1.StatusCause's Type is serialised as "reason" (apimachinery types.go, json:"reason")
            if cause.get("reason") == "ExitCode" and str(cause.get("message", "")).isdigit():
                return ExecResult(int(cause["message"]), stdout, stderr, sent_at=sent_at, opened_at=opened_at)
    # The API server upgrades the client's WebSocket before it dials the kubelet (k8s.io/apiserver
    # v0.36.3 streamtranslator.go); a dial that failed on its way (a reset, a broken pipe: kwok's
    # endpoint at 1,000 execs at once) comes as an InternalError "error sending request: ..."
    # (client-go transport/spdy Negotiate), and the kubelet may have begun the command: unknown,
    # so followed through the exec journal, never counted as the episode's failure.
    dial_failed = status.get("reason") == "InternalError" and "error sending request" in str(status.get("message"))
    return ExecResult(None, stdout, stderr, error=status.get("message") or "exec failed (%s)" % status.get("reason"),
                      sent_at=sent_at, opened_at=opened_at, cut=dial_failed)


def open_exec_channel(cluster, namespace, console):
    """The run's exec channel: a WebSocket through the command's proxy, or, where its channel
    has none, one `kubectl exec` per episode (its open() said so, once)."""
    if cluster.api.serves:
        return ProxyExecChannel(cluster, namespace)
    return KubectlExecChannel(cluster, namespace, cluster.api.fallback_reason)


# ============================================================================
# Console and output files
# ============================================================================


class Console:
    """Where the tool's lines go, handed to whatever prints (httpie's Environment, in spirit):
    stdout carries results for scripts; notes, warnings and progress go to stderr. --quiet
    silences notes and progress, never warnings or errors. Progress is one line rewritten in
    place, and only on a terminal."""

    def __init__(self, quiet=False, stdout=None, stderr=None):
        self.quiet = quiet
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.progress_shown = False
        self.writing = threading.Lock()  # notes come from many threads: each line whole

    @property
    def interactive(self):
        """A person watches stderr: progress lines and the human summary are worth writing."""
        return self.stderr.isatty() and not self.quiet

    def say(self, *parts, end="\n"):
        """Print to stdout. A reader that stopped reading (`run ... | head -1`) must not stop the
        run or end it in a traceback: from then on stdout goes to /dev/null."""
        try:
            print(*parts, end=end, file=self.stdout, flush=True)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stdout.fileno())

    def note(self, message):
        """Progress for people (not with --quiet)."""
        if not self.quiet:
            self.line(message)

    def warn(self, message):
        """Something the user must know even with --quiet."""
        self.line("warning: " + message)

    def tell(self, message):
        """A line for people that --quiet does not silence (interrupts, the human summary)."""
        self.line(message)

    def line(self, text):
        """A line of its own on stderr: a progress line being rewritten ends first."""
        with self.writing:
            self.end_progress()
            self.stderr.write(text + "\n")
            self.stderr.flush()

    def progress(self, line):
        """Rewrite the progress line in place (a terminal only)."""
        if self.interactive:
            self.stderr.write("\r%s   " % line)
            self.stderr.flush()
            self.progress_shown = True

    def end_progress(self):
        if self.progress_shown:
            self.stderr.write("\n")
            self.stderr.flush()
            self.progress_shown = False


class PrefixedConsole(Console):
    """One of several things done at once (`cleanup A B`): each of its lines whole and prefixed
    with what it is about ("A: Deleting namespace ..."), no progress line to be torn by another's."""

    def __init__(self, console, prefix, lock):
        super().__init__(console.quiet, console.stdout, console.stderr)
        self.parent, self.prefix, self.lock = console, prefix, lock

    def line(self, text):
        with self.lock:
            self.parent.line("%s: %s" % (self.prefix, text))

    def progress(self, line):
        pass


def write_json(path, obj):
    """Write atomically, so an interrupted write never leaves half a receipt. A list of
    objects (pods.json) is written one object a line, and so is each such list among an
    object's top-level values (results.json's per-episode rows): greppable, and quick at 10,000
    episodes (a line is encoded by json's C encoder; an indented document only by its Python one,
    2.8 s for the rows of 10,000). Written as it is encoded: 10,000 pods never sit in memory a
    second time as text."""
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w") as out:
            if is_object_list(obj):
                write_object_lines(out, obj, "")
                out.write("\n")
            elif isinstance(obj, dict) and any(is_object_list(value) for value in obj.values()):
                out.write("{")
                for number, (key, value) in enumerate(obj.items()):
                    out.write((",\n  " if number else "\n  ") + json.dumps(key) + ": ")
                    if is_object_list(value):
                        write_object_lines(out, value, "  ")
                    else:
                        out.write(json.dumps(value, indent=2).replace("\n", "\n  "))
                out.write("\n}\n")
            else:
                json.dump(obj, out, indent=2)
                out.write("\n")
        os.replace(partial, path)
    except OSError as error:
        try:
            partial.unlink()  # a full disk must not leave half a file behind
        except OSError:
            pass
        if error.filename is None:  # a failed write() names no file: say which one it was
            raise OSError(error.errno, error.strerror, str(path)) from None
        raise


def is_object_list(value):
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def write_object_lines(out, objects, indent):
    """A list of objects as JSON, one object a line."""
    out.write("[\n")
    for number, item in enumerate(objects):
        out.write((",\n" if number else "") + indent + "  " + json.dumps(item))
    out.write("\n%s]" % indent)


def shared_strings(pairs):
    """A JSON object whose keys and short string values are the interpreter's one copy
    (sys.intern): 10,000 pods repeat the same keys, labels, images and node names, and parsed
    one by one (as a watch delivers them) each would hold its own. A pod takes about 10 KB
    instead of 21 KB parsed alone, 15 KB in one document (issue 31: the tool's memory)."""
    return {sys.intern(key): sys.intern(value) if value.__class__ is str and len(value) <= 64 else value
            for key, value in pairs}


COMPACT_JSON = json.JSONDecoder(object_pairs_hook=shared_strings)


def load_json(text):
    """json.loads for what may be held by the thousand (pods, claims, records)."""
    return COMPACT_JSON.decode(text)


SHARED_PARTS_KEPT = 4096  # the parts a SharedParts remembers at once, twice over (two generations)


class SharedParts:
    """A JSON decoder for the API objects the tool holds by the thousand (the pods, Sandboxes and
    claims its watches and lists deliver, and pods.json read back): equal parts of different
    objects are one object in memory. A Job's pods repeat their spec's containers, volumes and
    tolerations, their labels and owner, a node's addresses and many a condition; kept once,
    a pod costs about a third of what it does parsed alone (benchmarks/README.md, "10,000
    episodes on the real control plane"). Keys and short strings are interned, as by load_json.

    What it returns is for reading only: a part changed in place would change every object that
    shares it. So the keys in `drop` (metadata.managedFields, which kubectl hides: the one thing
    the tool used to take out of an API object after parsing) are left out while parsing, never
    popped later. The parts are remembered in two generations of SHARED_PARTS_KEPT: a part
    seen again moves to the young one, so the parts every pod has stay, and a pod's own parts
    are forgotten soon. A part is remembered by its keys and values, its objects and lists by
    identity; the object remembered holds those, so an identity is never that of another."""

    def __init__(self, drop=()):
        self.drop = frozenset(drop)
        self.young, self.old = {}, {}
        self.lock = threading.Lock()  # watches decode in their own threads
        self.decoder = json.JSONDecoder(object_pairs_hook=self.shared_object)

    def decode(self, text):
        if isinstance(text, (bytes, bytearray)):
            text = text.decode("utf-8")
        with self.lock:
            return self.decoder.decode(text)

    def shared_object(self, pairs):
        held, key = [], []
        for name, value in pairs:
            if name in self.drop:
                continue
            name = sys.intern(name)
            if value.__class__ is list:
                value = self.shared_list(value)
            elif value.__class__ is str and len(value) <= 64:
                value = sys.intern(value)
            held.append((name, value))
            key += (name, part_key(value))
        return self.remembered(tuple(key), dict(held))

    def shared_list(self, items):
        return self.remembered((list,) + tuple(part_key(item) for item in items), items)

    def remembered(self, key, part):
        found = self.young.get(key)
        if found is None:
            found = self.old.get(key, part)
            self.young[key] = found
            if len(self.young) > SHARED_PARTS_KEPT:
                self.old, self.young = self.young, {}
        return found


def part_key(value):
    """A value as a SharedParts key holds it: a string or None as itself, an object or list by
    its identity (an int), a number or bool with its type (1, 1.0 and True are equal in Python)."""
    cls = value.__class__
    if cls is str or value is None:
        return value
    if cls is dict or cls is list:
        return id(value)
    return (cls, value)


# API objects as the watches, lists and saved pod files deliver them, without managedFields
API_OBJECTS = SharedParts(drop=("managedFields",))


def decode_file(path, decode, keep=None):
    """A JSON file's value, decoded by `decode`; of a list, only the items `keep` is true of
    (when given). A list written one object a line (write_json's pods.json, events.json) is
    decoded a line at a time, so that 10,000 pods' 45 MB of text are never held at once beside
    what they decode to, nor the items not kept; any other layout is decoded whole, and so is a
    file whose lines are not that layout after all (then the whole text says what is wrong)."""
    with open(path, encoding="utf-8") as source:
        if source.readline().strip() == "[":
            items, more = [], True  # more: the last element ended with a comma
            for line in source:
                line = line.strip()
                if line == "]" and not more:
                    if not source.read().strip():
                        return items
                    break
                if not more or not line:
                    break
                more = line.endswith(",")
                try:
                    item = decode(line[:-1] if more else line)
                except ValueError:
                    break
                if keep is None or keep(item):
                    items.append(item)
    value = decode(path.read_text(encoding="utf-8"))
    return [item for item in value if keep(item)] if keep is not None and isinstance(value, list) else value


def read_json(path, what, keys=(), shape=dict, decode=load_json):
    """A JSON object (or list) from a file of the output folder; one clear error when it is
    missing, unreadable, of another shape, or lacks one of `keys`. `decode`: API_OBJECTS.decode
    for objects held by the thousand and only read (SharedParts)."""
    try:
        obj = decode_file(path, decode)
    except FileNotFoundError:
        raise DemoError("no %s in %s" % (path.name, path.parent)) from None
    except (OSError, ValueError) as error:
        raise DemoError("cannot read %s (%s): %s" % (what, path, error)) from None
    if not isinstance(obj, shape):
        raise DemoError("%s is not %s of rl-batch-demo: a JSON %s was expected, it holds %s"
                        % (path, what, "object" if shape is dict else "list",
                           type(obj).__name__ if obj is not None else "null"))
    missing = [key for key in keys if key not in obj]
    if missing:
        raise DemoError("%s is not %s of rl-batch-demo: it lacks %s" % (path, what, ", ".join(missing)))
    return obj


def read_saved(path, decode=load_json, keep=None):
    return decode_file(path, decode, keep) if path.exists() else None


def program_name():
    """How the user ran the tool: `rl-batch-demo` (the installed command) or `rl-batch-demo.py`."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("rl-batch-demo") else "rl-batch-demo"


def invocation():
    """The command that runs this tool again, as the user ran it."""
    program = program_name()
    return "python3 " + shlex.quote(sys.argv[0]) if program.endswith(".py") else program


def cleanup_command(output):
    return "%s cleanup --output %s" % (invocation(), shlex.quote(str(output)))

def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def some_of(names, shown=5):
    """"a, b, c and 2 more": the first `shown` of `names` and how many others, for one line."""
    names = [str(name) for name in names]
    return ", ".join(names[:shown]) + (" and %d more" % (len(names) - shown) if len(names) > shown else "")


def iso_micro(unix_seconds):
    return datetime.datetime.fromtimestamp(unix_seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ============================================================================
# Manifests: pure functions returning the objects a run creates
# ============================================================================


def default_deadline(count, parallelism):
    """The Job's activeDeadlineSeconds unless --timeout: the seed's 240 s for one wave of at
    most 20 episodes, plus 30 s per further wave (episodes queue behind each other), plus
    1 s per 10 episodes beyond 20 (creating, scheduling and collecting more pods)."""
    waves = -(-count // parallelism)
    return DEFAULT_TIMEOUT_SECONDS + 30 * (waves - 1) + max(0, count - MAX_COUNT) // 10


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


def configmap_manifest(namespace, run_id, program=EPISODE_PROGRAM):
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP_NAME, "namespace": namespace,
                         "labels": object_labels(run_id, "episode-program")},
            "data": {"episode.py": program, EXEC_JOURNAL_FILE: EXEC_JOURNAL_PROGRAM,
                     SANDBOX_PROBE_FILE: SANDBOX_PROBE_PROGRAM, SANDBOX_RESET_FILE: SANDBOX_RESET_PROGRAM}}


def tasks_configmap_manifest(namespace, run_id, tasks):
    """Episode i reads /tasks/task-<i>.json (its TASK_FILE)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": TASKS_CONFIGMAP, "namespace": namespace, "labels": object_labels(run_id, "tasks")},
            "data": tasks_data(tasks)}


def tasks_data(tasks):
    return {"task-%d.json" % index: json.dumps(task) for index, task in enumerate(tasks)}


def configmap_bytes(data):
    """What the API server counts against its 1 MiB limit: every key and value."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in data.items())


def network_policy_manifest(namespace, run_id):
    """Default deny, ingress and egress, for every pod of the namespace."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "deny-all", "namespace": namespace,
                         "labels": object_labels(run_id, "network-isolation")},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}


@dataclasses.dataclass(frozen=True)
class CustomEpisodes:
    """--episode: the batch's episodes are the user's program. Its Job is Indexed, each index
    retried up to `retries` times; with `tasks` (--tasks) episode i reads task i."""

    retries: int = 0
    tasks: bool = False


def episode_pod_template(run_id, image, runtime, tasks=False):
    """The episode pod every cluster backend starts: the image, the RuntimeClass (None = the
    cluster default), requests and limits, a hardened security context, the episode program
    at /demo, an empty /workspace; with `tasks`, /tasks and the episode's TASK_FILE."""
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-B", "/demo/" + SANDBOX_PROBE_FILE, "/demo/episode.py"],
        "env": [{"name": "EPISODE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "securityContext": {"allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "resources": {"requests": dict(EPISODE_REQUESTS), "limits": dict(EPISODE_LIMITS)},
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
    if tasks:
        container["env"] += [
            # the annotation exists on every Indexed Job's pods; the label only with PodIndexLabel (1.28+)
            {"name": "TASK_INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['%s']" % INDEX_KEY}}},
            {"name": "TASK_FILE", "value": "/tasks/task-$(TASK_INDEX).json"}]
        container["volumeMounts"].append({"name": "tasks", "mountPath": "/tasks", "readOnly": True})
        pod_spec["volumes"].append({"name": "tasks", "configMap": {"name": TASKS_CONFIGMAP}})
    if runtime is not None:
        pod_spec = {"runtimeClassName": runtime, **pod_spec}
    return {"metadata": {"labels": {"app": "rl-batch-demo", **object_labels(run_id, "episode")}}, "spec": pod_spec}


def common_manifests(spec, namespace, run_id):
    """What every cluster backend's run creates first: the namespace (labelled with the backend
    that made it, which `list` and `cleanup` read), the episode program, the tasks and (with
    --network none) the default-deny policy."""
    namespace_object = namespace_manifest(namespace, run_id)
    namespace_object["metadata"]["labels"][BACKEND_LABEL] = spec.backend or DEFAULT_BACKEND
    objects = [namespace_object, configmap_manifest(namespace, run_id, spec.program)]
    if spec.tasks_list is not None:
        objects.append(tasks_configmap_manifest(namespace, run_id, spec.tasks_list))
    if spec.network == "none":
        objects.append(network_policy_manifest(namespace, run_id))
    return objects


# ============================================================================
# Metrics and validation: pure functions over saved JSON and logs
# ============================================================================
# Clocks and precision. Every time below is Unix seconds from one of these clocks:
#   api-server  metadata.creationTimestamp, and the PodScheduled condition (the API server
#               stamps it when it accepts the binding): whole seconds (truncated)
#   kubelet     PodReadyToStartContainers, container startedAt/finishedAt: the node's
#               clock, whole seconds
#   episode     the episode's own time.time() inside the sandbox: sub-microsecond, but
#               a VM sandbox has its own guest clock
#   client      this tool's wall clock (time.time()), for what only the tool sees: its create
#               calls as it sent them, and each transition as its watch received it (the
#               transition itself came earlier, by the watch's delivery latency, usually a few
#               ms; clusterloader2 stamps its pod startup the same way). Millisecond figures.
# A delta between two clocks is good to about one second and needs synchronised clocks.
# A phase whose end is a whole-second stamp (truncated) can come out negative for a duration
# under a second: it is then no figure but a bound (episode_phases, phase_bounds).


@dataclasses.dataclass(eq=False)  # compared and hashed by identity: each backend names its own
class PhaseScheme:
    """How one kind of episode record is timed, and so measured and drawn: its time points
    (name -> (clock, resolution in seconds, source)), its phases (name -> (from point, to
    point, label)), its startup metric (a phase, also the row key `<metric>_seconds`), the
    function that reads a record's times, the point a row is ordered by, how a row is named,
    the timeline's colours (phase -> colour, in drawing order) and the combined phases it draws
    only where their split is unknown, and the report's phase rows (slot -> phases). Each backend
    names its scheme; nothing else tells schemes apart."""

    points: dict
    phases: dict
    startup_metric: str
    times_of: "collections.abc.Callable"
    created_point: str
    identity: "collections.abc.Callable"
    row_key: str
    timeline_colours: dict
    report_phases: dict
    # phase -> point: a combined phase drawn only when that point (which splits it) is unknown
    timeline_fallbacks: dict = dataclasses.field(default_factory=dict)
    # status.reason values of a record whose failure its backend explained in status.message
    # (no exit code of the episode's own: an exec that failed, say); named by that message
    explained_failures: tuple = ()
    # those of them that mean the batch's deadline ended the attempt (named as the deadline's doing)
    deadline_failures: tuple = ()
    timeline_attributes: tuple = ()  # row keys the timeline gives each episode as data-* attributes
    # its logs are read through a kubelet, which rotates them (so a log's beginning can be gone)
    kubelet_logs: bool = False


# A pod's points (the Job and local backends), in order.
TIME_POINTS = {
    "pod_created": ("api-server", 1.0, "pod metadata.creationTimestamp"),
    # written by the API server when it accepts the scheduler's binding
    # (tests/fakecluster/ASSUMPTIONS.md, fact 28)
    "scheduled": ("api-server", 1.0, "PodScheduled=True lastTransitionTime"),
    "sandbox_ready": ("kubelet", 1.0, "PodReadyToStartContainers=True lastTransitionTime"),
    "container_started": ("kubelet", 1.0, "containerStatuses[0].state.terminated.startedAt"),
    "process_start": ("episode", 1e-6, "ready event started_at (first statement)"),
    "imports_done": ("episode", 1e-6, "ready event imports_done_at"),
    "ready": ("episode", 1e-6, "ready event at"),
    "reward": ("episode", 1e-6, "reward event at"),
    "container_finished": ("kubelet", 1.0, "containerStatuses[0].state.terminated.finishedAt"),
    # the same transitions as the tool's pod watch received them (JobWatches), sub-second
    "pod_seen": ("client", 1e-3, "the tool's pod watch first delivered the pod"),
    "scheduled_seen": ("client", 1e-3, "the tool's pod watch first delivered it with PodScheduled=True"),
    "container_started_seen": ("client", 1e-3, "the tool's pod watch first delivered its container running or ended"),
}

# Per-episode phases: name -> (from point, to point, label). pod_to_ready is the tutorial's metric.
PHASES = {
    "scheduling": ("pod_created", "scheduled", "pod created -> scheduled"),
    "sandbox_start": ("scheduled", "sandbox_ready", "scheduled -> sandbox ready"),
    "container_start": ("sandbox_ready", "container_started", "sandbox ready -> container started"),
    "scheduled_to_container_started": ("scheduled", "container_started", "scheduled -> container started"),
    "interpreter_start": ("container_started", "process_start", "container started -> first statement"),
    "module_import": ("process_start", "imports_done", "Python module import"),
    "import_done_to_ready": ("imports_done", "ready", "import done -> ready"),
    "ready_to_reward": ("ready", "reward", "ready -> reward"),
    "reward_to_container_finished": ("reward", "container_finished", "reward -> container finished"),
    "pod_to_ready": ("pod_created", "ready", "pod created -> ready"),
    # sub-second startup on the client clock (from the pod's first delivery, so without the
    # creationTimestamp's truncation): tells apart starts that whole seconds cannot
    "client_scheduling": ("pod_seen", "scheduled_seen", "pod seen -> scheduled seen"),
    "client_scheduled_to_container_started": ("scheduled_seen", "container_started_seen",
                                              "scheduled seen -> container started seen"),
    "client_pod_to_ready": ("pod_seen", "ready", "pod seen -> ready"),
}
# The phases every scheme shares (the episode program's own), defined alike in each.
EPISODE_PHASES = ("module_import", "import_done_to_ready", "ready_to_reward")

# Timeline segments, in order: phase -> colour. scheduled_to_container_started is drawn only
# when the sandbox-ready time is unknown (POD_SCHEME's timeline_fallbacks).
TIMELINE_COLOURS = {
    "scheduling": "#bdbdbd", "sandbox_start": "#8e6bbf", "container_start": "#4c72b0",
    "scheduled_to_container_started": "#76b7b2", "interpreter_start": "#dd8452", "module_import": "#c44e52",
    "import_done_to_ready": "#937860", "ready_to_reward": "#55a868", "reward_to_container_finished": "#8c8c8c",
}


def phase_definition(name, scheme=None):
    """What a phase measures: its endpoints, clocks, resolution and unit (for results.json)."""
    scheme = scheme or POD_SCHEME
    points = scheme.points
    start, end, _ = scheme.phases[name]
    clocks = [points[start][0], points[end][0]]
    return {"from": start, "to": end, "from_source": points[start][2], "to_source": points[end][2],
            "clocks": clocks if clocks[0] != clocks[1] else clocks[:1], "mixed_clocks": clocks[0] != clocks[1],
            "resolution_seconds": max(points[start][1], points[end][1]), "unit": "seconds"}


def parse_k8s_time(value):
    """RFC 3339 'YYYY-MM-DDTHH:MM:SSZ' -> Unix seconds (float)."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")


def parse_rfc3339_nano(value):
    """RFC3339Nano (Go's time.RFC3339Nano: up to nine fraction digits) -> Unix seconds; None when
    absent or not a time (agent-sandbox writes "unknown" for a first-Ready time it lost)."""
    match = RFC3339.match(value or "")
    if not match:
        return None
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    whole = datetime.datetime.fromisoformat(match.group(1) + zone).timestamp()
    return whole + (float(match.group(2)) if match.group(2) else 0.0)


def percentile(values, q):
    """Linear interpolation between order statistics (the tutorial's definition).

    q in [0, 1]; rank (n - 1) * q, as numpy's default and R's type 7.
    """
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


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
    """Every TIME_POINT of one episode: ({point: unix seconds or None}, {point: why None},
    {point: the fallback source used instead of the point's own}; a pod's points have none).

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
    for point, key in (("pod_seen", "first_seen"), ("scheduled_seen", "scheduled_seen"),
                       ("container_started_seen", "container_started_seen")):
        value = (observed or {}).get(key)
        times[point] = float(value) if isinstance(value, (int, float)) else None
        missing[point] = None if times[point] is not None else "the tool's pod watch did not see it (observed.json)"
    return times, {point: why for point, why in missing.items() if why}, {}


def episode_phases(times, missing, scheme):
    """({phase: seconds or None}, {phase: why None}, {phase: upper bound in seconds}) from one
    episode's times. A phase measured negative is no duration: its end is a stamp truncated to
    its resolution (a kubelet's finishedAt, say), so the true one is at least 0 and under the
    measured value plus that resolution: None, with that bound."""
    phases, notes, bounds = {}, {}, {}
    for name, (start, end, _) in scheme.phases.items():
        if times.get(start) is None or times.get(end) is None:
            phases[name] = None
            notes[name] = missing.get(start) or missing.get(end)
            continue
        phases[name] = times[end] - times[start]
        if phases[name] < 0:
            resolution = max(scheme.points[start][1], scheme.points[end][1])
            bounds[name] = round(max(phases[name] + resolution, 0.0), 6)
            notes[name] = "measured negative: under %g s, a bound (phase_bounds), since an end is a stamp " \
                          "truncated to %g s" % (resolution, resolution)
            phases[name] = None
    return phases, notes, bounds


POD_SCHEME = PhaseScheme(
    TIME_POINTS, PHASES, "pod_to_ready", episode_times, "pod_created",
    identity=lambda pod: {"pod": pod["metadata"]["name"]}, row_key="pod", timeline_colours=TIMELINE_COLOURS,
    timeline_fallbacks={"scheduled_to_container_started": "sandbox_ready"}, kubelet_logs=True,
    report_phases={"startup": ("scheduling", "sandbox_start", "container_start", "scheduled_to_container_started",
                               "interpreter_start"),
                   "startup_metric": ("pod_to_ready", "client_pod_to_ready"), "finish": ("reward_to_container_finished",)})


def job_finished_time(job):
    """When the API server saw the Job finish (Unix seconds, whole, truncated): the earliest of
    its terminal or target conditions and completionTime (every pod had ended before each of
    them); None while it runs."""
    status = (job or {}).get("status", {})
    stamps = [c["lastTransitionTime"] for c in status.get("conditions") or [] if c.get("status") == "True"
              and c.get("type") in ("SuccessCriteriaMet", "Complete", "FailureTarget", "Failed")
              and c.get("lastTransitionTime")] + ([status["completionTime"]] if status.get("completionTime") else [])
    return min(parse_k8s_time(stamp) for stamp in stamps) if stamps else None


def episode_skew(times, job_finished, created_point="pod_created"):
    """How far one episode's node clocks are at least off the API server's, where the data bound
    it: [{"clock", "direction", "at_least_seconds", "bound"}]. API times are truncated to the
    second, so the true moment lies in [stamp, stamp + 1):
      behind  the episode cannot start before its pod was created:
              pod_created - process_start (or ready) > 0 is a lower bound, exactly;
              the kubelet's container start likewise, less its own 1 s resolution;
      ahead   the episode's reward comes before the Job finished (its pods ended first):
              reward - (Job finished + 1 s) > 0 is a lower bound; the kubelet's finishedAt likewise.
    """
    found = []
    created = times.get(created_point)  # the episode's object's creation (a pod; a warm episode's claim)
    episode_start = min((times[p] for p in ("process_start", "ready") if times.get(p) is not None), default=None)
    if created is not None and episode_start is not None and created - episode_start > 0:
        found.append({"clock": "episode", "direction": "behind", "at_least_seconds": created - episode_start,
                      "bound": "an episode cannot start before its pod's creation (pod metadata.creationTimestamp)"})
    if created is not None and times.get("container_started") is not None and \
            created - times["container_started"] - 1.0 > 0:
        found.append({"clock": "kubelet", "direction": "behind",
                      "at_least_seconds": created - times["container_started"] - 1.0,
                      "bound": "a container cannot start before its pod's creation (less 1 s of resolution)"})
    if job_finished is not None:
        limit = job_finished + 1.0
        if times.get("reward") is not None and times["reward"] - limit > 0:
            found.append({"clock": "episode", "direction": "ahead", "at_least_seconds": times["reward"] - limit,
                          "bound": "an episode's reward comes before its Job finished (the Job's completionTime "
                                   "or terminal condition, + 1 s of resolution)"})
        if times.get("container_finished") is not None and times["container_finished"] - limit > 0:
            found.append({"clock": "kubelet", "direction": "ahead",
                          "at_least_seconds": times["container_finished"] - limit,
                          "bound": "a container finishes before its Job finished (+ 1 s of resolution)"})
    return found


def skew_phrase(finding):
    return "the %s clock on node %s is at least %.1f s %s the API server" % (
        finding["clock"], finding["node"], finding["at_least_seconds"],
        "behind" if finding["direction"] == "behind" else "ahead of")


def clock_skew_summary(rows):
    """Per node, clock and direction: the largest lower bound any episode gives, with the bound
    used and how many episodes show it. Episode-clock skew withholds the headline figures that
    compare the episode's clock with the API server's."""
    worst = {}
    for row in rows:
        for finding in row.get("clock_skew") or []:
            key = (row["node"], finding["clock"], finding["direction"])
            entry = worst.setdefault(key, dict(finding, node=row["node"], pods=0, example_pod=row["pod"]))
            entry["pods"] += 1
            if finding["at_least_seconds"] > entry["at_least_seconds"]:
                entry.update(finding, example_pod=row["pod"])
    findings = [worst[key] for key in sorted(worst, key=lambda k: (str(k[0]), k[1], k[2]))]
    episode = [f for f in findings if f["clock"] == "episode"]
    return {"findings": findings,
            "max_seconds": max((f["at_least_seconds"] for f in findings), default=None),
            "headline_withheld": "; ".join(skew_phrase(f) for f in episode) or None}


class EpisodeInvalid(Exception):
    """One episode failed one check; the message names the pod and the check."""


def log_text(data):
    """A log (bytes, kept byte for byte in the folder) as text for reading its events: what is not
    UTF-8 is replaced, so such a line is simply not an event (it never parses as one)."""
    return data.decode("utf-8", "replace")


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


def the_event(pod_name, events, kind, log=None):
    found = [event for event in events if event.get("event") == kind]
    rotated = rotated_log(events, log) if kind == "ready" and not found else None
    if rotated:
        raise EpisodeInvalid("pod %s: %s" % (pod_name, rotated))
    if len(found) != 1:
        raise EpisodeInvalid("pod %s: expected exactly one %s event, found %d"
                             % (pod_name, kind, len(found)))
    return found[0]


def rotated_log(events, log):
    """The phrase for a log that holds a reward event but no ready event (which an episode emits
    first): either the episode never emitted it, or the log's beginning is gone, as after the
    kubelet rotated it (at containerLogMaxSize, 10 MiB by default; the API serves only the newest
    file), and nothing in the log tells the two apart. None when the log does not show that."""
    kinds = [event.get("event") for event in events if isinstance(event, dict)]
    if log is None or "ready" in kinds or "reward" not in kinds:
        return None
    return ("never ready: no ready event in its log, yet a reward event: the episode did not emit one, or the log's "
            "beginning is gone (the kubelet rotates a container's log at containerLogMaxSize, 10 MiB by default, and "
            "the API serves only the newest file; %d bytes kept, events seen: %s); write the events to "
            "/dev/termination-log as well, as the built-in episode does, and they survive a rotation"
            % (len(log.encode()), ", ".join(sorted(set(map(str, kinds))))))


def termination_message(pod):
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("terminated") or {}).get("message") or ""


def episode_events(pod, log):
    """The episode's events and where they came from: the termination message when it holds
    JSON events (one `get pods` returned it), else the log (a message may be missing or
    cut at the kubelet's 4096 bytes)."""
    message = termination_message(pod)
    if message.strip():
        try:
            events = [json.loads(line) for line in message.splitlines() if line.strip()]
            if all(isinstance(event, dict) and "event" in event for event in events):
                return events, "termination-message"
        except ValueError:
            pass
    return parse_events(pod["metadata"]["name"], log or ""), "log"


def validate_episode(pod, log, job_created, observed=None, job_finished=None, scheme=None):
    """Check one episode (pod + its events) and return its per-episode row."""
    name = pod["metadata"]["name"]
    phase = pod.get("status", {}).get("phase")
    if phase != "Succeeded":
        detail = pod.get("status", {}).get("message")
        raise EpisodeInvalid("pod %s: phase is %s, expected Succeeded%s" % (name, phase, " (%s)" % detail if detail else ""))
    events, source = episode_events(pod, log)
    ready = the_event(name, events, "ready", log if source == "log" and (scheme or POD_SCHEME).kubelet_logs else None)
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
    row = episode_row(pod, ready, reward, job_created, observed, source, job_finished, scheme)
    for finding in row["clock_skew"]:
        if finding["clock"] == "episode":
            raise EpisodeInvalid("pod %s: %s (%s); synchronise that node's clock with the API server's (NTP) "
                                 "and run again" % (name, skew_phrase(dict(finding, node=row["node"])),
                                                    finding["bound"]))
    if not job_created <= pod_created <= ready_at <= reward_at:
        raise EpisodeInvalid(
            "pod %s: time order job created (%.3f) <= pod created (%.3f) <= ready (%.3f) <= "
            "reward (%.3f) does not hold; check that the log is complete"
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
    return row


def episode_row(pod, ready, reward, job_created, observed, source, job_finished=None, scheme=None):
    """One episode's per-episode row: the tutorial's metrics, its times and phases. Its scheme
    names it (a pod; a warm-pool claim with its Sandbox, pod and launch type) and gives its
    startup metric (pod_to_ready_seconds, claim_to_ready_seconds)."""
    scheme = scheme or POD_SCHEME
    status = (pod["status"].get("containerStatuses") or [{}])[0]
    ready_at, reward_at = float(ready["at"]), float(reward["at"])
    pod_created = parse_k8s_time(pod["metadata"]["creationTimestamp"])
    times, missing, fallbacks = scheme.times_of(pod, ready, reward, observed)
    phases, notes, bounds = episode_phases(times, missing, scheme)
    skew = episode_skew(times, job_finished, scheme.created_point)
    withhold_skewed_phases(phases, notes, scheme, skew, pod["spec"].get("nodeName"), bounds)
    episode_skewed = any(finding["clock"] == "episode" for finding in skew)
    extra = {"time_fallbacks": fallbacks} if fallbacks else {}
    if bounds:
        extra["phase_bounds"] = bounds  # phase -> the duration is under this (measured negative)
    return {
        **scheme.identity(pod),
        "node": pod["spec"].get("nodeName"),
        "image": (pod["spec"].get("containers") or [{}])[0].get("image"),  # as the pod asked for it
        "image_id": status.get("imageID"),
        "reward": float(reward["reward"]),  # one type for every episode (the built-in one emits 1)
        # The tutorial's metrics (seconds; api-server clock, whole seconds, vs episode clock),
        # null when this episode's clock is provably skewed (clock_skew says by how much):
        scheme.startup_metric + "_seconds": None if episode_skewed else ready_at - pod_created,
        "batch_to_ready_seconds": None if episode_skewed else ready_at - job_created,
        "batch_to_reward_seconds": None if episode_skewed else reward_at - job_created,
        "phases": phases,
        "phase_notes": notes,
        "times": times,
        "clock_skew": skew,
        "events_source": source,
        # the container's own CPU time, first statement -> reward (the episode's cgroup counter), or None
        "cpu_usec": reward.get("cpu_usec") if isinstance(reward.get("cpu_usec"), int) else None,
        **extra,
    }


def withhold_skewed_phases(phases, notes, scheme, skew, node, bounds):
    """A phase that compares a clock this episode shows skewed with another clock is not a
    duration (it can even be negative), nor a bound: null, with the skew named in its note."""
    for finding in skew:
        for name, (start, end, _) in scheme.phases.items():
            clocks = {scheme.points[start][0], scheme.points[end][0]}
            if (phases.get(name) is not None or name in bounds) and len(clocks) > 1 and finding["clock"] in clocks:
                phases[name] = None
                bounds.pop(name, None)
                notes[name] = "withheld: %s" % skew_phrase(dict(finding, node=node))


def by_creation(pod):
    """Pods in the order they were created (whole seconds, so the name breaks ties)."""
    return pod["metadata"].get("creationTimestamp", ""), pod["metadata"]["name"]


def task_index(pod):
    """The task a custom episode's pod runs: its completion index, through its Job's task map
    (RL_TASK_INDEXES, one Job of a batch across images) when its container has one."""
    index = pod_index(pod)
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    mapped = next((var.get("value") for var in containers[0].get("env") or [] if var.get("name") == "RL_TASK_INDEXES"),
                  None)
    if index is None or not mapped:
        return index
    indexes = mapped.split(",")
    return int(indexes[index]) if index < len(indexes) and indexes[index].isdigit() else index


def pod_index(pod):
    index = pod["metadata"].get("annotations", {}).get(INDEX_KEY)
    return int(index) if index is not None and str(index).isdigit() else None


def attempt_failure(pod, log, cut_short=None, explained=(), deadline_failures=()):
    """Why a finished custom-episode attempt is not a sample, or None when it is one. `cut_short`:
    what ended the batch before its episodes could finish (the Job's deadline), named first for
    an attempt that never finished; `explained`: the scheme's explained_failures, and of them
    `deadline_failures` the deadline's doing when it ended the batch."""
    status = pod.get("status", {})
    phase = status.get("phase")
    if phase == "Succeeded":
        return None  # an episode that finished inside its eviction's grace period still counts
    evicted = eviction_message(pod)
    if evicted:
        return "evicted: %s" % evicted
    if status.get("reason") in explained:
        if cut_short and status["reason"] in deadline_failures:
            return "%s (%s: %s)" % (cut_short, status["reason"], status.get("message"))
        return "%s: %s" % (status["reason"], status.get("message"))
    container = (status.get("containerStatuses") or [{}])[0]
    state = container.get("state") or {}
    if "terminated" in state:
        code = state["terminated"].get("exitCode")
        if cut_short and (pod["metadata"].get("deletionTimestamp") or code in (128 + 9, 128 + 15)):
            # SIGTERM or SIGKILL, as its pod went (a Job's) or its process was killed (the local backend's)
            return "%s (exit code %s: killed at the deadline)" % (cut_short, code)
        detail = last_line(log)
        said = kubelet_reason(state["terminated"])
        if said:
            return "%s (exit code %s%s)" % (said, code, "; last line: %s" % detail if detail else "")
        return "crashed: %s%s" % (exit_code_words(code), " (%s)" % detail if detail else "")
    waiting = (state.get("waiting") or {}).get("reason")
    unfinished = "pod phase %s%s" % (phase, ", container %s" % waiting if waiting else "")
    return "%s (%s)" % (cut_short, unfinished) if cut_short else "did not finish: " + unfinished


def sample_events(pod, log, scheme):
    """A custom episode's (ready, reward, source) or raises EpisodeInvalid naming the malformation.

    Lines that are not JSON objects are the episode's own output and are ignored; a line that
    starts like an object but does not parse, or an event without the protocol's fields, is
    malformed.
    """
    name = pod["metadata"]["name"]
    message = termination_message(pod)
    events, source = None, "log"
    if message.strip():
        try:
            events = [json.loads(line) for line in message.splitlines() if line.strip()]
            source = "termination-message"
        except ValueError:
            events = None
    if events is None and log is None:
        raise EpisodeInvalid("no events: the pod was deleted before its log could be read (e.g. after an eviction) "
                             "and left no termination message; write the events to /dev/termination-log as well")
    if events is None:
        events = []
        for number, line in enumerate(log.splitlines(), 1):
            # The episode's own output is ignored, even when it looks like an object (a Python
            # dict printed with print()); a line that names "event" but does not parse is a
            # broken event.
            try:
                events.append(json.loads(line))
            except ValueError:
                if '"event"' in line:
                    raise EpisodeInvalid("malformed events: log line %d names \"event\" but is not valid JSON"
                                         % number) from None
    events = [event for event in events if isinstance(event, dict) and "event" in event]
    found = {kind: [e for e in events if e.get("event") == kind] for kind in ("ready", "reward")}
    if not found["ready"]:
        raise EpisodeInvalid((rotated_log(events, log) if source == "log" and scheme.kubelet_logs else None)
                             or "never ready: no ready event")
    if not found["reward"]:
        raise EpisodeInvalid("no reward: the episode was ready but emitted no reward event")
    for kind in ("ready", "reward"):
        if len(found[kind]) != 1:
            raise EpisodeInvalid("malformed events: %d %s events" % (len(found[kind]), kind))
        event = found[kind][0]
        if event.get("episode_id") != name:
            raise EpisodeInvalid("malformed events: %s episode_id %r is not the pod name" % (kind, event.get("episode_id")))
        if isinstance(event.get("at"), bool) or not isinstance(event.get("at"), (int, float)):
            raise EpisodeInvalid("malformed events: %s has no numeric 'at'" % kind)
    reward = found["reward"][0].get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward or abs(reward) == float("inf"):
        raise EpisodeInvalid("malformed reward: %r is not a finite number" % (reward,))
    return found["ready"][0], found["reward"][0], source


def index_verdict(index, tried, job_created, job_finished, observed, scheme, cut_short=None):
    """One custom episode's verdict from its attempts so far ([(pod, log)], any order): (its
    sample row or None, [{"pod", "reason"}] of every attempt that is not its sample). The
    batch's validation and the stream (--stream) both ask this, so they agree."""
    tried = sorted(tried, key=lambda item: by_creation(item[0]))
    # Every attempt is looked at: creation times are whole seconds, so their order within
    # a second is unknown, and a failed attempt must be listed whatever its place.
    reasons, sample = [], None
    for pod, log in tried:
        reason = attempt_failure(pod, log, cut_short, scheme.explained_failures, scheme.deadline_failures)
        if reason is None:
            try:
                ready, reward, source = sample_events(pod, log, scheme)
            except EpisodeInvalid as problem:
                reason = str(problem)
            else:
                if sample is None:
                    sample = episode_row(pod, ready, reward, job_created, (observed or {}).get(pod["metadata"]["name"]),
                                         source, job_finished, scheme)
                    sample["index"] = index
                    sample["reward_fields"] = {k: v for k, v in reward.items()
                                               if k not in ("event", "at", "episode_id", "reward")}
                continue
        reasons.append({"pod": pod["metadata"]["name"], "reason": reason, **attempt_span(pod)})
    if sample is not None:
        sample["failed_attempts"] = reasons
    return sample, reasons


def attempt_span(pod):
    """When an attempt that gave no sample was created and when its container ended (Unix seconds,
    the API server's and the kubelet's clocks: whole seconds on a cluster; None when not known, as
    for a pod still running when it was saved): the timeline draws the attempt from them."""
    ended = pod["metadata"].get("deletionTimestamp")
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        ended = ((status.get("state") or {}).get("terminated") or {}).get("finishedAt") or ended
    created = pod["metadata"].get("creationTimestamp")
    return {"created_at": parse_k8s_time(created) if created else None,
            "ended_at": parse_k8s_time(ended) if ended else None}


CUT_SHORT_BY_DEADLINE = "cut short by the deadline"  # an attempt the deadline ended
NEVER_STARTED_BY_DEADLINE = "never started: the deadline came first"  # an episode whose turn came after it


def ended_by_deadline(failure):
    """Whether an infrastructure failure (no_sample's) is the deadline's doing."""
    return failure["reason"].startswith((CUT_SHORT_BY_DEADLINE, NEVER_STARTED_BY_DEADLINE))


def no_sample(index, reasons, deadline=None):
    """An episode with no sample: an infrastructure failure, its last attempt's reason first; one
    that never started is named so, with the deadline that came first when there was one."""
    if reasons:
        return {"index": index, "reason": reasons[-1]["reason"], "attempts": reasons}
    return {"index": index, "reason": "%s (%s)" % (NEVER_STARTED_BY_DEADLINE, deadline) if deadline else
            "no pod ran for this episode (see events.txt)", "attempts": reasons}


def collect_samples(pods, logs, job, count, observed=None, scheme=None):
    """Custom episodes: every index is a sample (ready and a numeric reward, whatever its value)
    or an infrastructure failure (never ready, crashed, evicted, malformed), never both.

    Retried indexes have several pods; one sample counts (the first by creation), and every
    failed attempt is listed with its reason.
    """
    scheme = scheme or POD_SCHEME
    job_created = parse_k8s_time(job["metadata"]["creationTimestamp"])
    job_finished = job_finished_time(job)
    cut_short = deadline = exceeded = None
    # FailureTarget comes first (the Job controller then ends the pods, and only then sets Failed)
    condition = next((c for c in (job_condition(job, "FailureTarget"), job_condition(job, "Failed"))
                      if c.get("reason") == "DeadlineExceeded"), None)
    if condition is not None:
        seconds = job.get("spec", {}).get("activeDeadlineSeconds")
        deadline = "%s, %s s, from --timeout" % ("the Job's activeDeadlineSeconds" if job.get("kind", "Job") == "Job"
                                                 else "the batch's", seconds)
        cut_short = "%s (%s)" % (CUT_SHORT_BY_DEADLINE, deadline)
        exceeded = {"seconds": seconds, "at": parse_k8s_time(condition["lastTransitionTime"])
                    if condition.get("lastTransitionTime") else None}
    attempts = collections.defaultdict(list)
    for position, (pod, log) in enumerate(zip(pods, logs)):
        index = pod_index(pod)
        attempts[position if index is None else index].append((pod, log))
    samples, failures = [], []
    for index in range(count):
        sample, reasons = index_verdict(index, attempts.get(index, []), job_created, job_finished, observed, scheme,
                                        cut_short)
        if sample is not None:
            samples.append(sample)
        else:
            failures.append(no_sample(index, reasons, deadline))
    rewards = [row["reward"] for row in samples]
    return {"episodes": count, "successful_episodes": len(samples), "reward_sum": sum(rewards),
            "rewards": reward_stats(rewards), "infrastructure_failures": failures, "deadline_exceeded": exceeded,
            **batch_summary(samples, scheme), "pods": samples}


def task_entry(index, row, failure):
    """One task's entry (results.json's `tasks`, a streamed line): its reward, or null with its
    infrastructure failure's reason; which episode (pod or claim) gave it; how many attempts
    were made."""
    failure = failure or {}
    return {"task": index, "reward": row["reward"] if row else None,
            "episode": episode_name(row) if row else None,
            "attempts": 1 + len(row.get("failed_attempts") or []) if row else len(failure.get("attempts") or []),
            "infrastructure_failure": None if row else failure.get("reason")}


def episode_name(row):
    """What names an episode: its claim (a warm-pool episode's EPISODE_ID), else its pod."""
    return row.get("claim") or row.get("pod")


def results_by_task(report):
    """With --tasks: one entry per task, in task order (what a training loop reads)."""
    rows = {row["index"]: row for row in report["pods"]}
    failures = {failure["index"]: failure for failure in report["infrastructure_failures"]}
    return [task_entry(index, rows.get(index), failures.get(index)) for index in range(report["episodes"])]


def reward_stats(rewards):
    return {"count": len(rewards), "sum": sum(rewards), "mean": statistics.fmean(rewards) if rewards else None,
            "min": min(rewards, default=None), "max": max(rewards, default=None)}


def phase_statistics(rows, scheme):
    """Every phase's definition and statistics over a set of episode rows."""
    phases = {}
    for name in scheme.phases:
        values = [row["phases"][name] for row in rows if row["phases"][name] is not None]
        reasons = collections.Counter(row["phase_notes"][name] for row in rows if name in row["phase_notes"])
        bounds = [row["phase_bounds"][name] for row in rows if name in (row.get("phase_bounds") or {})]
        phases[name] = {**phase_definition(name, scheme), **batch_stats(values),
                        "missing": sum(reasons.values()), "missing_reasons": dict(reasons),
                        # episodes whose duration is only bounded (measured negative), and their largest bound
                        "bounded": len(bounds), "bounded_below_seconds": max(bounds) if bounds else None}
    return phases


def batch_summary(rows, scheme=None):
    """What a set of episode rows says about the batch: the tutorial's batch and startup
    metrics (pod_to_ready_* or the scheme's own), episodes per node, image IDs, every phase's
    statistics, clock skew. Metrics of an empty set are None."""
    scheme = scheme or POD_SCHEME
    startup_metric = scheme.startup_metric
    startup = [row[startup_metric + "_seconds"] for row in rows]
    phases = phase_statistics(rows, scheme)
    skew = clock_skew_summary(rows)
    # The headline figures compare the episode's clock with the API server's: with a skewed
    # episode clock they would be wrong (even negative), so they are withheld, never reported.
    trusted = skew["headline_withheld"] is None
    return {
        "batch_to_all_ready_seconds": max((row["batch_to_ready_seconds"] for row in rows), default=None)
        if trusted else None,
        "batch_to_all_rewards_seconds": max((row["batch_to_reward_seconds"] for row in rows), default=None)
        if trusted else None,
        startup_metric + "_p50_seconds": percentile(startup, 0.5) if startup and trusted else None,
        startup_metric + "_p95_seconds": percentile(startup, 0.95) if startup and trusted else None,
        startup_metric + "_max_seconds": max(startup, default=None) if trusted else None,
        "nodes": dict(sorted(collections.Counter(row["node"] for row in rows).items())),
        "image_ids": sorted({str(row["image_id"]) for row in rows}),
        "phases": phases,
        "clock_skew": skew,
    }


def collect(pods, logs, job, count, observed=None, scheme=None):
    """Validate every episode; return the results (summary + per-episode rows).

    Raises EpisodeInvalid listing every failed check: a partial batch is never a result.
    `observed` maps pod names to times seen while the pods ran (see episode_times).
    """
    observed = observed or {}
    if len(pods) != count:
        evicted = ["pod %s was evicted (%s) and replaced" % (pod["metadata"]["name"], message)
                   for pod, message in ((pod, eviction_message(pod)) for pod in pods) if message]
        raise EpisodeInvalid("expected %d pods for %d episodes, found %d%s; inspect pods.json for "
                             "failures or replacements" % (count, count, len(pods),
                                                           ": " + "; ".join(evicted) if evicted else ""))
    job_created = parse_k8s_time(job["metadata"]["creationTimestamp"])
    job_finished = job_finished_time(job)
    rows, problems = [], []
    for pod, log in zip(pods, logs):
        try:
            rows.append(validate_episode(pod, log, job_created, observed.get(pod["metadata"]["name"]), job_finished,
                                         scheme))
        except EpisodeInvalid as problem:
            problems.append(str(problem))
    if problems:
        raise EpisodeInvalid("\n".join(problems))
    return {"episodes": count, "successful_episodes": len(rows), "reward_sum": sum(row["reward"] for row in rows),
            **batch_summary(rows, scheme), "pods": rows}


# Which kernel each episode ran on. A RuntimeClass name is taken as meant for a sandbox unless it
# names a plain OCI runtime, which shares the node's kernel by design (runc, crun, youki): then its
# episodes sharing the node's kernel is no finding, only a fact on the record.
PLAIN_RUNTIMES = ("runc", "crun", "youki")


def sandbox_report(log):
    """The sandbox probe's event in an episode's log (SANDBOX_PROBE_PROGRAM), or None."""
    for line in (log or "").splitlines():
        if line.startswith('{"event": "sandbox"'):
            try:
                event = json.loads(line)
            except ValueError:
                return None
            return event if isinstance(event, dict) else None
    return None


def episode_kernel(report, node_kernel):
    """One episode's kernel record: what its sandbox reported against its node's kernelVersion.
    shared_node_kernel is None when either is unknown (no probe event, or a node not read)."""
    release = (report or {}).get("kernel_release")
    return {"release": release, "proc_version": (report or {}).get("proc_version"), "node_kernel": node_kernel,
            "shared_node_kernel": None if release is None or node_kernel is None else release == node_kernel}


def isolation_summary(rows, runtime):
    """The run's verdict on its sandboxes from its rows' kernel records: `separate-kernel` (every
    episode reported a kernel other than its node's), `node-kernel` (every one shared it), `mixed`,
    or `unknown` (no episode could be compared); the one-line finding when a RuntimeClass meant as a
    sandbox shared the node's kernel."""
    kernels = [row.get("kernel") or {} for row in rows]
    shared = [k for k in kernels if k.get("shared_node_kernel") is True]
    separate = [k for k in kernels if k.get("shared_node_kernel") is False]
    verdict = ("unknown" if not shared and not separate else "node-kernel" if not separate and len(shared) == len(rows)
               else "separate-kernel" if not shared and len(separate) == len(rows) else "mixed")
    summary = {"verdict": verdict, "runtime_class": runtime, "episodes": len(rows),
               "episodes_on_node_kernel": len(shared), "episodes_on_own_kernel": len(separate),
               "episodes_unknown": len(rows) - len(shared) - len(separate),
               "kernels_reported": sorted({k["release"] for k in kernels if k.get("release")}),
               "node_kernels": sorted({k["node_kernel"] for k in kernels if k.get("node_kernel")})}
    meant_as_sandbox = runtime is not None and runtime not in PLAIN_RUNTIMES
    if shared and meant_as_sandbox:
        which = "every episode" if len(shared) == len(rows) else "%d of %d episodes" % (len(shared), len(rows))
        summary["finding"] = "RuntimeClass %s: %s ran on the node's own kernel %s: this is not a sandbox on this " \
                             "cluster" % (runtime, which, ", ".join(summary["node_kernels"]))
    return summary


def add_kernels(rows, row_key, pods, logs, nodes, machine_kernel=None):
    """Each row's `kernel` record, from its pod's log and its node's kernelVersion (nodes.json);
    a local episode's node is this machine (machine_kernel, from run.json)."""
    node_kernels = {node.get("name"): node.get("kernel") for node in nodes if isinstance(node, dict)} \
        if isinstance(nodes, list) else {}
    reports = {pod["metadata"]["name"]: sandbox_report(termination_message(pod)) or sandbox_report(log)
               for pod, log in zip(pods, logs)}
    for row in rows:
        node = row.get("node") or ""
        node_kernel = machine_kernel if node.startswith("local:") else node_kernels.get(node)
        row["kernel"] = episode_kernel(reports.get(row.get(row_key)), node_kernel)


# What the kubelet said of each pod's image (its Pulling and Pulled events; v1.36's
# pkg/kubelet/images/image_manager.go, tests/fakecluster/ASSUMPTIONS.md "Image pulls"):
#   Successfully pulled image "<ref>" in <pull> (<total> including waiting). Image size: <n> bytes.
#   Container image "<ref>" already present on machine[ and can be accessed by the pod]
# <pull> is the runtime's pull alone, <total> also the wait behind the node's other pulls (the
# kubelet's puller serves one at a time by default, serializeImagePulls); both are Go durations
# truncated to the millisecond, measured on the node's monotonic clock. Every pod that found the
# image missing says "pulled", also those whose turn came once it was there.
PULLED_MESSAGE = re.compile(r'^Successfully pulled image "(?P<image>[^"]*)" in (?P<pull>\S+) \((?P<total>\S+) '
                            r'including waiting\)(?:\. Image size: (?P<size>\d+) bytes)?')
CACHED_MESSAGE = re.compile(r'^Container image "(?P<image>[^"]*)" already present on machine')
GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                     "h": 3600.0}


def go_duration_seconds(text):
    """A Go time.Duration's String() ("1m2.5s", "54ms", "0s") in seconds; None when it is not one."""
    parts = GO_DURATION_PART.findall(text or "")
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * GO_DURATION_UNITS[unit] for number, unit in parts)


def event_time(event):
    """When an Event last happened (Unix seconds; whole seconds for the kubelet's recorder)."""
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or \
        (event.get("metadata") or {}).get("creationTimestamp")
    return parse_rfc3339_nano(stamp) or 0.0


def events_table(events):
    """events.txt: one line per Event, oldest first, with its time in UTC."""
    lines = ["%-20s  %-7s  %-24s  %-40s  %s" % ("LAST SEEN (UTC)", "TYPE", "REASON", "OBJECT", "MESSAGE")]
    for event in events:
        target = event.get("involvedObject") or {}
        when = event_time(event)
        lines.append("%-20s  %-7s  %-24s  %-40s  %s" % (
            iso_micro(when)[:19] if when else "?", event.get("type", ""), event.get("reason", ""),
            "%s/%s" % ((target.get("kind") or "").lower(), target.get("name", "")),
            " ".join((event.get("message") or "").split())))
    return "\n".join(lines) + "\n"


def is_image_event(event):
    """An event the image pulls are read from: the kubelet's Pulling or Pulled of a pod (of the
    10,011 events of a 10,000-episode Job, none on kwok's nodes, two a pod on a real one)."""
    return event.get("reason") in ("Pulling", "Pulled") and (event.get("involvedObject") or {}).get("kind") == "Pod"


def image_pulls_by_pod(events):
    """{pod name: what the kubelet said of its image}: `pulled` (with the pull's own seconds, the
    seconds including the wait behind other pulls, and the image's size) or `cached` (already on
    the node), from its Pulled event; a pod without one is not in the map."""
    pulls = {}
    for event in events if isinstance(events, list) else []:
        target = event.get("involvedObject") or {}
        if target.get("kind") != "Pod" or event.get("reason") != "Pulled":
            continue
        message = event.get("message") or ""
        pulled, cached = PULLED_MESSAGE.match(message), CACHED_MESSAGE.match(message)
        if pulled:
            pulls[target.get("name")] = {
                "state": "pulled", "image": pulled.group("image"),
                "pull_seconds": go_duration_seconds(pulled.group("pull")),
                "pull_seconds_including_waiting": go_duration_seconds(pulled.group("total")),
                "image_size_bytes": int(pulled.group("size")) if pulled.group("size") else None}
        elif cached and pulls.get(target.get("name"), {}).get("state") != "pulled":
            pulls[target.get("name")] = {"state": "cached", "image": cached.group("image")}
    return pulls


def add_image_pulls(rows, events):
    """Each row's `image_pull` from its pod's Pulled event (events.json); `unknown` without one."""
    pulls = image_pulls_by_pod(events)
    for row in rows:
        row["image_pull"] = pulls.get(row.get("pod")) or {
            "state": "unknown", "why": "no Pulled event for this pod was saved" if isinstance(events, list)
            else "the folder has no events.json"}


def image_pull_summary(rows, startup_key="pod_to_ready_seconds"):
    """results.json's `image_pulls`: how many episodes' pods pulled their image, found it cached
    or cannot say, and P50/P95 of the pulls (the kubelet's own figures, ms precision); per image,
    the same with the nodes that pulled it and the startup (`startup_key`) of pulled and cached
    episodes apart; and, when the batch's startup figures mix pulled and cached episodes, a
    sentence that says so."""
    pulls = [row.get("image_pull") or {} for row in rows]
    pulled = [pull for pull in pulls if pull.get("state") == "pulled"]
    by_image = {}
    for row in rows:
        by_image.setdefault(row.get("image") or (row.get("image_pull") or {}).get("image") or "unknown", []).append(row)
    summary = dict(pull_counts(pulls), images=sorted({pull["image"] for pull in pulls if pull.get("image")}),
                   pull_seconds=batch_stats([p["pull_seconds"] for p in pulled if p.get("pull_seconds") is not None]),
                   pull_seconds_including_waiting=batch_stats([p["pull_seconds_including_waiting"] for p in pulled
                                                               if p.get("pull_seconds_including_waiting") is not None]),
                   by_image={image: image_pulls_of(group, startup_key) for image, group in by_image.items()})
    summary["mixed_startup"] = None if not (summary["pulled"] and summary["cached"]) else (
        "%s's figures mix %d episode(s) that pulled their image with %d that found it cached: by_image has each "
        "apart" % (startup_key.replace("_seconds", ""), summary["pulled"], summary["cached"]))
    summary["definition"] = {
        "source": "the kubelet's Pulled event of each episode's pod", "clock": "kubelet (monotonic)",
        "resolution_seconds": 0.001, "unit": "seconds", "pull_seconds": "the container runtime's pull of the image",
        "pull_seconds_including_waiting": "from the kubelet's pull request to the image being there, including the "
                                          "wait behind the node's other pulls of it",
        "by_image": "per image, as the episode's pod names it: its episodes, pulled / cached / unknown, the nodes "
                    "that pulled it, pull_seconds, and startup_seconds: %s of the pulled and of the cached episodes "
                    "apart" % startup_key}
    return summary


def pull_counts(pulls):
    """{"pulled", "cached", "unknown"}: how many of these image_pull records are each."""
    states = collections.Counter(pull.get("state") for pull in pulls)
    return {"pulled": states["pulled"], "cached": states["cached"],
            "unknown": len(pulls) - states["pulled"] - states["cached"]}


def image_pulls_of(rows, startup_key):
    """image_pulls.by_image's entry for one image's rows."""
    def state(row):
        return (row.get("image_pull") or {}).get("state")
    pulls = [row.get("image_pull") or {} for row in rows]
    return dict(episodes=len(rows), **pull_counts(pulls),
                pulled_on_nodes=sorted({row.get("node") for row in rows if state(row) == "pulled"} - {None}),
                pull_seconds=batch_stats([pull["pull_seconds"] for pull in pulls if pull.get("state") == "pulled"
                                          and pull.get("pull_seconds") is not None]),
                startup_seconds={wanted: batch_stats([row[startup_key] for row in rows if state(row) == wanted
                                                      and row.get(startup_key) is not None])
                                 for wanted in ("pulled", "cached")})


def node_summary(node):
    """What a node contributes to a result's meaning: versions, kernel, OS, capacity."""
    info = node.get("status", {}).get("nodeInfo", {})
    return {"name": node["metadata"]["name"], "kubelet": info.get("kubeletVersion"),
            "container_runtime": info.get("containerRuntimeVersion"), "kernel": info.get("kernelVersion"),
            "os": info.get("osImage"), "architecture": info.get("architecture"),
            "allocatable": node.get("status", {}).get("allocatable")}


def eviction_message(pod):
    """Why a pod was evicted (by the kubelet under node pressure, or through the Eviction
    API), or None when it was not."""
    status = pod.get("status", {})
    disruption = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"
                       and c.get("status") == "True"), None)
    if status.get("reason") == "Evicted" or (disruption and disruption.get("reason") in (
            "EvictionByEvictionAPI", "TerminationByKubelet", "DeletionByTaintManager")):
        return (status.get("message") or (disruption or {}).get("message") or "evicted").strip()
    return None


def kubelet_reason(terminated):
    """The kubelet's own word for a terminated container when it says more than an exit code
    (OOMKilled: killed at its memory limit; StartError or ContainerCannotRun: the runtime could not
    start it, with the runtime's message), or None for a plain exit (reason Error or Completed)."""
    reason = terminated.get("reason")
    if reason in (None, "", "Error", "Completed"):
        return None
    if reason == "OOMKilled":  # its message, if any, is the episode's own termination message
        return "OOMKilled: killed at its memory limit (limit %s)" % EPISODE_LIMITS["memory"]
    if reason == "Unknown":  # containerd's CRI: unknownExitReason, with its unknownExitCode 255
        return ("Unknown: the container runtime lost the container's exit status (its 255 is the runtime's, not the "
                "episode's; seen when containerd restarted after the container ended)")
    message = (terminated.get("message") or "").strip()
    return "%s%s" % (reason, ": " + last_line(message) if message else "")


def exit_code_words(code):
    """A container's exit code as words: 128 + N is how a runtime reports a process ended by
    signal N (137: SIGKILL, from the kernel's OOM killer, a runtime or a person; 143: SIGTERM)."""
    if isinstance(code, int) and 128 < code < 128 + 65:
        try:
            return "exit code %d (128 + %s: killed by a signal)" % (code, signal.Signals(code - 128).name)
        except ValueError:
            pass
    return "exit code %s" % code


def describe_failed_pods(pods, logs, explained=()):
    """One phrase per failed pod: name, eviction or exit code (or, for a reason in `explained`,
    the scheme's explained_failures, its message), and the last line of its log.
    An evicted pod is named whatever phase it was last seen in: the Job controller counts a
    pod deleted while it runs as failed at once, so a batch can fail while the evicted pod is
    still Running in its grace period (tests/fakecluster/ASSUMPTIONS.md, "Job controller")."""
    phrases = []
    for pod, log in zip(pods, logs):
        evicted = eviction_message(pod)
        if evicted:
            phase = pod.get("status", {}).get("phase")
            after = {"Failed": "", "Succeeded": "; it finished anyway inside its grace period, but the Job had counted "
                                                "it as failed when it was deleted"}.get(
                phase, "; it was still %s, in its grace period" % phase)
            phrases.append("pod %s was evicted (%s)%s" % (pod["metadata"]["name"], evicted, after))
            continue
        if pod.get("status", {}).get("phase") != "Failed":
            continue
        if pod["status"].get("reason") in explained:
            phrases.append("episode %s: %s" % (pod["metadata"]["name"], pod["status"].get("message")))
            continue
        statuses = pod["status"].get("containerStatuses") or [{}]
        terminated = statuses[0].get("state", {}).get("terminated")
        if terminated is None:
            continue  # it never ran: why_not_started says why
        phrase = "pod %s ended with %s" % (pod["metadata"]["name"], exit_code_words(terminated.get("exitCode", "?")))
        said = kubelet_reason(terminated)
        if said:
            phrase += ", %s" % said
        if last_line(log):
            phrase += " (%s)" % last_line(log)
        phrases.append(phrase)
    return phrases


# ============================================================================
# Cost: reserved capacity per reward (results.json's `cost`), pure
# ============================================================================
# What a batch held of its cluster: each pod's effective request (as the scheduler counts it)
# x the time it held its node. Kubernetes timestamps: whole seconds, API server and kubelet
# clocks. Divided per verified reward; the RuntimeClass's Pod overhead shown apart.

GIB = 2.0 ** 30
COST_RESOURCES = ("cpu", "memory")
COST_DEFINITION = ("reserved = sum over the run's pods of effective request x time held; effective request as the "
                   "scheduler counts it (app containers' requests, a limit standing in for a missing request, "
                   "sidecar init containers added, each other init container's request a floor, plus "
                   "spec.overhead: the RuntimeClass's podFixed); time held from PodScheduled=True to the end of "
                   "its last container, or its deletion, or the run's end for a pod still running then; a pod "
                   "never scheduled holds nothing. CPU in core-seconds, memory in GiB-seconds; per reward: "
                   "divided by the verified rewards (successful episodes). Whole-second timestamps: a pod held "
                   "for a few seconds is known to about one second, so short episodes' figures are coarse")


def container_request(container, resource):
    """A container's request, in cores or bytes: the API server defaults a missing request to
    the limit (pkg/apis/core/v1/defaults.go), and an absent one is 0."""
    resources = container.get("resources") or {}
    value = (resources.get("requests") or {}).get(resource)
    if value is None:
        value = (resources.get("limits") or {}).get(resource)
    return parse_quantity(value) if value is not None else 0.0


def effective_request(pod_spec):
    """({resource: amount}, {resource: overhead}) the scheduler reserves for a pod
    (k8s.io/component-helpers resource.PodRequests): app containers plus restartable init
    containers (sidecars), at least each other init container plus the sidecars started
    before it, plus spec.overhead."""
    total, overhead = {}, {}
    for resource in COST_RESOURCES:
        sidecars, floor = 0.0, 0.0
        for container in pod_spec.get("initContainers") or []:
            if container.get("restartPolicy") == "Always":
                sidecars += container_request(container, resource)
            else:
                floor = max(floor, container_request(container, resource) + sidecars)
        apps = sum(container_request(container, resource) for container in pod_spec.get("containers") or [])
        overhead[resource] = parse_quantity((pod_spec.get("overhead") or {}).get(resource, 0))
        total[resource] = max(apps + sidecars, floor) + overhead[resource]
    return total, overhead


def held_interval(pod, run_end):
    """(from, to) in Unix seconds while the pod held its node, or None when it never did."""
    start, _ = condition_time(pod, "PodScheduled")
    if start is None:
        return None
    statuses = pod.get("status", {}).get("containerStatuses") or []
    finished = [parse_k8s_time(((status.get("state") or {}).get("terminated") or {}).get("finishedAt") or "")
                for status in statuses if ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")]
    if statuses and len(finished) == len(statuses):
        end = max(finished)
    elif pod["metadata"].get("deletionTimestamp"):
        end = parse_k8s_time(pod["metadata"]["deletionTimestamp"])
    else:
        end = run_end if run_end is not None else start
    return start, max(start, end)


def reserved_capacity(pods, run_end, split=None):
    """{share: {"cpu_seconds", "gib_seconds", "overhead_cpu_seconds", "overhead_gib_seconds", "pods"}}.
    split(pod, start, end) -> [(share, from, to)] divides a pod's held time between shares (a
    warm pool's idle and episode time); by default all of it is the episodes'."""
    shares = {}
    for pod in pods:
        interval = held_interval(pod, run_end)
        if interval is None:
            continue
        request, overhead = effective_request(pod.get("spec") or {})
        parts = split(pod, *interval) if split else [("episodes", *interval)]
        for share, start, end in parts:
            held = max(0.0, end - start)
            entry = shares.setdefault(share, {"cpu_seconds": 0.0, "gib_seconds": 0.0, "overhead_cpu_seconds": 0.0,
                                              "overhead_gib_seconds": 0.0, "pods": 0})
            entry["cpu_seconds"] += request["cpu"] * held
            entry["gib_seconds"] += request["memory"] / GIB * held
            entry["overhead_cpu_seconds"] += overhead["cpu"] * held
            entry["overhead_gib_seconds"] += overhead["memory"] / GIB * held
            entry["pods"] += 1
    return shares


def used_cpu_seconds(rows):
    """The episodes' own CPU time (first statement -> reward, from the container's cgroup counter
    the built-in episode reports as `cpu_usec`), summed; None unless every measured row has it."""
    values = [row.get("cpu_usec") for row in rows]
    if not values or any(not isinstance(value, int) for value in values):
        return None
    return sum(values) / 1e6


def run_prices(flags):
    """(price per CPU-hour, price per GiB-hour) the run was given, each None when not."""
    return flags.get("price_cpu_hour"), flags.get("price_gib_hour")


def cost_summary(shares, rewards, prices, extra=None, used_cpu=None):
    """results.json's `cost`: the shares, their total, per verified reward, the overhead's and
    the idle share's fractions, and (only when both prices were given) a price per 1,000 rewards."""
    keys = ("cpu_seconds", "gib_seconds", "overhead_cpu_seconds", "overhead_gib_seconds")
    total = {key: sum(share[key] for share in shares.values()) for key in keys}

    def fraction(part, whole):
        return part / whole if whole else None

    per_reward = {key: total[key] / rewards for key in ("cpu_seconds", "gib_seconds")} if rewards else None
    summary = {"definition": COST_DEFINITION, "clock": "API server (PodScheduled, deletion) and kubelet (container "
                                                        "finishedAt) timestamps", "resolution_seconds": 1.0,
               "reserved": {key: round(value, 3) for key, value in total.items()},
               "shares": {name: {key: round(value, 3) if isinstance(value, float) else value
                                 for key, value in share.items()} for name, share in shares.items()},
               "rewards": rewards,
               "per_reward": {key: round(value, 4) for key, value in per_reward.items()} if per_reward else None,
               "overhead_share": fraction(total["overhead_cpu_seconds"], total["cpu_seconds"]),
               "overhead_share_memory": fraction(total["overhead_gib_seconds"], total["gib_seconds"]),
               "idle_share": fraction(shares.get("idle", {}).get("cpu_seconds", 0.0), total["cpu_seconds"]),
               "used": None if used_cpu is None else {
                   "cpu_seconds": round(used_cpu, 6),
                   "utilisation": round(used_cpu / total["cpu_seconds"], 4) if total["cpu_seconds"] else None,
                   "definition": "the episodes' own CPU time from their first statement to their reward, read "
                                 "from each container's cgroup counter (cgroup v2 cpu.stat usage_usec, v1 "
                                 "cpuacct.usage; microseconds), summed; utilisation = used / reserved CPU (the "
                                 "reserved time also covers the sandbox's start and end)"},
               "used_note": None if used_cpu is not None else (
                   "not measured: the episodes did not report a cgroup CPU counter (custom episodes, or no "
                   "cgroup visible in the container)"),
               "price": None}
    cpu_price, gib_price = prices
    if cpu_price is not None and gib_price is not None and per_reward:
        summary["price"] = {
            "cpu_hour": cpu_price, "gib_hour": gib_price,
            "per_1000_rewards": round(1000 * (per_reward["cpu_seconds"] * cpu_price +
                                              per_reward["gib_seconds"] * gib_price) / 3600.0, 6),
            "definition": "1,000 x (CPU-s per reward x price per CPU-hour + GiB-s per reward x price per GiB-hour) / "
                          "3600, in the currency of the prices given"}
    summary.update(extra or {})
    return summary


# ============================================================================
# Preflight: how many episode pods fit the usable nodes at once, pure
# ============================================================================

def tolerates(tolerations, taint):
    """Kubernetes' Toleration.ToleratesTaint: an empty effect matches every effect, and
    `Exists` without a key matches every taint."""
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator", "Equal") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def usable_nodes(nodes, runtime_class):
    """Nodes the episode pods can land on: schedulable, Ready, every NoSchedule/NoExecute taint
    tolerated, and matching the RuntimeClass's nodeSelector. Admission adds the RuntimeClass's
    `scheduling.tolerations` to every pod (tests/fakecluster/ASSUMPTIONS.md, fact 31), so dedicated
    sandbox pools tainted for that class count."""
    scheduling = (runtime_class or {}).get("scheduling") or {}
    selector = scheduling.get("nodeSelector") or {}
    tolerations = scheduling.get("tolerations") or []
    usable = []
    for node in nodes:
        labels = node["metadata"].get("labels", {})
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in node.get("status", {}).get("conditions", []))
        untolerated = [t for t in node.get("spec", {}).get("taints") or []
                       if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)]
        if ready and not untolerated and not node.get("spec", {}).get("unschedulable") and all(
                labels.get(key) == value for key, value in selector.items()):
            usable.append(node)
    return usable


# resource.Quantity's suffixes (kubernetes/apimachinery pkg/api/resource/quantity.go): binary SI,
# decimal SI, and a decimal exponent ("1e3", "1E3"; "1E" alone is exa).
QUANTITY_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
                     "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
                     "E": 1e18}


def parse_quantity(value):
    """Kubernetes quantity -> float ('100m' -> 0.1 CPU, '64Mi' -> bytes, '2Pi', '500u', '1e3')."""
    match = re.match(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[A-Za-z]*)$", str(value).strip())
    if not match:
        raise ValueError("not a Kubernetes quantity: %r" % (value,))
    number, suffix = match.groups()
    if re.match(r"^[eE][+-]?[0-9]+$", suffix):
        return float(number + suffix)
    if suffix not in QUANTITY_SUFFIXES:
        raise ValueError("not a Kubernetes quantity: %r (unknown suffix %r)" % (value, suffix))
    return float(number) * QUANTITY_SUFFIXES[suffix]


def mebibytes(value):
    text = "%.0fMi" % (value / 2 ** 20)
    return text + (" (%.1fGiB)" % (value / 2 ** 30) if value >= 2 ** 30 else "")


def preflight(parallelism, runtime_class, nodes):
    """Can `parallelism` episode pods (requests plus Pod overhead) run at once on the usable
    nodes' allocatable capacity? Returns (pods that fit at once, the arithmetic as text)."""
    overhead = (runtime_class or {}).get("overhead", {}).get("podFixed", {})
    cpu = parse_quantity(EPISODE_REQUESTS["cpu"]) + parse_quantity(overhead.get("cpu", 0))
    memory = parse_quantity(EPISODE_REQUESTS["memory"]) + parse_quantity(overhead.get("memory", 0))
    usable = usable_nodes(nodes, runtime_class)
    fit = 0
    for node in usable:
        allocatable = node["status"].get("allocatable", {})
        fit += int(min(parse_quantity(allocatable.get("cpu", 0)) // cpu if cpu else 10 ** 9,
                       parse_quantity(allocatable.get("memory", 0)) // memory if memory else 10 ** 9,
                       parse_quantity(allocatable.get("pods", 110))))
    lines = ["each episode pod requests %s CPU + %s memory" % (EPISODE_REQUESTS["cpu"], EPISODE_REQUESTS["memory"])]
    if overhead:
        lines.append("plus the RuntimeClass's Pod overhead %s CPU + %s memory (overhead alone: %s x %d = %s)" % (
            overhead.get("cpu", "0"), overhead.get("memory", "0"), overhead.get("memory", "0"), parallelism,
            mebibytes(parse_quantity(overhead.get("memory", 0)) * parallelism)))
    lines.append("%d at once need %.0fm CPU and %s memory" % (parallelism, cpu * parallelism * 1000,
                                                              mebibytes(memory * parallelism)))
    lines.append("%d usable node(s) of %d fit %d such pods at once (allocatable capacity, not counting other "
                 "pods' requests)" % (len(usable), len(nodes), fit))
    return fit, "; ".join(lines)


# How the kubelet names an image in a node's status.images, and how a task's reference is made
# comparable with it (tests/fakecluster/ASSUMPTIONS.md, "Images on a node"): distribution/
# reference's ParseDockerRef, the normalization the kubelet and containerd apply.
DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = ("index.docker.io",)
NODE_STATUS_MAX_IMAGES = 50  # the kubelet's default nodeStatusMaxImages: the largest 50 images only


def normalized_image(reference):
    """An image reference as a node's status.images names it: "python:3.12" ->
    "docker.io/library/python:3.12", "ghcr.io/o/r" -> "ghcr.io/o/r:latest"; a digest wins over
    a tag (name@sha256:...)."""
    first, slash, rest = reference.partition("/")
    if not slash:
        domain, remote = DOCKER_HUB, "library/" + reference
    elif first == "localhost" or any(ch in first for ch in ".:") or first.lower() != first:
        domain, remote = (DOCKER_HUB if first in DOCKER_HUB_ALIASES else first), rest
    else:
        domain, remote = DOCKER_HUB, reference
    if domain == DOCKER_HUB and "/" not in remote:
        remote = "library/" + remote
    name, at, digest = remote.partition("@")
    last = name.rsplit("/", 1)[-1]
    if at:
        name = name[:len(name) - len(last)] + last.split(":", 1)[0]
        return "%s/%s@%s" % (domain, name, digest)
    return "%s/%s%s" % (domain, name, "" if ":" in last else ":latest")


def image_holders(images, nodes):
    """{image: [names of the nodes whose status.images lists it]}, for each image of the batch.
    A node lists its NODE_STATUS_MAX_IMAGES largest images only: a node with that many may hold
    an image it does not list (image_holders_note)."""
    names_by_node = {node["metadata"]["name"]: {name for image in node.get("status", {}).get("images") or []
                                                for name in image.get("names") or []} for node in nodes}
    return {image: sorted(node for node, names in names_by_node.items() if normalized_image(image) in names)
            for image in images}


def image_holders_note(nodes):
    """What a node not listing an image may still mean, when a node lists as many as it reports."""
    full = sorted(node["metadata"]["name"] for node in nodes
                  if len(node.get("status", {}).get("images") or []) >= NODE_STATUS_MAX_IMAGES)
    if not full:
        return None
    return ("node(s) %s list %d images, as many as a kubelet reports by default: they may hold an image they do not "
            "list" % (some_of(full), NODE_STATUS_MAX_IMAGES))


# ============================================================================
# The results folder: results.json from the saved files, and nothing else
# ============================================================================


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
        "preflight": run_info.get("preflight"),
        "images": run_info.get("images"),
        "cache_state": {"state": "uncontrolled",
                        "detail": "no pre-pull or prewarm; whether the image was cached on each node is not known"},
    }


def results_from_folder(output):
    """The whole results.json from the files saved in an output folder, and nothing else.

    A folder of several rounds pools its round-N/ folders. Raises EpisodeInvalid when an
    episode fails validation. The backend named in run.json reads its own records (and says
    what only it has); an admission gate, when the run had one, says which pods are results.
    """
    run_info = read_json(output / "run.json", "the run record")
    if run_info.get("rounds", 1) > 1:
        return pool_rounds([results_from_folder(output / ("round-%d" % number))
                            for number in range(1, run_info["rounds"] + 1)], run_info)
    backend = backend_named(run_info.get("backend"), str(output / "run.json"))
    flags = run_info["flags"]
    expected = run_info.get("expected_episodes", flags["count"])
    gate = saved_admission(output)
    validate = collect_samples if run_info.get("custom_episode") else collect
    parts = run_info.get("image_parts")  # a batch across images: a Job each, in image-N/
    folders = [output / part["folder"] for part in parts] if parts else [output]
    records, pods, logs, observed, reports, jobs = [], [], [], {}, [], []
    for folder in folders:
        job = read_json(folder / "job.json", "the saved Job")
        # held once for all the results' reading (10,000 pods' equal parts shared): read, never changed
        part_records = read_json(folder / backend.episodes_file, "the saved episodes", shape=list,
                                 decode=API_OBJECTS.decode)
        part_pods = part_records
        # None: no log was saved (the pod was gone from the API before it could be read)
        part_logs = [log_text((folder / (pod["metadata"]["name"] + ".log")).read_bytes())
                     if (folder / (pod["metadata"]["name"] + ".log")).exists() else None for pod in part_pods]
        part_observed = read_saved(folder / "observed.json") or {}
        if gate is not None:
            part_pods, part_logs = gate.results_pods(part_pods, part_logs, expected, part_observed)
        part_expected = len(parts[len(reports)]["task_indexes"]) if parts else expected
        reports.append(validate(part_pods, part_logs, job, part_expected, part_observed, backend.scheme))
        jobs.append(job)
        records += part_records
        pods += part_pods
        logs += part_logs
        observed.update(part_observed)
    report = merge_image_parts(reports, jobs, parts, expected, backend.scheme) if parts else reports[0]
    del reports
    report.update(backend=backend.name, context=run_info["context"], namespace=run_info["namespace"], image=flags["image"],
                  runtime=flags["runtime"], parallelism=flags["parallelism"],
                  cache_state="uncontrolled", client_job_complete_seconds=run_info.get("client_job_complete_seconds"))
    if run_info.get("custom_episode"):
        report["episode_program"] = {"file": flags.get("episode"), "sha256": run_info.get("episode_sha256"),
                                     "tasks": flags.get("tasks")}
        if flags.get("tasks"):
            report["tasks"] = results_by_task(report)
    nodes = saved_nodes(folders)
    report["run"] = run_metadata(run_info, read_saved(output / "version.json"),
                                 read_saved(output / "runtimeclass.json"), nodes)
    if parts:
        report["image_parts"] = [{key: part[key] for key in ("folder", "image", "job", "parallelism")}
                                 for part in parts]
    add_kernels(report["pods"], backend.scheme.row_key, pods, logs, nodes, run_info.get("machine_kernel"))
    report["isolation"] = isolation_summary(report["pods"], flags["runtime"])
    if backend.uses_cluster:  # a batch across images read its namespace's events once, for the round
        add_image_pulls(report["pods"], read_saved(output / "events.json", API_OBJECTS.decode, is_image_event))
        report["image_pulls"] = image_pull_summary(report["pods"], backend.scheme.startup_metric + "_seconds")
    if "round" in run_info:
        report["round"] = run_info["round"]
    backend.describe_results(output, report, observed)
    report["cost"] = backend.cost(output, report, run_prices(flags), records)
    if gate is not None:
        gate.describe_results(report)
    if any((folder / "logs.json").exists() for folder in folders):
        report["log_archive"] = log_archive_summary(*folders)
    report["pods"] = report.pop("pods")  # per-episode rows last, as in the tutorial
    return report


def saved_nodes(folders):
    """nodes.json of one folder, or of each Job's folder of a batch across images, once each."""
    found, nodes = {}, None
    for folder in folders:
        listed = read_saved(folder / "nodes.json")
        if not isinstance(listed, list):
            return listed if len(folders) == 1 else nodes
        nodes = nodes or []
        for node in listed:
            if node.get("name") not in found:
                found[node.get("name")] = node
                nodes.append(node)
    return nodes


def merge_image_parts(reports, jobs, parts, count, scheme):
    """One round of a batch across images from its Jobs' own results (collect_samples of each, its
    episodes numbered within its Job): every sample and failure under its task's index, in task
    order, and the batch figures measured from the earliest Job's creation (each episode's
    batch_to_* moved by how much later its Job was created: whole seconds, the API server's)."""
    origin = min(parse_k8s_time(job["metadata"]["creationTimestamp"]) for job in jobs)
    samples, failures = [], []
    for report, job, part in zip(reports, jobs, parts):
        later = parse_k8s_time(job["metadata"]["creationTimestamp"]) - origin
        indexes = part["task_indexes"]
        for row in report["pods"]:
            row = dict(row, index=indexes[row["index"]])
            for key in ("batch_to_ready_seconds", "batch_to_reward_seconds"):
                if row.get(key) is not None:
                    row[key] += later
            samples.append(row)
        failures += [dict(failure, index=indexes[failure["index"]]) for failure in report["infrastructure_failures"]]
    samples.sort(key=lambda row: row["index"])
    failures.sort(key=lambda failure: failure["index"])
    exceeded = [report["deadline_exceeded"] for report in reports if report.get("deadline_exceeded")]
    rewards = [row["reward"] for row in samples]
    return {"episodes": count, "successful_episodes": len(samples), "reward_sum": sum(rewards),
            "rewards": reward_stats(rewards), "infrastructure_failures": failures,
            "deadline_exceeded": min(exceeded, key=lambda found: found.get("at") or 0) if exceeded else None,
            **batch_summary(samples, scheme), "pods": samples}


BATCH_KEYS = ("batch_to_all_ready_seconds", "batch_to_all_rewards_seconds", "client_job_complete_seconds")


def pool_rounds(rounds, run_info):
    """Several rounds as one result: batch times per round (in `rounds`), per-episode
    percentiles and phases pooled over every round's episodes (the tutorial's third column)."""
    rows = [dict(row, round=result["round"]) for result in rounds for row in result["pods"]]
    first = rounds[0]
    pooled = {"episodes": sum(result["episodes"] for result in rounds),
              "successful_episodes": sum(result["successful_episodes"] for result in rounds),
              "reward_sum": sum(result["reward_sum"] for result in rounds)}
    if "infrastructure_failures" in first:
        pooled.update(rewards=reward_stats([row["reward"] for row in rows]),
                      infrastructure_failures=[dict(failure, round=result["round"]) for result in rounds
                                               for failure in result["infrastructure_failures"]],
                      episode_program=first.get("episode_program"))
    pooled["rounds"] = [dict({key: result[key] for key in BATCH_KEYS}, round=result["round"],
                             episodes=result["episodes"], folder="round-%d" % result["round"]) for result in rounds]
    summary = batch_summary(rows, backend_of(first).scheme)
    for key in BATCH_KEYS[:2]:
        del summary[key]  # batch times are per round, in `rounds`
    pooled.update(summary)
    for key in ("context", "namespace", "image", "runtime", "parallelism", "cache_state"):
        pooled[key] = first[key]
    pooled["backend"] = first["backend"]
    pooled["run"] = dict(first["run"], rounds=run_info["rounds"])
    if all((result.get("cost") or {}).get("shares") is not None for result in rounds):
        shares = {}
        for result in rounds:
            for name, share in result["cost"]["shares"].items():
                entry = shares.setdefault(name, dict.fromkeys(share, 0))
                for key, value in share.items():
                    entry[key] += value
        pooled["cost"] = cost_summary(shares, pooled["successful_episodes"], run_prices(run_info.get("flags", {})))
    pooled["isolation"] = isolation_summary(rows, first["runtime"])
    if "image_pulls" in first:
        pooled["image_pulls"] = image_pull_summary(rows, backend_of(first).scheme.startup_metric + "_seconds")
    pooled["pods"] = rows
    return pooled


def summary_view(report):
    """What `run` prints: the tutorial's summary keys (batch times per round when there are
    rounds), the per-phase medians, and what the backend and the admission gate add."""
    backend = backend_of(report)
    metric = backend.scheme.startup_metric  # pod_to_ready (the tutorial's keys) or claim_to_ready
    keys = ("episodes", "successful_episodes", "reward_sum", "rewards", "rounds", "batch_to_all_ready_seconds",
            "batch_to_all_rewards_seconds", metric + "_p50_seconds", metric + "_p95_seconds", metric + "_max_seconds",
            "nodes", "image_ids", "context", "namespace", "image", "runtime", "parallelism", "cache_state",
            "client_job_complete_seconds")
    view = {key: report[key] for key in keys if key in report}
    view["phase_p50_seconds"] = {name: phase["p50"] for name, phase in report["phases"].items()}
    if "infrastructure_failures" in report:
        view["infrastructure_failures"] = len(report["infrastructure_failures"])
    if (report.get("image_pulls") or {}).get("mixed_startup"):
        view["startup_note"] = report["image_pulls"]["mixed_startup"]  # beside the figures it qualifies
    for part in (*GATES, backend):
        view.update(part.summary_view(report))
    return view


def log_archive_summary(*folders):
    """How many episode logs the folder holds (or a batch across images' Jobs' folders) and where
    they came from (logs.json)."""
    sources = {}
    for folder in folders:
        sources.update(read_saved(folder / "logs.json") or {})
    return {"logs": len(sources), "sources": dict(sorted(collections.Counter(
        source if not source.startswith("not available") else "not available" for source in sources.values()
    ).items())), "detail": "logs.json: the source of each <pod>.log"}


def write_results(folder, where, before_failing=lambda: None):
    """Validate the saved folder and write results.json and timeline.svg; on a failed check
    save the rest (before_failing), list every problem in validation-errors.txt and raise."""
    try:
        report = results_from_folder(folder)
    except EpisodeInvalid as problem:
        before_failing()
        problems = str(problem).splitlines()
        (folder / "validation-errors.txt").write_text(str(problem) + "\n")
        more = " (and %d more in validation-errors.txt)" % (len(problems) - 1) if len(problems) > 1 else ""
        raise BatchFailed("validation failed, no results.json written: %s%s; %s"
                          % (problems[0], more, where)) from None
    write_json(folder / "results.json", report)
    if timeline_drawable(report):
        (folder / "timeline.svg").write_text(timeline_svg([(folder.name, report)]))
    return report


def round_folder(output, number, rounds):
    """One round keeps the tutorial's flat folder; several rounds get round-N/ each."""
    return output if rounds == 1 else output / ("round-%d" % number)


def pool_round_folders(output, run_info, rounds):
    """After the last round: with several, the pooled results.json and one stacked timeline."""
    if len(rounds) == 1:
        return rounds[0]
    run_info["rounds"] = len(rounds)
    write_json(output / "run.json", run_info)
    report = results_from_folder(output)
    write_json(output / "results.json", report)
    drawable = [("round %d" % r["round"], r) for r in rounds if timeline_drawable(r)]
    if drawable:
        (output / "timeline.svg").write_text(timeline_svg(drawable))
    return report


# ============================================================================
# Presentation: the comparison table and the timeline picture (pure functions)
# ============================================================================

# Report rows: (label, kind, key). kind "phase": P50 / P95 of a phase; "batch": a batch time
# in seconds (with a ratio against the first column); "count": passed episodes, reward sum,
# infrastructure failures (count_cell); "counts": key (mapping, its keys) shown "a / b" (a
# backend's launch types warm / cold, say); "number": a count, by key; "quantity": an amount (3 significant digits, with a
# ratio); "share": a fraction shown in percent. Runs of different backends side by side: rows a
# backend does not have are n/a in its column, and dropped when no column has them.
# The table is laid out in slots; in each, the schemes' phase rows come first, then the rows
# each backend and the admission gate add (Backend.REPORT_ROWS), then these shared rows.
REPORT_SLOTS = ("count", "setup", "startup", "episode_start", "ready", "startup_metric", "episode_run", "rewards",
                "finish", "after", "client", "cost")
SHARED_REPORT_ROWS = {
    "count": [("episodes passed / run", "count", "passed"), ("reward sum", "count", "reward_sum"),
              ("infrastructure failures", "count", "infrastructure_failures"),
              # which kernel the episodes ran on (isolation_summary), and how their pods got the image
              ("sandbox kernel", "text", "isolation.verdict"), ("image", "text", "image"),
              ("episodes on the node's kernel / their own / unknown", "counts",
               ("isolation", ("episodes_on_node_kernel", "episodes_on_own_kernel", "episodes_unknown"))),
              ("image pulled / cached / unknown", "counts", ("image_pulls", ("pulled", "cached", "unknown"))),
              ("image pull P50 / P95 (kubelet, ms)", "stats", "image_pulls.pull_seconds")],
    "episode_start": [(PHASES[name][2] + " P50 / P95", "phase", name) for name in EPISODE_PHASES[:2]],
    "ready": [("batch all ready", "batch", "batch_to_all_ready_seconds")],
    "episode_run": [(PHASES[name][2] + " P50 / P95", "phase", name) for name in EPISODE_PHASES[2:]],
    "rewards": [("batch all rewards", "batch", "batch_to_all_rewards_seconds")],
    # client_job_complete_seconds (the tutorial's key): a Job's Complete condition as the client's
    # watch saw it; a warm-pool run's last claimed episode; a local run's last episode (README).
    "client": [("client sees the batch done", "batch", "client_job_complete_seconds")],
    "cost": [("reserved CPU-s per reward", "quantity", "cost.per_reward.cpu_seconds"),
             ("reserved GiB-s per reward", "quantity", "cost.per_reward.gib_seconds"),
             ("Pod overhead share of reserved CPU", "share", "cost.overhead_share"),
             ("idle sandboxes' share of reserved CPU", "share", "cost.idle_share"),
             ("price per 1,000 rewards", "quantity", "cost.price.per_1000_rewards")],
}


def phase_schemes():
    """Every backend's phase scheme, once each, in registry order."""
    schemes = []
    for backend in BACKENDS.values():
        if backend.scheme not in schemes:
            schemes.append(backend.scheme)
    return schemes


def report_rows():
    """Every row the comparison table can have, in order, each once: (label, kind, key, phase
    scheme or None). Two schemes that share a phase (the local one is the pod one, timed
    another way) give it one row."""
    rows, seen = [], set()
    for slot in REPORT_SLOTS:
        candidates = []
        for scheme in phase_schemes():
            candidates += [(scheme.phases[name][2] + " P50 / P95", "phase", name, scheme)
                           for name in scheme.report_phases.get(slot, ())]
        for part in (*BACKENDS.values(), *GATES):
            candidates += [(label, kind, key, None) for label, kind, key in part.REPORT_ROWS.get(slot, ())]
        candidates += [(label, kind, key, POD_SCHEME if kind == "phase" else None)
                       for label, kind, key in SHARED_REPORT_ROWS.get(slot, ())]
        for row in candidates:
            if row[:3] not in seen:
                seen.add(row[:3])
                rows.append(row)
    return rows


def format_seconds(value, whole_seconds=False):
    """A duration for people. Figures read from whole-second timestamps are shown in seconds
    to one decimal at most ("1 s", "0.6 s"): an interpolation between whole seconds is not a
    millisecond figure."""
    if value is None:
        return "n/a"
    if whole_seconds:
        text = ("%.1f" % value).rstrip("0").rstrip(".")
        return ("0" if text in ("0", "-0") else text) + " s"  # the sign kept: -0.3 s is not 0.3 s
    return "%.1f ms" % (value * 1000) if abs(value) < 1 else "%.2f s" % value


def lookup(results, key):
    """results["a"]["b"] for the key "a.b"; None where any part is missing."""
    value = results
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def count_cell(results, key):
    """The report's counts: episodes that passed of those run, the sum of their rewards (as
    results.json has it), and the infrastructure failures (custom episodes; 0 otherwise)."""
    if key == "passed":
        return "%d/%d" % (results["successful_episodes"], results["episodes"])
    if key == "reward_sum":
        return "%g" % results["reward_sum"]
    return str(len(results.get("infrastructure_failures") or []))


def report_table(columns):
    """columns: [(label, results)] -> {"columns": [...], "rows": [{"measure", "values", "ratios"}]}."""
    rows = []
    for label, kind, key, scheme in report_rows():
        values, ratios = [], []
        # Whole-second rows: a phase with a Kubernetes timestamp at either end, or a batch time
        # measured from the Job's creation; a backend whose clocks are all fine (local) has none.
        coarse = any(backend_of(results).api_timestamps and (
            (kind == "phase" and phase_definition(key, scheme)["resolution_seconds"] >= 1) or
            key in backend_of(results).coarse_batch_keys) for _, results in columns)
        for _, results in columns:
            if kind == "count":
                values.append(count_cell(results, key))
                ratios.append(None)
            elif kind == "counts":
                mapping, parts = key
                counted = results.get(mapping)
                values.append(None if counted is None else " / ".join("%d" % counted.get(part, 0) for part in parts))
                ratios.append(None)
            elif kind in ("number", "text"):
                number = lookup(results, key)
                values.append(None if number is None else str(number))
                ratios.append(None)
            elif kind == "stats":
                stats = lookup(results, key)
                values.append(None if not stats or not stats.get("count") else "%s / %s" % (
                    format_seconds(stats["p50"]), format_seconds(stats["p95"])))
                ratios.append(None)
            elif kind == "share":
                share = lookup(results, key)
                values.append(None if share is None else "%.0f%%" % (100 * share))
                ratios.append(None)
            elif kind == "quantity":
                amount, base = lookup(results, key), lookup(columns[0][1], key)
                values.append(None if amount is None else "%.3g" % amount)
                ratios.append(amount / base if amount is not None and base else None)
            elif kind == "phase":
                phase = results.get("phases", {}).get(key)
                if phase is not None and phase["count"] == 0 and phase.get("bounded"):
                    values.append("under %s (a bound)" % format_seconds(phase["bounded_below_seconds"], coarse))
                else:
                    values.append(None if phase is None or phase["count"] == 0 else "%s / %s" % (
                        format_seconds(phase["p50"], coarse), format_seconds(phase["p95"], coarse)))
                ratios.append(None)
            else:
                per_round, base_rounds = batch_values(results, key), batch_values(columns[0][1], key)
                whole = any(gate.whole_seconds(key, results) for gate in GATES)
                values.append(" / ".join(format_seconds(v, whole) for v in per_round) if per_round else None)
                ratios.append(statistics.fmean(per_round) / statistics.fmean(base_rounds)
                              if per_round and base_rounds and statistics.fmean(base_rounds) else None)
        if any(value is not None for value in values):
            rows.append({"measure": label, "values": values, "ratios": ratios, "whole_second_resolution": coarse})
    return {"columns": [label for label, _ in columns], "rows": rows}


def batch_values(results, key):
    """A batch time for each round (one value for a single-round run); None values dropped."""
    values = [lookup(r, key) for r in results["rounds"]] if "rounds" in results else [lookup(results, key)]
    return [value for value in values if value is not None]


BATCH_ROW_PREFIXES = ("batch ", "client ")  # rows whose values list one figure per round


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
    if len(table["columns"]) > 1 and any(any(row["ratios"][1:]) for row in table["rows"]):
        lines.append("(1.50x): the column's figure divided by the first column's (%s); above 1 is slower (for the "
                     "cost rows: more), below 1 faster (less)." % table["columns"][0])
    if any(row["whole_second_resolution"] for row in table["rows"]):
        lines.append("\\* uses Kubernetes timestamps (whole seconds, another clock than the episode's): read to "
                     "about one second; small or negative values are within that resolution.")
    if any(" / " in (value or "") for row in table["rows"] if row["measure"].startswith(BATCH_ROW_PREFIXES)
           for value in row["values"]):
        lines.append("Batch times of several rounds are listed per round; their ratio compares the means.")
    return "\n".join(lines) + "\n"


QUEUED_COLOUR = "#f2c14e"
DRAINING_COLOUR = "#d37295"  # an evicted cycle's pods terminating before Kueue requeues it


def batch_origin(results):
    """When the batch was created (Unix seconds), from an episode's ready time and its
    batch_to_ready; with every such row withheld (a skewed episode clock), the earliest creation
    of an episode or of an attempt that gave no sample."""
    for row in results["pods"]:
        if row.get("batch_to_ready_seconds") is not None and row["times"].get("ready") is not None:
            return row["times"]["ready"] - row["batch_to_ready_seconds"]
    scheme = backend_of(results).scheme
    return min([row["times"][scheme.created_point] for row in results["pods"]
                if row["times"].get(scheme.created_point) is not None] +
               [attempt["created_at"] for attempt in unsampled_attempts(results) if attempt.get("created_at")])


def attempts_without_sample(entry):
    """An infrastructure failure's attempts, or a retried sample's earlier, failed ones."""
    return entry.get("attempts") or entry.get("failed_attempts") or []


def unsampled_attempts(results):
    """Every attempt that gave no sample: a failed episode's, and a retried sample's earlier ones."""
    return [attempt for entry in (results.get("infrastructure_failures") or []) + results["pods"]
            for attempt in attempts_without_sample(entry)]


def timeline_drawable(results):
    """Whether a run has anything the timeline can draw: an episode, or an attempt that ran."""
    return bool(results["pods"]) or any(attempt.get("created_at") for attempt in unsampled_attempts(results))


def timeline_rows(results, scheme):
    """The timeline's rows, one per episode: [(number, sample row or None, failure or None)] in the
    order the episodes were first created (their first attempt's creation; episodes that never
    started last), numbered by the episode's index (a custom episode's task index), else from 0
    in that order."""
    entries = [(row, None) for row in results["pods"]] + [
        (None, failure) for failure in results.get("infrastructure_failures") or []]

    def first_created(entry):
        row, failure = entry
        times = [attempt["created_at"] for attempt in attempts_without_sample(failure or row)
                 if attempt.get("created_at") is not None]
        if row is not None and row["times"].get(scheme.created_point) is not None:
            times.append(row["times"][scheme.created_point])
        return (not times, min(times, default=0.0), (row or failure).get("index", -1),
                row[scheme.row_key] if row else "")
    ordered = sorted(entries, key=first_created)
    return [((row or failure).get("index", position), row, failure) for position, (row, failure) in enumerate(ordered)]


# The marks of the timeline for what gave no sample: an attempt's bar and the deadline's line
CUT_SHORT_COLOUR = "#c0392b"
NO_SAMPLE_COLOUR = "#8c8c8c"
CUT_SHORT_LABEL = "an attempt cut short by the deadline (--timeout)"
NO_SAMPLE_LABEL = "an attempt that gave no sample (crashed, evicted, malformed)"
DEADLINE_LABEL = "the deadline (--timeout): dashed line"


def timeline_attempt_svg(attempt, number, place, y):
    """One attempt that gave no sample as a bar from its creation to its end (the batch's end when
    its end is not known), coloured by what ended it; returns (svg, legend label, colour), or None
    for an attempt whose creation is not known."""
    from xml.sax.saxutils import escape
    start = attempt.get("created_at")
    if start is None:
        return None
    end = attempt.get("ended_at") or place.end_of_batch
    cut_short = attempt["reason"].startswith(CUT_SHORT_BY_DEADLINE)
    colour, label = (CUT_SHORT_COLOUR, CUT_SHORT_LABEL) if cut_short else (NO_SAMPLE_COLOUR, NO_SAMPLE_LABEL)
    x0 = place.left + (start - place.origin) * place.scale
    x1 = place.left + (max(start, end) - place.origin) * place.scale
    return ('<rect class="attempt" x="%.2f" y="%d" width="%.2f" height="%d" fill="%s" fill-opacity="0.75">'
            '<title>episode %s, %s: %s</title></rect>' % (x0, y, max(1.0, x1 - x0), max(1, place.height - 1), colour,
                                                         number, escape(attempt["pod"]), escape(attempt["reason"])),
            label, colour)


def timeline_legend(results_list, drawn=None):
    """{label: colour} of everything the runs' timelines draw (queue spans, each scheme's phases;
    with `drawn`, {(id(scheme), phase)}, only the phases that were drawn)."""
    legend = {}
    for gate in GATES:
        legend.update(gate.timeline_legend(results_list))
    for results in results_list:
        scheme = backend_of(results).scheme
        for phase, colour in scheme.timeline_colours.items():
            if drawn is None or (id(scheme), phase) in drawn:
                legend.setdefault(scheme.phases[phase][2], colour)
    return legend


def text_width(text, size):
    """An upper estimate of a bold sans-serif text's width in px at `size` px: em widths close to
    Helvetica Bold's (narrow punctuation and i/l/t, wide m/w and capitals), rounded up."""
    def em(char):
        if char in " .,:;!|'()[]ijlft-/":
            return 0.34
        if char in "mwMW@%":
            return 0.95
        if char.isupper() or char in "&#":
            return 0.75
        return 0.62
    # never below 0.58 em a character on average (the estimate a whole title was drawn with before)
    return size * max(sum(em(char) for char in text), 0.58 * len(text))


def timeline_span_svg(span, origin, scale, left, y):
    """One span a gate gives (Gate.timeline_spans) as a bar of the row above a run's episodes."""
    from xml.sax.saxutils import escape
    x0 = left + max(0.0, span["from"] - origin) * scale
    x1 = left + max(0.0, span["to"] - origin) * scale
    return '<rect class="%s" x="%.2f" y="%d" width="%.2f" height="8" fill="%s"><title>%s</title></rect>' % (
        span["kind"], x0, y, max(0.0, x1 - x0), span["colour"], escape(span["title"]))


TimelinePlace = collections.namedtuple("TimelinePlace", "scheme origin scale left height end_of_batch")


def timeline_episode_svg(place, number, row, failure, y, drawn, marks):
    """One episode's row of the timeline at `y` (its sample `row`, or its `failure`): a segment per
    phase, a bar per attempt that gave no sample, "never started"; adds to `drawn` the phases
    drawn and to `marks` the failure marks' legend."""
    from xml.sax.saxutils import escape
    scheme, origin, scale, left, height = place.scheme, place.origin, place.scale, place.left, place.height
    attempts = attempts_without_sample(failure or row)
    if row is None:
        parts = ['<g class="episode failed" data-index="%s" data-reason="%s">' % (number, escape(failure["reason"]))]
    else:
        parts = ['<g class="episode" data-%s="%s"%s>' % (scheme.row_key, escape(row[scheme.row_key]), "".join(
            ' data-%s="%s"' % (key.replace("_", "-"), escape(str(row[key])))
            for key in scheme.timeline_attributes if key in row))]
    for drawn_attempt in filter(None, (timeline_attempt_svg(attempt, number, place, y) for attempt in attempts)):
        svg, label, colour = drawn_attempt
        parts.append(svg)
        marks[label] = colour
    if row is None:
        if not any(attempt.get("created_at") for attempt in attempts):
            parts.append('<text x="%d" y="%d" font-size="%d" fill="#555">%s</text>' % (
                left + 2, y + min(height, 10), min(10, max(7, height)),
                escape("never started" if failure["reason"].startswith(NEVER_STARTED_BY_DEADLINE)
                       else failure["reason"][:80])))
        return parts + ["</g>"]
    name, times = row[scheme.row_key], row["times"]
    for phase, colour in scheme.timeline_colours.items():
        start, end, _ = scheme.phases[phase]
        if phase in scheme.timeline_fallbacks and times.get(scheme.timeline_fallbacks[phase]) is not None:
            continue
        if times.get(start) is None or times.get(end) is None:
            continue
        drawn.add((id(scheme), phase))
        x0 = left + (times[start] - origin) * scale
        x1 = left + (times[end] - origin) * scale
        parts.append('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s %s: %s</title></rect>'
                     % (x0, y, max(0.0, x1 - x0), max(1, height - 1), colour, escape(name), phase,
                        format_seconds(times[end] - times[start])))
    return parts + ["</g>"]


def timeline_svg(runs):
    """One SVG stacking each run: a row per episode in creation order, a segment per phase,
    x in seconds since the run's batch was created. runs: [(label, results)]."""
    from xml.sax.saxutils import escape

    def title_of(label, results):
        backend = backend_of(results)
        return "%s: %d episodes, %s%s, %s" % (
            label, results["episodes"],
            "parallelism %s, " % results["parallelism"] if backend.takes_parallelism else "",
            "runtime %s" % results["runtime"] if results["runtime"] else "no RuntimeClass (the nodes' default runtime)",
            backend.timeline_where(results))
    # wide enough for the longest title (bold 13 px text), so that no title is clipped
    width = max(1000, 20 + int(max(text_width(title_of(label, results), 13) for label, results in runs)))
    left, right = 40, 10  # the left margin holds the episode numbers
    plot = width - left - right
    drawn = set()  # (scheme, phase) drawn at least once: the legend shows only those
    marks = {}  # {label: colour} of the failure marks drawn
    spans = []
    for _, results in runs:
        origin = batch_origin(results)
        ends = [value for row in results["pods"] for value in row["times"].values() if value]
        ends += [value for attempt in unsampled_attempts(results)
                 for value in (attempt.get("created_at"), attempt.get("ended_at")) if value]
        if (results.get("deadline_exceeded") or {}).get("at"):
            ends.append(results["deadline_exceeded"]["at"])
        spans.append((origin, max(ends) - origin))
    horizon = max(span for _, span in spans) or 1.0
    step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
                if horizon / s <= 12)
    scale = plot / (math.ceil(horizon / step) * step)
    parts, y = [], 10
    for (label, results), (origin, extent) in zip(runs, spans):
        backend = backend_of(results)
        scheme = backend.scheme
        rows = timeline_rows(results, scheme)
        end_of_batch = origin + extent  # where the bar of an attempt whose end is not known stops
        height = max(2, min(14, 600 // max(1, len(rows))))
        title = title_of(label, results)
        parts.append('<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>' % (10, y + 12, escape(title)))
        y += 22
        gate_spans = next((spans for spans in (gate.timeline_spans(results) for gate in GATES) if spans is not None),
                          None)
        if gate_spans is not None:
            parts += [timeline_span_svg(span, origin, scale, left, y) for span in gate_spans]
            y += 12
        top = y
        every = max(1, math.ceil(10 / height))  # an episode number every few rows, where rows are thin
        place = TimelinePlace(scheme, origin, scale, left, height, end_of_batch)
        for position, (number, row, failure) in enumerate(rows):
            if position == 0 or (position + 1) % every == 0:
                parts.append('<text x="%d" y="%d" font-size="%d" text-anchor="end" fill="#555">%d</text>' % (
                    left - 4, y + min(height, 10), min(10, max(7, height)), number))
            parts += timeline_episode_svg(place, number, row, failure, y, drawn, marks)
            y += height
        ticks = []
        for index in range(int(math.ceil(horizon / step)) + 1):
            x = left + index * step * scale
            ticks.append('<line x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="#e0e0e0"/>' % (x, top, x, y))
            ticks.append('<text x="%.2f" y="%d" font-size="10" text-anchor="middle">%g</text>' % (x, y + 12, index * step))
        parts.extend(ticks)
        exceeded = results.get("deadline_exceeded") or {}
        if exceeded.get("at"):
            x = left + (exceeded["at"] - origin) * scale
            parts.append('<line class="deadline" x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="%s" stroke-width="1.5" '
                         'stroke-dasharray="4 3"><title>the deadline: %s s (--timeout)</title></line>' % (
                             x, top - 4, x, y, CUT_SHORT_COLOUR, exceeded.get("seconds")))
            marks[DEADLINE_LABEL] = CUT_SHORT_COLOUR
        parts.append('<text x="%d" y="%d" font-size="10">seconds since the %s was created%s; rows: episodes in '
                     'creation order, numbered on the left by episode (from 0)</text>'
                     % (left, y + 26, backend.timeline_origin,
                        " (API times are whole seconds)" if backend.api_timestamps else ""))
        y += 40
    legend = dict(timeline_legend([results for _, results in runs], drawn), **marks)
    # columns as wide as the longest label (11 px text, about 6.2 px a character), as many as fit
    column_width = max(330, 30 + int(6.2 * max([len(text) for text in legend] or [0])))
    columns = max(1, (width - 20) // column_width)
    for index, (text, colour) in enumerate(legend.items()):
        column, line = index % columns, index // columns
        x, ly = 10 + column * column_width, y + line * 16
        parts.append('<rect x="%d" y="%d" width="12" height="10" fill="%s"/>' % (x, ly, colour))
        parts.append('<text x="%d" y="%d" font-size="11">%s</text>' % (x + 16, ly + 9, escape(text)))
    y += 16 * math.ceil(len(legend) / columns) + 10
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
            'font-family="sans-serif">\n<rect width="100%%" height="100%%" fill="white"/>\n%s\n</svg>\n'
            % (width, y, width, y, "\n".join(parts)))


# ============================================================================
# Backend interface: a Job's Admission and the Gate that gives it, the run specification, the
# run context, the Backend class, the start of every run, what every cluster backend checks
# first, and the summary
# ============================================================================


class Admission:
    """One Job's admission, handed to the Job's wait by its gate (Gate.admission): when its
    deadline falls, what the progress line says of it, whether it can never be admitted, what
    is saved of it. These defaults are a Job that no gate holds (Unqueued)."""

    queued = False

    def begin(self, started):
        """The wait begins (client monotonic clock)."""
        self.started = started

    def follow(self, created, create_returned):
        """The Job as its create returned it, and when (Unix seconds, client clock)."""

    def deadline(self, wait_seconds):
        return self.started + wait_seconds

    def state_line(self):
        """What the progress line adds, or None."""
        return None

    def blocked(self, started):
        """Why the Job can never run (the wait then stops), or None."""
        return None

    def finish(self):
        pass

    def timeout_error(self, job_name, where):
        """The DemoError a timed-out wait raises instead of the plain one, or None."""
        return None

    def save(self, folder, run_info):
        pass

    def stop(self):
        pass


class Gate:
    """An admission gate: something that holds a backend's batch until it is admitted (Kueue's
    queues, `--queue`). A gate is registered in GATES; shared code asks every registered gate
    and never names one. A run has a gate instance when `chosen(spec)`; everything else is
    asked of the class, about saved results, and answers "nothing" for a run it did not hold."""

    REPORT_ROWS = {}  # slot -> [(label, kind, key)]: its rows of the comparison table
    argument_group = None  # the title of its `run` options' group

    def __init__(self, spec, console):
        self.spec, self.console = spec, console

    # --- the command line
    @staticmethod
    def add_arguments(parser):
        pass

    @staticmethod
    def check_options(args, fail, backend):
        pass

    @staticmethod
    def chosen(spec):
        """Whether this gate holds the run `spec` describes."""
        return False

    # --- a run it holds (the backend calls these on its instance)
    def receipt_fields(self):
        return {}

    def manifests(self, namespace, run_id):
        return []

    def decorate(self, job):
        pass

    def check(self, cluster, runtime_class):
        return {}

    def prepare(self, cluster, namespace, facts):
        return {}

    def admission(self, cluster, namespace, job_name):
        return Unqueued()

    # --- saved results (asked of the class, for any run)
    @staticmethod
    def saved(output):
        """Its record of a saved run folder (what decides which pods are results), or None."""
        return None

    @staticmethod
    def summary_view(report):
        return {}

    @staticmethod
    def summary_lines(report):
        return []

    @staticmethod
    def whole_seconds(key, results):
        """Whether its batch figure `key` was read from whole-second API timestamps."""
        return False

    @staticmethod
    def timeline_spans(results):
        """Its spans on a run's timeline (one row above the episodes), or None: [{"kind", "from",
        "to" (Unix seconds), "colour", "title"}]; the timeline draws them (timeline_span_svg)."""
        return None

    @staticmethod
    def timeline_legend(results_list):
        return {}

    # --- cleanup
    @staticmethod
    def used_in_namespace(receipt):
        """{(kind, name)}: objects of the namespace that the run did not create but went through (a
        namespace policy's LocalQueue its Job was queued in): not foreign to its cleanup."""
        return set()

    @staticmethod
    def after_jobs_deleted(cluster, namespace, receipt):
        pass


def gate_for(spec, console):
    """The registered gate that holds this run (an instance), or None."""
    return next((gate(spec, console) for gate in GATES if gate.chosen(spec)), None)


def saved_admission(output):
    """A gate's record of a saved run folder, or None for a run no gate held."""
    return next((record for record in (gate.saved(output) for gate in GATES) if record is not None), None)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything `run` was asked to do, built and checked once from the command line
    (run_spec); nothing changes it afterwards. The fields keep the command line's names, so
    that run.json's `flags` keep theirs."""

    command: str = "run"
    output: str = None
    episode: str = None
    tasks: str = None
    retries: int = 0
    backend: str = None
    count: int = None
    allow_large: bool = False
    parallelism: int = None
    rounds: int = 1
    image: str = None
    runtime: str = None
    no_runtime_class: bool = False
    require_isolation: bool = False
    timeout: int = None
    network: str = "default"
    dry_run: bool = False
    force: bool = False
    quiet: bool = False
    stream: bool = False
    context: str = None
    price_cpu_hour: float = None
    price_gib_hour: float = None
    program: str = None  # the episode program's text: --episode's, or the built-in one
    tasks_list: tuple = None  # --tasks, one parsed JSON task each; None without --tasks
    # The `run` options a backend or an admission gate adds (its add_arguments), by name: read
    # as attributes too (spec.pool_size), so a new plug-in's options need no field here.
    options: dict = dataclasses.field(default_factory=dict)

    def __getattr__(self, name):
        options = self.__dict__.get("options") or {}
        if name in options:
            return options[name]
        raise AttributeError("%s has no option %r" % (type(self).__name__, name))

    @property
    def custom_episodes(self):
        """How the manifests run --episode's program, or None for the built-in task."""
        return CustomEpisodes(self.retries, self.tasks_list is not None) if self.episode else None

    @property
    def task_images(self):
        """Each episode's image, in task order: a task's own "image", else --image."""
        if self.tasks_list is None:
            return (self.image,) * (self.count or 0)
        return tuple(task_image(task, self.image) for task in self.tasks_list)

    @property
    def images(self):
        """The batch's distinct images (one however spelt), in the order their first task comes."""
        return tuple(distinct_images(self.task_images))

    @property
    def images_from_tasks(self):
        """Whether a task named its own image."""
        return any(own_image(task) is not None for task in self.tasks_list or ())

    @property
    def runtime_class(self):
        """The RuntimeClass the pods name; None: the nodes' default runtime."""
        return None if self.no_runtime_class else self.runtime

    def flags(self):
        """Every flag of the command line, as given or defaulted (for run.json)."""
        flags = dataclasses.asdict(self)
        flags.update(flags.pop("options"))
        flags["runtime"] = self.runtime_class
        return flags


class Run:
    """One run under way, as every backend's driver is handed it: the spec, the console, the
    cluster (None for a local run), the output folder, the receipt and the facts read before
    anything was created."""

    def __init__(self, spec, console, cluster, output, receipt, facts):
        self.spec, self.console, self.cluster = spec, console, cluster
        self.output, self.receipt, self.facts = output, receipt, facts
        self.stream = EpisodeStream(spec, console, output)  # prints only with --stream

    @property
    def namespace(self):
        return self.receipt.get("namespace")

    @property
    def run_id(self):
        return self.receipt.get("run_id")

    def save_receipt(self):
        write_json(self.output / "receipt.json", self.receipt)

    def cleanup_advice(self):
        """The cleanup command; when receipt.json no longer holds this run's receipt (the
        folder was removed, the disk refused the write), one that carries the receipt itself."""
        try:
            intact = json.loads((self.output / "receipt.json").read_text()) == self.receipt
        except (OSError, ValueError):
            intact = False
        if intact:
            return cleanup_command(self.output)
        return "echo %s | %s cleanup --receipt - (receipt.json in %s is lost; this is its content)" % (
            shlex.quote(json.dumps(self.receipt, separators=(",", ":"))), invocation(), self.output)

    def new_run_info(self, backend):
        """run.json as the run starts: the tool, the command line, the backend."""
        info = {"tool_version": __version__, "started_at": utc_now(), "backend": backend.name,
                "context": self.cluster.context if self.cluster else None, "namespace": self.namespace,
                "flags": self.spec.flags(), "expected_episodes": self.spec.count,
                "custom_episode": bool(self.spec.episode)}
        if self.spec.episode:
            info["episode_sha256"] = hashlib.sha256(self.spec.program.encode()).hexdigest()
        if not backend.uses_cluster:  # its episodes' node is this machine: the kernel they share
            info["machine_kernel"] = os.uname().release
        if self.facts.get("images") is not None:
            info["images"] = self.facts["images"]  # each image, and the nodes holding it at the preflight
        return info

    def write_facts(self, run_info):
        """run.json and what was read before the run: versions, the RuntimeClass, why nodes are unknown."""
        write_json(self.output / "run.json", run_info)
        write_json(self.output / "version.json", self.facts["version"])
        if self.facts["runtime_class"] is not None:
            write_json(self.output / "runtimeclass.json", self.facts["runtime_class"])
        if self.facts["nodes"] is None:
            write_json(self.output / "nodes.json", self.facts["nodes_error"])

    def create_recorded(self, obj):
        """Create one of the objects cleanup proves by UID (the namespace, a Job, a warm pool and its
        template) as this run's own, its receipt naming it under "sent" before the create is sent;
        the caller records the UID the answer carries. A signal while the answer is in flight (the
        server committed, the tool never heard) so leaves an object cleanup can still prove: sent by
        this run and labelled with its run id (adopt_unconfirmed)."""
        sent = self.receipt.setdefault("sent", [])
        entry = sent_entry(obj["kind"], obj["metadata"]["name"])
        if entry not in sent:
            sent.append(entry)
            self.save_receipt()
        return self.cluster.create_owned(obj, self.run_id)

    def create_namespace(self, namespace_obj, supporting):
        """The run's namespace (its UID into the receipt at once), then the objects every
        episode needs, each created as this run's own."""
        self.receipt["uid"] = self.create_recorded(namespace_obj)["metadata"]["uid"]
        self.save_receipt()
        self.console.note("namespace: %s" % self.namespace)  # stdout carries JSON only
        for obj in supporting:
            self.cluster.create_owned(obj, self.run_id)


class Backend:
    """One way of running a batch's episodes. A subclass owns everything that differs by
    backend: its name and options, its phase scheme, its checks and manifests, its run, what
    its saved results add, its summary and timeline, its cleanup and its `list` state. The
    rest of the file asks the backend (found in BACKENDS), never compares its name.

    This class holds only what is true of every backend: hooks whose default adds nothing.
    What varies, each backend declares in its own class body: every attribute of CONTRACT,
    every method of METHODS, and with `uses_cluster` every method of CLUSTER_METHODS (most of
    them shared by ClusterBackend); tests/test_backends.py walks BACKENDS and checks."""

    CONTRACT = {
        "name": "the --backend value; run.json's, the receipt's and results.json's `backend`",
        "help": "--backend's help for this value",
        "scheme": "how its episode records are timed (a PhaseScheme)",
        "episodes_file": "the saved records results.json is computed from",
        "uses_cluster": "it runs through kubectl against a context (the preflight, --image, --runtime)",
        "leaves_remote_state": "a run leaves objects somewhere that `cleanup` removes (its advice is printed)",
        "api_timestamps": "some of its times are whole-second Kubernetes timestamps",
        "coarse_batch_keys": "its batch times read from whole-second API timestamps (the rest is client time)",
        "takes_queue": "--queue: the Kueue gate can admit its batch",
        "takes_parallelism": "--parallelism limits its episodes at once (named in its timeline's title)",
        "runs_several_images": "a batch whose tasks name several images runs on it (as one Job per image)",
        "own_flags": "(flag, RunSpec field): options only this backend takes",
        "batch_origin": "what its batch times count from, for people",
        "startup_label": "the human summary's name for its startup metric",
        "timeline_origin": "what the timeline's seconds count from (\"seconds since the <it> was created\")",
        "phase_words": "{words of its scheme's phase labels: what it calls them} for people (phase_label)",
        "REPORT_ROWS": "slot -> [(label, kind, key)]: its rows of the comparison table",
    }
    METHODS = ("read_facts", "run", "new_receipt", "describe_results", "cost", "timeline_where")
    CLUSTER_METHODS = ("manifests", "delete_objects", "list_objects", "list_state", "list_fields")

    def __init__(self, spec, console):
        self.spec, self.console = spec, console

    # --- the command line ---------------------------------------------------------------

    @classmethod
    def add_arguments(cls, parser):
        """The `run` options only this backend takes (listed in own_flags too)."""

    @classmethod
    def check_options(cls, args, fail):
        """Refuse (fail(message)) what this backend cannot do; return the RunSpec fields it derives."""
        return {}

    # --- a run ------------------------------------------------------------------------------

    def read_facts(self, cluster):
        """What the run must know before it changes anything, read-only (`cluster`: the command's
        Cluster, None for a backend without one); a refusal raised here leaves no folder."""
        raise NotImplementedError

    def new_receipt(self, context, namespace, run_id):
        """receipt.json before any change: what `cleanup` needs to find and prove the run."""
        raise NotImplementedError

    def run(self, run):
        """Everything after the receipt; returns the exit code."""
        raise NotImplementedError

    # --- saved results (no run needed: class methods) ------------------------------------

    @classmethod
    def describe_results(cls, output, report, observed):
        """Add to results.json what only this backend's runs have."""
        raise NotImplementedError

    @classmethod
    def cost(cls, output, report, prices, records):
        """results.json's `cost` (`records`: the episodes file as read, not read again)."""
        raise NotImplementedError

    @classmethod
    def summary_view(cls, report):
        """What `run` prints on stdout beside the shared summary keys."""
        return {}

    @classmethod
    def summary_lines(cls, report):
        """Its lines of the human summary."""
        return []

    @classmethod
    def timeline_where(cls, results):
        """Where the batch ran, for the timeline's title."""
        raise NotImplementedError

    # --- cleanup and list -----------------------------------------------------------------

    @classmethod
    def episodes_cell(cls, row):
        """`list`'s EPISODES column for one row: its counts (from its results.json when nothing
        on a cluster counts them)."""
        if row.get("succeeded") is None:
            return "no results.json found"
        return "%s/%s done, %s failed" % (row["succeeded"], row["completions"], row["failed"])

    @classmethod
    def cleanup(cls, receipt, source, output, console, delete_foreign=False):
        """`cleanup` of one of its runs (`receipt`, read from `source`; `output` its folder or
        None): delete what it left, after proving it is the run's; the exit code. A backend that
        leaves nothing behind (leaves_remote_state false) has nothing to do."""
        if cls.leaves_remote_state:
            raise NotImplementedError
        console.tell("Nothing to clean up: %s ran with --backend %s, which leaves nothing behind"
                     % (output or source, cls.name))
        return EXIT_OK

class ClusterBackend(Backend):
    """What is true of every backend that runs through kubectl against a context: the receipt
    naming the context and the run's namespace, the read-only checks before any change
    (versions, the RuntimeClass, the nodes, the preflight), a dry run of its manifests; the
    cleanup and `list` hooks, which each such backend writes (CLUSTER_METHODS)."""

    # API paths beyond the tool's namespaces and the cluster-wide reads that the command's
    # channel serves for this backend (channel_accept_paths)
    api_paths = ()

    # --- a run ------------------------------------------------------------------------------

    def manifests(self, namespace, run_id):
        """Every object of one run, in creation order (the namespace first)."""
        raise NotImplementedError

    def dry_run_objects(self, namespace, run_id):
        return self.manifests(namespace, run_id)

    def new_receipt(self, context, namespace, run_id):
        """receipt.json before any change: what `cleanup` needs to find and prove the run, and
        which backend made it (cleanup and list act as that backend)."""
        return {"context": context, "namespace": namespace, "run_id": run_id, "backend": self.name,
                "images": list(self.spec.images)}

    def check_server(self, cluster, facts):
        """Read-only checks of the server before the RuntimeClass is read (add-ons, versions)."""

    def check_admission(self, cluster, facts):
        """Read-only checks once the RuntimeClass is known (an admission gate's quota)."""

    def pods_at_once(self):
        """How many of its pods must fit the nodes at once."""
        return self.spec.parallelism

    def needs_nodes(self):
        """The option that cannot go on without the node list (named in the refusal), or None:
        without it the preflight is skipped with a note."""
        return None

    def never_fits(self, fit, runtime_class, nodes):
        """Why the run could never complete on these nodes (beyond no pod fitting at all), or None."""
        return None

    def capacity_warning(self, fit, at_once, arithmetic):
        return ("preflight: only %d of %d episode pods fit at once, so the batch will queue and "
                "batch_to_all_ready_seconds will include queueing: %s" % (fit, at_once, arithmetic))

    def read_facts(self, cluster):
        """What the run needs to know before it changes anything, read-only: versions, the
        RuntimeClass, the nodes and the preflight. Refusals are raised here, before any folder
        or receipt exists."""
        spec = self.spec
        # kubectl's own: its client version beside the server's
        facts = {"version": fetch_optional(lambda: json.loads(cluster.read("version", "-o", "json")))}
        self.check_server(cluster, facts)
        runtime = spec.runtime_class
        facts["runtime_class"] = None
        if runtime is not None:
            facts["runtime_class"] = cluster.api.get(RUNTIME_CLASSES, runtime)
            if facts["runtime_class"] is None:
                raise DemoError("RuntimeClass %r not found on context %s; list them with `kubectl "
                                "--context %s get runtimeclass`, then pass --runtime NAME (or "
                                "--no-runtime-class for the cluster's default runtime)"
                                % (runtime, cluster.context, cluster.context))
        self.check_admission(cluster, facts)
        facts["preflight"] = None
        try:
            facts["nodes"] = cluster.api.list(NODES)
        except KubectlError as error:
            facts["nodes"], facts["nodes_error"] = None, {"error": meaningful_line(error.stderr) or str(error)}
            needed_by = self.needs_nodes()
            if needed_by:
                raise DemoError("%s needs to list the nodes, and kubectl could not: %s"
                                % (needed_by, facts["nodes_error"]["error"])) from None
            self.console.note("preflight skipped: cannot list nodes (%s)" % meaningful_line(error.stderr))
        if facts["nodes"] is not None:
            at_once = self.pods_at_once()
            fit, arithmetic = preflight(at_once, facts["runtime_class"], facts["nodes"])
            if fit == 0 and not spec.force:
                raise DemoError("preflight: no usable node can run even one episode pod: %s; fix the capacity or "
                                "the RuntimeClass scheduling, or pass --force to submit anyway" % arithmetic)
            never = self.never_fits(fit, facts["runtime_class"], facts["nodes"])
            if never and not spec.force:
                raise DemoError("preflight: %s; pass --force to submit anyway" % never)
            if fit == 0:  # submitted with --force
                self.console.warn("preflight: no usable node can run even one episode pod, submitted anyway "
                                  "(--force): the pods stay Pending until capacity appears or the deadline "
                                  "passes: %s" % arithmetic)
            elif fit < at_once:
                self.console.warn(self.capacity_warning(fit, at_once, arithmetic))
            facts["preflight"] = {"pods_that_fit_at_once": fit, "parallelism": at_once, "arithmetic": arithmetic}
        facts["images"] = self.images_on_nodes(facts["nodes"], facts["runtime_class"])
        return facts

    def images_on_nodes(self, nodes, runtime_class):
        """run.json's `images`: each image of the batch, its episodes, and which usable nodes
        already hold it (their status.images), each said in one preflight line."""
        counts = collections.Counter(normalized_image(image) for image in self.spec.task_images)
        usable = usable_nodes(nodes, runtime_class) if nodes is not None else None
        reporting = [node for node in usable or () if node.get("status", {}).get("images")]
        holders = image_holders(self.spec.images, reporting)
        images = []
        for image in self.spec.images:
            entry = {"image": image, "episodes": counts[normalized_image(image)]}
            if usable is None:
                entry["nodes_holding"], entry["note"] = None, "the nodes could not be listed"
            elif not reporting:
                entry["nodes_holding"], entry["note"] = None, "the usable nodes report no images (status.images)"
            else:
                entry["nodes_holding"], entry["note"] = holders[image], image_holders_note(reporting)
            images.append(entry)
            if entry["nodes_holding"] is None and not self.spec.images_from_tasks:
                continue  # kept in run.json; a line only when it says something or the tasks chose the image
            if entry["nodes_holding"] is None:
                where = "which nodes hold it is unknown: %s" % entry["note"]
            elif entry["nodes_holding"]:
                where = "on %d of %d usable node(s) already (%s)" % (
                    len(entry["nodes_holding"]), len(usable), some_of(entry["nodes_holding"]))
            else:
                where = "on none of the %d usable node(s) yet: the first episode on each node pulls it%s" % (
                    len(usable), " (%s)" % entry["note"] if entry["note"] else "")
            self.console.note("preflight: image %s (%d episode(s)): %s" % (image, entry["episodes"], where))
        return images

    @classmethod
    def timeline_where(cls, results):
        return "image %s, context %s" % (results["image"], results["context"])

    # --- cleanup and list (each cluster backend writes its own) -----------------------------

    @classmethod
    def cleanup(cls, receipt, source, output, console, delete_foreign=False):
        return cleanup_namespace(receipt, source, output, console, delete_foreign)

    @classmethod
    def busy(cls, receipt, listing):
        """Why cleanup must wait (something of the run's still serves others), or None."""
        return None

    @classmethod
    def delete_objects(cls, cluster, namespace, run_id, receipt, output, listing):
        """Prove (and where it matters, delete) what this backend made in the run's namespace,
        before the namespace goes; `listing` is what cleanup read of it (a NamespaceListing)."""
        raise NotImplementedError

    @classmethod
    def list_objects(cls, cluster, namespace):
        """What `list` reads of one run: {"jobs": [...], ...}."""
        raise NotImplementedError

    @classmethod
    def list_state(cls, objects):
        """One word or phrase for `list`'s STATE column."""
        raise NotImplementedError

    @classmethod
    def list_fields(cls, objects, folder):
        """Its fields of a `list --json` row (the shared ones are namespace, run_id, backend,
        age_seconds, state and receipt); `folder` is the run's output folder when a receipt of
        this very namespace was found, else None."""
        raise NotImplementedError



def job_list_fields(jobs):
    """`list`'s Job fields of a run: its Jobs (rounds and prewarm too) and their pods' counts."""
    def total(key):
        return sum(job.get("status", {}).get(key, 0) for job in jobs)
    return {"jobs": sorted(job["metadata"]["name"] for job in jobs),
            "completions": sum(job.get("spec", {}).get("completions", 0) for job in jobs) if jobs else None,
            "succeeded": total("succeeded"), "failed": total("failed"), "active": total("active")}


def batch_record(backend, kind, name, created, status, spec=None):
    """The Job-shaped job.json a backend without a Job keeps (kind WarmPoolBatch, LocalBatch):
    results.json reads the batch's creation time (`created`, RFC 3339) from it, as from a Job."""
    record = {"apiVersion": "rl-batch-demo/" + backend.name, "kind": kind,
              "metadata": {"name": name, "creationTimestamp": created}, "status": status}
    if spec is not None:
        record["spec"] = spec
    return record


def start_run(spec, console):
    """`run`, whatever the backend: the dry run, the output folder, the read-only checks, the
    receipt before any change, then the backend's run; every failure after the receipt ends
    with the cleanup command."""
    backend = backend_named(spec.backend)(spec, console)
    if spec.dry_run:
        # Exactly what a run would create, as one List `kubectl create -f -` accepts;
        # neither the cluster nor the output folder is touched.
        run_id = uuid.uuid4().hex[:12]
        objects = backend.dry_run_objects(NAMESPACE_PREFIX + run_id, run_id)
        console.say(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
        return EXIT_OK
    output = Path(spec.output)
    if output.exists():
        raise DemoError("output folder %s already exists; choose a new --output so that no "
                        "experiment record is overwritten" % output)
    runner = Kubectl(console)
    try:
        return run_on(backend, spec, console, runner, output)
    finally:
        runner.stop_background()  # the channel, its watches and proxy: every way out


def run_on(backend, spec, console, runner, output):
    """start_run from the read-only checks on, its kubectl `runner` stopped by the caller."""
    cluster = None
    if backend.uses_cluster:
        cluster = connect(runner, runner.existing_context(spec.context) if spec.context else runner.current_context(),
                          backend.api_paths)
    # Read-only checks first: a run refused here leaves no folder behind, and the same
    # --output can be used again.
    facts = backend.read_facts(cluster)
    run_id = uuid.uuid4().hex[:12]
    receipt = backend.new_receipt(cluster and cluster.context, cluster and NAMESPACE_PREFIX + run_id, run_id)
    try:
        output.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise DemoError("output folder %s already exists; choose a new --output" % output) from None
    except OSError as error:
        raise DemoError("cannot create output folder %s: %s" % (output, error.strerror)) from None
    run = Run(spec, console, cluster, output, receipt, facts)
    # The receipt names the namespace before any cluster change, so every failure after
    # this line leaves something `cleanup` can finish.
    try:
        run.save_receipt()
    except OSError as error:
        # Nothing exists on the cluster yet, and the folder is the one just made: remove it, so
        # that the same --output can be used again once the disk takes writes.
        shutil.rmtree(output, ignore_errors=True)
        raise DemoError("cannot write %s: %s; nothing was created on the cluster, and the output folder was "
                        "removed" % (error.filename or output / "receipt.json", error.strerror or error)) from None
    try:
        return backend.run(run)
    except DemoError as error:
        if backend.leaves_remote_state:
            raise with_context(error, "Clean up with: %s" % run.cleanup_advice(), ". ") from None
        raise
    except OSError as error:
        # The output folder failed (a full disk, a read-only mount, the folder removed): one
        # line, and a way to clean up even when the receipt itself is lost.
        where = " (%s)" % error.filename if error.filename else ""
        advice = ". Clean up with: %s" % run.cleanup_advice() if backend.leaves_remote_state else ""
        raise DemoError("cannot write to the output folder %s: %s%s%s" % (
            output, error.strerror or error, where, advice)) from None
    except KeyboardInterrupt:
        if backend.leaves_remote_state:
            console.tell("Interrupted. Clean up with: %s" % run.cleanup_advice())
        raise


def fetch_optional(fetch):
    """What fetch() returns, or {"error": ...} on a kubectl error: metadata must not fail a run."""
    try:
        return fetch()
    except KubectlError as error:
        if error.transient:
            raise  # the API server is not answering (already retried): the next read would fail too
        return {"error": meaningful_line(error.stderr) or str(error)}

# What every cluster backend's preflight counts: which nodes the episode pods can land on,
# and how many of them fit at once.


def human_summary(report, output):
    """A few lines for a person at a terminal (stdout keeps the JSON for scripts)."""
    backend = backend_of(report)

    def seconds(key):
        return "n/a" if report.get(key) is None else "%.2f s" % report[key]
    lines = ["Done: %d episodes, %d with a reward (sum %g)%s." % (
        report["episodes"], report["successful_episodes"], report["reward_sum"],
        ", %d infrastructure failures" % len(report["infrastructure_failures"])
        if report.get("infrastructure_failures") else "")]
    if "rounds" in report:
        lines.append("Batch times per round: all ready %s; all rewards %s." % tuple(
            ", ".join("n/a" if r[key] is None else "%.2f s" % r[key] for r in report["rounds"])
            for key in ("batch_to_all_ready_seconds", "batch_to_all_rewards_seconds")))
    else:
        lines.append("Batch: all ready %s, all rewards %s after the %s." % (
            seconds("batch_to_all_ready_seconds"), seconds("batch_to_all_rewards_seconds"), backend.batch_origin))
    metric = backend.scheme.startup_metric
    lines.append("%s: P50 %s, P95 %s." % (
        backend.startup_label,
        seconds(metric + "_p50_seconds"), seconds(metric + "_p95_seconds")))
    for gate in GATES:
        lines += gate.summary_lines(report)
    lines += backend.summary_lines(report) + cost_lines(report)
    lines.append("Results: %s (results.json, timeline.svg, one log per episode)." % (output / "results.json"))
    if backend.leaves_remote_state:
        lines.append("Clean up with: %s" % cleanup_command(output))
    return "\n".join(lines)


def cost_lines(report):
    """The human summary's cost line: reserved capacity per reward, the overhead's and idle share."""
    cost = report.get("cost") or {}
    per = cost.get("per_reward")
    if not per:
        return []
    parts = ["Reserved per reward: %.3g CPU-s, %.3g GiB-s" % (per["cpu_seconds"], per["gib_seconds"])]
    if cost.get("overhead_share"):
        parts.append("Pod overhead %.0f%% of the CPU" % (100 * cost["overhead_share"]))
    if cost.get("idle_share"):
        parts.append("idle sandboxes %.0f%%" % (100 * cost["idle_share"]))
    if cost.get("price"):
        parts.append("%.4g per 1,000 rewards" % cost["price"]["per_1000_rewards"])
    return ["; ".join(parts) + " (whole-second Kubernetes times)."]


def conclude(report, run):
    """Print the summary and warnings; the exit code says whether any episode is an
    infrastructure failure (custom episodes only: their results are written regardless)."""
    output, console = run.output, run.console
    failures = report.get("infrastructure_failures") or []
    exit_code = EXIT_INFRA_FAILURES if failures else EXIT_OK
    isolation = report.get("isolation") or {}
    not_isolated = run.spec.require_isolation and isolation.get("verdict") != "separate-kernel"
    if not_isolated and not failures:
        exit_code = EXIT_NOT_ISOLATED
    if run.stream.enabled:
        run.stream.summary(summary_view(report), exit_code)  # one line, the stream's last
    else:
        console.say(json.dumps(summary_view(report), indent=2))
    if console.interactive:
        console.tell(human_summary(report, output))
    for finding in report["clock_skew"]["findings"]:
        console.warn("clock skew: %s (%d episode(s), e.g. pod %s; bound: %s)" % (
            skew_phrase(finding), finding["pods"], finding["example_pod"], finding["bound"]))
    if report["clock_skew"].get("headline_withheld"):
        console.warn("batch_to_all_ready_seconds, batch_to_all_rewards_seconds and pod_to_ready_* are null in "
                     "results.json: they compare the episode clock with the API server's, and %s"
                     % report["clock_skew"]["headline_withheld"])
    if failures:
        by_deadline = sum(ended_by_deadline(failure) for failure in failures)
        console.warn("%d of %d episodes are infrastructure failures, not samples (listed in results.json); "
                     "first: episode %d: %s%s" % (len(failures), report["episodes"], failures[0]["index"],
                                                  failures[0]["reason"], "; %d of them ended by the deadline: raise "
                                                  "--timeout if the episodes need longer" % by_deadline
                                                  if by_deadline else ""))
    if isolation.get("finding"):
        console.warn(isolation["finding"])
    if not_isolated:
        console.tell("Error: --require-isolation: %s (results.json's isolation: %s)" % (
            isolation.get("finding") or "%d of %d episodes could not be compared with their node's kernel" % (
                isolation.get("episodes_unknown", 0), isolation.get("episodes", 0)), isolation.get("verdict")))
    return exit_code


# ============================================================================
# The episode stream (--stream): each episode on stdout as soon as it is verified
# ============================================================================
# What a consumer may rely on (the README's "Use it from a training loop" says the same):
#   * one line per episode, {"type": "episode", ...}, as soon as its verdict is final, in
#     the order the verdicts were reached; every episode of the batch has exactly one;
#   * a line is never withdrawn: its reward (or infrastructure failure), episode and attempt
#     count are what results.json's `tasks` (and `pods`) say; its phases are the episode's
#     own, and results.json may still withhold one (null) when the Job's end proves the
#     episode's clock ahead (clock_skew says so);
#   * the last line is {"type": "summary", "exit_code": N, ...the usual summary...}, or
#     {"type": "error", "exit_code": N, "error": "..."} when the run failed (the same line as
#     stderr's `Error:`); with the built-in episode a failed check fails the whole batch, so
#     its episodes' lines stand but no results.json is written.
# The lines are kept in the output folder's stream.jsonl as well: a reader that went away
# loses nothing.

STREAM_FILE = "stream.jsonl"


class EpisodeStream:
    """--stream: the backends offer each episode's attempts as they end; the stream asks the
    batch's own validation (index_verdict, validate_episode) whether the verdict is final and
    prints it. A run without --stream has one too, which prints nothing."""

    def __init__(self, spec, console, output):
        self.enabled, self.custom = spec.stream, bool(spec.episode)
        self.console, self.output = console, output
        self.round, self.started = None, None
        self.sent = {}  # (round, key) -> the line sent; key: the task index, or the built-in episode's name
        self.lock = threading.Lock()

    def begin(self, started, round_number=None):
        """A batch starts (client monotonic clock): streamed_after_seconds counts from here."""
        self.started, self.round = started, round_number

    def has_sent(self, key):
        return (self.round, key) in self.sent

    def offer(self, key, tried, job_created, observed, scheme, final):
        """Attempts of one episode ([(pod-shaped record, log text or None)]); `final`: no other
        attempt will be made. Sends the episode's line once its verdict is final."""
        if not self.enabled or self.has_sent(key):
            return
        if self.custom:
            sample, reasons = index_verdict(key, tried, job_created, None, observed, scheme)
            if sample is None and not final:
                return
            self.send(key, task_entry(key, sample, None if sample else no_sample(key, reasons)), sample)
            return
        pod, log = tried[0]
        try:
            row = validate_episode(pod, log, job_created, (observed or {}).get(key), None, scheme)
        except EpisodeInvalid:
            return  # the built-in episode: the batch fails, and its error line says why
        self.send(key, task_entry(None, row, None), row)

    def send(self, key, entry, row):
        line = dict({"type": "episode"}, **({"round": self.round} if self.round else {}), **entry)
        line["phases"] = row["phases"] if row else None
        # client monotonic clock, from the batch's start (the Job's create call, the first claim,
        # the local batch's start), microseconds
        line["streamed_after_seconds"] = round(time.monotonic() - self.started, 6)
        text = json.dumps(line)
        with self.lock:
            if (self.round, key) in self.sent:
                return
            self.sent[(self.round, key)] = line
            with open(self.output / STREAM_FILE, "a") as kept:
                kept.write(text + "\n")
            self.console.say(text)

    def finish(self, report):
        """After results.json: the episodes whose verdict came only with the batch's end (a
        log read at the end, an index the deadline cut short), then a check that every line
        sent agrees with results.json."""
        if not self.enabled:
            return
        if self.custom:
            final = {entry["task"]: (entry, row) for entry, row in zip(
                results_by_task(report), self.rows_by_index(report))}
        else:
            final = {episode_name(row): (task_entry(None, row, None), row) for row in report["pods"]}
        for key, (entry, row) in final.items():  # task order, or results.json's
            if (self.round, key) not in self.sent:
                self.send(key, entry, row)
            sent = self.sent[(self.round, key)]
            differs = [field for field in entry if sent.get(field) != entry[field]]
            if differs:
                self.console.warn("streamed episode %s disagrees with results.json on %s (streamed %s); "
                                  "results.json is the record" % (key, ", ".join(differs),
                                                                   {field: sent.get(field) for field in differs}))

    @staticmethod
    def rows_by_index(report):
        rows = {row["index"]: row for row in report["pods"]}
        return [rows.get(index) for index in range(report["episodes"])]

    def summary(self, view, exit_code):
        self.console.say(json.dumps(dict({"type": "summary", "exit_code": exit_code}, **view)))


# ============================================================================
# Pod logs: every episode pod's log archived as it finishes, through the command's ApiChannel
# ============================================================================

def log_workers(count):
    """Concurrent `kubectl logs` processes: enough for large batches, few for small ones
    (each kubectl is a process of its own, tens of MB)."""
    return max(LOG_FETCH_WORKERS, min(MAX_LOG_FETCH_WORKERS, count // 16))


LOGS_SOURCE_PROXY = "GET pods/NAME/log through the run's kubectl proxy"

LOGS_SOURCE_POD = "kubectl logs POD"

FOLLOW_DRAIN_SECONDS = 5  # a followed log whose container has exited: the stream's end, waited for this long

LOGS_SOURCE_FOLLOWED = ("GET pods/NAME/log?follow=true through the run's kubectl proxy, from the pod's deletion "
                        "until its container exited")

LOGS_GONE = "not available: the pod was gone from the API before its log could be read (no <pod>.log)"


def fetch_logs(cluster, namespace, folder, names):
    """Save <pod>.log for each pod named, byte for byte what the API's pods/NAME/log returns (what
    `kubectl logs POD` prints); return {pod name: log text}. Through the command's proxy, one GET
    per pod, API_PROXY_IN_FLIGHT at once: through one kubectl process the real kubectl allows 5
    requests a second (`kubectl logs -l` of 1,000 pods took 199 s, issue 31). Any the proxy did
    not give (or all, where the channel has no proxy): one `kubectl logs POD` each (4 to 16 at a
    time: each process has a bucket of its own), which words any error as kubectl does. A log
    that cannot be had is saved empty, one warning names how many and the first reason. logs.json
    records where each came from."""
    if not names:
        return {}
    sources, saved, missing = {}, {}, []
    if cluster.api.serves:
        with concurrent.futures.ThreadPoolExecutor(max_workers=API_PROXY_IN_FLIGHT) as pool:
            for name, data in zip(names, pool.map(
                    lambda name: read_log_through_proxy(cluster.api.proxy, namespace, folder, name), names)):
                if data is not None:
                    saved[name], sources[name] = log_text(data), LOGS_SOURCE_PROXY

    def fetch(name):
        try:
            data = cluster.read("-n", namespace, "logs", name, "-c", CONTAINER_NAME, binary=True)
            sources[name] = LOGS_SOURCE_POD
        except KubectlError as error:
            missing.append((name, meaningful_line(error.stderr)))
            sources[name] = "not available: " + meaningful_line(error.stderr)
            data = b""
        (folder / (name + ".log")).write_bytes(data)  # byte for byte
        return name, log_text(data)

    rest = [name for name in names if name not in saved]
    if rest:
        with concurrent.futures.ThreadPoolExecutor(max_workers=log_workers(len(rest))) as pool:
            saved.update(pool.map(fetch, rest))
    if missing:
        missing.sort()
        cluster.console.warn("no log for %d pod(s), saved empty; first: %s: %s" % (len(missing), missing[0][0],
                                                                                   missing[0][1]))
    record_log_sources(folder, sources)
    return saved


def read_log_through_proxy(proxy, namespace, folder, name, follow_seconds=None):
    """GET one pod's log through `proxy` and save it byte for byte as <pod>.log; the bytes, or
    None when the proxy did not answer 200 (the caller leaves that pod to `kubectl logs POD`).
    With follow_seconds, the log is followed (`follow=true`) until its container exits, for at
    most that long: a pod in its grace period, whose log goes with it."""
    query = {"container": CONTAINER_NAME}
    if follow_seconds is not None:
        query["follow"] = "true"
    try:
        status, data = proxy.request("GET", "/api/v1/namespaces/%s/pods/%s/log?%s" % (
            urllib.parse.quote(namespace), urllib.parse.quote(name), urllib.parse.urlencode(query)),
            **({"timeout": follow_seconds} if follow_seconds is not None else {}))
    except ProxyUnavailable:
        return None
    if status != 200:
        return None
    (folder / (name + ".log")).write_bytes(data)
    return data


def log_saved_through_proxy(proxy, namespace, folder, name, follow_seconds=None):
    """read_log_through_proxy for the LogArchive: whether the log is saved, not its bytes (the
    archive reads thousands of logs and keeps none in memory; its file has them)."""
    return read_log_through_proxy(proxy, namespace, folder, name, follow_seconds) is not None


def pod_log_later(cluster, namespace, name):
    """One pod's log (bytes) read in a BackgroundCall: through the command's proxy, else `kubectl
    logs POD`; a refusal raised as kubectl's KubectlError."""
    api = cluster.api
    if not api.serves:
        return BackgroundCall(lambda started: cluster.kubectl("-n", namespace, "logs", name, "-c", CONTAINER_NAME,
                                                              binary=True, on_start=started))
    path = "%s/log?%s" % (PODS.path(namespace, name), urllib.parse.urlencode({"container": CONTAINER_NAME}))

    def read(started):
        status, body = api.send("GET", path)
        if status != 200:
            raise api.refusal("GET", path, status, body)
        return body
    return BackgroundCall(read)


class LogArchive:
    """A Job's episode logs archived while the batch runs, not after it: the wait loop offers
    every pod it sees finished, and the command's proxy reads each one's log (where its channel
    has one), API_PROXY_IN_FLIGHT at once, saved byte
    for byte as <pod>.log. A finished pod's log is final (restartPolicy Never: its one
    container has exited), so reading it early reads what the end would, and at Complete only
    the last few remain (1,000 pods at 100 ms a request: 3.5 s of reads after Complete before,
    none of them after; issue 31). What it did not get (no proxy, a refusal, a pod already gone)
    is left to the end's fetch_logs, which words why. Its threads only write <pod>.log;
    logs.json is written by settle(), in the caller's thread.

    A pod deleted while it runs (an eviction, a drain) takes its log with it when its grace
    period ends, perhaps seconds after its episode printed a reward and exited inside that
    period; whatever the batch's size, such a pod's log is followed from the moment the watch
    shows its deletion until its container exits (issue 32 item 6)."""

    def __init__(self, cluster, namespace, folder):
        self.cluster, self.namespace, self.folder = cluster, namespace, folder
        self.enabled = cluster.api.serves
        self.proxy, self.threads = cluster.api.proxy, None
        self.finished = set()  # the pods offered finished: each is looked at once
        self.reads = {}  # pod name -> Future of its read: True once saved, False when not had
        self.recorded = set()  # the pods whose source settle() wrote into logs.json
        self.followed = set()  # the pods seen deleted while running: their logs followed
        self.exited = set()  # followed pods last seen Succeeded or Failed: their streams are ending
        self.closed = not self.enabled  # closed, or no proxy to read through: no more reads

    def offer(self, pods):
        """Start reading the log of every finished pod in {name: pod} not read or saved yet, and
        following that of every pod deleted while it runs."""
        if self.closed:
            return
        self.exited.update(name for name in self.followed if pods.get(name, {}).get("status", {}).get("phase")
                           in ("Succeeded", "Failed"))
        for name, pod in pods.items():
            phase = pod.get("status", {}).get("phase")
            if name in self.followed or name in self.reads or not pod["metadata"].get("deletionTimestamp") \
                    or phase not in ("Pending", "Running"):
                continue
            self.followed.add(name)
            if not (self.folder / (name + ".log")).exists():
                grace = pod["metadata"].get("deletionGracePeriodSeconds") or pod["spec"].get(
                    "terminationGracePeriodSeconds", 30)
                self.read(name, grace + KUBECTL_PROCESS_TIMEOUT_SECONDS)
        if not self.enabled:
            return
        for name, pod in pods.items():
            if name in self.finished or pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                continue
            self.finished.add(name)
            if name in self.reads or (self.folder / (name + ".log")).exists():  # followed, or the stream saved it
                continue
            self.read(name)

    def read(self, name, follow_seconds=None):
        """Read (or follow) one pod's log in the pool. A finished read leaves its outcome in
        `reads`, not its Future: 10,000 Futures held to the end were about 10 MB."""
        self.reads[name] = future = self.pool.submit(log_saved_through_proxy, self.proxy, self.namespace,
                                                     self.folder, name, follow_seconds)
        # replacing a value never resizes the dict, so the caller's thread may iterate it meanwhile
        future.add_done_callback(lambda done: self.reads.__setitem__(name, SettledRead.of(done)))

    @property
    def pool(self):
        """The reads' threads, started at the first read."""
        if self.threads is None:
            self.threads = concurrent.futures.ThreadPoolExecutor(max_workers=API_PROXY_IN_FLIGHT)
        return self.threads

    def settle(self, names=None):
        """Wait for the reads started of `names` (all when None) and record where their logs came
        from in logs.json; the names whose log is saved."""
        wanted = [name for name in (self.reads if names is None else names) if name in self.reads]
        # A followed log whose pod still runs (a deadline's kill, a drain: up to its grace period,
        # 30 s by default) is not waited for: the end reads what the API has of it now.
        wanted = [name for name in wanted if name not in self.followed or name in self.exited
                  or self.reads[name].done()]
        saved = [name for name in wanted if not self.reads[name].cancelled() and self.result_of(name)]
        new = [name for name in saved if name not in self.recorded]
        if new:
            record_log_sources(self.folder, {name: LOGS_SOURCE_FOLLOWED if name in self.followed else LOGS_SOURCE_PROXY
                                             for name in new})
            self.recorded.update(new)
        return saved

    def result_of(self, name):
        """Whether a read saved its log (None: not yet); a followed stream whose container has
        exited gets FOLLOW_DRAIN_SECONDS to end."""
        try:
            return self.reads[name].result(timeout=FOLLOW_DRAIN_SECONDS if name in self.followed else None)
        except concurrent.futures.TimeoutError:
            return None

    def close(self):
        """Stop reading (reads not started are dropped; the end or a failure path reads what it needs)."""
        self.enabled, self.closed = False, True
        if self.threads is not None:
            self.threads.shutdown(wait=False, cancel_futures=True)
            self.threads.shutdown(wait=True)


class SettledRead:
    """A finished log read as LogArchive keeps it: what its Future answered, without the Future."""

    def __init__(self, saved, cancelled=False, error=None):
        self.saved, self.was_cancelled, self.error = saved, cancelled, error

    @classmethod
    def of(cls, future):
        if future.cancelled():
            return READ_CANCELLED
        error = future.exception()
        if error is not None:
            return cls(None, error=error)
        return READ_SAVED if future.result() else READ_NOT_SAVED

    def done(self):
        return True

    def cancelled(self):
        return self.was_cancelled

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.saved


READ_SAVED, READ_NOT_SAVED, READ_CANCELLED = SettledRead(True), SettledRead(False), SettledRead(None, cancelled=True)


def record_log_sources(folder, sources):
    """Add {pod: where its log came from} to logs.json."""
    record = read_saved(folder / "logs.json") or {}
    record.update(sources)
    write_json(folder / "logs.json", dict(sorted(record.items())))


# ============================================================================
# Job backend: one batch/v1 Job, a pod per episode; its watches, rounds and prewarm
# ============================================================================

JOBS = Resource("Job", "batch/v1", "jobs")
# The TTL-after-finished controller deletes a finished Job (its pods with it) this long after it
# finished: long after the tool has read and saved everything (it reads as the Job finishes).
JOB_SAFETY_NET_SECONDS = 600


def job_manifest(namespace, run_id, count, parallelism, image, runtime, deadline=DEFAULT_TIMEOUT_SECONDS,
                 custom=None, task_indexes=None):
    """The batch: `count` episodes, `parallelism` at a time; runtime None = cluster default.

    `custom` (CustomEpisodes): Indexed completion mode, `custom.retries` failed attempts allowed
    per index (backoffLimitPerIndex) so one failure never fails the others, and evictions
    (DisruptionTarget) retried without counting; with `custom.tasks` episode i gets task i, or
    with `task_indexes` (one Job of a batch across images) task task_indexes[i], which the
    probe program sets as the episode's TASK_INDEX and TASK_FILE (RL_TASK_INDEXES).
    """
    spec = {"completions": count, "parallelism": parallelism, "backoffLimit": 0,
            "activeDeadlineSeconds": deadline,
            # a safety net, as a claim's shutdownTime: a tool killed for good leaves no Job or pod past it
            "ttlSecondsAfterFinished": JOB_SAFETY_NET_SECONDS}
    if custom is not None:
        del spec["backoffLimit"]  # with backoffLimitPerIndex it defaults to "no global limit"
        spec.update(completionMode="Indexed", backoffLimitPerIndex=custom.retries, podFailurePolicy={"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]})
    spec["template"] = episode_pod_template(run_id, image, runtime, custom is not None and custom.tasks)
    if task_indexes is not None:
        spec["template"]["spec"]["containers"][0]["env"].append(
            {"name": "RL_TASK_INDEXES", "value": ",".join(str(index) for index in task_indexes)})
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": JOB_NAME, "namespace": namespace, "labels": object_labels(run_id, "batch")},
            "spec": spec}


def prewarm_pull_words(pull):
    """How a prewarm episode's node got its image, for its line: "pulled in 0.07 s (2.6 s with
    waiting)", "cached", or "unknown" (the kubelet's events said neither)."""
    if pull["state"] == "pulled":
        return "pulled in %s%s" % (format_seconds(pull["pull_seconds"]) if pull["pull_seconds"] is not None else "?",
                                   " (%s with waiting)" % format_seconds(pull["pull_seconds_including_waiting"])
                                   if pull.get("pull_seconds_including_waiting") is not None else "")
    return pull["state"] or "unknown"


def image_parts(task_images, parallelism):
    """A batch across images as one Job per image: [(image, [task indexes], its parallelism)], in
    the order each image's first task comes (images compared as the kubelet names them)."""
    groups = {}
    for index, image in enumerate(task_images):
        groups.setdefault(normalized_image(image), (image, []))[1].append(index)
    shares = split_parallelism(parallelism, [len(indexes) for _, indexes in groups.values()])
    return [(image, indexes, share) for (image, indexes), share in zip(groups.values(), shares)]


def split_parallelism(total, sizes):
    """--parallelism `total` shared by Jobs of `sizes` episodes, so that together they never run
    more than `total` at once: each Job one, then what is left in proportion to each Job's
    remaining episodes (largest remainder, ties to the earlier Job), never more than its size.
    Needs total >= len(sizes) (batch_image refuses fewer)."""
    total = min(total, sum(sizes))
    room = [size - 1 for size in sizes]
    left = total - len(sizes)
    ideal = [left * r / (sum(room) or 1) for r in room]
    shares = [int(x) for x in ideal]
    for i in sorted(range(len(sizes)), key=lambda i: (-(ideal[i] - shares[i]), i))[:left - sum(shares)]:
        shares[i] += 1
    return [1 + share for share in shares]


JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
LOG_FETCH_WORKERS = 4  # the tutorial's concurrency, the floor for small batches
MAX_LOG_FETCH_WORKERS = 16  # each is a kubectl process of its own

# Refusals that cannot pass until someone changes the cluster or the spec. Others, such as a
# namespace's ServiceAccount not made yet or a ResourceQuota that is full, pass on their own
# (tests/fakecluster/ASSUMPTIONS.md, fact 26), and the Job controller retries them.
PERMANENT_REFUSALS = ("violates PodSecurity", "pod rejected: RuntimeClass", "because it is being terminated",
                      "cannot create resource")
PERMANENT_WAITING = ("CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull")
# A pull the registry answered "no such image" for: the kubelet retries it with a back-off, but
# no retry finds what the registry does not have (containerd's CRI answers gRPC NotFound,
# "failed to resolve image: NAME: not found"). A registry that cannot be reached is not this.
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")
IMAGE_NOT_FOUND = ("code = NotFound", ": not found", "manifest unknown")


def job_outcome(job):
    """'Complete', 'Failed' or None (still running), from the Job's conditions. FailureTarget
    counts as Failed: since 1.31 `Failed` waits until every pod has terminated, up to their
    grace period later (tests/fakecluster/ASSUMPTIONS.md, fact 29), but the outcome is already decided."""
    conditions = {c.get("type"): c for c in (job or {}).get("status", {}).get("conditions", [])}
    for kind, outcome in (("Complete", "Complete"), ("Failed", "Failed"), ("FailureTarget", "Failed")):
        if conditions.get(kind, {}).get("status") == "True":
            return outcome
    return None


def job_condition(job, kind):
    for condition in job.get("status", {}).get("conditions", []):
        if condition.get("type") == kind:
            return condition
    return {}


def blocking_reason(events, pods):
    """Why the episode pods can never start, when waiting will not help; None otherwise.

    Admission refusals (PodSecurity, RuntimeClass) show only as the Job controller's
    FailedCreate events; a container the kubelet refuses to start shows as a waiting reason.
    A refusal counts only when no pod was created at or after its last occurrence.
    """
    newest_pod = max((parse_k8s_time(pod["metadata"]["creationTimestamp"]) for pod in pods
                      if pod["metadata"].get("creationTimestamp")), default=None)
    for event in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "", reverse=True):
        message = event.get("message") or ""
        if event.get("reason") != "FailedCreate" or not any(marker in message for marker in PERMANENT_REFUSALS):
            continue
        when = event.get("lastTimestamp") or (event.get("eventTime") or "")[:19] + "Z"
        if newest_pod is not None and (len(when) < 20 or newest_pod >= parse_k8s_time(when)):
            continue  # a pod was created since: the refusal did not last
        return "the cluster refused to create the episode pods: " + message.replace("Error creating: ", "", 1)
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = status.get("state", {}).get("waiting") or {}
            if waiting.get("reason") in PERMANENT_WAITING:
                return "pod %s cannot start its container (%s: %s)" % (
                    pod["metadata"]["name"], waiting["reason"], waiting.get("message"))
            if waiting.get("reason") in PULL_FAILURES and any(
                    marker in (waiting.get("message") or "") for marker in IMAGE_NOT_FOUND):
                needing = tasks_of_image(pods, status.get("image"))
                return "the image %s does not exist in its registry: pod %s cannot pull it (%s: %s)%s; check %s" % (
                    status.get("image") or "?", pod["metadata"]["name"], waiting["reason"], waiting.get("message"),
                    needing, "the tasks' \"image\" or --image" if needing else "--image")
    return None


def tasks_of_image(pods, image):
    """"; tasks 0, 3 and 5 need it": the task indexes (custom episodes of an Indexed Job) of the
    pods that wait for `image`, or "" when the pods carry no index."""
    indexes = sorted({task_index(pod) for pod in pods if task_index(pod) is not None and any(
        status.get("image") == image for status in pod.get("status", {}).get("containerStatuses") or [])})
    if not indexes:
        return ""
    return "; task%s %s need%s it" % ("s" if len(indexes) > 1 else "", some_of(indexes, 10),
                                      "" if len(indexes) > 1 else "s")


def why_not_started(pods, events=()):
    """Why pods have not run, for a timeout's error line: each distinct waiting reason or
    scheduling failure with its message, and the last refused creation. Empty when unknown."""
    reasons = collections.OrderedDict()
    for pod in pods:
        for condition in pod.get("status", {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reasons.setdefault("FailedScheduling: %s" % condition.get("message", condition.get("reason")), 0)
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
                reasons.setdefault("%s: %s" % (waiting["reason"], waiting.get("message", "")), 0)
    failed_creates = [e for e in events if e.get("reason") == "FailedCreate"]
    if failed_creates and not pods:
        reasons.setdefault("FailedCreate: %s" % failed_creates[-1].get("message", ""), 0)
    return list(reasons)


class ObjectDeleted(DemoError):
    """An object of the run was deleted, mid-run, by something other than this run."""


def deleted_by_someone_else(cluster, namespace, kind, name):
    """The line for a Job (or Sandbox, ...) that vanished mid-run: whether its namespace went
    with it, and that this run did not delete it."""
    try:
        ns = cluster.api.get(NAMESPACES, namespace)
    except KubectlError:
        ns = {}
    if ns is None or (ns or {}).get("metadata", {}).get("deletionTimestamp"):
        return ("namespace %s was deleted by someone else while the batch ran (%s): this run did not delete it, "
                "and its %s %s went with it" % (namespace, "it is gone" if ns is None else
                                                "Terminating since %s" % ns["metadata"]["deletionTimestamp"],
                                                kind, name))
    return ("%s %s was deleted by someone else while the batch ran (another user, a controller, or a cleanup of "
            "this run from another terminal): this run did not delete it" % (kind, name))


class JobWatches:
    """One pod watch and one Job watch for a set of Jobs, shared by their JobProgress: the
    prewarm Jobs of 100 nodes cost two kubectl watches, not 200. Pods are filed under their
    `job-name` label; the last state of every pod seen is kept, also once the API has deleted
    it, and so is when each pod's sandbox became ready, which a finished pod no longer shows."""

    def __init__(self, cluster, namespace, pod_selector, job_name=None, job_selector=None):
        """Start before the Jobs are created, so that no pod state is missed: the Jobs' watch is
        `job_name`'s, or that of the Jobs of label `job_selector`."""
        self.cluster, self.namespace = cluster, namespace
        # Timed: when each pod was first seen (client clock) tells admission cycles apart within a second.
        self.pod_watch = cluster.api.watch(PODS, namespace, pod_selector, timed=True)
        self.job_watch = cluster.api.watch(JOBS, namespace, job_selector, job_name)
        self.pods = collections.defaultdict(dict)  # job name -> pod name -> latest state
        self.observed = collections.defaultdict(dict)  # job name -> pod name -> {"sandbox_ready": unix s}
        self.jobs = {}  # job name -> latest state

    def absorb(self, timeout=0.0):
        """Take in what the watches delivered; True when a Job changed."""
        jobs = self.job_watch.drain(timeout=timeout)
        for job in jobs:
            self.jobs[job["metadata"]["name"]] = job
        for arrival, pod in self.pod_watch.drain():
            labels = pod["metadata"].get("labels") or {}
            job_name, name = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name"), \
                pod["metadata"]["name"]
            self.pods[job_name][name] = pod
            seen = self.observed[job_name].setdefault(name, {})
            seen.setdefault("first_seen", arrival)
            if condition_time(pod, "PodScheduled")[0] is not None:
                seen.setdefault("scheduled_seen", arrival)
            state = ((pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {})
            if "running" in state or "terminated" in state:
                seen.setdefault("container_started_seen", arrival)
            when, _ = condition_time(pod, "PodReadyToStartContainers")
            if when is not None:
                seen.setdefault("sandbox_ready", when)
        return bool(jobs)

    def stop(self):
        self.job_watch.stop()
        self.pod_watch.stop()


class JobProgress:
    """Waits for one Job through its watches (its own, or shared with other Jobs); polls as a
    fallback. `pods` holds the last state of every pod of the Job the watch saw, `observed`
    the sandbox-ready times seen while the pods ran."""

    def __init__(self, cluster, namespace, job_name, shared=None):
        self.cluster, self.namespace, self.job_name = cluster, namespace, job_name
        self.watches = shared or JobWatches(cluster, namespace, "job-name=" + job_name, job_name)
        self.own_watches = shared is None
        self.pods = self.watches.pods[job_name]
        self.observed = self.watches.observed[job_name]
        self.failed_creates = []  # the Job's FailedCreate events, as last read
        self.unreachable_since = None  # client monotonic clock: since when no call reaches the API server
        self.unreachable_error = ""  # kubectl's line for it
        self.poll = None  # the `get job` running in the background, if any
        self.feed = None  # with --stream: the JobEpisodeFeed told of every update
        self.log_archive = None  # the LogArchive offered every finished pod

    def absorb_pods(self):
        self.watches.absorb()

    def read_failed_creates(self):
        """The Job's own FailedCreate events (a field selector: not every event of the namespace)."""
        selector = "involvedObject.kind=Job,involvedObject.name=%s,reason=FailedCreate" % self.job_name
        # Through the command's channel (a stall check every few seconds of a long wait was a
        # kubectl process each: 30 of a 1,000-episode Job's 42), sent once: the wait loop is its
        # retry, and a failure in passing is the loop's word that the API server went away.
        self.failed_creates = self.cluster.api.list(EVENTS, self.namespace, fields=selector, retry=False)
        return self.failed_creates

    def unreachable(self, error):
        if self.unreachable_since is None:
            self.unreachable_since, self.unreachable_error = time.monotonic(), meaningful_line(error.stderr)
            self.cluster.console.note("the API server is not answering (%s); waiting for it, the pods run on "
                                      "without it" % self.unreachable_error)

    def reachable(self):
        if self.unreachable_since is not None:
            self.cluster.console.note("the API server answers again, after %.0f s"
                                      % (time.monotonic() - self.unreachable_since))
            self.unreachable_since = None

    def poll_job(self, previous):
        """The Job as the API server has it now, once a `get job` started in the background
        (by this call, or an earlier one) has answered; until then, or while the server cannot
        be reached, `previous`. An outage (a control-plane upgrade, a restarted API server) is
        waited out, as the pods run on without it; it is noted when it starts and when it ends.
        Raises ObjectDeleted when the Job or its namespace was deleted by someone else."""
        if self.poll is None:
            self.poll = self.cluster.api.get_later(JOBS, self.job_name, self.namespace)
        if not self.poll.done():
            return previous
        poll, self.poll = self.poll, None
        try:
            job = poll.result()
        except KubectlError as error:
            if not error.transient:
                raise
            self.unreachable(error)
            return previous
        if job is None:
            raise ObjectDeleted(deleted_by_someone_else(self.cluster, self.namespace, "Job", self.job_name))
        self.reachable()
        if job["metadata"].get("deletionTimestamp"):
            raise ObjectDeleted(deleted_by_someone_else(self.cluster, self.namespace, "Job", self.job_name))
        return job

    def wait(self, started, wait_seconds, admission):
        """Until Complete, FailureTarget/Failed, a reason the pods can never start (the
        admission gate's among them), or the client deadline (the gate's while it queues).
        An unreachable API server is waited for up to that deadline.
        Returns (job, 'Complete'|'Failed'|None, blocking reason or None)."""
        console = self.cluster.console
        admission.begin(started)
        live = self.poll_job({})
        progress, progress_at, polled_at = None, time.monotonic(), time.monotonic()
        while True:
            deadline = admission.deadline(wait_seconds)
            queue_state = admission.state_line()
            # While the server is unreachable, asked every second: the watches only restart.
            poll_every = FALLBACK_POLL_SECONDS if self.unreachable_since is None else 1.0
            if self.watches.absorb(timeout=WATCH_WAIT_SECONDS) and self.job_name in self.watches.jobs:
                live = self.watches.jobs[self.job_name]
                self.reachable()  # the watch delivered: the server answers
                if live["metadata"].get("deletionTimestamp"):
                    live = self.poll_job(live)
            elif self.poll is not None or time.monotonic() - polled_at >= poll_every:
                live = self.poll_job(live)
                if self.poll is None:
                    polled_at = time.monotonic()
            if self.feed is not None:
                self.feed.update(live, self.pods, self.observed)
            if self.log_archive is not None:
                self.log_archive.offer(self.pods)
            outcome = job_outcome(live)
            status = live.get("status", {})
            counts = tuple(status.get(key, 0) for key in ("active", "ready", "succeeded", "failed"))
            unreachable = "API server unreachable for %.0f s; " % (time.monotonic() - self.unreachable_since) \
                if self.unreachable_since is not None else ""
            console.progress("%s: %s%sactive %d, ready %d, succeeded %d, failed %d, %.0f s"
                             % ((self.job_name, unreachable, "%s; " % queue_state[:100] if queue_state else "") +
                                counts + (time.monotonic() - started,)))
            blocked = None if outcome or unreachable else admission.blocked(started)
            if counts != progress:
                progress, progress_at = counts, time.monotonic()
            elif not outcome and not unreachable and time.monotonic() - progress_at >= STALL_CHECK_SECONDS:
                try:
                    blocked = blocking_reason(self.read_failed_creates(), list(self.pods.values()))
                except KubectlError as error:
                    if not error.transient:
                        raise
                    self.unreachable(error)
                progress_at = time.monotonic()
            if time.monotonic() > deadline and self.unreachable_since is not None:
                console.end_progress()
                raise BatchTimeout("the API server did not answer for the last %.0f s of the client's %d s "
                                   "wait (%s), so whether Job %s finished is unknown"
                                   % (time.monotonic() - self.unreachable_since, wait_seconds,
                                      self.unreachable_error, self.job_name))
            if outcome or blocked or time.monotonic() > deadline:
                console.end_progress()
                admission.finish()
                return live, outcome, blocked

    def settled_pods(self, job, timeout=2.0):
        """The watched pods, once they are provably the finished Job's final pod states (so
        no `get pods` of every pod is needed): every one terminal and counted (the Job
        controller removes its job-tracking finalizer when it counts a pod, before it sets
        Complete), and together they account for the Job's succeeded and failed counts.
        None when the watch has not shown that within `timeout` seconds."""
        status = job.get("status", {})
        give_up = time.monotonic() + timeout
        while True:
            pods = list(self.pods.values())
            phases = collections.Counter(pod.get("status", {}).get("phase") for pod in pods)
            counted = all(pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and JOB_TRACKING_FINALIZER
                          not in (pod["metadata"].get("finalizers") or []) for pod in pods)
            if pods and counted and phases["Succeeded"] >= status.get("succeeded", 0) and \
                    phases["Failed"] >= status.get("failed", 0):
                return sorted(pods, key=by_creation)
            if time.monotonic() > give_up:
                return None
            self.watches.absorb(timeout=WATCH_WAIT_SECONDS)

    def stop(self):
        if self.poll is not None:
            self.poll.cancel()
            self.poll = None
        if self.own_watches:
            self.watches.stop()


class Unqueued(Admission):
    """The Job's admission when no gate holds it: admitted from the start, its deadline the
    client's wait from the create call (every method as Admission has it)."""


def save_events(cluster, namespace, folder):
    """events.json (the namespace's Events, oldest first: image pulls are read from it) and
    events.txt (the same as a table, for people)."""
    events = sorted(cluster.api.list(EVENTS, namespace), key=event_time)
    write_json(folder / "events.json", events)
    (folder / "events.txt").write_text(events_table(events))


def save_state(cluster, namespace, job_name, folder, job=None, watched=None):
    """job.json and pods.json as the API server has them now, plus the last watched state of
    every pod the API no longer has (deleted by the Job controller or an eviction); returns
    (job, pods, names of the pods known only from the watch)."""
    if job is None:
        job = cluster.api.get(JOBS, job_name, namespace)
        if job is None:
            raise ObjectDeleted(deleted_by_someone_else(cluster, namespace, "Job", job_name))
    pods = cluster.api.list(PODS, namespace, "job-name=" + job_name)
    listed = {pod["metadata"]["name"] for pod in pods}
    gone = sorted(name for name in (watched or {}) if name not in listed)
    pods += [watched[name] for name in gone]
    pods.sort(key=by_creation)
    write_state(folder, job, pods)
    return job, pods, gone


def write_state(folder, job, pods):
    """job.json and pods.json: what results.json is computed from."""
    write_json(folder / "job.json", job)
    write_json(folder / "pods.json", pods)


def save_node_summaries(nodes, pods, folder):
    """nodes.json: the nodes this folder's episodes ran on, from the list read at the start
    (or the reason it could not be read)."""
    if nodes is None:
        parent = folder if (folder / "nodes.json").exists() else folder.parent
        if (parent / "nodes.json").exists() and parent != folder:
            (folder / "nodes.json").write_text((parent / "nodes.json").read_text())
        return
    used = {pod["spec"].get("nodeName") for pod in pods}
    write_json(folder / "nodes.json", [node_summary(node) for node in nodes if node["metadata"]["name"] in used])


def index_set(ranges):
    """A Job's completedIndexes or failedIndexes ("1,3-5") as a set of ints."""
    indexes = set()
    for part in (ranges or "").split(","):
        if part.strip():
            first, _, last = part.partition("-")
            indexes.update(range(int(first), int(last or first) + 1))
    return indexes


STREAM_LOG_READS = 8  # `kubectl logs POD` processes at once for the stream's early logs


class JobEpisodeFeed:
    """--stream on the Job backend: hands the stream each episode whose verdict the watches
    already show. A finished pod is enough when its termination message holds its events;
    otherwise (and for a failed attempt, whose reason quotes its log) its log is read in the
    background as soon as it finished, saved as <pod>.log, and not read again at the end. A
    custom episode's failure is final once the Job controller gave up on its index
    (status.failedIndexes); until then another attempt may still come."""

    def __init__(self, job_round):
        self.round, self.stream = job_round, job_round.run.stream
        self.custom = bool(job_round.run.spec.episode)
        self.logs = {}  # pod name -> log text, or None when the API no longer had it
        self.reading = {}  # pod name -> BackgroundCall of its `kubectl logs`
        self.waiting = []  # pod names whose log is wanted, in the order they finished
        self.refused = collections.Counter()  # pod name -> failed reads (after 3, the end reads it)

    def update(self, job, pods, observed):
        """Called by the wait loop with the Job and every pod as last seen."""
        created = job.get("metadata", {}).get("creationTimestamp")
        if not created:
            return
        self.collect_logs()
        failed_indexes = index_set(job.get("status", {}).get("failedIndexes"))
        if self.round.task_indexes is not None:
            failed_indexes = {self.round.task_indexes[index] for index in failed_indexes}
        groups = collections.defaultdict(list)
        for pod in pods.values():
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                # a batch across images: the pod's own task, not its Job's index
                groups[task_index(pod) if self.custom else pod["metadata"]["name"]].append(pod)
        for key, finished in groups.items():
            if key is None or self.stream.has_sent(key):
                continue
            counted = [pod for pod in finished if pod["status"]["phase"] == "Succeeded"
                       and not pod["metadata"].get("deletionTimestamp")]
            final = bool(counted) or key in failed_indexes
            if not self.custom and not counted:
                continue  # a failed built-in episode fails the batch: nothing to stream
            wanted = [pod["metadata"]["name"] for pod in finished if self.needs_log(pod)]
            if any(name not in self.logs for name in wanted):
                for name in wanted:
                    if self.refused[name] < 3:
                        self.want_log(name)
                continue
            tried = [(pod, self.logs.get(pod["metadata"]["name"])) for pod in finished]
            self.stream.offer(key, tried, parse_k8s_time(created), observed, JobBackend.scheme, final)

    @staticmethod
    def needs_log(pod):
        return pod["status"]["phase"] != "Succeeded" or episode_events(pod, "")[1] == "log"

    def want_log(self, name):
        if name not in self.reading and name not in self.waiting:
            self.waiting.append(name)
        self.start_reads()

    def start_reads(self):
        while self.waiting and len(self.reading) < STREAM_LOG_READS:
            pod = self.waiting.pop(0)
            self.reading[pod] = pod_log_later(self.round.cluster, self.round.namespace, pod)

    def collect_logs(self):
        """Take in the logs read since the last update, saved byte for byte as the end would."""
        for name, call in list(self.reading.items()):
            if not call.done():
                continue
            del self.reading[name]
            try:
                data = call.result()
            except KubectlError as error:
                if error.not_found:
                    self.logs[name] = None  # gone with its pod; the end records it so in logs.json
                else:
                    self.refused[name] += 1  # asked again at the next update, up to 3 times
                continue
            (self.round.folder / (name + ".log")).write_bytes(data)
            record_log_sources(self.round.folder, {name: LOGS_SOURCE_PROXY if self.round.cluster.api.serves
                                                   else LOGS_SOURCE_POD})
            self.logs[name] = log_text(data)
        self.start_reads()

    def stop(self):
        for call in self.reading.values():
            call.cancel()
        self.reading, self.waiting = {}, []


class JobRound:
    """One Job of a run from its submission to its results (a measured round, or one prewarm
    Job): what its wait saw is kept here, so that every way out can save it."""

    def __init__(self, run, job, folder, run_info, progress, admission):
        self.run, self.job, self.folder, self.run_info = run, job, folder, run_info
        self.progress, self.admission = progress, admission
        self.name = job["metadata"]["name"]
        self.cluster, self.console, self.namespace = run.cluster, run.console, run.namespace
        self.started = None  # client monotonic clock, just before the create call
        # The Job's pods as saved (just their names once results.json is being computed: pod_names());
        # those the API no longer has, once known
        self.pods, self.gone = [], None
        self.created = None  # the Job as its create returned it
        self.events_saved = False  # events.json written for results.json (archive() leaves it so)
        self.measured = "prewarm_node" not in run_info  # a prewarm Job's episode is no sample: not streamed
        self.task_indexes = run_info.get("task_indexes")  # one Job of a batch across images: its tasks
        if self.task_indexes is not None and self.measured:
            # the namespace's events are the same for every Job of the round: it reads them once
            self.events_saved = True
        progress.feed = JobEpisodeFeed(self) if run.spec.stream and self.measured else None
        progress.log_archive = self.log_archive = LogArchive(self.cluster, self.namespace, folder)

    def submit(self):
        """Create the Job, recording its UID in the receipt at once."""
        write_json(self.folder / "job-submitted.json", self.job)
        self.started = time.monotonic()
        if self.measured:
            self.run.stream.begin(self.started, self.run_info.get("round"))
        created = self.run.create_recorded(self.job)
        create_returned = time.time()  # the Job exists: a queue wait starts no later than this
        self.created = created  # as the API server returned it: job.json never depends on the watch
        self.run.receipt.setdefault("jobs", {})[self.name] = created["metadata"]["uid"]
        if self.name == JOB_NAME:
            self.run.receipt["job_uid"] = created["metadata"]["uid"]  # the tutorial's key
        self.run.save_receipt()
        self.admission.follow(created, create_returned)

    def finish(self):
        """Wait for the Job, save its diagnostics, validate it, write its results.

        Order matters at scale: results.json is written from one `get pods` (each episode's
        events travel in its termination message) before the per-episode logs are archived
        (most of them already are: the LogArchive read each as its pod finished).
        """
        try:
            return self.wait_validate_archive()
        finally:
            self.log_archive.close()

    def wait_validate_archive(self):
        folder, run_info, progress = self.folder, self.run_info, self.progress
        wait_seconds = self.run.spec.timeout + CLIENT_GRACE_SECONDS
        try:
            live, outcome, blocked = progress.wait(self.started, wait_seconds, self.admission)
            # client_job_complete_seconds: client monotonic clock, from just before the Job's
            # create request to the moment the client saw the Complete condition.
            run_info["client_job_complete_seconds"] = time.monotonic() - self.started
            run_info["outcome_observed_at"] = time.time()
            progress.absorb_pods()
            # A complete Job's pods come from the watch when it provably holds their final states;
            # which of them the API still has (for their logs) is asked after results.json.
            settled = progress.settled_pods(live) if outcome == "Complete" else None
        except KeyboardInterrupt:
            self.stop()
            self.admission.save(folder, run_info)
            self.save_what_is_known()
            raise
        except DemoError as error:
            self.stop()
            raise self.save_what_was_seen(error) from None
        finally:
            self.stop()
        write_json(folder / "observed.json", progress.observed)
        self.admission.save(folder, run_info)
        try:
            self.pods = settled
            if self.pods is None:
                _, self.pods, self.gone = save_state(self.cluster, self.namespace, self.name, folder, live,
                                                     progress.pods)
            else:
                write_state(folder, live, self.pods)
        except DemoError as error:
            # The watches already hold the Job and every pod: a failing read must not lose them.
            write_state(folder, live, sorted(progress.pods.values(), key=by_creation))
            run_info["pods_seen_only_by_watch"] = sorted(progress.pods)
            write_json(folder / "run.json", run_info)
            raise DemoError("%s; the Job and its pods were saved as the watches last saw them (job.json, pods.json "
                            "in %s): the results can be recomputed once the cluster answers" % (error, folder)) from None
        if self.gone is not None:
            run_info["pods_seen_only_by_watch"] = self.gone
        write_json(folder / "run.json", run_info)
        save_node_summaries(self.run.facts["nodes"], self.pods, folder)
        where = "diagnostics saved in %s (job.json, pods.json, events.txt, pod logs)" % folder
        if blocked or outcome is None or (outcome != "Complete" and not run_info.get("custom_episode")):
            self.fail(live, outcome, blocked, wait_seconds, where)
        # Episodes whose termination message does not hold their events are validated from logs,
        # and a failed attempt's log says why it failed.
        needed = [pod["metadata"]["name"] for pod in self.pods if episode_events(pod, "")[1] == "log"
                  or pod.get("status", {}).get("phase") != "Succeeded"]
        # From here on only the pods' names are needed: results.json is computed from pods.json,
        # and the watch's copy held beside the events and the results would double the tool's
        # memory (10,000 pods: 37 MB beside 17 MB of events).
        del settled
        self.pods = self.pod_names()
        self.progress.pods.clear()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as side:
            # the events say how each pod got its image (results.json's image_pulls): read beside the logs
            events = None if self.events_saved else side.submit(save_events, self.cluster, self.namespace, folder)
            self.log_archive.settle(needed)
            needed = [name for name in needed  # neither the stream's reads nor the archive's have it
                      if not (folder / (name + ".log")).exists()]
            if needed:
                self.learn_gone()
                self.logs_of(needed)
            try:
                if events is not None:
                    events.result()
                    self.events_saved = True
            except DemoError as error:  # the results do not wait for them: their pulls are unknown
                self.console.warn("could not read the events, so the image pulls are unknown: %s" % error)
        report = write_results(folder, where, before_failing=self.archive)
        if self.measured and self.task_indexes is None:  # a batch across images streams its round's
            self.run.stream.finish(report)  # the episodes only the end decided, before the archive
        try:
            self.archive()  # for people: the results are already safe
        except DemoError as error:
            raise DemoError("results.json is written, but archiving the episode logs and events failed: %s; %s"
                            % (error, where)) from None
        report["log_archive"] = log_archive_summary(folder)
        write_json(folder / "results.json", report)
        return report

    def fail(self, live, outcome, blocked, wait_seconds, where):
        """The Job did not complete (or was blocked, or the wait ended): save the events and
        logs, then raise the one line that says why."""
        save_events(self.cluster, self.namespace, self.folder)
        logs = self.logs_of(self.pod_names())
        if blocked:
            raise DemoError("%s; stopped early instead of waiting for the deadline; %s" % (blocked, where))
        not_started = why_not_started(self.pods, self.progress.failed_creates)
        why = "; pods not running: %s" % "; ".join(not_started[:3]) if not_started else ""
        if outcome is None:
            raise self.admission.timeout_error(self.name, where) or BatchTimeout(
                "Job %s did not finish within the client's %d s wait%s%s; %s"
                % (self.name, wait_seconds, " after its admission" if self.admission.queued else "", why, where))
        failed = job_condition(live, "Failed") or job_condition(live, "FailureTarget")
        message = "Job %s failed (%s: %s)" % (self.name, failed.get("reason"), failed.get("message"))
        details = describe_failed_pods(self.pods, [logs.get(pod["metadata"]["name"], "") for pod in self.pods])
        if details:
            message += "; " + "; ".join(details[:3])
            if len(details) > 3:
                message += "; and %d more failed pods" % (len(details) - 3)
        message += why
        error_type = BatchTimeout if failed.get("reason") == "DeadlineExceeded" else BatchFailed
        raise error_type("%s; %s" % (message, where))

    def learn_gone(self):
        """Which pods the API no longer has (their last state is the watch's), in run.json."""
        if self.gone is not None:
            return self.gone
        names = {pod["metadata"]["name"] for pod in self.cluster.api.list(PODS, self.namespace, "job-name=" + self.name,
                                                                          metadata_only=True)}
        self.gone = sorted(name for name in self.pod_names() if name not in names)
        self.run_info["pods_seen_only_by_watch"] = self.gone
        write_json(self.folder / "run.json", self.run_info)
        return self.gone

    def pod_names(self):
        """The names of the Job's pods as saved (self.pods holds just these once results.json
        is being computed)."""
        return [pod if isinstance(pod, str) else pod["metadata"]["name"] for pod in self.pods]

    def logs_of(self, names):
        """Save the logs of the pods named that the API still has (those the LogArchive read as
        their pods finished are taken from their files); logs.json says which it no longer had.
        Returns {pod name: log text}."""
        archived = set(self.log_archive.settle(names))
        texts = {name: log_text((self.folder / (name + ".log")).read_bytes()) for name in archived}
        gone = set(self.gone or ())
        lost = [name for name in names if name in gone - archived]
        if lost:
            record_log_sources(self.folder, {name: LOGS_GONE for name in lost})
        texts.update(fetch_logs(self.cluster, self.namespace, self.folder,
                                [name for name in names if name not in gone | archived]))
        return texts

    def archive(self):
        """Every episode's log not saved yet, and the events: the events' read runs beside the
        pod list that says which pods are gone and beside the logs' reads."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as side:
            # once saved for results.json, never again: its image pulls were computed from that copy
            events = None if self.events_saved else side.submit(save_events, self.cluster, self.namespace, self.folder)
            self.learn_gone()
            self.log_archive.settle()
            self.logs_of([name for name in self.pod_names() if not (self.folder / (name + ".log")).exists()])
            if events is not None:
                events.result()

    def save_what_was_seen(self, error):
        """The wait ended in an error (the Job or its namespace deleted by someone else, an API
        server unreachable to the deadline, a refused read): save what the watches saw (the Job,
        every pod, sandbox-ready times), then, unless the server is unreachable, the events and
        the logs it still has. Returns the error to raise, naming what was kept."""
        folder, progress = self.folder, self.progress
        write_json(folder / "observed.json", progress.observed)
        self.admission.save(folder, self.run_info)
        pods = sorted(progress.pods.values(), key=by_creation)
        # the Job's last watched state, else as its create returned it (the watch may not have
        # delivered it before the API server went away)
        job = progress.watches.jobs.get(self.name) or self.created
        if job is not None:
            write_json(folder / "job.json", job)
        write_json(folder / "pods.json", pods)
        self.run_info["pods_seen_only_by_watch"] = sorted(progress.pods)
        write_json(folder / "run.json", self.run_info)
        kept = ["job.json"] if job is not None else []
        kept += ["pods.json (%d pod(s) as the watch last saw them)" % len(pods), "observed.json"]
        if progress.unreachable_since is None:
            try:
                save_events(self.cluster, self.namespace, folder)
                kept.append("events.txt")
                self.pods = pods
                still_listed = len(pods) - len(self.learn_gone())
                self.logs_of(self.pod_names())
                if still_listed:
                    kept.append("the logs of the %d pod(s) the API still had" % still_listed)
            except DemoError as late:
                kept.append("not the events or logs (%s)" % late)
        return with_context(error, "what the run saw is saved in %s: %s" % (folder, ", ".join(kept)))

    def save_what_is_known(self):
        """After Ctrl-C or SIGTERM: keep the Job, its pods, events and logs, as far as they can be had."""
        folder = self.folder
        # Ctrl-C or SIGTERM alike: a second one stops at once (on_sigterm resets the handler)
        self.console.tell("Interrupted: saving what is known in %s (interrupt again to stop at once)..." % folder)
        watched = self.progress.pods
        write_json(folder / "observed.json", self.progress.observed)  # what only the watch saw, first
        try:
            _, self.pods, self.gone = save_state(self.cluster, self.namespace, self.name, folder, watched=watched)
            save_events(self.cluster, self.namespace, folder)
            self.logs_of(self.pod_names())
        except DemoError as error:
            if watched and not (folder / "pods.json").exists():
                write_json(folder / "pods.json", sorted(watched.values(), key=by_creation))
            self.console.warn("could not save everything: %s" % error)

    def stop(self):
        if self.progress.feed is not None:
            self.progress.feed.stop()
        self.progress.stop()
        self.admission.stop()


class JobBackend(ClusterBackend):
    """`--backend kubernetes`: the batch is one batch/v1 Job, an episode per pod, in one round
    or several; with --prewarm a warm-up Job per node first; with --queue through Kueue."""

    name = "kubernetes"
    help = "one Job, a pod per episode"
    scheme = POD_SCHEME
    episodes_file = "pods.json"
    uses_cluster = True
    leaves_remote_state = True
    api_timestamps = True
    coarse_batch_keys = ("batch_to_all_ready_seconds", "batch_to_all_rewards_seconds")
    takes_queue = True
    takes_parallelism = True
    runs_several_images = True  # one Job per image, --parallelism split between them (image_parts)
    own_flags = (("--prewarm", "prewarm"),)
    batch_origin = "Job was created"
    startup_label = "Pod created -> ready"
    timeline_origin = "Job"
    phase_words = {}
    REPORT_ROWS = {}

    @classmethod
    def add_arguments(cls, parser):
        # default None, not False: a flag given to another backend is refused (own_flags)
        parser.add_argument("--prewarm", action="store_true", default=None,
                            help="first run one warm-up episode pinned to each usable node (kept in prewarm/, "
                                 "excluded from the figures)")

    @classmethod
    def check_options(cls, args, fail):
        return {"prewarm": bool(args.prewarm)}

    def needs_nodes(self):
        return "--prewarm" if self.spec.prewarm else None  # a warm-up episode is pinned to each node

    @classmethod
    def describe_results(cls, output, report, observed):
        """A run with --prewarm: which nodes ran a warm-up episode first (prewarm/, beside the
        rounds), the cache state of every figure."""
        if (output.parent / "prewarm" / "prewarm.json").exists() or (output / "prewarm" / "prewarm.json").exists():
            where = output / "prewarm" if (output / "prewarm").exists() else output.parent / "prewarm"
            prewarm = read_json(where / "prewarm.json", "the prewarm record")
            report["cache_state"] = "prewarmed"
            report["run"]["cache_state"] = {
                "state": "prewarmed", "nodes": prewarm["nodes"],
                "detail": "one warm-up episode ran on each of these nodes before the measured rounds (kept in "
                          "prewarm/, excluded from every figure); nodes not listed were not prewarmed"}

    def __init__(self, spec, console):
        super().__init__(spec, console)
        self.gate = gate_for(spec, console)

    def manifests(self, namespace, run_id):
        """What a run creates, its Jobs last: one, or with tasks across images one per image (the
        first round's names)."""
        spec = self.spec
        objects = common_manifests(spec, namespace, run_id)
        if len(spec.images) > 1:
            return objects + self.image_jobs(namespace, run_id, JOB_NAME)
        job = job_manifest(namespace, run_id, spec.count, spec.parallelism, spec.image, spec.runtime_class,
                           spec.timeout, spec.custom_episodes)
        if self.gate:
            objects += self.gate.manifests(namespace, run_id)
            self.gate.decorate(job)
        return objects + [job]

    def image_jobs(self, namespace, run_id, name):
        """A batch across images: a Job per image (image_parts), `name`-i<k>, running its tasks."""
        spec = self.spec
        jobs = []
        for number, (image, indexes, parallelism) in enumerate(image_parts(spec.task_images, spec.parallelism)):
            job = job_manifest(namespace, run_id, len(indexes), parallelism, image, spec.runtime_class, spec.timeout,
                               spec.custom_episodes, indexes)
            job["metadata"]["name"] = "%s-i%d" % (name, number)
            jobs.append(job)
        return jobs

    def new_receipt(self, context, namespace, run_id):
        receipt = super().new_receipt(context, namespace, run_id)
        if self.gate:
            receipt.update(self.gate.receipt_fields())
        return receipt

    def check_server(self, cluster, facts):
        server = facts["version"].get("serverVersion", {})
        minor = int("".join(ch for ch in str(server.get("minor", "")) if ch.isdigit()) or 0)
        if self.spec.episode and server.get("major") == "1" and minor and minor < 29:
            self.console.warn("the server is Kubernetes %s; per-episode retries (backoffLimitPerIndex) need 1.29 or "
                              "later, so an older API server ignores them and one failure may count against the "
                              "whole batch" % server.get("gitVersion"))

    def check_admission(self, cluster, facts):
        if self.gate:
            facts["kueue"] = self.gate.check(cluster, facts["runtime_class"])

    def run(self, run):
        """Everything after the receipt: metadata, objects, prewarm, the measured rounds."""
        spec = self.spec
        run_info = run.new_run_info(self)
        if run.facts["preflight"] is not None:
            run_info["preflight"] = run.facts["preflight"]
        run.write_facts(run_info)
        objects = self.manifests(run.namespace, run.run_id)
        namespace_obj, *supporting = [obj for obj in objects if obj["kind"] != "Job"]
        job = next(obj for obj in objects if obj["kind"] == "Job")  # a batch across images makes its own
        run.create_namespace(namespace_obj, supporting)
        if self.gate:
            run_info["queue"] = self.gate.prepare(run.cluster, run.namespace, run.facts["kueue"])
            write_json(run.output / "run.json", run_info)
        if spec.prewarm:
            self.prewarm(run, run_info)
        rounds = []
        parts = image_parts(spec.task_images, spec.parallelism) if len(spec.images) > 1 else None
        for number in range(1, spec.rounds + 1):
            folder = round_folder(run.output, number, spec.rounds)
            info = self.round_info(run, run_info, folder, spec.count, {"round": number} if spec.rounds > 1 else {})
            name = JOB_NAME if spec.rounds == 1 else "%s-%d" % (JOB_NAME, number)
            if parts is not None:
                if spec.rounds > 1:
                    self.console.note("round %d of %d" % (number, spec.rounds))
                rounds.append(self.run_image_parts(run, info, folder, name, parts))
                continue
            job = dict(job, metadata=dict(job["metadata"], name=name))
            progress = JobProgress(run.cluster, run.namespace, name)
            # The gate starts watching before the Job exists, so that no admission is missed.
            admission = self.gate.admission(run.cluster, run.namespace, name) if self.gate else Unqueued()
            job_round = JobRound(run, job, folder, info, progress, admission)
            job_round.submit()
            if spec.rounds > 1:
                self.console.note("round %d of %d: Job %s" % (number, spec.rounds, name))
            rounds.append(job_round.finish())
        return conclude(pool_round_folders(run.output, run_info, rounds), run)

    def run_image_parts(self, run, round_info, folder, name, parts):
        """One round of a batch across images: a Job per image (image_parts), created one after
        another and waited for together through two shared watches, each in folder/image-<k>/
        with its own results (its episodes numbered within its Job, `task_indexes` their tasks);
        the round's results.json pools them in task order (results_from_folder). A Job that
        fails does not stop the others: each is waited for, saved and validated, then the first
        failure is raised."""
        namespace = run.namespace
        shared = JobWatches(run.cluster, namespace, "app.kubernetes.io/component=episode",
                            job_selector="app.kubernetes.io/component=batch")
        job_rounds, record = [], []
        try:
            for number, ((image, indexes, parallelism), job) in enumerate(zip(parts, self.image_jobs(
                    namespace, run.run_id, name))):
                part = folder / ("image-%d" % number)
                info = self.round_info(run, round_info, part, len(indexes), {"image": image, "task_indexes": indexes})
                info["flags"] = dict(info["flags"], image=image, parallelism=parallelism)
                write_json(part / "run.json", info)
                job_round = JobRound(run, job, part, info, JobProgress(run.cluster, namespace, job["metadata"]["name"],
                                                                       shared), Unqueued())
                job_round.submit()
                job_rounds.append(job_round)
                record.append({"folder": part.name, "image": image, "job": job_round.name, "parallelism": parallelism,
                               "task_indexes": indexes})
            round_info["image_parts"] = record
            write_json(folder / "run.json", round_info)
            self.console.note("%d images: a Job each (%s)" % (len(parts), some_of(
                "%s %d at a time" % (job_round.name, parallelism) for job_round, (_, _, parallelism)
                in zip(job_rounds, parts))))
            failures = []
            for waited, job_round in enumerate(job_rounds):
                try:
                    job_round.finish()
                except DemoError as failure:
                    failures.append((job_round, failure))
                except BaseException:  # Ctrl-C: the Jobs not waited for yet keep what their watches saw
                    for later in job_rounds[waited + 1:]:
                        later.stop()
                        later.save_what_is_known()
                        later.log_archive.close()
                    raise
        finally:
            shared.stop()
        # client clock: from the first Job's create call to the last Job seen finished
        first = min(job_round.started for job_round in job_rounds)
        round_info["client_job_complete_seconds"] = max(
            job_round.started - first + job_round.run_info["client_job_complete_seconds"] for job_round in job_rounds
            if job_round.run_info.get("client_job_complete_seconds") is not None) if not failures else None
        write_json(folder / "run.json", round_info)
        try:
            save_events(run.cluster, namespace, folder)  # once for every Job: image_pulls come from them
        except DemoError as error:
            self.console.warn("could not read the events, so the image pulls are unknown: %s" % error)
        if failures:
            job_round, failure = failures[0]
            more = "; %d more of the %d images' Jobs failed (each in its image-N/)" % (
                len(failures) - 1, len(parts)) if len(failures) > 1 else ""
            raise type(failure)("image %s (Job %s): %s%s" % (job_round.run_info["image"], job_round.name, failure,
                                                              more)) from None
        report = write_results(folder, "diagnostics saved in %s (each image's Job in image-N/)" % folder)
        run.stream.finish(report)
        return report

    @staticmethod
    def round_info(run, run_info, folder, expected, extra):
        """A folder of its own for one Job (a round, a prewarm Job), with its run.json."""
        folder.mkdir(exist_ok=True)
        for name in ("version.json", "runtimeclass.json"):
            if (run.output / name).exists() and folder != run.output:
                (folder / name).write_text((run.output / name).read_text())
        info = dict(run_info, expected_episodes=expected, **extra)
        write_json(folder / "run.json", info)
        return info

    def prewarm(self, run, run_info):
        """One warm-up episode pinned to each usable node, before the measured rounds (with tasks
        across images, one per node and image, on that image's first task); validated like any
        episode, kept in prewarm/, and excluded from every figure. prewarm.json and one line per
        image say how each node got it (pulled, and how long, or cached)."""
        spec, namespace = self.spec, run.namespace
        nodes = usable_nodes(run.facts["nodes"], run.facts["runtime_class"])
        if not nodes:
            raise DemoError("--prewarm: no usable node for the episode pods (schedulable, Ready, taints tolerated, "
                            "matching the RuntimeClass)")
        base = run.output / "prewarm"
        base.mkdir()
        pending = []
        # Two watches for every prewarm Job and pod, whatever the number of nodes.
        shared = JobWatches(run.cluster, namespace, "app.kubernetes.io/component=prewarm",
                            job_selector="app.kubernetes.io/component=prewarm")
        several = len(spec.images) > 1
        # (image, the task it warms up on: custom episodes on task 0, or on their image's first)
        warmups = [(image, indexes[:1]) for image, indexes, _ in image_parts(spec.task_images, len(spec.images))] \
            if several else [(spec.image, None)]
        for index, (node, (image, first_task), image_number) in enumerate(
                ((node, warmup, number) for node in nodes for number, warmup in enumerate(warmups)), 1):
            name = node["metadata"]["name"]
            # The same program as the measured rounds.
            job = job_manifest(namespace, run.run_id, 1, 1, image, spec.runtime_class, spec.timeout,
                               spec.custom_episodes, first_task)
            job["metadata"]["name"] = "prewarm-%d" % index
            job["metadata"]["labels"]["app.kubernetes.io/component"] = "prewarm"
            job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = "prewarm"
            # The node's own hostname label: it usually equals the node's name, but need not
            # (tests/fakecluster/ASSUMPTIONS.md, fact 31).
            hostname = node["metadata"].get("labels", {}).get("kubernetes.io/hostname", name)
            job["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": hostname}
            folder = base / (name if not several else "%s-i%d" % (name, image_number))
            info = self.round_info(run, run_info, folder, 1, dict({"prewarm_node": name}, **(
                {"image": image, "task_indexes": first_task} if several else {})))
            info["flags"] = dict(info["flags"], image=image)
            write_json(folder / "run.json", info)
            job_round = JobRound(run, job, folder, info, JobProgress(run.cluster, namespace, job["metadata"]["name"],
                                                                     shared), Unqueued())
            job_round.submit()
            pending.append(job_round)
        self.console.note("prewarm: one episode on each of %d node(s)%s" % (
            len(nodes), " for each of %d images" % len(warmups) if several else ""))
        pulls = []
        try:
            for job_round in pending:
                report = job_round.finish()
                row = report["pods"][0] if report["pods"] else {}
                pull = row.get("image_pull") or {}
                pulls.append({"node": job_round.run_info["prewarm_node"], "image": job_round.run_info["flags"]["image"],
                              "state": pull.get("state"), "pull_seconds": pull.get("pull_seconds"),
                              "pull_seconds_including_waiting": pull.get("pull_seconds_including_waiting")})
        finally:
            shared.stop()
        for image, _ in warmups:
            self.console.note("prewarm: image %s: %s" % (image, "; ".join(
                "%s %s" % (pull["node"], prewarm_pull_words(pull)) for pull in pulls if pull["image"] == image)))
        write_json(base / "prewarm.json", {"nodes": [node["metadata"]["name"] for node in nodes],
                                           "images": [image for image, _ in warmups],
                                           "jobs": [job_round.name for job_round in pending], "pulls": pulls})

    @classmethod
    def cost(cls, output, report, prices, records):
        """Every pod of the run (pods.json, attempts and all: `records`) is the episodes' share; a
        pod still running is counted to the last container's end seen."""
        pods = records
        ends = [interval[1] for interval in (held_interval(pod, None) for pod in pods) if interval]
        return cost_summary(reserved_capacity(pods, max(ends, default=None)), report["successful_episodes"], prices,
                            used_cpu=used_cpu_seconds(report["pods"]))

    @classmethod
    def delete_objects(cls, cluster, namespace, run_id, receipt, output, listing):
        delete_recorded_jobs(cluster, namespace, receipt, output, listing)
        for gate in GATES:
            gate.after_jobs_deleted(cluster, namespace, receipt)

    @classmethod
    def list_objects(cls, cluster, namespace):
        return {"jobs": cluster.api.list(JOBS, namespace)}

    @classmethod
    def list_fields(cls, objects, folder):
        return job_list_fields(objects["jobs"])

    @classmethod
    def episodes_cell(cls, row):
        return "%s/%s done, %s failed" % (row["succeeded"], row["completions"] or "?", row["failed"])

    @classmethod
    def list_state(cls, objects):
        jobs = objects["jobs"]
        outcomes = [job_outcome(job) for job in jobs]
        if not jobs:
            return "no Job"
        if "Failed" in outcomes:
            return "Failed"
        if any(job.get("spec", {}).get("suspend") and outcome is None for job, outcome in zip(jobs, outcomes)):
            return "Queued"  # suspended until Kueue admits it
        return "Complete" if all(outcome == "Complete" for outcome in outcomes) else "Running"


# ============================================================================
# Kueue gate: --queue, the Job backend's batch admitted by Kueue (a plug-in of the Job backend)
# ============================================================================
# KueueGate checks and prepares the queue and decorates the Job; each Job's JobAdmission owns
# its Workload watch and admission cycles and answers the Job's wait (deadline, state line,
# "never admissible"); SavedAdmission says, from queue.json, which pods are results and what
# results.json adds. Nothing outside this section asks about queues.

KUEUE_VERSION = "v0.19.2"  # the release the install hint names
KUEUE_INSTALL = ("kubectl --context %s apply --server-side -f https://github.com/kubernetes-sigs/kueue/releases/"
                 "download/" + KUEUE_VERSION + "/manifests.yaml")
KUEUE_API = "kueue.x-k8s.io/v1beta2"  # served since v0.15, storage since v0.16
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Where an admission cycle's times come from (results.json's *_source), compared, not only shown.
WATCH_ARRIVAL = "watch arrival (client clock)"
REQUEUED_ARRIVAL = "Requeued=True as the watch delivered it (client clock)"
NEW_WORKLOAD_ARRIVAL = "the new Workload as the watch delivered it (client clock)"
WORKLOAD_DELETED = "WorkloadDeleted"  # a cycle's end: its Workload was deleted, Kueue stopped the Job
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"  # on the Job's Workload
# Kueue's kinds as kubectl arguments: RESOURCE.VERSION.GROUP, which kubectl maps from its discovery
# cache. RESOURCE.GROUP with a dotted group (workloads.kueue.x-k8s.io) is first read as
# resource.version.group, misses, and makes kubectl discover every group again, on every call
# (checked with kubectl 1.32.4: 9 requests instead of 1; the LocalQueue poll runs every 0.25 s).
WORKLOADS = Resource("Workload", KUEUE_API, "workloads")
LOCAL_QUEUES = Resource("LocalQueue", KUEUE_API, "localqueues")
CLUSTER_QUEUES = Resource("ClusterQueue", KUEUE_API, "clusterqueues", namespaced=False)
COHORTS = Resource("Cohort", KUEUE_API, "cohorts", namespaced=False)
DEFAULT_QUEUE_TIMEOUT_SECONDS = 3600  # how long the client waits for an admission (the deadline does not run meanwhile)
LOCAL_QUEUE_WAIT_SECONDS = 10  # for a LocalQueue that a namespace policy puts in every new namespace
KUEUE_API_CHECK_SECONDS = 10.0  # while queued, how often to make sure Kueue is still installed
WORKLOAD_WAIT_SECONDS = 30  # for Kueue to make the Job's Workload
# A Workload that waiting will not admit: a batch over what its ClusterQueue can ever give
# (QuotaReserved=False reasons and messages, Kueue v0.19), and deactivation (checked apart).
# A queue that is stopped (`Suspended`, or `Inadmissible` "... is inactive" without Kueue's
# UnadmittedWorkloadsObservability gate) or `Misconfigured` admits the Workload once resumed
# or fixed: the wait goes on, bounded by --queue-timeout.
NEVER_ADMISSIBLE_REASONS = ("ExceedsMaxQuota",)
HELD_REASONS = ("Suspended", "Misconfigured", "Inadmissible")


def local_queue_manifest(namespace, run_id, name, cluster_queue):
    """The run's own LocalQueue (with --cluster-queue): its namespace is new, so no queue of
    the user's can be in it."""
    return {"apiVersion": KUEUE_API, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace, "labels": object_labels(run_id, "queue")},
            "spec": {"clusterQueue": cluster_queue}}


def queue_demand(parallelism, count, runtime_class):
    """What the Job's Workload asks of its ClusterQueue: (requests + Pod overhead) x
    min(parallelism, completions) pods (Kueue's podSet count), per resource."""
    overhead = (runtime_class or {}).get("overhead", {}).get("podFixed", {})
    pods = min(parallelism, count)
    return {name: (parse_quantity(EPISODE_REQUESTS.get(name, 0)) + parse_quantity(overhead.get(name, 0))) * pods
            for name in sorted(set(EPISODE_REQUESTS) | set(overhead))}


def cohort_of(queue):
    """A ClusterQueue's cohort: `spec.cohortName` (v1beta2, Kueue v0.15+), `spec.cohort` before."""
    spec = queue.get("spec", {})
    return spec.get("cohortName") or spec.get("cohort")


def quota_entries(obj):
    """((flavor, resource), its ResourceQuota) of a ClusterQueue's or Cohort's resourceGroups."""
    for group in obj.get("spec", {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for quota in flavor.get("resources") or []:
                yield (flavor["name"], quota["name"]), quota


def cohort_lending(cluster_queue, queues, cohorts):
    """{(flavor, resource): the most the ClusterQueue's cohort could ever lend it}: every other
    ClusterQueue of the cohort's tree lends its nominal quota less what its lendingLimit keeps
    back, and the tree's Cohort objects lend their own quota (apis/kueue/v1beta2
    clusterqueue_types.go and cohort_types.go). An upper bound: it never refuses what could fit."""
    parents = {c["metadata"]["name"]: c.get("spec", {}).get("parentName") for c in cohorts}

    def root(name):
        seen = set()
        while parents.get(name) and name not in seen:
            seen.add(name)
            name = parents[name]
        return name

    tree = root(cohort_of(cluster_queue))
    lending = collections.Counter()
    for member in queues:
        if member["metadata"]["name"] == cluster_queue["metadata"]["name"] or not cohort_of(member) or \
                root(cohort_of(member)) != tree:
            continue
        for key, quota in quota_entries(member):
            lending[key] += parse_quantity(quota["lendingLimit"]) if "lendingLimit" in quota \
                else parse_quantity(quota["nominalQuota"])
    for cohort in cohorts:
        if root(cohort["metadata"]["name"]) == tree:
            for key, quota in quota_entries(cohort):
                lending[key] += parse_quantity(quota["nominalQuota"])
    return lending


def never_fits(cluster_queue, demand, lending=None):
    """Why the batch can never be admitted by this ClusterQueue, or None. As Kueue's flavor
    assigner (pkg/scheduler/flavorassigner, findFlavorForPodSets), each resource group gives the
    pod set one flavor for all the group's resources, never a split over flavors: the batch fits
    a group when one of its flavors can hold it, with its nominal quota plus, in a cohort, what
    the cohort could lend (`lending`, within borrowingLimit)."""
    name = cluster_queue["metadata"]["name"]
    groups = cluster_queue.get("spec", {}).get("resourceGroups") or []
    covered = {resource for group in groups for resource in group.get("coveredResources") or []}
    for resource in sorted(demand):
        if demand[resource] > 0 and resource not in covered:
            return "ClusterQueue %s covers no %s" % (name, resource)
    quotas = dict(quota_entries(cluster_queue))

    def shown(resource, amount):
        return "%.0fm" % (amount * 1000) if resource == "cpu" else mebibytes(amount)

    for group in groups:
        wanted = [r for r in group.get("coveredResources") or [] if demand.get(r, 0) > 0]
        if not wanted:
            continue
        shortfalls = []
        for flavor in group.get("flavors") or []:
            short = []
            for resource in wanted:
                quota = quotas.get((flavor["name"], resource))
                most = parse_quantity(quota["nominalQuota"]) if quota else 0.0
                if lending is not None and quota:
                    borrow = parse_quantity(quota["borrowingLimit"]) if "borrowingLimit" in quota else float("inf")
                    most += min(borrow, lending.get((flavor["name"], resource), 0.0))
                if demand[resource] > most + 1e-9:
                    short.append("%s %s > %s" % (resource, shown(resource, demand[resource]), shown(resource, most)))
            if not short:
                break
            shortfalls.append("flavor %s: %s" % (flavor["name"], ", ".join(short)))
        else:
            return ("the batch needs %s at once from one flavor (Kueue never splits a pod set's resources over "
                    "flavors), more than ClusterQueue %s can ever give%s: %s" % (
                        ", ".join("%s %s" % (shown(r, demand[r]), r) for r in wanted), name,
                        " with all its cohort %s could lend" % cohort_of(cluster_queue) if lending is not None
                        else "", "; ".join(shortfalls)))
    return None


def queue_hold(queue, kind):
    """Why a readable LocalQueue or ClusterQueue admits nothing now (stopped by its
    administrator, or inactive), or None. Waiting may end it: it is a note, not a refusal."""
    name = queue["metadata"]["name"]
    policy = queue.get("spec", {}).get("stopPolicy") or "None"
    if policy != "None":
        return "%s %s is held (stopPolicy %s%s)" % (kind, name, policy, set_by(queue, "stopPolicy"))
    active = next((c for c in (queue.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if active is not None and active.get("status") != "True":
        return "%s %s is not active (%s: %s)" % (kind, name, active.get("reason"), active.get("message"))
    return None


def set_by(obj, field):
    """`, set by MANAGER` from the object's managedFields (read with --show-managed-fields), when
    one of them owns spec.FIELD."""
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        if '"f:%s"' % field in json.dumps(entry.get("fieldsV1") or {}):
            return ", set by %s" % entry.get("manager")
    return ""


class KueueGate(Gate):
    """--queue NAME: the Job is created suspended by Kueue's webhook and runs once its Workload
    is admitted. Checks the queue before anything is created, makes the run's LocalQueue
    (--cluster-queue), labels the Job, and hands each Job's wait a JobAdmission."""

    REPORT_ROWS = {"setup": [("queued: Job created -> admitted (first cycle)", "batch", "queue.queued_seconds"),
                             ("Kueue admission cycles", "number", "queue.admission_cycles"),
                             ("draining after evictions: evicted -> requeued (all cycles)", "batch",
                              "queue.total_draining_seconds"),
                             ("queued, all cycles: created or requeued -> admitted", "batch",
                              "queue.total_queued_seconds")]}
    argument_group = "queue (Kueue, Job backend)"

    @staticmethod
    def chosen(spec):
        return bool(spec.queue)

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("--queue", metavar="NAME",
                            help="submit the Job through the Kueue LocalQueue NAME (label kueue.x-k8s.io/queue-name): "
                                 "it waits suspended until admitted; the queue wait is reported apart from startup")
        parser.add_argument("--cluster-queue", metavar="NAME",
                            help="with --queue: create LocalQueue NAME in the run's new namespace for this "
                                 "ClusterQueue (without it, a namespace policy must put the LocalQueue there)")
        parser.add_argument("--queue-timeout", type=int, default=DEFAULT_QUEUE_TIMEOUT_SECONDS, metavar="SECONDS",
                            help="with --queue: how long to wait for an admission (the Job's deadline does not run "
                                 "while it is queued) (default %d)" % DEFAULT_QUEUE_TIMEOUT_SECONDS)

    @staticmethod
    def check_options(args, fail, backend):
        if args.cluster_queue and not args.queue:
            fail("--cluster-queue needs --queue NAME (the LocalQueue to create for it)")
        if args.queue and (not backend.takes_queue or args.prewarm):
            fail("--queue is for the Job backend without --prewarm (Kueue admits Jobs; prewarm Jobs "
                 "would have to queue too)")
        if args.queue_timeout < 1:
            fail("--queue-timeout must be at least 1 second, got %d" % args.queue_timeout)

    def receipt_fields(self):
        return {"queue": self.spec.queue}  # cleanup then also waits for the Job's Workload to go

    def manifests(self, namespace, run_id):
        if not self.spec.cluster_queue:
            return []
        return [local_queue_manifest(namespace, run_id, self.spec.queue, self.spec.cluster_queue)]

    def decorate(self, job):
        # Kueue's webhook stores the Job suspended; it runs once its Workload is admitted. The
        # backoffLimit stays as unqueued: a preemption suspends the Job, and the Job controller
        # removes its tracking finalizer from the pods before it deletes them, so they count
        # neither as failed nor as succeeded (tests/fakecluster/ASSUMPTIONS.md, "Job controller").
        job["metadata"]["labels"][QUEUE_LABEL] = self.spec.queue

    def check(self, cluster, runtime_class):
        """Read-only, before anything is created: Kueue's API is served and, with --cluster-queue,
        that ClusterQueue exists, is active, is not stopped and could ever fit the batch. A
        ClusterQueue the user may not read is "unknown", not a failure."""
        spec = self.spec
        served = cluster.api.served("kueue.x-k8s.io")
        if not {"localqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io"} <= served:
            raise DemoError("--queue needs Kueue on context %s, and the API serves no LocalQueues or Workloads; install "
                            "it with `%s`, or leave --queue out" % (cluster.context, KUEUE_INSTALL % cluster.context))
        demand = queue_demand(spec.parallelism, spec.count, runtime_class)
        facts = {"cluster_queue": spec.cluster_queue, "cluster_queue_state": "unknown",
                 "demand": {name: round(value, 6) for name, value in demand.items()}}
        if not spec.cluster_queue:
            return facts
        try:
            cluster_queue = cluster.api.get(CLUSTER_QUEUES, spec.cluster_queue, managed_fields=True)
        except KubectlError as error:
            if not error.forbidden:
                raise
            self.console.note("cannot read ClusterQueue %s (forbidden): whether it can admit the batch is unknown"
                              % spec.cluster_queue)
            return facts
        if cluster_queue is None:
            raise DemoError("ClusterQueue %s does not exist on context %s; list them with `kubectl --context %s get "
                            "clusterqueues` and pass one with --cluster-queue" % (spec.cluster_queue, cluster.context,
                                                                                  cluster.context))
        facts["cluster_queue_state"] = self.judge(cluster, cluster_queue, demand, "--queue")
        return facts

    def judge(self, cluster, cluster_queue, demand, flag):
        """Refuse a ClusterQueue that can never fit the batch (with its cohort's lending, when the
        cohort can be read); note one that is held or inactive now. Returns its state in words."""
        lending, skipped = None, None
        if cohort_of(cluster_queue):
            try:
                queues = cluster.api.list(CLUSTER_QUEUES)
                try:
                    cohorts = cluster.api.list(COHORTS)
                except KubectlError as error:
                    if not (error.no_such_kind or error.forbidden):
                        raise
                    cohorts = []  # no Cohort objects: the cohort is just the name its members share
                lending = cohort_lending(cluster_queue, queues, cohorts)
            except KubectlError as error:
                if not error.forbidden:
                    raise
                skipped = ("ClusterQueue %s borrows from cohort %s, whose other ClusterQueues cannot be read "
                           "(forbidden): whether the batch can ever fit was not checked"
                           % (cluster_queue["metadata"]["name"], cohort_of(cluster_queue)))
                self.console.note(skipped)
        refusal = None if skipped else never_fits(cluster_queue, demand, lending)
        if refusal:
            raise DemoError("%s: %s, so the batch could never be admitted; choose another --cluster-queue or a "
                            "smaller --parallelism" % (flag, refusal))
        held = queue_hold(cluster_queue, "ClusterQueue")
        if held:
            self.console.note("%s: the batch will wait until it is resumed (up to --queue-timeout %d s)"
                              % (held, self.spec.queue_timeout))
            return held
        return "active, fit not checked" if skipped else "active, fits%s" % (
            " with its cohort's lending" if lending is not None else "")

    def prepare(self, cluster, namespace, facts):
        """The LocalQueue in the run's namespace, before the Job: the run's own (--cluster-queue,
        created with the other objects) must turn Active; without it a namespace policy must have
        put one of that name there. Its ClusterQueue is then checked like in check()."""
        spec = self.spec
        deadline = time.monotonic() + (30 if spec.cluster_queue else LOCAL_QUEUE_WAIT_SECONDS)
        while True:
            local_queue = cluster.api.get(LOCAL_QUEUES, spec.queue, namespace, managed_fields=True)
            active = next((c for c in ((local_queue or {}).get("status") or {}).get("conditions") or []
                           if c.get("type") == "Active"), {})
            if active.get("status") == "True" or (local_queue is not None and queue_hold(local_queue, "LocalQueue")
                                                  and active.get("reason") in ("Stopped", "ClusterQueueIsInactive")):
                break  # held by its administrator: the batch waits for the resume (a note below)
            if time.monotonic() > deadline:
                if local_queue is None:
                    raise DemoError("LocalQueue %s does not exist in the run's namespace %s: the tool runs in a new "
                                    "namespace of its own, so pass --cluster-queue NAME to have it create LocalQueue "
                                    "%s there for that ClusterQueue (or have a namespace policy create it)"
                                    % (spec.queue, namespace, spec.queue))
                raise DemoError("LocalQueue %s is not active (%s: %s); check its ClusterQueue %s" % (
                    spec.queue, active.get("reason"), active.get("message"), local_queue["spec"].get("clusterQueue")))
            time.sleep(0.25)
        cluster_queue = local_queue["spec"].get("clusterQueue")
        record = dict(facts, local_queue=spec.queue, cluster_queue=cluster_queue,
                      local_queue_created_by_tool=bool(spec.cluster_queue))
        held = queue_hold(local_queue, "LocalQueue")
        if held and active.get("reason") == "Stopped":
            self.console.note("%s: the batch will wait until it is resumed (up to --queue-timeout %d s)"
                              % (held, spec.queue_timeout))
        if not spec.cluster_queue:
            try:
                live = cluster.api.get(CLUSTER_QUEUES, cluster_queue, managed_fields=True)
            except KubectlError as error:
                if not error.forbidden:
                    raise
                live = None
            if live is not None:
                record["cluster_queue_state"] = self.judge(cluster, live, facts["demand"], "--queue %s" % spec.queue)
        return record

    def admission(self, cluster, namespace, job_name):
        """The admission of one Job, watching before the Job is created."""
        return JobAdmission(cluster, namespace, job_name, self.spec.queue_timeout)

    # --- saved results ----------------------------------------------------------------------

    @staticmethod
    def saved(output):
        """The admission record of a saved folder (queue.json), or None for an unqueued run."""
        record = read_saved(output / "queue.json")
        return SavedAdmission(record) if record else None

    @staticmethod
    def summary_view(report):
        if not report.get("queue"):
            return {}
        return {"queued_seconds": report["queue"]["queued_seconds"],
                "admission_cycles": report["queue"]["admission_cycles"],
                "batch_to_all_ready_after_admission_seconds": report.get("batch_to_all_ready_after_admission_seconds")}

    @staticmethod
    def whole_seconds(key, results):
        return key.startswith("queue.") and KueueGate.from_api_seconds(results)

    @staticmethod
    def from_api_seconds(results):
        """Whether the first queue wait was read from two whole-second API timestamps (the watch
        first saw the Workload already admitted): then it is shown in whole seconds."""
        cycles = (results.get("queue") or {}).get("cycles") or []
        return bool(cycles) and cycles[0].get("admitted_source") != WATCH_ARRIVAL

    @staticmethod
    def summary_lines(report):
        if not report.get("queue"):
            return []
        queue = report["queue"]
        queued = queue["queued_seconds"]
        lines = ["Queued %s before Kueue admitted the Job (%d admission cycle(s)); the batch times above include "
                 "it." % (format_seconds(queued, KueueGate.from_api_seconds(report)), queue["admission_cycles"])]
        if queue["admission_cycles"] > 1:
            lines.append("After evictions: draining %s (evicted -> requeued), then queued %s in all (requeued -> "
                         "admitted)." % (format_seconds(queue.get("total_draining_seconds")),
                                         format_seconds(queue.get("total_queued_seconds"))))
        return lines

    @staticmethod
    def timeline_spans(results):
        """The queued span(s) of a run's timeline (the Job waits suspended until Kueue admits
        it), or None for an unqueued run."""
        cycles = (results.get("queue") or {}).get("cycles")
        if not cycles:
            return None
        spans = []
        for cycle in cycles:
            if cycle.get("draining_seconds") is not None:
                spans.append({"kind": "draining", "from": cycle["draining_since_unix"], "to": cycle["queued_since_unix"],
                              "colour": DRAINING_COLOUR, "title": "draining (before cycle %d): %s" % (
                                  cycle["cycle"], format_seconds(cycle["draining_seconds"]))})
            if cycle["queued_seconds"] is None:
                continue  # a wait the watch did not see
            spans.append({"kind": "queued", "from": cycle["queued_since_unix"], "to": cycle["admitted_at_unix"],
                          "colour": QUEUED_COLOUR, "title": "queued (cycle %d): %s" % (
                              cycle["cycle"], format_seconds(cycle["queued_seconds"]))})
        return spans

    @staticmethod
    def timeline_legend(results_list):
        legend = {}
        if any((results.get("queue") or {}).get("cycles") for results in results_list):
            legend["queued: Job created (or requeued) -> admitted by Kueue"] = QUEUED_COLOUR
        if any(cycle.get("draining_seconds") is not None for results in results_list
               for cycle in (results.get("queue") or {}).get("cycles") or []):
            legend["draining: evicted -> requeued by Kueue (pods terminating, back-off)"] = DRAINING_COLOUR
        return legend

    # --- cleanup --------------------------------------------------------------------------

    @staticmethod
    def used_in_namespace(receipt):
        """The LocalQueue a queued run's Job went through, when a namespace policy made it: the run
        needed it, and it ends with the run's namespace."""
        return {("LocalQueue", receipt["queue"])} if receipt.get("queue") else set()

    @staticmethod
    def after_jobs_deleted(cluster, namespace, receipt):
        """A queued run: a Job's Workload goes with it (garbage collection, ownerReference); wait as for pods."""
        if not receipt.get("queue"):
            return
        try:
            cluster.api.wait_until_gone("Workloads in %s" % namespace, WORKLOADS, namespace,
                                        timeout=CLEANUP_WAIT_SECONDS)
        except KubectlError as error:
            if not error.no_such_kind:
                raise


class JobAdmission(Admission):
    """One Job's admission by Kueue, handed to the Job's wait: the Workload watch (started
    before the Job is created) and the admission cycles. It answers for the deadline (the
    Job's deadline runs only while it is admitted and restarts at each admission; while queued
    the client waits up to --queue-timeout), the state line, and "never admissible"."""

    queued = True

    def __init__(self, cluster, namespace, job_name, queue_timeout):
        self.cluster, self.namespace, self.job_name = cluster, namespace, job_name
        self.queue_timeout = queue_timeout
        self.console = cluster.console
        # Every Workload of the run's namespace; the Job's is told apart by its job-uid label.
        self.workload_watch = cluster.api.watch(WORKLOADS, namespace, timed=True)
        self.cycles, self.job_uid = None, None
        self.last_state = None
        self.started = self.cycle_began = None
        self.api_checked = time.monotonic()  # when Kueue's API was last seen served

    def follow(self, created, create_returned):
        """The Job exists: Kueue must have suspended it; its Workload is followed from now."""
        if created.get("spec", {}).get("suspend") is not True:
            raise DemoError("Kueue did not suspend Job %s when it was created, so it runs unqueued: this cluster's "
                            "Kueue does not manage batch/v1 Jobs (its batch/job integration is off, or its webhook is "
                            "not installed)" % self.job_name)
        self.job_uid = created["metadata"]["uid"]
        self.cycles = AdmissionCycles(create_returned, parse_k8s_time(created["metadata"]["creationTimestamp"]))

    def begin(self, started):
        self.started = self.cycle_began = started

    def absorb(self):
        """Take in the Job's Workload's states; returns the monotonic time its current cycle
        began (admission, or since when it has been queued)."""
        for arrival, workload in self.workload_watch.drain():
            if (workload["metadata"].get("labels") or {}).get(JOB_UID_LABEL) == self.job_uid:
                self.take(arrival, workload)
        return self.cycle_began

    def take(self, arrival, workload):
        before = len(self.cycles.cycles), self.cycles.admitted
        unseen_before = self.cycles.unseen_evictions()
        self.cycles.update(arrival, workload)
        for reason in self.cycles.unseen_evictions()[len(unseen_before):]:
            self.console.note("%s: evicted (%s) and re-admitted while the Workload watch was down (counted by Kueue's "
                              "status.schedulingStats; when is unknown)" % (self.job_name, reason))
        if (len(self.cycles.cycles), self.cycles.admitted) != before:
            self.cycle_began = time.monotonic()

    def deadline(self, wait_seconds):
        began = self.absorb()
        return began + (wait_seconds if self.cycles.admitted else self.queue_timeout)

    def state_line(self):
        """The admission state for the progress line; on a log, one line per change."""
        state = self.cycles.state()
        if state != self.last_state and not self.console.interactive:
            self.console.note("%s: %s" % (self.job_name, state))
        self.last_state = state
        return state

    def blocked(self, started):
        never = self.cycles.never_admissible()
        if never:
            return "the Job's Workload can never be admitted: %s" % never
        if not self.cycles.admitted and time.monotonic() - self.api_checked >= KUEUE_API_CHECK_SECONDS:
            # The watch restarts silently when Kueue's API goes away: ask now and then while queued.
            self.api_checked = time.monotonic()
            try:
                self.cluster.api.list(WORKLOADS, self.namespace, "%s=%s" % (JOB_UID_LABEL, self.job_uid))
            except KubectlError as error:
                if error.no_such_kind:
                    return ("the API server no longer serves Kueue's Workloads (%s): Kueue was uninstalled while Job "
                            "%s waited in its queue, and nothing will admit it now (it stays suspended); reinstall "
                            "Kueue, or run without --queue" % (meaningful_line(error.stderr), self.job_name))
        if self.cycles.workload is None and time.monotonic() - started > WORKLOAD_WAIT_SECONDS:
            return ("Kueue made no Workload for Job %s within %d s; is its job integration and controller "
                    "running?" % (self.job_name, WORKLOAD_WAIT_SECONDS))
        return None

    def finish(self):
        """Once the wait is over: the Job's Workload as the API has it now (the watch may be down
        or behind), so that every admission and eviction is known before pods are judged."""
        self.absorb()
        try:
            listed = self.cluster.api.list(WORKLOADS, self.namespace, "%s=%s" % (JOB_UID_LABEL, self.job_uid))
        except KubectlError as error:
            self.console.note("%s: could not read its Workload's last state (%s); the admission cycles are as the "
                              "watch saw them" % (self.job_name, meaningful_line(error.stderr)))
            return
        for workload in listed:
            self.take(time.time(), workload)

    def timeout_error(self, job_name, where):
        if self.cycles.admitted:
            return None
        return BatchTimeout("Job %s was not admitted by Kueue within %d s (--queue-timeout; %s); %s"
                            % (job_name, self.queue_timeout, self.cycles.state(), where))

    def save(self, folder, run_info):
        """queue.json (the admission cycles as the watch saw them) and workload.json."""
        if self.cycles is None:
            return
        queue_record = run_info.get("queue") or {}
        write_json(folder / "queue.json", self.cycles.record(queue_record.get("local_queue"),
                                                             queue_record.get("cluster_queue")))
        if self.cycles.workload is not None:
            write_json(folder / "workload.json", self.cycles.workload)

    def stop(self):
        self.workload_watch.stop()


class SavedAdmission:
    """A saved queue.json: which pods are results, and what results.json adds."""

    def __init__(self, record):
        self.record = record
        self.earlier = []  # pods of a preempted admission cycle

    def results_pods(self, pods, logs, expected, observed=None):
        """The pods (and logs) that are results: those of the last admission cycle, and those of
        an earlier cycle that succeeded before its eviction (the Job counted them and does not run
        their episodes again). A pod the eviction's suspension deleted is never a result: the Job
        controller dropped its tracking finalizer first, so however it ended it was not counted.

        A pod is of an earlier cycle when it was created before the last admission: by its
        creationTimestamp (API clock, whole seconds), and, for a pod created in the very second
        of that admission, by whether the client's pod watch had delivered it before the Workload
        watch delivered the admission (client clock): a pod of the new cycle is created only
        after Kueue admits and unsuspends the Job, so it cannot be seen before the admission."""
        cycles = self.record["cycles"]
        boundary = last_admission_time(self.record)
        if len(cycles) <= 1 or boundary is None:
            return pods, logs
        admitted_seen = cycles[-1]["admitted_at"] if cycles[-1].get("admitted_source") == \
            WATCH_ARRIVAL else None

        def earlier(pod):
            created = parse_k8s_time(pod["metadata"]["creationTimestamp"])
            if created < boundary:
                return True
            first_seen = ((observed or {}).get(pod["metadata"]["name"]) or {}).get("first_seen")
            return created == boundary and admitted_seen is not None and first_seen is not None \
                and first_seen < admitted_seen

        def counted(pod):
            return pod.get("status", {}).get("phase") == "Succeeded" and not pod["metadata"].get("deletionTimestamp")

        def deleted_in_the_admission_second(pod):
            # Preempted, suspended and re-admitted within one API second, and the watch missed the
            # admission: a pod of that second deleted before it succeeded is the suspension's (a
            # pod of the new cycle is deleted only by another eviction, which is another cycle).
            return admitted_seen is None and parse_k8s_time(pod["metadata"]["creationTimestamp"]) == boundary \
                and bool(pod["metadata"].get("deletionTimestamp")) and not counted(pod)

        kept = [not (earlier(pod) or deleted_in_the_admission_second(pod)) or counted(pod) for pod in pods]
        self.earlier = [pod for pod, keep in zip(pods, kept) if not keep]
        return [pod for pod, keep in zip(pods, kept) if keep], [log for log, keep in zip(logs, kept) if keep]

    def describe_results(self, report):
        report["queue"] = queue_summary(self.record)
        report["queue"]["preempted_cycle_pods"] = len(self.earlier)
        admitted = last_admission_time(self.record)
        readies = [row["times"]["ready"] for row in report["pods"] if row["times"].get("ready")]
        report["batch_to_all_ready_after_admission_seconds"] = (
            max(readies) - admitted if readies and admitted and report["clock_skew"]["headline_withheld"] is None
            else None)


class AdmissionCycles:
    """The Job's Workload as the watch delivers it: each admission cycle (admitted, then maybe
    evicted), when each began and ended, and the Workload's latest state for the progress
    line. `job_created` is the client's clock when the Job's create call returned (the Job
    exists: the call's own latency, 7 s under load, is no queue wait), `job_created_server` the
    Job's creationTimestamp (for a cycle backfilled at 1 s).

    A watch can be down (ended, relisting, the list failing) while Kueue evicts and re-admits
    the Workload; the relist then shows it admitted as if nothing happened. Kueue counts every
    eviction in `status.schedulingStats.evictions` in the same update as the Evicted condition,
    so evictions the watch never delivered are still counted and named, their times unknown."""

    UNSEEN = "not seen: the watch was down while Kueue evicted and re-admitted the Workload"

    def __init__(self, job_created, job_created_server):
        self.job_created, self.job_created_server = job_created, job_created_server
        self.cycles = []
        self.workload = None
        self.evictions_accounted = {}  # (reason, underlyingCause) -> count already in self.cycles
        self.deleted_uids = set()  # Workloads of the Job deleted by someone else (replaced by Kueue)

    def update(self, arrival, workload):
        first = self.workload is None
        if workload["metadata"].get("uid") in self.deleted_uids:
            return  # a deleted Workload's last state, delivered after its successor's
        if not first and workload["metadata"].get("uid") != self.workload["metadata"].get("uid"):
            self.replaced(arrival, workload)
        self.workload = workload
        admitted = workload_condition(workload, "Admitted")
        evicted = workload_condition(workload, "Evicted")
        counts = eviction_counts(workload)
        unseen = sorted(reason for key, count in counts.items()
                        for reason in [eviction_reason(*key)] * (count - self.evictions_accounted.get(key, 0)))
        if admitted.get("status") == "True" and evicted.get("status") != "True":
            if self.admitted and not unseen:
                return
            if unseen:
                previously = evicted.get("message") or ""
                self.close_unseen(unseen, previously[len("Previously: "):] if previously.startswith("Previously: ")
                                  else None)
            server = parse_k8s_time(admitted["lastTransitionTime"])
            # When the watch missed the moment itself (its first sight was already admitted, or
            # it missed the eviction before), the admission comes from the API, at whole seconds.
            if unseen:
                source = ("Admitted lastTransitionTime (API clock, whole seconds: the watch missed the eviction "
                          "before it)")
            elif first and not self.cycles:
                source = ("Admitted lastTransitionTime - Job creationTimestamp (API clocks, whole seconds: the watch "
                          "saw it admitted first)")
            else:
                source = WATCH_ARRIVAL
            late = source != WATCH_ARRIVAL
            previous = self.cycles[-1] if self.cycles else None
            if previous is None:
                queued_since, queued_source = (self.job_created_server, "Job creationTimestamp (API clock)") if late \
                    else (self.job_created, "Job create call returned (client clock)")
            elif previous.get("requeued_at") is not None:
                queued_since, queued_source = previous["requeued_at"], previous.get("requeued_source", REQUEUED_ARRIVAL)
            else:
                queued_since, queued_source = previous["evicted_at"], (
                    "the eviction's arrival: the watch did not deliver Requeued=True apart, so draining is counted "
                    "as queued")
            self.cycles.append({
                "admitted_at": server if late else arrival, "admitted_at_server": server, "admitted_source": source,
                "queued_since": queued_since, "queued_source": queued_source,
                "draining_since": previous["evicted_at"] if previous is not None else None})
        elif evicted.get("status") == "True" and (self.admitted or unseen):
            observed = next((r for r in unseen if r == evicted.get("reason")), None)
            if observed is not None:
                unseen.remove(observed)
            self.close_unseen(unseen, None)
            if not self.admitted:
                self.cycles.append(self.unseen_cycle())
            self.cycles[-1].update(evicted_at=arrival, evicted_reason=evicted.get("reason"),
                                   evicted_message=evicted.get("message"))
        elif self.cycles and not self.admitted and self.cycles[-1].get("evicted_at") is not None and \
                "requeued_at" not in self.cycles[-1] and workload_condition(workload, "Requeued").get("status") == "True":
            # Kueue requeues the Workload once the evicted Job's pods are gone (and any PodsReady
            # back-off is over): from here on it waits for quota, as Kueue's own queued time does.
            self.cycles[-1]["requeued_at"] = arrival
            return
        else:
            return
        self.evictions_accounted = counts

    def replaced(self, arrival, workload):
        """Someone deleted the Job's Workload and Kueue made a new one (of the same name, a new
        uid), having stopped the Job ("Missing Workload"): the cycle under way ended when the new
        Workload was first seen, which waits for quota from then; its evictions count from zero."""
        old = self.workload["metadata"]
        self.deleted_uids.add(old.get("uid"))
        if self.admitted:
            self.cycles[-1].update(evicted_at=arrival, evicted_reason=WORKLOAD_DELETED, evicted_message=(
                "Workload %s (uid %s) was deleted by someone else; Kueue stopped the Job (Missing Workload) and "
                "made a new Workload (uid %s)" % (old.get("name"), old.get("uid"), workload["metadata"].get("uid"))))
        if self.cycles and self.cycles[-1].get("requeued_at") is None:
            self.cycles[-1].update(requeued_at=arrival, requeued_source=NEW_WORKLOAD_ARRIVAL)
        self.evictions_accounted = {}

    def unseen_evictions(self):
        return [cycle["evicted_reason"] for cycle in self.cycles if cycle.get("evicted_source") == self.UNSEEN]

    def unseen_cycle(self):
        return {"admitted_at": None, "admitted_at_server": None, "admitted_source": self.UNSEEN,
                "queued_since": None}

    def close_unseen(self, reasons, last_message):
        """Cycles ended by evictions the watch never delivered: the open cycle first, then one
        more cycle each; reasons from schedulingStats (their order unknown), times unknown."""
        for number, reason in enumerate(reasons, 1):
            if not self.admitted:
                self.cycles.append(self.unseen_cycle())
            self.cycles[-1].update(evicted_at=None, evicted_reason=reason, evicted_source=self.UNSEEN,
                                   evicted_message=last_message if number == len(reasons) else None)

    @property
    def admitted(self):
        return bool(self.cycles) and "evicted_reason" not in self.cycles[-1]

    def state(self):
        """'admitted', or the reason and message it waits with (for the progress line)."""
        if self.workload is None:
            return "no Workload yet"
        if self.admitted:
            return "admitted"
        evicted = workload_condition(self.workload, "Evicted")
        if evicted.get("status") == "True" and workload_condition(self.workload, "QuotaReserved").get("status") == "True":
            return "evicted (%s), its pods terminating: %s" % (evicted.get("reason"), evicted.get("message"))
        reserved = workload_condition(self.workload, "QuotaReserved")
        if evicted.get("status") == "True" and workload_condition(self.workload, "Requeued").get("status") != "True":
            requeued = workload_condition(self.workload, "Requeued")
            return "evicted (%s), not requeued yet%s" % (evicted.get("reason"), ": %s: %s" % (
                requeued.get("reason"), requeued.get("message")) if requeued else "")
        if reserved.get("status") == "False" and reserved.get("reason") in HELD_REASONS and \
                not self.never_admissible():
            return "held: %s: %s; waiting for the queue to be resumed or fixed" % (
                reserved.get("reason"), reserved.get("message"))
        return "queued: %s" % ("%s: %s" % (reserved.get("reason"), reserved.get("message")) if reserved else "pending")

    def never_admissible(self):
        """The condition's message when waiting will not admit the Workload, else None."""
        if self.workload is None or self.admitted:
            return None
        evicted = workload_condition(self.workload, "Evicted")
        if self.workload.get("spec", {}).get("active") is False or (
                evicted.get("status") == "True" and (evicted.get("reason") or "").startswith("Deactivated")):
            return evicted.get("message") or "the Workload is deactivated (spec.active is false)"
        reserved = workload_condition(self.workload, "QuotaReserved")
        if reserved.get("status") == "False" and ((reserved.get("reason") or "").startswith(NEVER_ADMISSIBLE_REASONS) or
                                                  "maximum capacity" in (reserved.get("message") or "")):
            return reserved.get("message") or reserved.get("reason")
        return None

    def record(self, local_queue, cluster_queue):
        return {"local_queue": local_queue, "cluster_queue": cluster_queue,
                "workload": (self.workload or {}).get("metadata", {}).get("name"), "job_create_returned": self.job_created,
                "cycles": self.cycles, "last_state": self.state()}


def workload_condition(workload, kind):
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def eviction_counts(workload):
    """status.schedulingStats.evictions as {(reason, underlyingCause): count} (Kueue v0.14+;
    empty on older versions, which then count only the evictions the watch delivers)."""
    stats = ((workload.get("status") or {}).get("schedulingStats") or {}).get("evictions") or []
    return {(entry.get("reason"), entry.get("underlyingCause") or ""): entry.get("count", 0) for entry in stats}


def eviction_reason(reason, underlying_cause):
    """The Evicted condition's reason for a schedulingStats entry: Kueue appends the cause to
    "Deactivated" only (`DeactivatedDueToRequeuingLimitExceeded`, evict.go)."""
    return reason + "DueTo" + underlying_cause if reason == "Deactivated" and underlying_cause else reason


def queue_summary(record):
    """results.json's `queue`: the first admission wait, every cycle with its reason and wait,
    and what the batch figures include. Times on the client clock, except where backfilled."""
    cycles = []
    for number, cycle in enumerate(record["cycles"], 1):
        known = cycle["admitted_at"] is not None
        draining = cycle.get("draining_since")
        # An admission can arrive before the create call's answer (Kueue admits at once, the answer
        # is slow): the wait was then no longer than the call itself, and is counted as 0.
        cycles.append({"cycle": number, "queued_seconds": max(0.0, cycle["admitted_at"] - cycle["queued_since"])
                       if known and cycle["queued_since"] is not None else None,
                       "draining_seconds": cycle["queued_since"] - draining
                       if draining is not None and cycle.get("queued_source") in (REQUEUED_ARRIVAL, NEW_WORKLOAD_ARRIVAL)
                       else None,
                       "draining_since_unix": draining, "queued_source": cycle.get("queued_source"),
                       "queued_since_unix": cycle["queued_since"], "admitted_at_unix": cycle["admitted_at"],
                       "admitted_source": cycle["admitted_source"],
                       "admitted_at_server": iso_micro(cycle["admitted_at_server"]) if known else None,
                       "ran_seconds": (cycle["evicted_at"] - cycle["admitted_at"])
                       if known and cycle.get("evicted_at") is not None else None,
                       "evicted_reason": cycle.get("evicted_reason"), "evicted_message": cycle.get("evicted_message"),
                       "evicted_source": cycle.get("evicted_source", WATCH_ARRIVAL)
                       if cycle.get("evicted_reason") else None})
    waits = [c["queued_seconds"] for c in cycles if c["queued_seconds"] is not None]
    drains = [c["draining_seconds"] for c in cycles if c["draining_seconds"] is not None]
    return {"local_queue": record["local_queue"], "cluster_queue": record["cluster_queue"],
            "workload": record["workload"], "admission_cycles": len(cycles),
            "queued_seconds": cycles[0]["queued_seconds"] if cycles else None,
            "total_queued_seconds": sum(waits) if cycles else None,
            "total_draining_seconds": sum(drains) if len(cycles) > 1 else None,
            "unseen_queue_waits": sum(1 for c in cycles if c["queued_seconds"] is None),
            "queued_definition": "the Job's create call returned (the Job exists) -> the Workload's Admitted=True "
                                 "as the watch delivered it (client clock, seconds); a cycle after an eviction is queued from Kueue's Requeued=True "
                                 "(Kueue's own queued time starts there), or from the eviction's arrival when the "
                                 "watch did not deliver Requeued=True apart; a wait the watch did not see (it was "
                                 "down) is null and left out of the total. Its precision is the watch's delivery "
                                 "(tens of ms), except for waits marked as from API times (whole seconds); an "
                                 "admission that arrived before the create call's answer counts as 0",
            "draining_definition": "a cycle after an eviction: the eviction's arrival -> Requeued=True's arrival (client "
                                   "clock, seconds): the preempted pods terminating (up to their grace period) and any "
                                   "PodsReady back-off, time in which the Workload does not yet wait for quota; null "
                                   "where the watch did not deliver Requeued=True apart",
            "cycles": cycles,
            "batch_figures_include_queueing": True,
            "batch_figures_note": "batch_to_all_ready_seconds and batch_to_all_rewards_seconds run from the Job's "
                                  "creation, so they include the queue wait; batch_to_all_ready_after_admission_seconds "
                                  "does not; every per-episode phase starts at pod creation, after admission",
            "deadline_note": "activeDeadlineSeconds does not run while the Job is suspended, and each admission "
                             "restarts it (the Job's startTime is reset on resume)"}


def last_admission_time(record):
    """The server time of the last admission (whole seconds), or None."""
    return record["cycles"][-1]["admitted_at_server"] if record.get("cycles") else None


# ============================================================================
# Warm-pool backend: kubernetes-sigs/agent-sandbox (SandboxTemplate -> SandboxWarmPool ->
# SandboxClaim), each episode exec'd into its claimed sandbox through the API server
# ============================================================================

# kubernetes-sigs/agent-sandbox, API v1beta1 (served by v0.5.0 and later).
AGENT_SANDBOX_VERSION = "v0.5.6"  # the release the install hint and the kind workflow pin
AGENT_SANDBOX_INSTALL = ("kubectl --context %s apply -f https://github.com/kubernetes-sigs/agent-sandbox/releases/"
                         "download/" + AGENT_SANDBOX_VERSION + "/sandbox-with-extensions.yaml")
EXTENSIONS_API = "extensions.agents.x-k8s.io/v1beta1"
SANDBOX_API = "agents.x-k8s.io/v1beta1"  # the Sandbox CRD's storage version (agent-sandbox v0.5.6)
CLAIM_PLURAL = "sandboxclaims"  # the CRD's spec.names.plural: the claims' collection in API paths
SANDBOXES = Resource("Sandbox", SANDBOX_API, "sandboxes")
CLAIMS = Resource("SandboxClaim", EXTENSIONS_API, CLAIM_PLURAL)
WARM_POOLS = Resource("SandboxWarmPool", EXTENSIONS_API, "sandboxwarmpools")
TEMPLATES = Resource("SandboxTemplate", EXTENSIONS_API, "sandboxtemplates")
CONTROLLER_NAMESPACE, CONTROLLER_DEPLOYMENT = "agent-sandbox-system", "agent-sandbox-controller"
TEMPLATE_NAME, POOL_NAME, CLAIM_PREFIX = "episode", "episodes", "episode-"
LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type"  # on the Sandbox: warm (from the pool) or cold
POOL_MEMBER_LABEL = "agents.x-k8s.io/warm-pool-sandbox"  # on unclaimed pool Sandboxes and their pods
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
# Claim timestamps (RFC3339Nano) of agent-sandbox's internal/metrics/metrics.go (v0.5.6): the client's
# create call (its SDK sets it; so does this tool), the controller's first sight, the first Ready
# (may be "unknown" when the controller had to backfill it).
CLIENT_REQUESTED_ANNOTATION = "agents.x-k8s.io/client-first-requested-at"
CONTROLLER_OBSERVED_ANNOTATION = "agents.x-k8s.io/controller-first-observed-at"
CLAIM_FIRST_READY_ANNOTATION = "agents.x-k8s.io/claim-first-ready-at"
CLAIM_TIME_ANNOTATIONS = (CLIENT_REQUESTED_ANNOTATION, CONTROLLER_OBSERVED_ANNOTATION, CLAIM_FIRST_READY_ANNOTATION)
# The pod's own command: stay alive, exit at once on SIGTERM (agent-sandbox's own stress test
# uses this); the episode is exec'd into it.
KEEP_ALIVE_COMMAND = ["sh", "-c", "trap 'exit 0' TERM INT; sleep infinity & wait"]
DEFAULT_EXEC_CONCURRENCY = 1024  # episodes exec'd at once over the WebSocket channel (a thread and a socket each)
CLAIM_CREATE_STREAMS = 64  # claim creates under way at once through the proxy
SANDBOX_WATCH_PATIENCE_SECONDS = 3.0  # how long an episode waits for the Sandbox watch before asking kubectl
CLAIM_CREATE_PROCESSES = 4  # `kubectl create -f -` processes (a List of claims each) without it
CLAIM_SAFETY_NET_SECONDS = 600  # claims expire (shutdownPolicy Delete) this long after the client's deadline
# Claim Ready=False reasons that waiting will not cure: the SDK's TERMINAL_CLAIM_READY_REASONS.
# WarmPoolNotFound and TemplateNotFound are not among them: the controller requeues those claims
# (the pool or template may yet be created), so the run waits for them like for any claim.
TERMINAL_CLAIM_REASONS = ("InvalidMetadata", "EnvVarsInjectionRejected", "VolumeClaimTemplatesError",
                          "ClaimExpired", "SandboxExpired")
WARM_KIND = "WarmPoolEpisode"  # an exec'd episode in the shape of a pod, in episodes.json
EXTENSIONS_WAIT_SECONDS = 30  # a pool the controller has not reconciled by then: no extensions controller


def go_bool_flag(arg, name):
    """Whether a command-line word turns Go's boolean flag `name` on, as the flag package parses
    it: -name or --name alone, or =value with a value strconv.ParseBool takes as true."""
    flag, _, value = arg.lstrip("-").partition("=")
    if not arg.startswith("-") or arg.startswith("---") or flag != name:
        return False
    return "=" not in arg or value in ("1", "t", "T", "TRUE", "true", "True")

# An exec'd episode's points: the claim's life, then the episode. "client" is this tool's
# wall clock (time.time()); a watch time is when the event reached the tool, so it includes
# the watch's delivery delay. Durations on it assume no clock step during the run.
WARM_TIME_POINTS = {
    # Set by the tool as it sends the create, as agent-sandbox's SDK does; it feeds the
    # controller's agent_sandbox_client_claim_startup_latency_ms. A claim without it (made by
    # something else) falls back to its creationTimestamp, named in the row's time_fallbacks.
    "claim_created": ("client", 1e-6, "claim annotation %s (RFC3339Nano, set at the create call); fallback: "
                                      "metadata.creationTimestamp (api-server clock, whole seconds)"
                      % CLIENT_REQUESTED_ANNOTATION),
    "claim_observed": ("controller", 1e-6, "claim annotation %s (RFC3339Nano, the agent-sandbox controller's clock)"
                       % CONTROLLER_OBSERVED_ANNOTATION),
    "claim_first_ready": ("controller", 1e-6, "claim annotation %s (RFC3339Nano, the controller's clock, stamped "
                                              "as it records the claim Ready)" % CLAIM_FIRST_READY_ANNOTATION),
    # The API keeps no time of the binding: the first watch event with status.sandbox.name.
    "claim_bound": ("client", 1e-3, "first claim watch event with status.sandbox.name (arrival)"),
    "claim_ready": ("client", 1e-3, "first claim watch event with Ready=True (arrival)"),
    "exec_started": ("client", 1e-6, "the exec request sent (WebSocket channel; fallback: `kubectl exec` started)"),
    "stream_open": ("client", 1e-6, "the exec stream open: HTTP 101 received (WebSocket channel only)"),
    "process_start": TIME_POINTS["process_start"],
    "imports_done": TIME_POINTS["imports_done"],
    "ready": TIME_POINTS["ready"],
    "reward": TIME_POINTS["reward"],
    "exec_finished": ("client", 1e-6, "`kubectl exec` returned"),
}
WARM_PHASES = {
    "claim_to_controller": ("claim_created", "claim_observed", "claim requested -> controller saw it"),
    "client_claim_startup": ("claim_created", "claim_first_ready", "claim requested -> first Ready (controller)"),
    "claim_binding": ("claim_created", "claim_bound", "claim created -> bound"),
    "bound_to_claim_ready": ("claim_bound", "claim_ready", "bound -> claim Ready"),
    "claim_ready_to_exec": ("claim_ready", "exec_started", "claim Ready -> exec started"),
    "exec_to_stream_open": ("exec_started", "stream_open", "exec request -> stream open"),
    "stream_open_to_first_statement": ("stream_open", "process_start", "stream open -> first statement"),
    "exec_to_first_statement": ("exec_started", "process_start", "exec started -> first statement"),
    "module_import": PHASES["module_import"],
    "import_done_to_ready": PHASES["import_done_to_ready"],
    "ready_to_reward": PHASES["ready_to_reward"],
    "reward_to_exec_finished": ("reward", "exec_finished", "reward -> exec returned"),
    "claim_to_ready": ("claim_created", "ready", "claim created -> ready"),
}
WARM_TIMELINE_COLOURS = {  # a claim's own phases in colours of their own; the episode's as for a pod
    "claim_binding": "#e5c494", "bound_to_claim_ready": "#b3de69", "claim_ready_to_exec": "#17becf",
    "exec_to_stream_open": "#9edae5", "stream_open_to_first_statement": "#ff9da7",
    "exec_to_first_statement": "#d62728", "module_import": "#c44e52", "import_done_to_ready": "#937860",
    "ready_to_reward": "#55a868", "reward_to_exec_finished": "#5f5f5f",
}


def warm_episode_times(record, ready, reward, observed):
    """An exec'd warm-pool episode's points (WARM_TIME_POINTS), why any is missing, and which
    fell back to another source."""
    observed = observed or {}
    annotations = record["metadata"].get("annotations") or {}
    times, missing, fallbacks = {}, {}, {}
    times["claim_created"] = parse_rfc3339_nano(annotations.get(CLIENT_REQUESTED_ANNOTATION))
    if times["claim_created"] is None:
        times["claim_created"] = parse_k8s_time(record["metadata"]["creationTimestamp"])
        fallbacks["claim_created"] = ("metadata.creationTimestamp (api-server clock, whole seconds): the claim has "
                                      "no %s annotation" % CLIENT_REQUESTED_ANNOTATION)
    for point, key in (("claim_observed", CONTROLLER_OBSERVED_ANNOTATION),
                       ("claim_first_ready", CLAIM_FIRST_READY_ANNOTATION)):
        times[point] = parse_rfc3339_nano(annotations.get(key))
        if times[point] is None:
            missing[point] = "the claim has no %s annotation (or it is %r)" % (key, annotations.get(key))
    for point, key in (("claim_bound", "bound"), ("claim_ready", "ready"), ("exec_started", "exec_started"),
                       ("stream_open", "stream_open"), ("exec_finished", "exec_finished")):
        times[point] = observed.get(key)
        if times[point] is None:
            missing[point] = ("the claim watch did not see it" if point.startswith("claim") else
                              "`kubectl exec` (the fallback channel) does not tell when its stream opened"
                              if point == "stream_open" else "no exec time")
    for point, event, key in (("process_start", ready, "started_at"), ("imports_done", ready, "imports_done_at"),
                              ("ready", ready, "at"), ("reward", reward, "at")):
        value = event.get(key)
        times[point] = float(value) if isinstance(value, (int, float)) else None
        if times[point] is None:
            missing[point] = "the %s event has no %s" % (event.get("event"), key)
    return times, missing, fallbacks


# A warm-pool episode record's status.reason when its exec did not give an exit code of its own.
EXEC_FAILURE_REASONS = ("ExecFailed", "ExecTimedOut", "SandboxDeleted")
WARM_SCHEME = PhaseScheme(
    WARM_TIME_POINTS, WARM_PHASES, "claim_to_ready", warm_episode_times, "claim_created",
    identity=lambda record: {"claim": record["metadata"]["name"], "sandbox": record["spec"].get("sandbox"),
                             "pod": record["spec"].get("pod"), "launch_type": record["spec"].get("launch_type")},
    row_key="claim", timeline_colours=WARM_TIMELINE_COLOURS, timeline_fallbacks={"exec_to_first_statement": "stream_open"},
    report_phases={"startup": ("client_claim_startup", "claim_binding", "bound_to_claim_ready", "claim_ready_to_exec",
                               "exec_to_stream_open", "stream_open_to_first_statement", "exec_to_first_statement"),
                   "startup_metric": ("claim_to_ready",), "finish": ("reward_to_exec_finished",)},
    explained_failures=EXEC_FAILURE_REASONS, deadline_failures=("ExecTimedOut",),
    timeline_attributes=("launch_type",))


def sandbox_template_manifest(namespace, run_id, image, runtime, tasks=False):
    """The SandboxTemplate: the Job pod's spec (image, RuntimeClass, resources, hardened
    security context, the episode program at /demo) with a keep-alive command instead of the
    episode, an explicit dnsPolicy and no managed NetworkPolicy (agent-sandbox's defaults would
    otherwise change DNS and networking against the Job backend's pods)."""
    pod = episode_pod_template(run_id, image, runtime, tasks)
    pod["spec"]["containers"][0].update(command=list(KEEP_ALIVE_COMMAND), env=[])
    pod["spec"].update(terminationGracePeriodSeconds=1, dnsPolicy="ClusterFirst")
    return {"apiVersion": EXTENSIONS_API, "kind": "SandboxTemplate",
            "metadata": {"name": TEMPLATE_NAME, "namespace": namespace, "labels": object_labels(run_id, "sandbox-template")},
            "spec": {"podTemplate": pod, "networkPolicyManagement": "Unmanaged"}}


def warm_pool_manifest(namespace, run_id, replicas):
    return {"apiVersion": EXTENSIONS_API, "kind": "SandboxWarmPool",
            "metadata": {"name": POOL_NAME, "namespace": namespace, "labels": object_labels(run_id, "warm-pool")},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": TEMPLATE_NAME}}}


def claim_manifests(namespace, run_id, count, shutdown_time, prefix=CLAIM_PREFIX):
    """One SandboxClaim per episode, named <prefix><i> (also the episode id: episode-<i>, or for a
    step of a kept pool episode-<step>-<i>, so that steps sharing the pool never collide). No env:
    claim env forces a cold start; the episode gets its id on the exec command line. The lifecycle
    is a safety net: if the tool dies, the claims (and through them the Sandboxes) go anyway."""
    return [{"apiVersion": EXTENSIONS_API, "kind": "SandboxClaim",
             "metadata": {"name": "%s%d" % (prefix, index), "namespace": namespace,
                          "labels": object_labels(run_id, "claim")},
             "spec": {"warmPoolRef": {"name": POOL_NAME},
                      "lifecycle": {"shutdownTime": shutdown_time, "shutdownPolicy": "Delete"}}}
            for index in range(count)]


def launch_type_of(sandbox):
    """A Sandbox's launch type (warm or cold, the controller's label), None when unlabelled or None."""
    return (((sandbox or {}).get("metadata") or {}).get("labels") or {}).get(LAUNCH_TYPE_LABEL)


def nearest_rank(values, p):
    """The agent-sandbox stress test's percentile (test/stress stats.go): the value at rank
    ceil(p/100 * n), 1-based. Not the tutorial's interpolation used everywhere else."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100.0 * len(ordered))) - 1]


def nearest_rank_stats(values):
    if not values:
        return {"count": 0}
    return {"count": len(values), "min": min(values), "mean": statistics.fmean(values),
            **{"p%d" % p: nearest_rank(values, p) for p in (50, 90, 95, 99)}, "max": max(values)}


def warm_pool_summary(output, report, observed):
    """What only a warm-pool run has: launch types, pool fill, refill pods, the time to all
    claims Ready by both definitions, and the phases of warm and cold episodes apart."""
    record = read_json(output / "warm-pool.json", "the warm-pool record")
    claims = read_json(output / "claims.json", "the saved claims", shape=list)
    pods = read_saved(output / "pods.json") or []
    launch = record.get("launch_types") or {}
    rows = report["pods"]
    batch_created = min(parse_k8s_time(claim["metadata"]["creationTimestamp"]) for claim in claims) if claims else None
    ready_seen = [observed.get(claim["metadata"]["name"], {}).get("ready") for claim in claims]
    all_ready = bool(claims) and None not in ready_seen
    called = [observed.get(claim["metadata"]["name"], {}).get("create_called") for claim in claims]
    returned = [observed.get(claim["metadata"]["name"], {}).get("create_returned") for claim in claims]
    end_to_end = [(ready - call) * 1000 for ready, call in zip(ready_seen, called) if ready and call]
    create_ack = [(back - call) * 1000 for back, call in zip(returned, called) if back and call]
    # Refill: pods of the pool made after the claims were fired (not in the pool then, and not
    # a claim's own cold pod), and those of them already started before the last reward.
    at_fire = set(record.get("pool_pods_at_fire") or []) | set(record.get("other_pods_at_fire") or [])
    claimed = {row.get("pod") for row in rows} | {claim["metadata"]["name"] for claim in claims}
    refill = [pod for pod in pods if pod["metadata"]["name"] not in at_fire and pod["metadata"]["name"] not in claimed]
    last_reward = max((row["times"]["reward"] for row in rows if row["times"].get("reward")), default=None)
    running_since = [((pod.get("status", {}).get("containerStatuses") or [{}])[0].get("state") or {})
                     .get("running", {}).get("startedAt") for pod in refill]
    started = [since for since in running_since
               if since and last_reward is not None and parse_k8s_time(since) <= last_reward]
    step = {}
    if record.get("kept_pool"):  # a step of a kept pool: what the pool held for it, and its refill
        refill, counts = record.get("refill") or {}, collections.Counter(launch.values())
        step = {"kept_pool_step": {
            "pool_folder": record["kept_pool"].get("folder"), "size": record.get("size"),
            "ready_at_start": record.get("ready_at_fire"), "warm": counts.get("warm", 0), "cold": counts.get("cold", 0),
            "expected_cold": record.get("expected_cold"), "refill_seconds": refill.get("seconds"),
            "refill_state": refill.get("state"), "ready_at_end": refill.get("ready_at_end"),
            "refill_definition": refill.get("definition"),
            "changes_since_pool_up": record["kept_pool"].get("changes") or []}}
    by_type = {}
    for kind in sorted(set(row.get("launch_type") for row in rows) - {None}):
        subset = [row for row in rows if row.get("launch_type") == kind]
        by_type[kind] = {"episodes": len(subset), "phases": {
            name: {key: phase[key] for key in ("count", "p50", "p95", "max")}
            for name, phase in phase_statistics(subset, WARM_SCHEME).items()}}
    return {
        "backend": "warm-pool",
        "parallelism": report["episodes"],
        "launch_types": dict(sorted(collections.Counter(kind or "unknown" for kind in launch.values()).items())),
        "launch_type_source": "the claimed Sandbox's label %s" % LAUNCH_TYPE_LABEL,
        "pool": {key: record.get(key) for key in ("name", "template", "size", "fill_seconds", "ready_at_fire")},
        "exec_channel": record.get("exec_channel"),
        "refill_pods": {"created_during_batch": len(refill), "started_before_last_reward": len(started),
                        "detail": "pool pods not in the pool when the claims were created, nor a claim's cold pod; "
                                  "started = container startedAt (kubelet clock, whole seconds) <= the last reward"},
        # Ours: like batch_to_all_ready_seconds, from the API server's creation of the batch.
        "batch_to_all_claims_ready_seconds": max(ready_seen) - batch_created if all_ready else None,
        "batch_to_all_claims_ready_definition": "earliest claim creationTimestamp (api-server clock, whole seconds) "
                                                "-> the last claim's Ready=True as first seen by the tool's watch",
        "agent_sandbox_stress_test": {
            "time_to_all_ready_seconds": max(ready_seen) - min(called) if all_ready and None not in called else None,
            "definition": "timeToAllReadySeconds of agent-sandbox test/stress: earliest create call -> latest claim "
                          "Ready seen by a watch (both on the client's clock); null if any claim never became Ready",
            "end_to_end_ready_ms": nearest_rank_stats(end_to_end),
            "create_ack_ms": nearest_rank_stats(create_ack),
            "percentile_rule": "nearest rank: the value at rank ceil(p/100 * n) (stress stats.go); every other "
                               "percentile in this file interpolates linearly",
        },
        "phases_by_launch_type": by_type,
        **step,
    }


def check_agent_sandbox(cluster, who="--backend warm-pool"):
    """Read-only: the four v1beta1 kinds are served, and the controller runs with --extensions
    (when its Deployment can be read). Raises one line with the install command otherwise,
    naming `who` needs it (the option, or `pool up`)."""
    install = AGENT_SANDBOX_INSTALL % cluster.context
    served = cluster.api.served("agents.x-k8s.io", "extensions.agents.x-k8s.io")
    wanted = ["sandboxes.agents.x-k8s.io"] + ["%s.extensions.agents.x-k8s.io" % plural for plural in (
        "sandboxtemplates", "sandboxwarmpools", "sandboxclaims")]
    missing = [name for name in wanted if name not in served]
    if missing:
        raise DemoError("%s needs kubernetes-sigs/agent-sandbox with its extensions on context %s, and "
                        "the API serves no %s; install it with `%s` (then `kubectl --context %s -n %s rollout status "
                        "deployment/%s`)" % (who, cluster.context, ", ".join(missing), install, cluster.context,
                                             CONTROLLER_NAMESPACE, CONTROLLER_DEPLOYMENT))
    try:
        deployment = cluster.api.get(DEPLOYMENTS, CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE)
    except KubectlError as error:
        deployment = {"error": meaningful_line(error.stderr)}
    if deployment is None or "error" in deployment:
        # Expected where a user may not read the controller's namespace, or Helm named it
        # otherwise: said only if the pool then does not fill (wait_for_pool), not on every run.
        return {"controller": None, "served": wanted, "controller_unread": "cannot read deployment/%s in %s (%s)" % (
            CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE, (deployment or {}).get("error", "not found"))}
    containers = deployment["spec"]["template"]["spec"].get("containers") or []
    args = [arg for container in containers for arg in (container.get("command") or []) + (container.get("args") or [])]
    if not any(go_bool_flag(arg, "extensions") for arg in args):
        raise DemoError("the agent-sandbox controller (deployment/%s in %s) runs without --extensions, so nothing "
                        "reconciles warm pools and claims; install sandbox-with-extensions.yaml (`%s`) or, with Helm, "
                        "set controller.extensions=true" % (CONTROLLER_DEPLOYMENT, CONTROLLER_NAMESPACE, install))
    return {"controller": {"image": [c.get("image") for c in containers], "args": args}, "served": wanted}


def pool_filled(pool, size):
    """The pool is reconciled (observedGeneration) and `size` replicas are there and Ready."""
    status = (pool or {}).get("status") or {}
    return (status.get("observedGeneration") == (pool or {}).get("metadata", {}).get("generation")
            and status.get("readyReplicas", 0) >= size and status.get("replicas", 0) >= size)


def wait_for_pool(cluster, namespace, size, wait_seconds, controller_unread=None, on_wait=None):
    """Until the pool is reconciled (observedGeneration) and every replica is Ready. Stops early
    when a pool Sandbox reports a refusal that cannot pass. Returns the pool as last seen.
    `controller_unread`: why the preflight could not see the controller's flags, added to a
    timeout's line (a controller without --extensions never fills a pool). Everything is read
    through the command's channel (a poll every 3 s was a kubectl process each).
    `on_wait` is called at every turn of the wait (the run takes in what its watches delivered)."""
    console = cluster.console
    watch = cluster.api.watch(WARM_POOLS, namespace, name=POOL_NAME)
    started = time.monotonic()

    def read_pool():
        return cluster.api.get(WARM_POOLS, POOL_NAME, namespace)

    try:
        pool, checked = read_pool(), time.monotonic()
        last_ready = None
        while True:
            for state in watch.drain(timeout=WATCH_WAIT_SECONDS):
                pool = state
            if on_wait is not None:
                on_wait()
            status = (pool or {}).get("status") or {}
            reconciled = status.get("observedGeneration") == (pool or {}).get("metadata", {}).get("generation")
            console.progress("warm pool: %d of %d ready, %.0f s" % (status.get("readyReplicas", 0), size,
                                                                    time.monotonic() - started))
            if pool_filled(pool, size):
                return pool
            elapsed = time.monotonic() - started
            if not reconciled and elapsed > EXTENSIONS_WAIT_SECONDS:
                raise DemoError("the SandboxWarmPool was not reconciled within %d s: is the agent-sandbox controller "
                                "running with --extensions? Install it with `%s`" % (
                                    EXTENSIONS_WAIT_SECONDS, AGENT_SANDBOX_INSTALL % cluster.context))
            if time.monotonic() - checked >= STALL_CHECK_SECONDS:
                checked = time.monotonic()
                # a watch may stall or miss a change (a dead watch costs latency, never
                # correctness): the pool as the API has it now
                pool = read_pool() or pool
                if pool_filled(pool, size):
                    return pool
                status = pool.get("status") or {}
                progressed, last_ready = status.get("readyReplicas", 0) != last_ready, status.get("readyReplicas", 0)
                if progressed and elapsed <= wait_seconds:
                    continue  # filling: the Sandboxes are read only when it stalls
                sandboxes = cluster.api.list(SANDBOXES, namespace)
                messages = [c.get("message", "") for s in sandboxes for c in (s.get("status") or {}).get(
                    "conditions") or [] if c.get("type") == "Ready" and c.get("status") == "False"]
                refused = [m for m in messages if any(marker in m for marker in PERMANENT_REFUSALS)]
                if refused:
                    raise DemoError("the warm pool cannot fill: %s" % refused[0])
                # The controller's own signal (SandboxWarmPool controller, setNotProgressing): its
                # sandboxes are unschedulable past the readiness grace period.
                stuck = cluster.api.list(EVENTS, namespace, fields=(
                    "involvedObject.kind=SandboxWarmPool,involvedObject.name=%s,reason=WarmPoolNotProgressing" % POOL_NAME))
                if stuck:
                    raise DemoError("the warm pool cannot fill: the agent-sandbox controller says: %s"
                                    % stuck[-1].get("message"))
                # A pod that can never start (an image its registry does not have, a container the
                # runtime refuses) is named at once, as the Job backend names it, not at the deadline.
                pods = cluster.api.list(PODS, namespace, POOL_MEMBER_LABEL)
                blocked = blocking_reason([], pods)
                if blocked:
                    raise DemoError("the warm pool cannot fill: %s; stopped early instead of waiting for the deadline"
                                    % blocked)
                if elapsed > wait_seconds:
                    # What holds the pods back (a waiting reason such as ImagePullBackOff, a
                    # scheduler message) says more than the Sandbox's "Pod is Not Ready".
                    held = why_not_started(pods)
                    raise BatchTimeout("the warm pool did not fill within %d s: %d of %d Sandboxes ready%s%s" % (
                        wait_seconds, status.get("readyReplicas", 0), size,
                        "; pods not running: %s" % "; ".join(held[:3]) if held else
                        "; e.g. %s" % messages[0] if messages else "",
                        "; %s, so whether the agent-sandbox controller runs with --extensions is unknown"
                        % controller_unread if controller_unread else ""))
    finally:
        console.end_progress()
        watch.stop()


WARM_DIAGNOSTICS = "diagnostics saved in %s (claims.json, sandboxes.json, pods.json, episodes.json, events.txt, logs)"


def save_pool_state(cluster, namespace, output):
    """A pool that did not fill: its pods, Sandboxes, the pool and the events, saved for the
    failure line (which names what was kept)."""
    kept = []
    for name, resource in (("pods.json", PODS), ("sandboxes.json", SANDBOXES), ("warm-pool-object.json", WARM_POOLS)):
        try:
            write_json(output / name, sorted(cluster.api.list(resource, namespace), key=by_creation))
            kept.append(name)
        except DemoError:
            pass
    try:
        save_events(cluster, namespace, output)
        kept.append("events.txt")
    except DemoError:
        pass
    return "diagnostics saved in %s (%s)" % (output, ", ".join(kept) or "none could be read")


def create_claims(cluster, claims, run_id, observed):
    """Create every claim at once, recording each create call and answer on the client clock
    (and the call in the claim's client-first-requested-at annotation). Through the command's
    proxy when its channel has one: concurrent POSTs from this process, no kubectl started; else a few `kubectl
    create -f -` processes (a List each) together. A create whose outcome is unknown is resolved
    claim by claim: looked for, then tried again (Cluster.create_owned)."""
    def stamp(chunk):
        called = time.time()
        for claim in chunk:
            observed[claim["metadata"]["name"]]["create_called"] = called
            claim["metadata"].setdefault("annotations", {})[CLIENT_REQUESTED_ANNOTATION] = iso_micro(called)

    def answered(chunk):
        returned = time.time()
        for claim in chunk:
            observed[claim["metadata"]["name"]]["create_returned"] = returned

    def post(claim):
        stamp([claim])
        try:
            status, body = cluster.api.create(CLAIMS, claim, claim["metadata"]["namespace"])
        except (OSError, http.client.HTTPException, ProxyUnavailable):
            status, body = None, {}
        if status in (400, 403, 404, 422):  # refused: nothing was made
            raise DemoError("creating SandboxClaim %s was refused: HTTP %d: %s" % (
                claim["metadata"]["name"], status, body.get("message")))
        if status != 201:
            cluster.create_owned(claim, run_id)  # unknown outcome (or AlreadyExists): look, then try again
        answered([claim])

    def create(chunk):
        stamp(chunk)
        try:
            cluster.kubectl("create", "-f", "-", "-o", "name", data={"apiVersion": "v1", "kind": "List", "items": chunk})
        except KubectlError as error:
            if (error.forbidden or error.invalid or error.no_such_kind) and not error.already_exists:
                raise
            for claim in chunk:  # the outcome of each is unknown: look before trying again
                cluster.create_owned(claim, run_id)
        answered(chunk)

    if cluster.api.serves:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(CLAIM_CREATE_STREAMS, len(claims))) as pool:
            list(pool.map(post, claims))
        return
    workers = min(CLAIM_CREATE_PROCESSES, len(claims))
    size = -(-len(claims) // workers)
    chunks = [claims[start:start + size] for start in range(0, len(claims), size)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        list(pool.map(create, chunks))


def older_state(new, old):
    """Whether `new` is an older state of the object than `old` (resourceVersions compared as
    numbers when both are, as etcd's are; otherwise never older)."""
    if old is None:
        return False
    new_version, old_version = (str(obj["metadata"].get("resourceVersion", "")) for obj in (new, old))
    return new_version.isdigit() and old_version.isdigit() and int(new_version) < int(old_version)


def claim_ready(claim):
    return next((c for c in (claim.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})


def episode_command(claim_name, index, spec):
    """The command exec'd into a claimed sandbox. The episode id (and task) go on the command
    line: claim env would force a cold start. A kept pool's sandboxes were started before this
    step's tasks existed, so there the task itself travels on the command line and is written
    into the sandbox's workspace before the episode starts (one episode per sandbox)."""
    env = ["EPISODE_ID=" + claim_name]
    if spec.episode:
        env.append("JOB_COMPLETION_INDEX=%d" % index)
    journaled = ["python", "-S", "-B", "/demo/" + EXEC_JOURNAL_FILE, "start", exec_journal(claim_name),
                 "python", "-B", "/demo/" + SANDBOX_PROBE_FILE, "/demo/episode.py"]
    if spec.tasks_list is None:
        return ["env", *env, *journaled]
    if not spec.pool:
        return ["env", *env, "TASK_INDEX=%d" % index, "TASK_FILE=/tasks/task-%d.json" % index, *journaled]
    return ["sh", "-c", 'printf "%%s" "$0" > %s && exec "$@"' % STEP_TASK_FILE, json.dumps(spec.tasks_list[index]),
            "env", *env, "TASK_INDEX=%d" % index, "TASK_FILE=" + STEP_TASK_FILE, *journaled]


def exec_journal(claim_name):
    return "%s/%s" % (EXEC_JOURNALS, claim_name)


def follow_command(claim_name):
    """The exec that reads an episode's journal again after its stream was cut."""
    return ["env", "python", "-S", "-B", "/demo/" + EXEC_JOURNAL_FILE, "follow", exec_journal(claim_name)]


def exec_journal_word(result):
    """What the exec journal itself said (never-started, started-before, lost), or None: the
    result is the episode's own."""
    if result.code not in (EXEC_JOURNAL_EXIT, None):  # None: a runtime that words an exit code as an error
        return None
    last = last_line(result.stderr.decode("utf-8", "replace"))
    return last[len(EXEC_JOURNAL_MARK):] if last.startswith(EXEC_JOURNAL_MARK) else None


def warm_episode_record(claim, index, sandbox, pod, result, times):
    """One exec'd episode in the shape of a pod (kind WarmPoolEpisode), so that one validator
    serves every backend: phase from the exec's exit code, the claim's creation time, the
    sandbox pod's node, image and restart count."""
    code, error = result.get("code"), result.get("error")
    container = ((pod or {}).get("status", {}).get("containerStatuses") or [{}])[0]
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    for key, point in (("startedAt", "exec_started"), ("finishedAt", "exec_finished")):
        if times.get(point):
            terminated[key] = iso_micro(times[point])
    status = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
        "name": CONTAINER_NAME, "restartCount": container.get("restartCount", 0), "imageID": container.get("imageID"),
        "state": {"terminated": terminated}}]}
    if error:
        status.update(reason=result.get("reason", "ExecFailed"), message=error)
    return {"apiVersion": "rl-batch-demo/warm-pool", "kind": WARM_KIND,
            "metadata": {"name": claim["metadata"]["name"], "creationTimestamp": claim["metadata"]["creationTimestamp"],
                         "uid": claim["metadata"].get("uid"), "annotations": {INDEX_KEY: str(index), **{
                             key: value for key, value in (claim["metadata"].get("annotations") or {}).items()
                             if key in CLAIM_TIME_ANNOTATIONS}}},
            "spec": {"nodeName": (pod or {}).get("spec", {}).get("nodeName"),
                     "sandbox": (sandbox or {}).get("metadata", {}).get("name"),
                     "pod": (pod or {}).get("metadata", {}).get("name"),
                     "launch_type": launch_type_of(sandbox)},
            "status": status}


class WarmPoolRun:
    """One warm-pool batch under way: the claims fired at once, their states as the watch
    delivers them, and each episode exec'd as soon as its claim is Ready. Everything it saw is
    kept here, so that every way out can save it."""

    def __init__(self, run, run_info, pool_run_id=None):
        self.run, self.run_info = run, run_info
        self.spec, self.cluster, self.console, self.output = run.spec, run.cluster, run.console, run.output
        self.namespace = run.namespace
        self.selector = "%s=%s" % (RUN_LABEL, run.run_id)  # the claims: this batch's
        # the pods: the template labels them with the run that made the pool (a kept pool's, not the step's)
        self.pod_selector = "%s=%s" % (RUN_LABEL, pool_run_id or run.run_id)
        self.names, self.position, self.observed = [], {}, {}  # claim names, the episode's index, times seen
        self.latest, self.sandboxes, self.results = {}, {}, {}  # claim and Sandbox states; finished episodes
        self.stopping = threading.Event()  # set on Ctrl-C or SIGTERM, before the tool closes its own channels
        self.pods = {}  # pod uid -> its last state the watch delivered (deleted pods too)
        self.pod_uids = {}  # pod name -> uid of the latest pod of that name seen
        self.pod_watch = None
        self.deadline = self.deadline_at = None
        self.channel, self.channel_lock = None, threading.Lock()  # how episodes are exec'd

    def fire(self, claims, claim_watch, sandbox_watch, pod_watch=None):
        """Create every claim and run every episode; returns once all are done or the deadline passed."""
        self.pod_watch = pod_watch
        self.names = [claim["metadata"]["name"] for claim in claims]
        self.position = {name: index for index, name in enumerate(self.names)}
        self.observed = {name: {} for name in self.names}
        started = time.monotonic()
        self.run.stream.begin(started)
        self.deadline = started + self.spec.timeout
        self.deadline_at = time.time() + self.spec.timeout  # the same deadline on the wall clock
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.spec.exec_concurrency)
        pending = {}
        try:
            # The claims are created in the background, so that the first claims' episodes start
            # while the last are still being created (as 1,000 independent clients would).
            creating = executor.submit(create_claims, self.cluster, claims, self.run.run_id, self.observed)
            polled = time.monotonic()
            while True:
                states = claim_watch.drain(timeout=WATCH_WAIT_SECONDS)
                if time.monotonic() - polled >= FALLBACK_POLL_SECONDS:
                    listed = self.list_claims()
                    states += [(time.time(), claim) for claim in listed]
                    polled = time.monotonic()
                if creating.done():
                    creating.result()  # a refused create ends the run here
                for sandbox in sandbox_watch.drain():
                    self.sandboxes[sandbox["metadata"]["name"]] = sandbox
                self.absorb_pods()
                for now, claim in states:
                    name = claim["metadata"]["name"]
                    if name not in self.observed or older_state(claim, self.latest.get(name)):
                        continue  # a lagging watch must not put an older state back
                    self.latest[name] = claim
                    bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
                    if bound:
                        self.observed[name].setdefault("bound", now)
                    if claim_ready(claim).get("status") == "True" and bound:
                        self.observed[name].setdefault("ready", now)
                        if name not in pending:
                            pending[name] = executor.submit(self.run_episode, name, bound)
                refused = [(name, claim_ready(claim)) for name, claim in self.latest.items() if name not in pending
                           and claim_ready(claim).get("reason") in TERMINAL_CLAIM_REASONS]
                done = sum(1 for future in pending.values() if future.done())
                self.console.progress("claims: %d bound, %d ready; episodes done %d of %d, %.0f s" % (
                    sum(1 for o in self.observed.values() if "bound" in o),
                    sum(1 for o in self.observed.values() if "ready" in o), done, len(self.names),
                    time.monotonic() - started))
                if refused:
                    name, condition = refused[0]
                    raise DemoError("claim %s can never become Ready (%s: %s); stopped early" % (
                        name, condition.get("reason"), condition.get("message")))
                if done == len(self.names) or time.monotonic() > self.deadline:
                    break
            for future in pending.values():
                future.result()  # an exception in a worker is the tool's own failure: surface it
            self.run_info["client_job_complete_seconds"] = time.monotonic() - started
        except KeyboardInterrupt:
            # The running execs: their episodes are cut short, not results. Closing the channel
            # ends every stream at once; stop_running stops the `kubectl exec` processes.
            self.stopping.set()
            self.close_channels()
            self.cluster.runner.stop_running(executor)
            self.console.tell("Interrupted: saving the claims and the episodes so far in %s" % self.output)
            self.save_state()
            raise
        finally:
            self.console.end_progress()
            executor.shutdown(wait=True, cancel_futures=True)

    def watch(self, resource, selector=None, name=None, timed=False):
        """A watch of the namespace's `resource` through the command's channel."""
        return self.cluster.api.watch(resource, self.namespace, selector, name, timed)

    def list_claims(self):
        """The run's claims now."""
        return self.list_namespaced(CLAIMS, self.selector)

    def list_namespaced(self, resource, selector=None):
        """The namespace's `resource` (those of `selector`) now, through the command's channel."""
        return self.cluster.api.list(resource, self.namespace, selector)

    def absorb_watched(self, sandbox_watch):
        """Take in what the Sandbox and pod watches delivered so far, the last state of each kept
        (as fire() does): while a pool of 1,000 fills, its sandboxes' and pods' every state would
        otherwise wait in the watches' queues (its memory at 1,000 claims: benchmarks/README.md)."""
        for sandbox in sandbox_watch.drain():
            self.sandboxes[sandbox["metadata"]["name"]] = sandbox
        self.absorb_pods()

    def absorb_pods(self):
        """Take in the pod states the watch delivered (kept by uid: a replacement pod has its own)."""
        if self.pod_watch is None:
            return
        for pod in self.pod_watch.drain():
            meta = pod["metadata"]
            if meta.get("uid") and not older_state(pod, self.pods.get(meta["uid"])):
                self.pods[meta["uid"]] = pod
                self.pod_uids[meta["name"]] = meta["uid"]

    def run_episode(self, name, bound):
        """One episode, exec'd into its claim's sandbox (`bound`, as the Ready state named it); its
        output kept as its log."""
        index = self.position[name]
        sandbox = self.wait_for_sandbox(bound) or self.read_sandbox(bound)
        pod_name = (sandbox or {}).get("metadata", {}).get("annotations", {}).get(POD_NAME_ANNOTATION) or bound
        pod_uid = self.pod_uids.get(pod_name)  # the pod the exec goes to, when the watch has shown it
        result = self.exec_episode(pod_name, name, episode_command(name, index, self.spec))
        self.observed[name]["exec_finished"] = time.time()
        self.observed[name]["exec_started"] = result.sent_at
        if result.code != 0 and self.stopping.is_set():
            # Its stream was cut by the tool's own shutdown, not by an outage: kept as interrupted,
            # and, like a Job's or a local episode cut short, never streamed (it has no verdict).
            result = ExecResult(None, result.stdout, result.stderr, reason="Interrupted", error=(
                "interrupted: the tool was stopped (Ctrl-C or SIGTERM) while the episode ran"),
                sent_at=result.sent_at, opened_at=result.opened_at)
        elif result.code != 0:
            deleted = self.deleted_under(bound, pod_name, pod_uid)
            if deleted:
                reason, message = deleted
                result = ExecResult(None, result.stdout, result.stderr, error=message, reason=reason,
                                    sent_at=result.sent_at, opened_at=result.opened_at)
        if result.opened_at is not None:
            self.observed[name]["stream_open"] = result.opened_at
        (self.output / (name + ".log")).write_bytes(result.stdout)
        if result.stderr:
            (self.output / (name + ".stderr")).write_bytes(result.stderr.rstrip(b"\n") + b"\n")
        self.results[name] = {"code": result.code, "error": result.error, "reason": result.reason,
                              "sandbox": sandbox, "pod_name": pod_name}
        if result.reason != "Interrupted":
            self.offer(name, index, result)

    def exec_episode(self, pod_name, claim_name, command):
        """The episode's exec on the run's channel (the fallback's when the stream is refused for
        every pod). Under the cluster's ApiPatience and within the deadline, an exec the API server
        refused in passing is sent again, and one whose stream was cut (an outage, a restart) is
        followed through the episode's exec journal: its output and exit code are read again,
        the episode itself sent again only when the journal shows it never started."""
        tries, first, journal_turns = self.cluster.patience.tries(), None, 0
        while True:
            result, broken = self.exec_once(pod_name, command)
            if broken:  # the channel's handshake was answered wrongly: never sent again
                tries.answered()
                return result
            first = first or result
            missing = next((name for name in (EXEC_JOURNAL_FILE, SANDBOX_PROBE_FILE) if result.code == 2 and
                            b"can't open file" in result.stderr and ("/demo/" + name).encode() in result.stderr), None)
            if missing:
                tries.answered()  # a kept pool made by an older rl-batch-demo: its episode did not start
                return ExecResult(None, result.stdout, result.stderr, sent_at=result.sent_at, error=(
                    "the sandbox has no /demo/%s: its pool was made by an older rl-batch-demo; make it again "
                    "(`pool down`, then `pool up`)" % missing))
            word = exec_journal_word(result)
            if word in ("never-started", "started-before") and journal_turns < EXEC_JOURNAL_TURNS:
                journal_turns += 1
                self.console.note("exec into %s: %s" % (pod_name, "its exec journal shows the episode never started; "
                                  "sending it again" if word == "never-started" else "the episode started before; "
                                  "following its exec journal"))
                command = episode_command(claim_name, self.position[claim_name], self.spec) \
                    if word == "never-started" else follow_command(claim_name)
                continue
            if word == "lost":
                tries.answered()
                return ExecResult(None, result.stdout, result.stderr.rsplit(EXEC_JOURNAL_MARK.encode(), 1)[0],
                                  error="the episode's process ended without an exit code (its sandbox's container "
                                        "restarted?); it may have run, so it is not sent again",
                                  sent_at=first.sent_at, opened_at=first.opened_at)
            delay = None
            if result.refused_in_passing or (result.cut and not self.stopping.is_set()):
                delay = tries.again("exec into %s" % pod_name, result.error, retry_after=result.retry_after,
                                    deadline=self.deadline)
            if delay is None:
                tries.answered()
                if result is not first:  # the episode's outcome, timed from its first exec
                    result = dataclasses.replace(result, sent_at=first.sent_at, opened_at=first.opened_at)
                return result
            if result.cut:
                command = follow_command(claim_name)  # it may have started: read its journal
            time.sleep(delay)

    def exec_once(self, pod_name, command):
        """(result, broken): one exec on the run's channel, the fallback's when the channel refuses;
        broken when the channel's handshake was answered wrongly (the command may have run)."""
        channel = self.channel
        try:
            result = channel.run(pod_name, command, self.exec_seconds_left())
        except ExecRefused as refused:
            channel = self.fall_back(channel, refused)
            result = channel.run(pod_name, command, self.exec_seconds_left())
        except ExecChannelBroken as broken:
            self.fall_back(channel, broken)
            return broken.result, True
        if result.code is None and result.opened_at is None and self.channel is not channel:
            # no stream on the channel another episode found refused meanwhile: the fallback's turn
            result = self.channel.run(pod_name, command, self.exec_seconds_left())
        return result, False

    def exec_seconds_left(self):
        """An episode's exec budget: what is left of the run's deadline."""
        return self.deadline - time.monotonic()

    def offer(self, name, index, result):
        """The finished episode, to the stream (--stream): its record as episodes.json will hold
        it, less what only the end reads (its pod's node, image and restart count). One attempt
        per claim, so its verdict is final."""
        claim = self.latest[name]
        record = warm_episode_record(claim, index, self.results[name]["sandbox"], None, self.results[name],
                                     self.observed[name])
        created = parse_k8s_time(claim["metadata"]["creationTimestamp"])
        self.run.stream.offer(index if self.spec.episode else name, [(record, log_text(result.stdout))], created,
                              self.observed, WarmPoolBackend.scheme, final=True)

    def deleted_under(self, sandbox_name, pod_name, pod_uid=None):
        """Why an episode's exec ended, as (status reason, message): its pod was evicted ("Evicted",
        with the eviction's own message: by its node's kubelet, the pod staying Failed; through the
        Eviction API, the pod deleted, and agent-sandbox then makes a new pod, perhaps of the same
        name, so the pod's uid tells them apart), or its Sandbox or pod was deleted while it ran
        ("SandboxDeleted": this run deletes nothing before its batch ends, so someone else did).
        None when both are there, unchanged."""
        try:
            sandbox = self.cluster.api.get(SANDBOXES, sandbox_name, self.namespace)
            pod = self.cluster.api.get(PODS, pod_name, self.namespace)
        except DemoError:
            return None
        replaced = pod is not None and pod_uid is not None and pod["metadata"].get("uid") != pod_uid
        pod_gone = pod is None or replaced or bool(pod["metadata"].get("deletionTimestamp"))
        if not pod_gone and eviction_message(pod):
            # the kubelet evicted it under node pressure: it stays, Failed with reason Evicted
            return "Evicted", "pod %s of Sandbox %s was evicted by its node while the episode ran (%s)" % (
                pod_name, sandbox_name, eviction_message(pod))
        if pod_gone:
            last = pod if pod is not None and not replaced else self.last_pod_state(pod_uid)
            evicted = eviction_message(last) if last is not None else None
            if evicted:
                return "Evicted", ("pod %s of Sandbox %s was evicted while the episode ran (%s)%s" % (
                    pod_name, sandbox_name, evicted, "; agent-sandbox replaced it with a new pod" if replaced else ""))
        for kind, name, live, gone in (("Sandbox", sandbox_name, sandbox, sandbox is None or bool(
                (sandbox or {}).get("metadata", {}).get("deletionTimestamp"))), ("pod", pod_name, pod, pod_gone)):
            if gone:
                return "SandboxDeleted", ("its %s %s was deleted while the episode ran, by someone else (this run "
                                          "deletes nothing before its batch ends)" % (kind, name))
        return None

    def last_pod_state(self, uid, patience=SANDBOX_WATCH_PATIENCE_SECONDS):
        """The pod of `uid` as the watch last showed it, once that shows its deletion (the watch
        may be behind the exec's end for a moment); None when the watch never showed that pod."""
        give_up = time.monotonic() + patience
        while uid is not None:
            pod = self.pods.get(uid)
            if pod is not None and pod["metadata"].get("deletionTimestamp") or time.monotonic() > give_up:
                return pod
            time.sleep(0.05)
        return None

    def wait_for_sandbox(self, name, patience=SANDBOX_WATCH_PATIENCE_SECONDS):
        """The bound Sandbox as the Sandbox watch delivers it (it names the pod: the pod of an
        adopted warm pod may differ from the Sandbox, resolvePodName); None when it is late,
        and the Sandbox is then read with kubectl."""
        give_up = time.monotonic() + patience
        while name not in self.sandboxes and time.monotonic() < give_up:
            time.sleep(0.05)
        return self.sandboxes.get(name)

    def read_sandbox(self, name):
        """A Sandbox as the API has it now (None when it does not exist), through the command's
        channel (a late Sandbox watch at 200 claims meant a kubectl process per episode, 19 of a
        run's 36)."""
        return self.cluster.api.get(SANDBOXES, name, self.namespace)

    def fall_back(self, refused_channel, refused):
        """The exec stream was refused for every pod alike: one line, then `kubectl exec` per episode."""
        with self.channel_lock:
            if self.channel is refused_channel:
                self.console.warn("%s; falling back to one `kubectl exec` process per episode" % refused)
                self.channel = KubectlExecChannel(self.cluster, self.namespace, str(refused))
            return self.channel

    def close_channels(self):
        """End every exec stream at once (the command's channel closed: its proxy and watches);
        what is read after this goes through kubectl."""
        self.cluster.api.close()

    def save_state(self):
        """claims.json, sandboxes.json, pods.json (the API's, plus what only the watch saw),
        episodes.json (one record per finished episode), observed.json, job.json (the batch's
        creation), events.txt."""
        output, names = self.output, self.names
        write_json(output / "observed.json", self.observed)
        write_json(output / "run.json", self.run_info)
        # the four reads at once (the lists through the run's proxy, the events' table from
        # kubectl): the trainer waits for them after the batch's last reward
        reads = concurrent.futures.ThreadPoolExecutor(max_workers=4)
        events = reads.submit(save_events, self.cluster, self.namespace, output)
        lists = [reads.submit(self.list_namespaced, *what) for what in (
            (CLAIMS, self.selector), (SANDBOXES,), (PODS, self.pod_selector))]
        reads.shutdown(wait=True)
        try:
            claims, sandbox_list, pods = [listed.result() for listed in lists]
            listed = {claim["metadata"]["name"] for claim in claims}
            claims += [self.latest[name] for name in names if name in self.latest and name not in listed]
            claims.sort(key=lambda claim: self.position.get(claim["metadata"]["name"], 0))
        except DemoError as error:
            claims, sandbox_list, pods = [self.latest[n] for n in names if n in self.latest], \
                list(self.sandboxes.values()), []
            self.console.warn("could not read the claims, Sandboxes and pods (%s); saved what the watches saw" % error)
        self.absorb_pods()
        listed = {pod["metadata"].get("uid") for pod in pods}
        gone = [pod for uid, pod in self.pods.items() if uid not in listed]  # evicted, deleted: as last seen
        pods += gone
        if gone:
            self.run_info["pods_seen_only_by_watch"] = sorted(pod["metadata"]["name"] for pod in gone)
            write_json(output / "run.json", self.run_info)
        write_json(output / "claims.json", claims)
        write_json(output / "sandboxes.json", sorted(sandbox_list, key=by_creation))
        write_json(output / "pods.json", sorted(pods, key=by_creation))
        by_name = {sandbox["metadata"]["name"]: sandbox for sandbox in sandbox_list}
        pods_by_name = {pod["metadata"]["name"]: pod for pod in pods}
        records, launch = [], {}
        for claim in claims:
            name = claim["metadata"]["name"]
            bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
            sandbox = by_name.get(bound) or self.sandboxes.get(bound)
            if sandbox is not None:
                # The list's copy, else the watch's; a copy read before the controller labelled
                # its adoption has no launch type yet (None: the summary counts it "unknown").
                launch[name] = launch_type_of(by_name.get(bound)) or launch_type_of(self.sandboxes.get(bound))
            if name in self.results:
                result = self.results[name]
                records.append(warm_episode_record(claim, self.position[name], sandbox or result["sandbox"],
                                                   pods_by_name.get(result["pod_name"]), result, self.observed[name]))
        pool_record = read_saved(output / "warm-pool.json") or {}
        pool_record["launch_types"] = launch
        if self.channel is not None:
            pool_record["exec_channel"] = self.channel.record()
        write_json(output / "warm-pool.json", pool_record)
        write_json(output / "episodes.json", records)
        save_node_summaries(self.run.facts["nodes"], records, output)  # each episode's node: its kernel
        created = min((claim["metadata"]["creationTimestamp"] for claim in claims), default=utc_now())
        status = {"episodes": len(names), "finished_episodes": len(records)}
        timed_out = [record for record in records if record["status"].get("reason") == "ExecTimedOut"]
        if self.deadline_at is not None and time.time() >= self.deadline_at and (
                timed_out or len(records) < len(names)):
            # as a Job past its activeDeadlineSeconds says it: what collect_samples names the deadline's
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                     "lastTransitionTime": iso_micro(self.deadline_at),
                                     "message": "the batch's --timeout of %d s passed: %d exec(s) cut short, %d "
                                                "episode(s) never started" % (self.spec.timeout, len(timed_out),
                                                                              len(names) - len(records))}]
        write_json(output / "job.json", batch_record(WarmPoolBackend, "WarmPoolBatch", POOL_NAME, created, status,
                                                     spec={"activeDeadlineSeconds": self.spec.timeout}))
        try:
            events.result()
        except DemoError as error:
            self.console.warn("could not save the events: %s" % error)

    def claim_state(self, claim):
        """Where an unfinished claim stands, for a failure line: its Ready condition when it has
        one, else whether it is bound, and what its Sandbox says."""
        ready = claim_ready(claim)
        if ready.get("reason"):
            return "%s: %s" % (ready["reason"], ready.get("message"))
        bound = (claim.get("status") or {}).get("sandbox", {}).get("name")
        if not bound:
            return "not bound to a Sandbox (the claim has no status yet: is the agent-sandbox controller keeping up?)"
        sandbox_ready = next((c for c in ((self.sandboxes.get(bound) or {}).get("status") or {}).get("conditions")
                              or [] if c.get("type") == "Ready"), {})
        return "bound to Sandbox %s, not Ready%s" % (bound, " (%s)" % sandbox_ready["message"]
                                                     if sandbox_ready.get("message") else "")

    def unfinished_error(self, where):
        """A BatchTimeout naming the claims without a finished episode, or None."""
        unfinished = [name for name in self.names if name not in self.results]
        if not unfinished:
            return None
        conditions = collections.Counter(self.claim_state(self.latest[name]) for name in unfinished
                                         if name in self.latest)
        held = why_not_started(read_saved(self.output / "pods.json") or [])  # as save_state() kept them
        return BatchTimeout("%d of %d claims had no finished episode within %d s%s%s; %s" % (
            len(unfinished), len(self.names), self.spec.timeout,
            " (%s)" % "; ".join(list(conditions)[:3]) if conditions else " (never seen by the watch)",
            "; pods not running: %s" % "; ".join(held[:3]) if held else "", where))


class WarmPoolBackend(ClusterBackend):
    """`--backend warm-pool`: a SandboxTemplate built from the Job pod's spec, a SandboxWarmPool
    filled before the batch (not measured), then one SandboxClaim per episode, all at once, and
    each episode exec'd into its sandbox as soon as its claim is Ready."""

    name = "warm-pool"
    help = ("kubernetes-sigs/agent-sandbox, a claim per episode from a pool of pre-started sandboxes, the episode "
            "exec'd into it")
    scheme = WARM_SCHEME
    episodes_file = "episodes.json"  # exec'd episodes, one pod-shaped record per claim (pods.json keeps the pods)
    uses_cluster = True
    leaves_remote_state = True
    api_timestamps = True
    coarse_batch_keys = JobBackend.coarse_batch_keys + ("batch_to_all_claims_ready_seconds",)
    takes_queue = False  # Kueue admits Jobs
    takes_parallelism = False  # every claim is fired at once
    runs_several_images = False  # one SandboxTemplate: a pool per image is not built yet
    own_flags = (("--pool-size", "pool_size"), ("--exec-concurrency", "exec_concurrency"), ("--pool", "pool"))
    api_paths = ("^%s$" % re.escape(DEPLOYMENTS.path(CONTROLLER_NAMESPACE, CONTROLLER_DEPLOYMENT)),)  # its preflight
    batch_origin = "first claim was created"
    startup_label = "Claim created -> ready"
    timeline_origin = "first claim"
    phase_words = {}
    REPORT_ROWS = {
        "setup": [("launch types warm / cold", "counts", ("launch_types", ("warm", "cold"))),
                  ("warm pool fill (setup, not measured in the batch)", "batch", "pool.fill_seconds")],
        "ready": [("batch all claims Ready", "batch", "batch_to_all_claims_ready_seconds"),
                  ("time to all claims Ready (agent-sandbox stress test definition)", "batch",
                   "agent_sandbox_stress_test.time_to_all_ready_seconds")],
        "after": [("refill pods created during the batch", "number", "refill_pods.created_during_batch")],
    }

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--pool-size", type=int, metavar="N",
                            help="warm-pool: sandboxes started before the batch (default COUNT; 0: every claim starts "
                                 "cold through the claim API)")
        parser.add_argument("--exec-concurrency", type=int, metavar="N",
                            help="warm-pool: episodes exec'd at once (default min(COUNT, %d) over the run's one "
                                 "WebSocket channel, at most %d `kubectl exec` processes if it falls back); episodes "
                                 "beyond it wait on this machine, which shows as claim Ready -> exec started"
                                 % (DEFAULT_EXEC_CONCURRENCY, FALLBACK_EXEC_PROCESSES))
        parser.add_argument("--pool", metavar="POOLDIR",
                            help="warm-pool: a step against the kept pool `pool up --output POOLDIR` made: claim from "
                                 "it (no pool made or deleted), delete only this step's claims at its end")

    @classmethod
    def check_options(cls, args, fail):
        if args.pool is not None and pool_recycles(Path(args.pool)):
            return RecycledPoolBackend.check_options(args, fail)  # a recycled pool's steps are that backend's
        # One batch of claims fired at once: the Job backend's waves, rounds, prewarm and
        # retries have no counterpart here.
        for flag, used in (("--parallelism", args.parallelism not in (None, args.count)),
                           ("--rounds", args.rounds != 1), ("--retries", args.retries)):
            if used:
                fail("%s is for the Job backend; --backend warm-pool claims every episode's sandbox at once (leave "
                     "%s out)" % (flag, flag))
        pool_size = args.count if args.pool_size is None else args.pool_size
        if pool_size < 0:
            fail("--pool-size must be 0 or more, got %d" % pool_size)
        exec_concurrency = min(args.count, DEFAULT_EXEC_CONCURRENCY) if args.exec_concurrency is None \
            else args.exec_concurrency
        if exec_concurrency < 1:
            fail("--exec-concurrency must be at least 1")
        derived = {"pool_size": pool_size, "exec_concurrency": exec_concurrency}
        if args.pool is not None:
            derived.update(kept_pool_options(args, fail))
        return derived

    def manifests(self, namespace, run_id):
        spec = self.spec
        objects = common_manifests(spec, namespace, run_id)
        return objects + [sandbox_template_manifest(namespace, run_id, spec.image, spec.runtime_class,
                                                    spec.tasks_list is not None),
                          warm_pool_manifest(namespace, run_id, spec.pool_size)]

    def dry_run_objects(self, namespace, run_id):
        # claims go in once the pool is full; their shutdownTime is set then
        return self.manifests(namespace, run_id) + claim_manifests(
            namespace, run_id, self.spec.count, "<at submission: now + %d s>"
            % (self.spec.timeout + CLIENT_GRACE_SECONDS + CLAIM_SAFETY_NET_SECONDS))

    def new_receipt(self, context, namespace, run_id):
        # cleanup then proves and deletes claims, pool and template; a step's, only its claims,
        # in the kept pool's namespace
        receipt = super().new_receipt(context, namespace, run_id)
        if self.spec.command == POOL_UP_COMMAND:
            receipt["command"] = POOL_UP_COMMAND  # the folder is a kept pool's, even before pool.json exists
        if self.spec.pool:
            record = read_pool_record(Path(self.spec.pool))
            receipt.update(namespace=record["namespace"], kept_pool={
                "folder": str(Path(self.spec.pool).resolve()), "run_id": record["run_id"],
                "namespace_uid": record["namespace_uid"], "pool_uid": record["pool_uid"]})
        return receipt

    def check_server(self, cluster, facts):
        if self.spec.pool:  # a step: its kept pool's existence proves agent-sandbox (KeptPoolStep.check)
            facts["agent_sandbox"] = {"checked": "by the kept pool's existence"}
            return
        facts["agent_sandbox"] = check_agent_sandbox(
            cluster, "`pool up`" if self.spec.command == POOL_UP_COMMAND else "--backend warm-pool")

    def pods_at_once(self):
        # A warm pool holds its pods idle, and refills as it is claimed: about pool + count pods
        # (a step of a kept pool: its claims' pods and their refill).
        return self.spec.count + (self.spec.count if self.spec.pool else self.spec.pool_size)

    def never_fits(self, fit, runtime_class, nodes):
        # The pool is waited for until every replica is Ready: one that does not fit never fills.
        if fit >= self.spec.pool_size or self.spec.pool:
            return None
        _, arithmetic = preflight(self.spec.pool_size, runtime_class, nodes)
        return ("the warm pool of %d sandboxes can never fill: %s; lower --pool-size, add capacity, or use a "
                "smaller RuntimeClass overhead" % (self.spec.pool_size, arithmetic))

    def capacity_warning(self, fit, at_once, arithmetic):
        return ("preflight: only %d of %d pods of the pool and its refill fit at once, so the pool cannot refill "
                "while the batch runs, and claims beyond it start cold or wait: %s" % (fit, at_once, arithmetic))

    def run(self, run):
        """Template and pool, the pool filled (not measured), then every claim at once and each
        episode exec'd as soon as its claim is Ready. `pool up` stops once the pool is full
        (bring_up_pool); a step of a kept pool (--pool) claims from it instead (KeptPoolStep)."""
        if self.spec.command == POOL_UP_COMMAND:
            return bring_up_pool(self, run)
        spec, cluster, output, namespace = self.spec, run.cluster, run.output, run.namespace
        run_info = run.new_run_info(self)
        run_info.update(pool_size=spec.pool_size, exec_concurrency=spec.exec_concurrency,
                        agent_sandbox=run.facts.get("agent_sandbox"))
        if run.facts["preflight"] is not None:
            run_info["preflight"] = run.facts["preflight"]
        kept = KeptPoolStep(run) if spec.pool else None
        if kept is not None:
            run_info["kept_pool"] = kept.info()
        run.write_facts(run_info)
        if kept is None:
            namespace_obj, *supporting, template, pool = self.manifests(namespace, run.run_id)
            run.create_namespace(namespace_obj, supporting)
            run.receipt["template_uid"] = run.create_recorded(template)["metadata"]["uid"]
            run.save_receipt()
        else:
            self.console.note("step %s of the kept pool in %s (namespace %s)" % (run.run_id, kept.folder, namespace))
            kept.check(cluster)
        batch = WarmPoolRun(run, run_info, kept and kept.record["run_id"])
        watches = []
        try:
            # The channel first: the watches run, the pool's fill is polled, the pods read, the
            # claims created and (a step's) deleted through its proxy, as the episodes are exec'd
            # (no kubectl each)
            batch.channel = open_exec_channel(cluster, namespace, self.console)
            # Timed: a claim's bound and Ready times are when the watch delivered them, not when
            # this loop got round to them.
            claim_watch = batch.watch(CLAIMS, batch.selector, timed=True)
            sandbox_watch = batch.watch(SANDBOXES)
            # Every state of the run's pods, also of those deleted (an evicted sandbox pod is
            # replaced by one of the same name: only the watch keeps what happened to the first).
            pod_watch = batch.watch(PODS, batch.pod_selector)
            watches += [claim_watch, sandbox_watch, pod_watch]
            if kept is not None:
                kept.watch(batch)
            batch.pod_watch = pod_watch
            pool_record = self.fill_pool(run, pool, lambda: batch.absorb_watched(sandbox_watch)) \
                if kept is None else kept.pool_record(spec.count)
            # the pool's pods now: its members, and (a kept pool's) pods of earlier or concurrent
            # steps, which are neither refill nor this step's
            pods = batch.list_namespaced(PODS, batch.pod_selector)
            members = [pod for pod in pods if POOL_MEMBER_LABEL in (pod["metadata"].get("labels") or {})]
            pool_record["pool_pods_at_fire"] = sorted(pod["metadata"]["name"] for pod in members)
            if kept is not None:
                pool_record["other_pods_at_fire"] = sorted(set(pod["metadata"]["name"] for pod in pods) - set(
                    pool_record["pool_pods_at_fire"]))
            write_json(output / "warm-pool.json", pool_record)
            self.console.note("warm pool: %d of %d ready%s; firing %d claims" % (
                pool_record["ready_at_fire"], pool_record["size"], " after %.1f s" % pool_record["fill_seconds"]
                if pool_record["fill_seconds"] is not None else "", spec.count))
            shutdown = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
                seconds=spec.timeout + CLIENT_GRACE_SECONDS + CLAIM_SAFETY_NET_SECONDS)).strftime("%Y-%m-%dT%H:%M:%SZ")
            claims = claim_manifests(namespace, run.run_id, spec.count, shutdown,
                                     CLAIM_PREFIX if kept is None else "%s%s-" % (CLAIM_PREFIX, run.run_id[:8]))
            write_json(output / "claims-submitted.json", claims)
            batch.fire(claims, claim_watch, sandbox_watch, pod_watch)
        except DemoError as error:
            for watch in watches:
                watch.stop()
            batch.close_channels()
            if not batch.names:
                raise  # no claim was fired: what the pool held is saved already
            batch.save_state()
            raise with_context(error, WARM_DIAGNOSTICS % output) from None
        else:
            batch.save_state()
        finally:
            for watch in watches:
                watch.stop()
            try:
                if kept is not None:
                    kept.finish(batch)  # the step's claims go, every way out; the pool stays
            finally:
                batch.close_channels()  # the proxy and its socket go on every way out
        where = WARM_DIAGNOSTICS % output
        # custom episodes: one whose claim was not served before the deadline is named so in results.json
        unfinished = batch.unfinished_error(where) if not spec.episode else None
        if unfinished:
            raise unfinished
        report = write_results(output, where)
        run.stream.finish(report)
        return conclude(report, run)

    def fill_pool(self, run, pool, on_wait=None):
        """The run's own pool, created and waited for until full (`on_wait` called at every turn):
        warm-pool.json's first fields."""
        spec, cluster, output, namespace = self.spec, run.cluster, run.output, run.namespace
        run.receipt["pool_uid"] = run.create_recorded(pool)["metadata"]["uid"]
        run.save_receipt()
        fill_started = time.monotonic()
        try:
            live_pool = wait_for_pool(cluster, namespace, pool["spec"]["replicas"], spec.timeout,
                                      (run.facts.get("agent_sandbox") or {}).get("controller_unread"), on_wait)
        except DemoError as error:
            raise with_context(error, save_pool_state(cluster, namespace, output)) from None
        return {"name": POOL_NAME, "template": TEMPLATE_NAME, "size": spec.pool_size,
                "fill_seconds": time.monotonic() - fill_started,
                "fill_definition": "client monotonic clock: pool created -> readyReplicas = replicas seen; setup, "
                                   "not part of any batch figure",
                "ready_at_fire": (live_pool.get("status") or {}).get("readyReplicas", 0)}

    @classmethod
    def describe_results(cls, output, report, observed):
        report.update(warm_pool_summary(output, report, observed))

    @classmethod
    def cost(cls, output, report, prices, records):
        """Every pod of the run (claimed, pool and refill sandboxes) to the run's end (the last
        exec's return: a sandbox kept after it is cleanup's business). A claimed sandbox is idle
        from its start to its claim's creation, the episode's after; a sandbox no claim of the
        batch took (the pool's rest, the refill) is idle throughout. A step of a kept pool counts
        from its first claim's creation. Plus the pool's steady idle rate: what keeping the pool
        costs per hour between batches."""
        pool = read_saved(output / "warm-pool.json") or {}
        others = set(pool.get("other_pods_at_fire") or [])  # a kept pool's earlier or concurrent steps'
        pods = [pod for pod in read_saved(output / "pods.json") or [] if pod["metadata"]["name"] not in others]
        episodes = records  # episodes.json as read
        claimed_at = {}
        for episode in episodes:
            annotations = episode["metadata"].get("annotations") or {}
            created = parse_rfc3339_nano(annotations.get(CLIENT_REQUESTED_ANNOTATION)) or \
                parse_k8s_time(episode["metadata"]["creationTimestamp"])
            if episode["spec"].get("pod"):
                claimed_at[episode["spec"]["pod"]] = created
        ends = [parse_rfc3339_nano(((episode["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get(
            "terminated", {}).get("finishedAt")) for episode in episodes]
        run_end = max((end for end in ends if end), default=None)

        # A step of a kept pool counts from its first claim: the pool held its sandboxes before,
        # and that is the pool's cost between steps (`pool status`), not this step's.
        window_start = min(claimed_at.values(), default=None) if pool.get("kept_pool") else None

        def split(pod, start, end):
            if window_start is not None:
                start = min(max(start, window_start), end)
            claim = claimed_at.get(pod["metadata"]["name"])
            if claim is None:
                return [("idle", start, end)]
            middle = min(max(claim, start), end)  # claimed before it was Ready: no idle time
            return [("idle", start, middle), ("episodes", middle, end)]

        size = pool.get("size") or 0
        request = effective_request(pods[0].get("spec") or {})[0] if pods else {"cpu": 0.0, "memory": 0.0}
        rate = {"cpu_core_hours": round(size * request["cpu"], 6), "gib_hours": round(size * request["memory"] / GIB, 6),
                "definition": "pool size x a sandbox pod's effective request: what keeping the pool full costs "
                              "each hour, whether or not a batch runs"}
        return cost_summary(reserved_capacity(pods, run_end, split), report["successful_episodes"], prices,
                            {"pool_idle_rate_per_hour": rate}, used_cpu=used_cpu_seconds(report["pods"]))

    @classmethod
    def summary_view(cls, report):
        step = report.get("kept_pool_step")
        return {**({"kept_pool_step": {key: step[key] for key in ("ready_at_start", "warm", "cold", "refill_seconds",
                                                                   "ready_at_end", "size")}} if step else {}),
                "launch_types": report["launch_types"],
                "batch_to_all_claims_ready_seconds": report["batch_to_all_claims_ready_seconds"],
                "pool_fill_seconds": report["pool"]["fill_seconds"],
                "refill_pods_created_during_batch": report["refill_pods"]["created_during_batch"],
                "agent_sandbox_time_to_all_ready_seconds":
                    report["agent_sandbox_stress_test"]["time_to_all_ready_seconds"]}

    @classmethod
    def summary_lines(cls, report):
        lines = ["Launch types: %s; %d refill pods started during the batch." % (", ".join(
            "%s %d" % item for item in report["launch_types"].items()), report["refill_pods"]["created_during_batch"])]
        step = report.get("kept_pool_step")
        if step:
            lines.append("Kept pool: %s of %s Ready at the step's start; %s" % (
                step["ready_at_start"], step["size"], "back to full %.2f s after the first claim" % step["refill_seconds"]
                if step["refill_seconds"] is not None else "%s (%s of %s Ready at its end)" % (
                    step["refill_state"], step["ready_at_end"], step["size"])))
        return lines

    @classmethod
    def timeline_where(cls, results):
        return super().timeline_where(results) + ", warm pool of %s, launch types %s" % (
            results["pool"]["size"], ", ".join("%s %d" % item for item in results["launch_types"].items()) or "none")

    @classmethod
    def cleanup(cls, receipt, source, output, console, delete_foreign=False):
        # a step of a kept pool owns only its claims in the pool's namespace
        if receipt.get("kept_pool"):
            return cleanup_step(receipt, source, console)
        return super().cleanup(receipt, source, output, console, delete_foreign)

    @classmethod
    def delete_objects(cls, cluster, namespace, run_id, receipt, output, listing):
        """Its claims (each must carry the run's label) and its pool and template (their UIDs must
        equal the receipt's) are proven, then deleted at once; the namespace's deletion takes their
        Sandboxes and pods. Then any Job, as for every run."""
        delete_warm_pool_objects(cluster, namespace, run_id, receipt, output, listing)
        delete_recorded_jobs(cluster, namespace, receipt, output, listing)

    @classmethod
    def busy(cls, receipt, listing):
        """A kept pool with a step's claims in it: a step is running (or died without its end)."""
        if receipt.get("command") != POOL_UP_COMMAND:
            return None
        steps = {}
        for obj in listing.items:
            step = (obj["metadata"].get("labels") or {}).get(RUN_LABEL)
            if obj.get("kind") == "SandboxClaim" and step not in (None, receipt["run_id"]):
                steps.setdefault(step, []).append(obj["metadata"]["name"])
        if not steps:
            return None
        return ("a step of this kept pool is running: %s; let it end (its claims go with it), or, for a step that "
                "died, `%s cleanup STEPDIR`; then `pool down` again (--delete-foreign deletes them now)" % (
                    "; ".join("step %s holds %d claim(s) (%s)" % (step, len(names), ", ".join(sorted(names)[:3]))
                              for step, names in sorted(steps.items())), invocation()))

    @classmethod
    def list_objects(cls, cluster, namespace):
        objects = {"jobs": cluster.api.list(JOBS, namespace)}  # a Job of the run's, if any
        try:
            objects["claims"] = cluster.api.list(CLAIMS, namespace)
        except KubectlError as error:
            if not error.no_such_kind:
                raise
            objects["claims"] = []  # agent-sandbox uninstalled since: nothing of it is left
        return objects

    @classmethod
    def list_fields(cls, objects, folder):
        """The claims on the cluster; the episodes' outcomes, which only the run's results.json
        holds (an exec leaves nothing on the cluster): null without it."""
        return {**job_list_fields(objects["jobs"]), "claims": len(objects["claims"]), **results_counts(folder)}

    @classmethod
    def episodes_cell(cls, row):
        if row.get("succeeded") is None:
            return "%d claims, no results.json found" % row["claims"]
        return "%d claims; %s/%s done, %s failed" % (row["claims"], row["succeeded"], row["completions"], row["failed"])

    @classmethod
    def list_state(cls, objects):
        claims = objects["claims"]
        ready = sum(1 for claim in claims if claim_ready(claim).get("status") == "True")
        return "warm pool: %d of %d claims Ready" % (ready, len(claims)) if claims else "warm pool: no claims"


def warm_pool_parts(cluster, namespace, listing):
    """(claims, {resource: the live pool or template, or None}) as cleanup found them: from its
    listing of the namespace, or read here where the listing is incomplete. (None, None) when
    agent-sandbox is no longer installed."""
    found = {resource: listing.of_kind(resource.kind) for resource in (CLAIMS, WARM_POOLS, TEMPLATES)}
    try:
        for resource, items in found.items():
            if items is None:
                found[resource] = cluster.api.list(resource, namespace)
    except KubectlError as error:
        if not error.no_such_kind:
            raise
        return None, None
    named = {resource: next((item for item in found[resource] if item["metadata"]["name"] == name), None)
             for resource, name in ((WARM_POOLS, POOL_NAME), (TEMPLATES, TEMPLATE_NAME))}
    return found[CLAIMS], named


def delete_warm_pool_objects(cluster, namespace, run_id, receipt, output, listing):
    """A warm-pool run: its claims (each must carry the run's label), its pool and template (their
    UIDs must equal the receipt's); then all deleted at once (ApiChannel.delete_all), so that
    their Sandboxes' pods start their grace period while the namespace controller waits to begin
    (5 s on a default installation, ASSUMPTIONS.md "Namespace deletion"). Waiting for them is the
    namespace's wait: no Sandbox or pod outlives the namespace."""
    console = cluster.console
    claims, live = warm_pool_parts(cluster, namespace, listing)
    if claims is None:
        console.note("agent-sandbox is no longer installed: the namespace's deletion removes what is left")
        return
    problems = []
    for claim in claims:
        problems += ownership_mismatches("sandboxclaim " + claim["metadata"]["name"], claim,
                                         {"label " + RUN_LABEL: run_id})
    for resource, key in ((WARM_POOLS, "pool_uid"), (TEMPLATES, "template_uid")):
        if live[resource] is not None:
            name = live[resource]["metadata"]["name"]
            if not receipt.get(key):
                adopt_unconfirmed(
                    cluster, receipt, output, live[resource]["kind"], live[resource], (key,),
                    "check it and delete it yourself with `kubectl --context %s -n %s delete %s %s`"
                    % (cluster.context, namespace, resource.plural, name))
            problems += ownership_mismatches("%s %s" % (resource.plural, name), live[resource],
                                             {"uid": receipt[key]})
    if problems:
        raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))
    # The claims by the run's label, which every claim of the namespace was just shown to carry;
    # the pool and template by name, on condition that their UIDs are still the ones proven.
    deletions = claims_by_name(namespace, [(claim["metadata"]["name"], claim["metadata"]["uid"]) for claim in claims
                                           if claim["metadata"].get("uid")]) + [claims_of_run(namespace, run_id)] \
        if claims else []
    deletions += [Deletion(resource, namespace, obj["metadata"]["name"], uid=obj["metadata"]["uid"])
                  for resource, obj in live.items() if obj is not None]
    if not deletions:
        return
    console.note("Deleting %d SandboxClaims, the warm pool and its template..." % len(claims))
    cluster.api.delete_all(deletions)


def claims_of_run(namespace, run_id):
    """The Deletion of every claim a run (or a kept pool's step) made, by its run-id label."""
    return Deletion(CLAIMS, namespace, selector="%s=%s" % (RUN_LABEL, run_id))


def claims_by_name(namespace, seen):
    """The Deletions of the claims `seen` [(name, uid)], each by name on its uid, sent beside the
    DELETE of their collection by the run's label: the API server deletes a collection one object
    at a time (kube-apiserver's --delete-collection-workers is 1: 64 claims took 0.7-1.9 s, 1,000
    took 15 s), and the collection's own deletes of those already gone are 404s, quickly done.
    No kubectl fallback each: the collection's covers them."""
    return [Deletion(CLAIMS, namespace, name, uid=uid, fallback=False) for name, uid in seen]


# ============================================================================
# Kept pool: `pool up`, `pool status`, `pool down` and the steps of `run --pool`
# ============================================================================
# `pool up` makes a namespace, template and pool as a warm-pool run does, waits for it to fill,
# and stops there, leaving pool.json (what steps read) beside its receipt.json (what `pool down`,
# which is `cleanup`, proves). A step (`run --backend warm-pool --pool POOLDIR`) makes and deletes
# only its own claims in that namespace, named and labelled with its own run id, and watches the
# pool's status for its refill. The pool's status carries no time: the refill is timed by when
# the tool's watch delivered it.

POOL_UP_COMMAND = "pool up"  # RunSpec.command of `pool up` (a warm-pool run that fires no claim)
POOL_RECORD_FILE = "pool.json"  # in POOLDIR: what a step needs of the pool, written once it is full
POOL_STEPS_FILE = "steps.jsonl"  # in POOLDIR: one line per step served, appended as each step ends
STEP_TASK_FILE = "/workspace/task.json"  # a step's task, written into its sandbox by the exec'd command
MAX_STEP_TASK_BYTES = 100000  # one command-line argument: Linux takes up to 128 KiB (MAX_ARG_STRLEN)
POOL_RECORD_KEYS = ("context", "namespace", "run_id", "namespace_uid", "pool_uid", "template_uid", "size",
                    "image", "runtime", "network")
REFILL_DEFINITION = ("client clock (time.time()), watch-arrival precision: the step's first claim create call -> "
                     "the first SandboxWarmPool state the tool's watch delivered with status.readyReplicas >= "
                     "spec.replicas after one below it (the pool's status has no time of its own); includes the "
                     "watch's delivery delay. null: not back to full by the step's end (its claims deleted)")


def read_pool_record(folder):
    """pool.json of a kept pool's folder; one line saying what the folder is otherwise."""
    check_pool_folder(folder)
    if not (folder / POOL_RECORD_FILE).exists():
        raise DemoError("%s holds no %s: `pool up` did not finish there (the pool never filled, or it was "
                        "interrupted); `%s pool down %s` deletes what it made" % (
                            folder, POOL_RECORD_FILE, invocation(), folder))
    return read_json(folder / POOL_RECORD_FILE, "a kept pool's record", keys=POOL_RECORD_KEYS)


def pool_recycles(folder):
    """Whether the kept pool in `folder` recycles its sandboxes (`pool up --recycle`); False where
    it has no readable pool.json (kept_pool_options then says what the folder is)."""
    try:
        record = read_saved(folder / POOL_RECORD_FILE)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and bool(record.get("recycle"))


def check_pool_folder(folder):
    """A folder `pool up` made (its pool.json, or its receipt of `pool up` when the pool never
    filled); anything else is refused in one line saying what it is (a run's folder is
    `cleanup`'s, never `pool down`'s)."""
    if not folder.is_dir():
        raise NoSuchFolder("no such folder: %s (give the folder of `pool up --output DIR`)" % folder)
    if (folder / POOL_RECORD_FILE).exists():
        return
    try:
        receipt = read_saved(folder / "receipt.json")
    except (OSError, ValueError):
        receipt = None
    if isinstance(receipt, dict) and receipt.get("command") == POOL_UP_COMMAND:
        return
    if isinstance(receipt, dict):
        raise DemoError("%s is not a kept pool's folder: it holds the receipt of a `run`%s; `%s cleanup %s` deletes "
                        "what that run made" % (folder, " (a step of the kept pool in %s)" % receipt["kept_pool"].get(
                            "folder") if isinstance(receipt.get("kept_pool"), dict) else "", invocation(), folder))
    raise DemoError("%s is not a kept pool's folder (no %s); bring one up with `%s pool up --size N --output "
                    "DIR`" % (folder, POOL_RECORD_FILE, invocation()))


def kept_pool_options(args, fail):
    """`run --pool DIR`: the RunSpec fields the pool fixed at `pool up` (image, RuntimeClass,
    network, context, episode program), each refused when the step asks for another."""
    folder = Path(args.pool)
    try:
        record = read_pool_record(folder)
    except DemoError as error:
        fail("--pool %s: %s" % (args.pool, error))
    for flag, given in (("--pool-size", args.pool_size is not None), ("--image", args.image),
                        ("--runtime", args.runtime), ("--no-runtime-class", args.no_runtime_class),
                        ("--network", args.network != "default" and args.network != record["network"])):
        if given:
            fail("%s is the kept pool's, fixed by `pool up` (image %s, %s, network %s, %d sandboxes): "
                 "leave it out with --pool" % (flag, record["image"], "RuntimeClass " + record["runtime"]
                                               if record["runtime"] else "no RuntimeClass", record["network"],
                                               record["size"]))
    if args.context and args.context != record["context"]:
        fail("--context %s: the kept pool in %s is on context %s" % (args.context, folder, record["context"]))
    episode, program = args.episode, args.program
    if record.get("episode"):
        kept = folder / record["episode"]
        if args.episode and hashlib.sha256(args.program.encode()).hexdigest() != record.get("episode_sha256"):
            fail("--episode %s differs from the program the kept pool's sandboxes hold (%s): bring up a pool with "
                 "this --episode, or leave --episode out" % (args.episode, kept))
        if not args.episode:
            try:
                episode, program = str(kept), kept.read_text()
            except OSError as error:
                fail("--pool %s: cannot read its episode program %s: %s" % (args.pool, kept, error.strerror))
    elif args.episode or args.tasks:
        fail("the kept pool in %s runs the built-in episode, which takes no --tasks: bring up a pool with `pool up "
             "--episode %s`" % (folder, args.episode or "FILE.py"))
    for index, task in enumerate(args.tasks_list or ()):
        image = own_image(task)
        if image is not None and normalized_image(image) != normalized_image(record["image"]):
            fail("task %d names the image %s, and the kept pool in %s holds sandboxes of %s: bring up a pool of that "
                 "image, or leave the task's \"%s\" out" % (index, image, folder, record["image"], TASK_IMAGE_KEY))
        if len(json.dumps(task)) > MAX_STEP_TASK_BYTES:
            fail("task %d is over %d bytes of JSON: a kept pool's task travels on the exec command line; shrink it "
                 "(or run the batch without --pool)" % (index, MAX_STEP_TASK_BYTES))
    return {"pool": args.pool, "pool_size": record["size"], "image": record["image"],
            "runtime": record["runtime"] or DEFAULT_RUNTIME, "no_runtime_class": record["runtime"] is None,
            "network": record["network"], "context": record["context"], "episode": episode, "program": program}


def bring_up_pool(backend, run):
    """`pool up`: namespace, episode program, template and pool as a warm-pool run makes them,
    the pool waited for until full (with progress), then pool.json; nothing is claimed."""
    spec, cluster, output, namespace, console = backend.spec, run.cluster, run.output, run.namespace, run.console
    run_info = run.new_run_info(backend)
    run_info.update(pool_size=spec.pool_size, agent_sandbox=run.facts.get("agent_sandbox"),
                    preflight=run.facts["preflight"])
    run.write_facts(run_info)
    namespace_obj, *supporting, template, pool = backend.manifests(namespace, run.run_id)
    run.create_namespace(namespace_obj, supporting)
    template = run.create_recorded(template)
    run.receipt["template_uid"] = template["metadata"]["uid"]
    run.save_receipt()
    recycle = bool(spec.options.get("recycle"))
    if recycle:
        filled = bring_up_recycled_pool(backend, run, template)
    else:
        console.note("warm pool: waiting for %d sandboxes to be Ready..." % spec.pool_size)
        filled = backend.fill_pool(run, pool)
    record = {"kind": "KeptWarmPool", "tool_version": __version__, "context": cluster.context, "namespace": namespace,
              "run_id": run.run_id, "namespace_uid": run.receipt["uid"], "pool_uid": run.receipt["pool_uid"],
              "template_uid": run.receipt["template_uid"],
              "template_generation": template["metadata"].get("generation"), "size": spec.pool_size,
              "image": spec.image, "runtime": spec.runtime_class, "network": spec.network,
              "episode": "episode.py" if spec.episode else None,
              "episode_sha256": hashlib.sha256(spec.program.encode()).hexdigest(), "created_at": utc_now(),
              "fill_seconds": filled["fill_seconds"], "fill_definition": filled["fill_definition"],
              "ready_at_up": filled["ready_at_fire"]}
    if recycle:  # its steps exec into the claims it holds (sandboxes.json); its warm pool holds none
        record.update(recycle=True, warm_pool_replicas=0,
                      ttl_seconds=spec.options.get("ttl") or DEFAULT_POOL_TTL_SECONDS)
    if spec.episode:
        (output / "episode.py").write_text(spec.program)
    write_json(output / POOL_RECORD_FILE, record)
    console.say(json.dumps({"pool": str(output), "namespace": namespace, "size": spec.pool_size,
                            "ready": record["ready_at_up"], "fill_seconds": round(record["fill_seconds"], 3)}))
    console.note("%s of %d Ready after %.1f s. Steps: %s run --backend warm-pool --pool %s --output STEP-DIR; "
                 "bring it down with: %s pool down %s" % ("recycled pool" if recycle else "warm pool", spec.pool_size,
                                                         record["fill_seconds"], invocation(),
                                                         shlex.quote(str(output)), invocation(),
                                                         shlex.quote(str(output))))
    return EXIT_OK


class KeptPoolStep:
    """A step of a kept pool (`run --pool POOLDIR`): the pool `pool up` made is checked, never
    made or deleted; the step's claims (its own names and run-id label) are deleted at its end,
    every way out; the pool's status is watched for the refill."""

    def __init__(self, run):
        self.run, self.console = run, run.console
        self.folder = Path(run.spec.pool)
        self.record = read_pool_record(self.folder)
        self.size = self.record["size"]  # spec.replicas as the step found it
        self.changes = []  # what changed since `pool up`, one sentence each
        self.pool_watch, self.pool, self.early_states = None, None, []
        self.started_at = utc_now()

    def info(self):
        return {"folder": str(self.folder), "namespace": self.record["namespace"], "run_id": self.record["run_id"],
                "size_at_up": self.record["size"]}

    def check(self, cluster):
        """The pool and its template are the ones `pool up` made; one line for each change since
        (a warning), a DemoError where no claim could ever be served."""
        namespace, folder = self.record["namespace"], self.folder
        again = "bring it down with `%s pool down %s` and up again" % (invocation(), folder)
        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as reads:  # the three reads at once
            live_namespace, *parts = reads.map(lambda read: cluster.api.get(*read), (
                (NAMESPACES, namespace), (WARM_POOLS, POOL_NAME, namespace), (TEMPLATES, TEMPLATE_NAME, namespace)))
        if live_namespace is None or live_namespace["metadata"].get("uid") != self.record["namespace_uid"] or \
                live_namespace["metadata"].get("deletionTimestamp"):
            raise DemoError("the kept pool in %s is gone: its namespace %s %s; bring up a new one with `%s pool up`"
                            % (folder, namespace, "no longer exists" if live_namespace is None else
                               "is being deleted" if live_namespace["metadata"].get("deletionTimestamp")
                               else "is another one now (its uid differs from pool.json's)", invocation()))
        for (kind, name, key), live in zip((("SandboxWarmPool", POOL_NAME, "pool_uid"),
                                            ("SandboxTemplate", TEMPLATE_NAME, "template_uid")), parts):
            if live is None:
                raise DemoError("the kept pool in %s cannot serve: its %s %s was deleted by someone else, and claims "
                                "would wait for it (%sNotFound: agent-sandbox requeues them, never starts them cold), "
                                "so this step creates none; %s" % (folder, kind, name, kind[len("Sandbox"):], again))
            if live["metadata"].get("uid") != self.record[key]:
                raise DemoError("the kept pool in %s cannot serve: its %s %s was replaced by someone else (uid %s, "
                                "pool.json says %s); %s" % (folder, kind, name, live["metadata"].get("uid"),
                                                            self.record[key], again))
            if kind == "SandboxWarmPool":
                self.pool = live
                self.size = (live.get("spec") or {}).get("replicas", 1)
                made = self.record.get("warm_pool_replicas", self.record["size"])  # a recycled pool's: none
                if self.size != made:
                    self.changes.append("it was scaled to %d sandboxes since `pool up` made it %d" % (
                        self.size, made))
            elif live["metadata"].get("generation") != self.record.get("template_generation"):
                self.changes.append("its SandboxTemplate was edited since `pool up` (generation %s, now %s): the "
                                    "sandboxes the pool holds keep the old spec (agent-sandbox's default OnReplenish "
                                    "update strategy), new ones get the edit" % (
                                        self.record.get("template_generation"), live["metadata"].get("generation")))
        for change in self.changes:
            self.console.warn("the kept pool in %s: %s" % (folder, change))

    def watch(self, batch):
        """The pool's states from now on, each with its arrival time (the refill is timed from them)."""
        self.pool_watch = batch.watch(WARM_POOLS, name=POOL_NAME, timed=True)
        return self.pool_watch

    def pool_record(self, count):
        """warm-pool.json for this step: the pool as it is now (Ready sandboxes: its last state the
        watch delivered, else as check() read it), and, before any claim is made, how many claims
        find no Ready sandbox."""
        states = self.pool_watch.drain()
        live = states[-1][1] if states else self.pool
        self.early_states = states  # kept for the refill (states before the fire count as such)
        ready = (live.get("status") or {}).get("readyReplicas", 0)
        cold = max(0, count - ready)
        if cold:
            # agent-sandbox gives each claim 2 s for a refilling sandbox to get an IP, then starts it
            # cold (warmCandidateGracePeriod): a fast refill may still serve some of them warm.
            self.console.warn("%d of %d claims find no Ready sandbox: the kept pool has %d of %d Ready%s; each of "
                              "them waits up to 2 s for a refilling sandbox, then starts cold" % (
                                  cold, count, ready, self.size, " (this step is larger than the pool)"
                                  if count > self.size else " (not refilled yet)"))
        return {"name": POOL_NAME, "template": TEMPLATE_NAME, "size": self.size, "fill_seconds": None,
                "fill_definition": "a kept pool: filled by `pool up` (%s), not by this step" % POOL_RECORD_FILE,
                "ready_at_fire": ready, "expected_cold": cold, "kept_pool": dict(self.info(), changes=self.changes)}

    def finish(self, batch):
        """The step's end, every way out: its claims deleted (their Sandboxes go with them), the
        refill read from the pool's watch into warm-pool.json, and one line in the pool's steps.jsonl."""
        cluster, namespace, output = self.run.cluster, self.record["namespace"], self.run.output
        try:
            delete_step_claims(cluster, namespace, self.run.run_id, [
                (name, claim["metadata"]["uid"]) for name, claim in batch.latest.items()
                if claim["metadata"].get("uid")])
        except DemoError as error:
            self.console.warn("could not delete this step's claims (%s); `%s` deletes them" % (
                error, cleanup_command(output)))
        states = self.early_states + (self.pool_watch.drain() if self.pool_watch is not None else [])
        if self.pool_watch is not None:
            self.pool_watch.stop()
        fired = min((seen["create_called"] for seen in batch.observed.values() if seen.get("create_called")),
                    default=None)
        refill = pool_refill(states, fired, self.size)
        record = read_saved(output / "warm-pool.json")
        if record is not None:
            record["refill"] = refill
            write_json(output / "warm-pool.json", record)
        self.count_step({"episodes": len(batch.names), "finished_episodes": len(batch.results),
                         "refill_seconds": refill["seconds"]})

    def count_step(self, fields):
        """One line in the pool's steps.jsonl: this step, its folder, start and end, and `fields`."""
        line = {"run_id": self.run.run_id, "output": str(Path(self.run.output).resolve()),
                "started_at": self.started_at, "ended_at": utc_now(), **fields}
        try:
            with open(self.folder / POOL_STEPS_FILE, "a") as steps:  # one short line: an atomic append
                steps.write(json.dumps(line) + "\n")
        except OSError as error:
            self.console.warn("could not count this step in %s: %s" % (self.folder / POOL_STEPS_FILE, error.strerror))


def pool_refill(states, fired, size):
    """When the pool was back to `size` Ready after the step's claims were fired (REFILL_DEFINITION),
    from the (arrival time, SandboxWarmPool) states of the step's watch."""
    below = refilled = None
    ready = None
    for at, pool in states:
        ready = ((pool.get("status") or {}).get("readyReplicas") or 0)
        if fired is None or at < fired:
            continue
        if ready < size and below is None:
            below = at
        elif ready >= size and below is not None and refilled is None:
            refilled = at
    state = ("refilled" if refilled is not None else "never below full" if below is None and ready is not None
             and ready >= size else "not refilled by the step's end")
    return {"seconds": refilled - fired if refilled is not None else None, "state": state, "size": size,
            "ready_at_end": ready, "definition": REFILL_DEFINITION}


def delete_step_claims(cluster, namespace, run_id, seen=()):
    """A step's claims (its run-id label), deleted at once (ApiChannel.delete_all); their
    Sandboxes and pods go with them (owner references). Nothing else is touched. `seen`: (name,
    uid) of the claims the step's watch showed, each deleted by name on its uid beside the
    collection's DELETE (claims_by_name)."""
    cluster.api.delete_all(claims_by_name(namespace, seen) + [claims_of_run(namespace, run_id)])


def cleanup_step(receipt, source, console):
    """`cleanup STEPDIR` of a step of a kept pool: its claims only (the pool, its template and
    namespace are `pool down`'s), once the namespace is proven to be the pool's."""
    kept = receipt["kept_pool"]
    try:
        context, namespace, run_id = receipt["context"], receipt["namespace"], receipt["run_id"]
    except (KeyError, TypeError):
        raise DemoError("%s lacks context, namespace or run_id; refusing cleanup" % source) from None
    with connected(console, context) as cluster:
        return delete_step_claims_proven(cluster, kept, namespace, run_id)


def delete_step_claims_proven(cluster, kept, namespace, run_id):
    """cleanup_step once its channel is open: the namespace proven the pool's, then the claims."""
    console = cluster.console
    live = cluster.api.get(NAMESPACES, namespace)
    if live is None:
        console.tell("The kept pool's namespace is already gone: %s" % namespace)
        return EXIT_OK
    problems = ownership_mismatches("namespace " + namespace, live, {
        "uid": kept.get("namespace_uid"), "label " + RUN_LABEL: kept.get("run_id")})
    if problems:
        raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))
    selector = "%s=%s" % (RUN_LABEL, run_id)
    claims = cluster.api.list(CLAIMS, namespace, selector)
    if not claims:
        console.tell("Nothing left of step %s: its claims are gone (the kept pool in %s stays; `pool down %s` "
                     "removes it)" % (run_id, namespace, kept.get("folder")))
        return EXIT_OK
    console.note("Deleting the %d SandboxClaims of step %s (the kept pool stays)..." % (len(claims), run_id))
    delete_step_claims(cluster, namespace, run_id)
    cluster.api.wait_until_gone("SandboxClaims of step %s" % run_id, CLAIMS, namespace, selector=selector,
                                timeout=CLEANUP_WAIT_SECONDS)
    return EXIT_OK


def kept_pool_status(cluster, folder, record):
    """`pool status`: the pool as the API has it (Ready / desired), its age, the steps it served
    (steps.jsonl), and what keeping it costs while it waits between steps."""
    namespace = record["namespace"]
    live = cluster.api.get(WARM_POOLS, POOL_NAME, namespace)
    state = "up" if live is not None and live["metadata"].get("uid") == record["pool_uid"] else \
        "gone" if live is None else "replaced"
    try:
        steps = [json.loads(line) for line in (folder / POOL_STEPS_FILE).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        steps = []
    claims, expires = [], None
    if record.get("recycle") and state == "up":
        # a recycled pool's sandboxes are its claims' (the warm pool holds none): Ready ones, and the
        # first expiry on the server (a claim's lifecycle.shutdownTime, extended by each step)
        claims = cluster.api.list(CLAIMS, namespace, "%s=%s" % (RUN_LABEL, record["run_id"]))
        stamps = [((claim.get("spec") or {}).get("lifecycle") or {}).get("shutdownTime") for claim in claims]
        expires = min((stamp for stamp in stamps if stamp), key=parse_k8s_time, default=None)
    pods = cluster.api.list(PODS, namespace, POOL_MEMBER_LABEL) if state == "up" and not record.get("recycle") else []
    template = cluster.api.get(TEMPLATES, TEMPLATE_NAME, namespace) if state == "up" else None
    pod_spec = pods[0].get("spec") if pods else ((template or {}).get("spec") or {}).get("podTemplate", {}).get("spec")
    request = effective_request(pod_spec or {})[0]
    size = ((live or {}).get("spec") or {}).get("replicas", 1) if state == "up" else 0
    ready = ((live or {}).get("status") or {}).get("readyReplicas", 0) if state == "up" else 0
    if record.get("recycle") and state == "up":
        size, ready = len(claims), sum(1 for claim in claims if claim_ready(claim).get("status") == "True")
    age = time.time() - parse_k8s_time(record["created_at"])
    return {"pool": str(folder), "state": state, "context": record["context"], "namespace": namespace,
            "recycle": bool(record.get("recycle")), "ready": ready,
            "size": size, "size_at_up": record["size"], "age_seconds": round(age, 1),
            "expires_at": expires, "expires_in_seconds": None if expires is None else round(
                parse_k8s_time(expires) - time.time(), 1),
            "steps_served": len(steps), "last_step": steps[-1] if steps else None,
            "idle_cost_per_hour": {
                "cpu_core_seconds": round(size * request["cpu"] * 3600, 3),
                "gib_seconds": round(size * request["memory"] / GIB * 3600, 3),
                "definition": "pool size (spec.replicas) x a pool sandbox pod's effective request (as the cost "
                              "section counts it, RuntimeClass overhead included when a pool pod shows it) x 3,600 s: "
                              "the capacity the pool reserves each hour between steps, whether or not one runs"}}


def pool_status_lines(status):
    if status["state"] != "up":
        return ["the kept pool in %s is %s (namespace %s on %s); %d steps served" % (
            status["pool"], status["state"], status["namespace"], status["context"], status["steps_served"])]
    idle = status["idle_cost_per_hour"]
    return ["pool %s: %d of %d sandboxes Ready, namespace %s on %s, age %s, %d steps served" % (
        status["pool"], status["ready"], status["size"], status["namespace"], status["context"],
        human_age(status["age_seconds"]), status["steps_served"]),
        "idle cost: %.0f CPU core-seconds and %.0f GiB-seconds reserved per hour between steps" % (
            idle["cpu_core_seconds"], idle["gib_seconds"])] + ([
        "recycled: its claims expire on the server at %s (in %s) unless a step extends them" % (
            status["expires_at"], human_age(max(0.0, status["expires_in_seconds"])))] if status.get("expires_at") else [])


def pool_up_spec(args):
    """`pool up` as the RunSpec of a warm-pool run that fires no claim (count 0), checked once."""
    fail = args.subparser.error
    bound = MAX_LARGE_COUNT if args.allow_large else MAX_COUNT
    if not 1 <= args.size <= bound:
        fail("--size must be between 1 and %d%s, got %d" % (bound, "" if args.allow_large else
                                                            " (--allow-large lifts it to %d)" % MAX_LARGE_COUNT, args.size))
    if args.timeout is not None and args.timeout < 1:
        fail("--timeout must be at least 1 second, got %d" % args.timeout)
    program, _ = read_episode_inputs(argparse.Namespace(episode=args.episode, tasks=None, retries=0, count=None), fail)
    run_parser = build_parser().parse_known_args(["run"])[0].subparser
    options = {dest: run_parser.get_default(dest) for dest in run_parser.plugin_options}
    if args.ttl is not None and not args.recycle:
        fail("--ttl is for a recycled pool's claims (with --recycle); a pool of fresh claims keeps none across steps")
    if args.ttl is not None and args.ttl < MIN_POOL_TTL_SECONDS:
        fail("--ttl must be at least %d seconds, got %d" % (MIN_POOL_TTL_SECONDS, args.ttl))
    options.update(pool_size=args.size, exec_concurrency=1, pool=None, recycle=args.recycle, ttl=args.ttl)
    return RunSpec(command=POOL_UP_COMMAND, output=args.output, backend=WarmPoolBackend.name, count=0,
                   allow_large=args.allow_large, parallelism=0, image=args.image or DEFAULT_IMAGE,
                   runtime=args.runtime or DEFAULT_RUNTIME, no_runtime_class=args.no_runtime_class,
                   timeout=args.timeout or default_deadline(args.size, args.size), network=args.network,
                   force=args.force, quiet=args.quiet, context=args.context, episode=args.episode, program=program,
                   options=options)


def add_pool_parser(commands):
    """`pool up|status|down`'s arguments (up shares `run`'s sandbox options)."""
    pool = commands.add_parser(
        "pool", help="a warm pool kept across batches (a training loop's steps: run --pool POOLDIR)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Keep one agent-sandbox warm pool up across many batches: `pool up` makes it and waits for it\n"
                    "to fill, each `run --backend warm-pool --pool POOLDIR` is a step that claims from it and deletes\n"
                    "only its own claims, `pool status` shows it, `pool down` deletes it (as cleanup does).",
        epilog="example:\n  %(prog)s up --size 64 --allow-large --output pool\n  %(prog)s status pool\n"
               "  " + program_name() + " run --backend warm-pool --pool pool --count 64 --allow-large --output step-1\n"
               "  %(prog)s down pool")
    pool.set_defaults(subparser=pool)
    actions = pool.add_subparsers(dest="pool_command", metavar="ACTION", parser_class=ArgumentParser)
    actions.required = True
    up = actions.add_parser("up", help="make a warm pool and wait until it is full",
                            description="Make a namespace, SandboxTemplate and SandboxWarmPool of SIZE sandboxes "
                                        "(shaped as `run` shapes a sandbox), wait until every one is Ready, and "
                                        "write POOLDIR/receipt.json and POOLDIR/%s." % POOL_RECORD_FILE)
    up.add_argument("--size", type=int, required=True, metavar="N",
                    help="sandboxes kept Ready, 1..%d, or up to %d with --allow-large" % (MAX_COUNT, MAX_LARGE_COUNT))
    up.add_argument("--output", required=True, metavar="POOLDIR", help="a new folder for the pool's receipt and record")
    up.add_argument("--allow-large", action="store_true", help="lift the bound of %d sandboxes to %d"
                    % (MAX_COUNT, MAX_LARGE_COUNT))
    add_sandbox_options(up.add_argument_group("the cluster (as for `run`)"))
    up.add_argument("--episode", metavar="FILE.py", help="the episode program the sandboxes hold (steps then run it, "
                                                         "with their own --tasks)")
    up.add_argument("--timeout", type=int, metavar="SECONDS", help="how long to wait for the pool to fill (default: "
                                                                   "as `run` for SIZE episodes)")
    up.add_argument("--recycle", action="store_true",
                    help="keep SIZE claims across steps: each step execs its episodes into these sandboxes, one per "
                         "sandbox at a time, each followed by a reset check; a sandbox an episode left dirty is "
                         "quarantined and claimed afresh (default: each step claims afresh from a warm pool)")
    up.add_argument("--ttl", type=int, metavar="SECONDS",
                    help="with --recycle: the claims expire on the server this long after the last step (which "
                         "extends them); default %d" % DEFAULT_POOL_TTL_SECONDS)
    up.add_argument("--force", action="store_true", help="make the pool even when the preflight says it cannot fill")
    up.add_argument("--quiet", action="store_true", help="no progress or notes on stderr")
    up.set_defaults(subparser=up)
    status = actions.add_parser("status", help="the pool's Ready sandboxes, age, steps served and idle cost")
    status.add_argument("folder", metavar="POOLDIR", help="the folder of `pool up --output`")
    status.add_argument("--json", action="store_true", help="print JSON instead of lines")
    status.set_defaults(subparser=status)
    down = actions.add_parser("down", help="delete what `pool up` made, after proving it owns it (as cleanup)")
    down.add_argument("folder", metavar="POOLDIR", help="the folder of `pool up --output`")
    down.add_argument("--delete-foreign", action="store_true",
                      help="also delete objects in the pool's namespace it did not create (a running or unfinished "
                           "step's claims among them); without it, pool down names them and refuses")
    down.add_argument("--quiet", action="store_true", help="no progress or notes on stderr")
    down.set_defaults(subparser=down)


def cmd_pool(args, console):
    """`pool status` and `pool down` (`pool up` is a run: start_run)."""
    folder = Path(args.folder)
    if args.pool_command == "down":
        check_pool_folder(folder)  # a run's folder is cleanup's: pool down never deletes a run
        return cleanup_one(folder, console, args.delete_foreign)
    record = read_pool_record(folder)
    with connected(console, record["context"]) as cluster:
        status = kept_pool_status(cluster, folder, record)
    if args.json:
        console.say(json.dumps(status, indent=2))
    else:
        for line in pool_status_lines(status):
            console.say(line)
    if status["state"] != "up":
        raise DemoError("the kept pool in %s is %s: bring up a new one with `%s pool up`" % (
            folder, status["state"], invocation()))
    return EXIT_OK


# ============================================================================
# Recycled pool: `pool up --recycle`, and steps that exec each episode into a sandbox the pool keeps
# ============================================================================
# A recycled pool keeps its claims (the pool's own: its run-id label, one per slot, named
# episode-slot-<slot>-<generation>) across steps instead of claiming afresh. `pool up --recycle`
# makes a SandboxWarmPool of none (each claim starts its sandbox cold: setup, not measured),
# claims SIZE sandboxes and takes each one's baseline (sandbox-reset.py baseline). A step
# (`run --backend recycled-pool --pool POOLDIR`, or warm-pool: a recycled pool's steps are
# this backend's) execs each episode into a free sandbox, then the reset check; a sandbox
# serves again only when the check answers clean. One that does not is quarantined: its claim
# deleted on its uid, a fresh claim for its slot, baselined; the episode that dirtied it named in
# results.json with what it left. A slot whose claim or pod is not the one recorded (deleted,
# evicted) is claimed afresh at the step's start, said in one line. Steps of one pool run one at
# a time (POOLDIR/step.lock); POOLDIR/sandboxes.json is the slots, written by `pool up` and at
# each step's end. Every claim expires on the server (its shutdownTime, policy Delete) --ttl
# after it was made or last extended; a step extends those with less than half of it left.

RECYCLED_STATE_FILE = "sandboxes.json"  # in POOLDIR: the recycled pool's slots and what each has served
RECYCLED_LOCK_FILE = "step.lock"  # in POOLDIR: held (flock) by the one step of a recycled pool at work
RECYCLED_KIND = "RecycledEpisode"  # an episode of a recycled step in the shape of a pod, in episodes.json
RESET_TIMEOUT_SECONDS = 15  # a baseline's or reset check's exec, from its send to its answer
DEFAULT_POOL_TTL_SECONDS = 3600  # a recycled pool's claims expire this long after their last step
MIN_POOL_TTL_SECONDS = 10  # the stamp's whole seconds, and the controller's requeue, are a second or two
# a step extends a claim to outlive its --timeout and last reset check by this much (clock skew, requeues)
EXPIRY_MARGIN_SECONDS = 30
SLOT_CLAIM_PREFIX = CLAIM_PREFIX + "slot-"


def shutdown_stamp(seconds):
    """RFC 3339 (whole seconds, UTC) `seconds` from now: a claim's lifecycle.shutdownTime."""
    return (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def slot_claim_manifest(namespace, pool_run_id, slot, generation, shutdown_time):
    """The claim of a recycled pool's slot: the pool's label (its `pool down` deletes it, a step
    never owns it), and an expiry the controller enforces if no step extends it."""
    return {"apiVersion": EXTENSIONS_API, "kind": "SandboxClaim",
            "metadata": {"name": "%s%d-%d" % (SLOT_CLAIM_PREFIX, slot, generation), "namespace": namespace,
                         "labels": object_labels(pool_run_id, "claim")},
            "spec": {"warmPoolRef": {"name": POOL_NAME},
                     "lifecycle": {"shutdownTime": shutdown_time, "shutdownPolicy": "Delete"}}}


def reset_baseline_command():
    # `env` first: the simulated runtimes translate the mount paths of an exec that starts so
    return ["env", "python", "-S", "-B", "/demo/" + SANDBOX_RESET_FILE, "baseline", "/workspace"]


def reset_check_command(episode, baseline):
    return ["env", "python", "-S", "-B", "/demo/" + SANDBOX_RESET_FILE, "check", "/workspace", exec_journal(episode),
            baseline]


# A recycled episode's exec runs its reset check too (one round trip, not two): the shell runs the
# episode, writes its exit code to stderr, runs the check and writes the check's exit code and
# answer after it, then exits with the episode's code. The marks let the tool split the stream
# again (split_reset_answer); a check that hangs leaves the episode's code already said.
RESET_MARK = "rl-batch-demo reset: "
RESET_AFTER_EPISODE_SCRIPT = (
    'baseline=$1 journal=$2; shift 2; "$@"; code=$?; printf "\\n%%sepisode exit %%s\\n" "%(mark)s" "$code" >&2; '
    'answer=$(python -S -B /demo/%(program)s check /workspace "$journal" "$baseline" 2>&1); checked=$?; '
    'printf "%%scheck exit %%s\\n%%s\\n" "%(mark)s" "$checked" "$answer" >&2; exit $code'
    % {"mark": RESET_MARK, "program": SANDBOX_RESET_FILE})


def episode_then_reset_command(episode, command, baseline):
    """`command` (the episode's exec), then its sandbox's reset check, in one exec."""
    return ["sh", "-c", RESET_AFTER_EPISODE_SCRIPT, "sh", baseline, exec_journal(episode), *command]


def split_reset_answer(result):
    """(the episode's own result, its reset check's) of an exec that ran both: the check's None
    when the exec did not get as far as the episode's end; the episode's code is kept when the
    check did not answer in time (the exec's error is then the check's)."""
    head, mark, tail = result.stderr.rpartition(b"\n" + RESET_MARK.encode() + b"episode exit ")
    code, _, rest = tail.partition(b"\n")
    if not mark or not code.strip().isdigit():
        return result, None
    episode = ExecResult(int(code), result.stdout, head, sent_at=result.sent_at, opened_at=result.opened_at)
    checked, mark, answer = rest.partition(b"\n")
    prefix = RESET_MARK.encode() + b"check exit "
    if checked.startswith(prefix) and checked[len(prefix):].strip().isdigit():
        return episode, ExecResult(int(checked[len(prefix):]), answer, answer)
    return episode, ExecResult(None, error=result.error or "the exec ended before the check answered",
                               reason=result.reason)


def reset_answer(result):
    """(clean, left, seconds in the sandbox) of a reset check's exec: clean only when it exited 0
    saying so; a check that broke or did not answer is not clean, its failure the one thing left."""
    line = last_line(result.stdout.decode("utf-8", "replace"))
    try:
        answer = json.loads(line) if line else None
    except ValueError:
        answer = None
    if result.code in (SANDBOX_RESET_CLEAN, SANDBOX_RESET_DIRTY) and isinstance(answer, dict) and \
            isinstance(answer.get("left"), list):
        return result.code == SANDBOX_RESET_CLEAN and answer.get("clean") is True, answer["left"], answer.get("seconds")
    why = result.error or "exit code %s%s" % (result.code, ": " + last_line(result.stderr.decode("utf-8", "replace"))
                                                if result.stderr.strip() else "")
    return False, ["the reset check did not answer (%s)" % why], None


def controller_uid(obj):
    """The uid of the object's controller (its ownerReference with controller: true), or None."""
    return next((ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")), None)


def over_creation(slots, sandboxes, pods):
    """The over-creation guard of a recycled pool, pure: (one line, the claims it concerns) when the
    cluster holds more than the pool asked for (more than one live Sandbox controlled by one of
    its claims, or more than one live pod controlled by one of their Sandboxes: a controller
    creating too many, as agent-sandbox issues #1215 and #1332 describe), else None. Live: no
    deletionTimestamp, and for a pod not Succeeded or Failed (a replacement after its end is not
    more)."""
    claims = {record["claim_uid"]: record["claim"] for record in slots if record.get("claim_uid")}

    def live_by_controller(objects, owners):
        """{owner uid: [its live objects]} of the objects whose controller is one of `owners`."""
        grouped = {}
        for obj in objects:
            if controller_uid(obj) in owners and not obj["metadata"].get("deletionTimestamp") and (
                    obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                grouped.setdefault(controller_uid(obj), []).append(obj)
        return grouped
    by_claim = live_by_controller(sandboxes, claims)
    for uid, found in sorted(by_claim.items(), key=lambda item: claims[item[0]]):
        if len(found) > 1:
            return ("claim %s controls %d Sandboxes (%s), one asked for" % (
                claims[uid], len(found), ", ".join(sorted(s["metadata"]["name"] for s in found))), [claims[uid]])
    owners = {sandbox["metadata"]["uid"]: (sandbox["metadata"]["name"], claims[uid])
              for uid, found in by_claim.items() for sandbox in found}
    by_sandbox = live_by_controller(pods, owners)
    for uid, found in sorted(by_sandbox.items(), key=lambda item: owners[item[0]]):
        if len(found) > 1:
            sandbox, claim = owners[uid]
            return ("Sandbox %s (claim %s) controls %d pods (%s), one asked for" % (
                sandbox, claim, len(found), ", ".join(sorted(p["metadata"]["name"] for p in found))), [claim])
    return None


class RecycledSlots:
    """POOLDIR/sandboxes.json and the lock that gives one step at a time the recycled pool."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.lock_file = None

    def take(self, holder):
        """The pool's lock for `holder` (named to a step refused meanwhile), or one line naming the
        step that holds it (flock: the lock goes with its process, however it ends)."""
        self.lock_file = open(self.folder / RECYCLED_LOCK_FILE, "a+")
        try:
            fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.lock_file.seek(0)
            holder = self.lock_file.read().strip() or "another step"
            self.lock_file.close()
            self.lock_file = None
            raise DemoError("the recycled pool in %s serves one step at a time, and %s holds it: wait for it to end "
                            "(or bring up a second pool)" % (self.folder, holder)) from None
        self.lock_file.seek(0)
        self.lock_file.truncate()
        self.lock_file.write("%s, pid %d" % (holder, os.getpid()))
        self.lock_file.flush()

    def release(self):
        if self.lock_file is not None:
            self.lock_file.close()
            self.lock_file = None

    def read(self):
        """{slot number: its record}."""
        state = read_json(self.folder / RECYCLED_STATE_FILE, "the recycled pool's sandboxes", keys=("slots",))
        return {int(slot["slot"]): slot for slot in state["slots"]}

    def generations(self):
        """{slot number: the generation of its last claim made}, also for slots lost since: the next
        claim of a slot has the next name (episode-slot-<slot>-<generation>), never one still being deleted."""
        state = read_saved(self.folder / RECYCLED_STATE_FILE) or {}
        made = {int(number): generation for number, generation in (state.get("generations") or {}).items()}
        for slot in state.get("slots") or []:
            made[int(slot["slot"])] = max(made.get(int(slot["slot"]), -1), slot["generation"])
        return made

    def write(self, slots, quarantined=(), generations=None):
        state = read_saved(self.folder / RECYCLED_STATE_FILE) or {}
        made = dict(state.get("generations") or {})
        made.update({str(number): generation for number, generation in (generations or {}).items()})
        write_json(self.folder / RECYCLED_STATE_FILE, {
            "slots": [slots[number] for number in sorted(slots)],
            "quarantined": (state.get("quarantined") or []) + list(quarantined), "generations": made})


class RecycledRun(WarmPoolRun):
    """A recycled pool's sandboxes at work: claimed and baselined (`pool up --recycle`, a
    quarantine, a slot found gone), or serving a step's episodes, one per sandbox at a time, each
    followed by its reset check. The watches are taken in by one thread (pump) for all who wait."""

    def __init__(self, run, run_info, pool_run_id, slots, ttl):
        super().__init__(run, run_info, pool_run_id)
        self.pool_run_id, self.ttl = pool_run_id, ttl
        self.selector = "%s=%s" % (RUN_LABEL, pool_run_id)  # the claims are the pool's, never a step's
        self.slots = slots  # slot number -> its record
        self.ready = {}  # claim name -> threading.Event, set once the watch shows it bound and Ready
        self.claim_times = {}  # claim name -> its create call and answer (create_claims)
        self.claims_created, self.claims_deleted, self.quarantined, self.lost = [], [], [], []
        self.claim_watch = self.sandbox_watch = None
        self.pumping, self.pump_thread, self.pump_error = threading.Event(), None, None
        # what the over-creation guard found (over_creation()), once; from then on no claim is made
        self.over_created, self.stop_claiming = None, threading.Event()
        self.generations = {}  # slot number -> its last claim's generation (RecycledSlots.generations)
        self.checks = {}  # pod name -> the reset check its last exec ran after the episode, or None

    def open(self):
        """The channel, the watches of the pool's claims, Sandboxes and pods, and their pump."""
        self.channel = open_exec_channel(self.cluster, self.namespace, self.console)
        self.claim_watch = self.watch(CLAIMS, self.selector, timed=True)
        self.sandbox_watch = self.watch(SANDBOXES)
        self.pod_watch = self.watch(PODS, self.pod_selector)
        self.pumping.set()
        self.pump_thread = threading.Thread(target=self.pump, daemon=True)
        self.pump_thread.start()

    def pump(self):
        try:
            while self.pumping.is_set():
                for now, claim in self.claim_watch.drain(timeout=WATCH_WAIT_SECONDS):
                    self.take_claim(claim, now)
                self.absorb_watched(self.sandbox_watch)
                if self.over_created is None:
                    self.over_created = over_creation(list(self.slots.values()), list(self.sandboxes.values()),
                                                      list(self.pods.values()))
                    if self.over_created is not None:
                        self.stop_claiming.set()
        except Exception as error:  # the tool's own failure: said where the waits end
            self.pump_error = error

    def take_claim(self, claim, now):
        name = claim["metadata"]["name"]
        if older_state(claim, self.latest.get(name)):
            return
        self.latest[name] = claim
        bound = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        if bound and claim_ready(claim).get("status") == "True" and name in self.ready:
            self.claim_times.setdefault(name, {}).setdefault("ready", now)
            self.ready[name].set()

    def close(self):
        self.pumping.clear()
        if self.pump_thread is not None:
            self.pump_thread.join()
        for watch in (self.claim_watch, self.sandbox_watch, self.pod_watch):
            if watch is not None:
                watch.stop()
        self.close_channels()

    def exec_seconds_left(self):
        """An episode's exec carries its reset check: the check's time beyond the deadline."""
        return self.deadline - time.monotonic() + RESET_TIMEOUT_SECONDS

    def exec_once(self, pod_name, command):
        """One exec; of an episode's that ran its reset check too, the episode's part (the check's
        answer kept in self.checks for serve_one, as the exec journal reads only the episode's)."""
        result, broken = super().exec_once(pod_name, command)
        result, check = split_reset_answer(result)
        self.checks[pod_name] = check
        return result, broken

    def exec_check(self, pod_name, command, seconds=RESET_TIMEOUT_SECONDS):
        """A baseline or a reset check: one exec within `seconds`, the fallback's when the stream is refused."""
        channel = self.channel
        try:
            return channel.run(pod_name, command, seconds)
        except ExecRefused as refused:
            return self.fall_back(channel, refused).run(pod_name, command, seconds)
        except ExecChannelBroken as broken:
            self.fall_back(channel, broken)
            return broken.result

    def claim_slots(self, numbers, why, wait_seconds):
        """A fresh claim for each slot of `numbers`, made at once, each baselined once Ready:
        {slot: record} of those that are, and [(slot, why not)] of the others."""
        if self.stop_claiming.is_set():
            return {}, [(number, "no claim is made once the cluster made more than asked (%s)" % self.over_created[0])
                        for number in numbers]
        # a claim made during a step outlives it (as extend_for_the_step makes the others)
        lifetime = self.ttl + (max(0.0, self.deadline - time.monotonic()) + RESET_TIMEOUT_SECONDS +
                               EXPIRY_MARGIN_SECONDS if self.deadline is not None else 0)
        claims = []
        for number in numbers:
            old = self.slots.get(number)
            generation = max(old["generation"] if old else -1, self.generations.get(number, -1)) + 1
            self.generations[number] = generation
            claim = slot_claim_manifest(self.namespace, self.pool_run_id, number, generation, shutdown_stamp(lifetime))
            name = claim["metadata"]["name"]
            self.ready[name], self.claim_times[name] = threading.Event(), {}
            claims.append((number, claim))
        if not claims:
            return {}, []
        create_claims(self.cluster, [claim for _, claim in claims], self.pool_run_id, self.claim_times)
        self.claims_created += [{"slot": number, "claim": claim["metadata"]["name"], "why": why}
                                for number, claim in claims]
        give_up = time.monotonic() + wait_seconds
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(claims), CLAIM_CREATE_STREAMS)) as workers:
            answers = list(workers.map(lambda pair: self.baselined(pair[0], pair[1], give_up), claims))
        made = {number: record for number, record in answers if isinstance(record, dict)}
        return made, [(number, record) for number, record in answers if not isinstance(record, dict)]

    def baselined(self, number, claim, give_up):
        """(slot, its record) once its claim is Ready and its sandbox baselined, or (slot, why not)."""
        name = claim["metadata"]["name"]
        while not self.ready[name].wait(0.2):
            if self.pump_error is not None or time.monotonic() > give_up or self.stopping.is_set():
                return number, "claim %s was not Ready within the wait (%s)" % (
                    name, self.claim_state(self.latest.get(name) or claim))
        latest = self.latest[name]
        bound = latest["status"]["sandbox"]["name"]
        sandbox = self.wait_for_sandbox(bound) or self.read_sandbox(bound)
        pod_name = ((sandbox or {}).get("metadata", {}).get("annotations") or {}).get(POD_NAME_ANNOTATION) or bound
        result = self.exec_check(pod_name, reset_baseline_command())
        line = last_line(result.stdout.decode("utf-8", "replace"))
        try:
            baseline = json.loads(line)
        except ValueError:
            baseline = {}
        if result.code != 0 or "processes" not in baseline:
            return number, "the baseline of its sandbox %s failed (%s)" % (bound, baseline.get("error") or result.error or (
                "exit code %s: %s" % (result.code, last_line(result.stderr.decode("utf-8", "replace")))))
        if len(line) > MAX_STEP_TASK_BYTES:
            return number, "its sandbox %s holds too much outside the workspace to check (a %d-byte baseline)" % (
                bound, len(line))
        pod = self.pods.get(self.pod_uids.get(pod_name)) or self.cluster.api.get(PODS, pod_name, self.namespace) or {}
        return number, {
            "slot": number, "generation": int(name.rsplit("-", 1)[1]), "claim": name,
            "claim_uid": latest["metadata"].get("uid"), "sandbox": bound, "pod": pod_name,
            "pod_uid": pod.get("metadata", {}).get("uid"), "node": pod.get("spec", {}).get("nodeName"),
            "shutdown_time": claim["spec"]["lifecycle"]["shutdownTime"], "claimed_at": utc_now(),
            "baseline": line, "episodes_served": 0}

    def delete_slot_claim(self, record):
        """A slot's claim, deleted on its uid (its Sandbox and pod go with it); a failure is said, not raised."""
        try:
            self.cluster.api.delete_all([Deletion(CLAIMS, self.namespace, record["claim"], uid=record["claim_uid"])])
            self.claims_deleted.append(record["claim"])
        except DemoError as error:
            self.console.warn("could not delete claim %s (%s); `pool down` deletes it" % (record["claim"], error))

    def unusable(self, record, claims, pods):
        """Why a slot cannot serve as `pool up` or the last step left it (its claim or pod gone,
        replaced, not Ready, evicted), or None."""
        claim = claims.get(record["claim"])
        if claim is None or claim["metadata"].get("uid") != record["claim_uid"]:
            return "its claim %s %s" % (record["claim"], "is gone" if claim is None else "was replaced")
        if claim["metadata"].get("deletionTimestamp"):
            return "its claim %s is being deleted (expired?)" % record["claim"]
        if claim_ready(claim).get("status") != "True":
            return "its claim %s is not Ready (%s)" % (record["claim"], self.claim_state(claim))
        pod = pods.get(record["pod"])
        if pod is None or pod["metadata"].get("uid") != record["pod_uid"]:
            return "its pod %s %s" % (record["pod"], "is gone" if pod is None else "was replaced (evicted?)")
        if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running":
            return "its pod %s is %s%s" % (record["pod"], "being deleted" if pod["metadata"].get("deletionTimestamp")
                                           else (pod.get("status") or {}).get("phase"),
                                           " (%s)" % eviction_message(pod) if eviction_message(pod) else "")
        return None

    def recheck(self, size):
        """The step's start: every slot as recorded, its claim Ready and its pod the same; one line for
        each that is not (or that an earlier step lost), then a fresh claim for it; a claim of the
        pool no slot records (a quarantine a killed step never wrote down) deleted."""
        claims = {claim["metadata"]["name"]: claim for claim in self.list_claims()}
        pods = {pod["metadata"]["name"]: pod for pod in self.list_namespaced(PODS, self.pod_selector)}
        stale = {}
        for number, record in sorted(self.slots.items()):
            why = self.unusable(record, claims, pods)
            if why:
                stale[number] = why
                self.console.warn("slot %d of the recycled pool cannot serve: %s; claiming a fresh sandbox for it" % (
                    number, why))
        for number in sorted(set(range(size)) - set(self.slots)):
            stale[number] = "an earlier step lost it"
            self.console.warn("slot %d of the recycled pool cannot serve: %s; claiming a fresh sandbox for it" % (
                number, stale[number]))
        recorded = {record["claim"] for record in self.slots.values()}
        strays = [claim for name, claim in claims.items() if name not in recorded and not claim["metadata"].get(
            "deletionTimestamp")]
        for claim in strays:
            self.console.warn("claim %s of the recycled pool is in no slot (a quarantine whose step was killed); "
                              "deleting it" % claim["metadata"]["name"])
            self.delete_slot_claim({"claim": claim["metadata"]["name"], "claim_uid": claim["metadata"]["uid"]})
        for number in stale:
            if number in self.slots and self.slots[number]["claim"] in claims:
                self.delete_slot_claim(self.slots[number])
        made, failed = self.claim_slots(sorted(stale), "found unusable at the step's start", self.spec.timeout)
        self.slots.update(made)
        for number, why in failed:
            self.console.warn("slot %d: no fresh sandbox (%s); the step runs without it" % (number, why))
            self.lost.append({"slot": number, "why": why})
            self.slots.pop(number, None)
        return {number: why for number, why in stale.items()}

    def contain_over_creation(self):
        """The claims the guard's extra objects hang from, deleted on their uids (the garbage
        collector takes their Sandboxes and pods, the extra ones with them); their slots lost until
        the next step claims them afresh."""
        what, claims = self.over_created
        for number, record in sorted(self.slots.items()):
            if record["claim"] in claims:
                self.console.warn("over-creation: %s; deleting claim %s" % (what, record["claim"]))
                self.delete_slot_claim(record)
                self.lost.append({"slot": number, "why": "over-creation: " + what})
                self.slots.pop(number)

    def stop_over_creation(self):
        """The guard's end of a step: the error that says what the cluster over-made and what the step did."""
        what, claims = self.over_created
        self.contain_over_creation()  # when the guard spoke after the last episode started
        return BatchFailed("over-creation: %s; the step stopped creating (%d of its %d episodes not started) and "
                           "deleted claim %s (its Sandboxes and pods go with it); the next step claims that slot "
                           "afresh" % (what, len(self.names) - len(self.results), len(self.names), ", ".join(claims)))

    def extend_expiry(self, needed, extended_to):
        """Each claim that would expire within `needed` seconds expires `extended_to` seconds from now
        (a merge patch on its uid each); returns how many were extended. At a step's start a claim
        must outlive the step (its --timeout, its last reset check); at its end it must live --ttl
        more. Claims with more left are not patched: a step costs no patch while the expiry allows."""
        due = [record for record in self.slots.values()
               if parse_k8s_time(record["shutdown_time"]) - time.time() < needed]
        stamp = shutdown_stamp(extended_to)

        def extend(record):
            path = CLAIMS.path(self.namespace, record["claim"])
            try:
                status, _ = self.cluster.api.proxy.request(
                    "PATCH", path, {"metadata": {"uid": record["claim_uid"]}, "spec": {"lifecycle": {
                        "shutdownTime": stamp, "shutdownPolicy": "Delete"}}},
                    headers={"Content-Type": "application/merge-patch+json"})
            except ProxyUnavailable as error:
                status = str(error)
            if status == 200:
                record["shutdown_time"] = stamp
            else:
                self.console.warn("could not extend claim %s's expiry (%s); it expires at %s" % (
                    record["claim"], status, record["shutdown_time"]))

        if due and self.cluster.api.serves:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(due), CLAIM_CREATE_STREAMS)) as workers:
                list(workers.map(extend, due))
        return len(due)

    def extend_for_the_step(self):
        """At the step's start: no claim expires before the step's deadline (and its last reset check)."""
        step = self.spec.timeout + RESET_TIMEOUT_SECONDS + EXPIRY_MARGIN_SECONDS
        return self.extend_expiry(step, step + self.ttl)

    def extend_after_the_step(self):
        """At the step's end: every claim lives at least half its --ttl more."""
        return self.extend_expiry(self.ttl / 2, self.ttl)

    def serve(self, episodes):
        """Every episode of the step (names in task order), one per free sandbox at a time, until all
        are done or the deadline passed; returns once every started episode and its check ended."""
        self.names = list(episodes)
        self.position = {name: index for index, name in enumerate(self.names)}
        self.observed = {name: {} for name in self.names}
        started = time.monotonic()
        self.run.stream.begin(started)
        self.deadline = started + self.spec.timeout
        self.deadline_at = time.time() + self.spec.timeout
        step_started = time.time()
        free = queue.Queue()
        for number in sorted(self.slots):
            free.put(number)
        waiting = collections.deque(self.names)
        running = set()
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.slots)))
        try:
            while waiting or running:
                if self.pump_error is not None:
                    raise self.pump_error
                if self.over_created is not None:
                    # no episode starts in a pool a controller over-made: what it over-made deleted now
                    # (the episode in that sandbox ends as an infrastructure failure); run() says so
                    self.contain_over_creation()
                    break
                try:
                    number = free.get(timeout=WATCH_WAIT_SECONDS)
                except queue.Empty:
                    number = None
                done = [future for future in running if future.done()]
                for future in done:
                    running.discard(future)
                    future.result()  # a worker's exception is the tool's own failure: surface it
                if number is not None:
                    if waiting and time.monotonic() < self.deadline:
                        name = waiting.popleft()
                        self.observed[name].update(step_started=step_started, sandbox_free=time.time())
                        running.add(executor.submit(self.serve_one, name, number, free))
                    else:
                        free.put(number)
                if waiting and (time.monotonic() >= self.deadline or not self.slots):
                    break  # the rest never start: the deadline came first, or no sandbox is left
                self.console.progress("episodes: %d done, %d running, %d waiting for a sandbox; %.0f s" % (
                    len(self.results), len(running), len(waiting), time.monotonic() - started))
            for future in running:
                future.result()
            self.run_info["client_job_complete_seconds"] = time.monotonic() - started
        except KeyboardInterrupt:
            self.stopping.set()
            self.close_channels()
            self.cluster.runner.stop_running(executor)
            self.console.tell("Interrupted: saving the episodes so far in %s" % self.output)
            self.save_state()
            raise
        finally:
            self.console.end_progress()
            executor.shutdown(wait=True, cancel_futures=True)

    def serve_one(self, name, number, free):
        """One episode in slot `number`'s sandbox, then its reset check; the slot back among the free
        ones when clean, else quarantined and claimed afresh (or lost)."""
        record = self.slots[number]
        index = self.position[name]
        self.observed[name].update(slot=number, claim=record["claim"], episodes_before=record["episodes_served"],
                                   sandbox=record["sandbox"], pod=record["pod"], node=record.get("node"),
                                   generation=record["generation"])
        self.checks.pop(record["pod"], None)
        result = self.exec_episode(record["pod"], name, episode_then_reset_command(
            name, episode_command(name, index, self.spec), record["baseline"]))
        self.observed[name].update(exec_finished=time.time(), exec_started=result.sent_at)
        check = self.checks.pop(record["pod"], None)
        result = self.within_deadline(result, check)
        if result.code != 0 and self.stopping.is_set():
            result = ExecResult(None, result.stdout, result.stderr, reason="Interrupted", error=(
                "interrupted: the tool was stopped (Ctrl-C or SIGTERM) while the episode ran"),
                sent_at=result.sent_at, opened_at=result.opened_at)
        elif result.code != 0:
            deleted = self.deleted_under(record["sandbox"], record["pod"], record["pod_uid"])
            if deleted:
                result = ExecResult(None, result.stdout, result.stderr, error=deleted[1], reason=deleted[0],
                                    sent_at=result.sent_at, opened_at=result.opened_at)
        if result.opened_at is not None:
            self.observed[name]["stream_open"] = result.opened_at
        (self.output / (name + ".log")).write_bytes(result.stdout)
        if result.stderr:
            (self.output / (name + ".stderr")).write_bytes(result.stderr.rstrip(b"\n") + b"\n")
        record["episodes_served"] += 1
        if result.reason in ("SandboxDeleted", "Evicted", "Interrupted"):
            clean, left, seconds = False, ["its sandbox was lost while the episode ran (%s)" % result.reason], None
        else:
            # the check rode on the episode's exec; one followed through the journal, or sent again
            # after the journal said it never started, did not: then it is an exec of its own
            if check is None:
                check = self.exec_check(record["pod"], reset_check_command(name, record["baseline"]))
            clean, left, seconds = reset_answer(check)
        self.observed[name].update(reset_checked=time.time(), reset_seconds=seconds)
        self.results[name] = {"code": result.code, "error": result.error, "reason": result.reason,
                              "sandbox": None, "pod_name": record["pod"], "reset": {
                                  "clean": clean, "left": left, "seconds_in_sandbox": seconds}}
        if result.reason != "Interrupted":
            self.offer(name, index, result)
        if number not in self.slots:
            return  # the slot was lost meanwhile (the over-creation guard deleted its claim)
        if clean:
            free.put(number)
            return
        self.quarantine(number, name, index, left, free)

    def within_deadline(self, result, check):
        """The episode's result, or ExecTimedOut when it ended after the step's deadline: its exec
        may run RESET_TIMEOUT_SECONDS longer for its check, so its end is the exec's return less
        the check's own seconds (later than the real end by the return trip: never too kind)."""
        seconds = reset_answer(check)[2] if check is not None else None
        if result.code is None or not isinstance(seconds, (int, float)) or self.deadline_at is None:
            return result
        late = time.time() - seconds - self.deadline_at
        if late <= 0:
            return result
        return ExecResult(None, result.stdout, result.stderr, reason="ExecTimedOut", sent_at=result.sent_at,
                          opened_at=result.opened_at, error="the episode ended %.1f s after the step's --timeout of "
                                                            "%d s" % (late, self.spec.timeout))

    def quarantine(self, number, episode, task, left, free):
        record = self.slots.get(number)
        if record is None:
            return  # lost meanwhile (the over-creation guard): nothing of it to quarantine
        self.quarantined.append({"slot": number, "claim": record["claim"], "sandbox": record["sandbox"],
                                 "pod": record["pod"], "episode": episode, "task": task, "left": left,
                                 "at": utc_now()})
        if self.stopping.is_set():
            return  # the tool is stopping: the next step claims the slot afresh (recheck)
        self.console.warn("quarantined the sandbox of slot %d (claim %s) after episode %s: %s; claiming a fresh "
                          "one" % (number, record["claim"], episode, "; ".join(left[:3])))
        self.delete_slot_claim(record)
        made, failed = self.claim_slots([number], "quarantine of %s after %s" % (record["claim"], episode),
                                        max(1.0, self.deadline - time.monotonic()))
        if made:
            self.slots[number] = made[number]
            free.put(number)
            return
        why = failed[0][1]
        self.console.warn("slot %d: no fresh sandbox (%s); the step goes on without it" % (number, why))
        self.lost.append({"slot": number, "why": why})
        self.slots.pop(number, None)

    def offer(self, name, index, result):
        record = recycled_episode_record(name, index, self.observed[name], self.results[name])
        self.run.stream.offer(index if self.spec.episode else name, [(record, log_text(result.stdout))],
                              self.observed[name]["step_started"], self.observed, RecycledPoolBackend.scheme,
                              final=True)

    def save_state(self):
        """episodes.json, observed.json, pods.json, claims.json, job.json (the step's start) and the
        events; the slots are the pool's (written by the step's end)."""
        output = self.output
        write_json(output / "observed.json", self.observed)
        write_json(output / "run.json", self.run_info)
        events = None
        try:
            claims = self.list_claims()
            pods = self.list_namespaced(PODS, self.pod_selector)
            events = save_events(self.cluster, self.namespace, output)
        except DemoError as error:
            claims, pods = list(self.latest.values()), list(self.pods.values())
            self.console.warn("could not read the claims and pods (%s); saved what the watches saw" % error)
        self.absorb_pods()
        listed = {pod["metadata"].get("uid") for pod in pods}
        pods += [pod for uid, pod in self.pods.items() if uid not in listed]
        write_json(output / "claims.json", sorted(claims, key=by_creation))
        write_json(output / "pods.json", sorted(pods, key=by_creation))
        pods_by_name = {pod["metadata"]["name"]: pod for pod in pods}
        records = [recycled_episode_record(name, self.position[name], self.observed[name], self.results[name],
                                           pods_by_name.get(self.results[name]["pod_name"]))
                   for name in self.names if name in self.results]
        write_json(output / "episodes.json", records)
        save_node_summaries(self.run.facts["nodes"], records, output)
        record = read_saved(output / "warm-pool.json") or {}
        record.update(quarantined=self.quarantined, lost_slots=self.lost, claims_created=self.claims_created,
                      claims_deleted=self.claims_deleted)
        if self.channel is not None:
            record["exec_channel"] = self.channel.record()
        write_json(output / "warm-pool.json", record)
        started = min((seen["step_started"] for seen in self.observed.values() if seen.get("step_started")),
                      default=time.time())
        status = {"episodes": len(self.names), "finished_episodes": len(records)}
        timed_out = [episode for episode in records if episode["status"].get("reason") == "ExecTimedOut"]
        if self.deadline_at is not None and time.time() >= self.deadline_at and (
                timed_out or len(records) < len(self.names)):
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                     "lastTransitionTime": iso_micro(self.deadline_at),
                                     "message": "the step's --timeout of %d s passed: %d exec(s) cut short, %d "
                                                "episode(s) never started" % (self.spec.timeout, len(timed_out),
                                                                              len(self.names) - len(records))}]
        write_json(output / "job.json", batch_record(RecycledPoolBackend, "RecycledPoolStep", POOL_NAME,
                                                     iso_micro(started), status,
                                                     spec={"activeDeadlineSeconds": self.spec.timeout}))
        del events


def recycled_episode_record(name, index, seen, result, pod=None):
    """One episode of a recycled step in the shape of a pod (kind RecycledEpisode): created when
    the step began serving, in the sandbox of its slot, fresh (its first episode) or recycled."""
    claim = {"metadata": {"name": name, "creationTimestamp": iso_micro(seen["step_started"])}}
    record = warm_episode_record(claim, index, None, pod, result, seen)
    record.update(apiVersion="rl-batch-demo/recycled-pool", kind=RECYCLED_KIND)
    record["spec"] = {"nodeName": (pod or {}).get("spec", {}).get("nodeName") or seen.get("node"),
                      "claim": seen.get("claim"), "sandbox": seen.get("sandbox"), "pod": seen.get("pod"),
                      "slot": seen.get("slot"), "sandbox_use": "fresh" if not seen.get("episodes_before") else "recycled",
                      "episodes_before": seen.get("episodes_before"), "reset": result.get("reset")}
    return record


def recycled_episode_times(record, ready, reward, observed):
    """A recycled episode's points (RECYCLED_TIME_POINTS), why any is missing, and no fallbacks."""
    observed = observed or {}
    times, missing = {}, {}
    for point, key in (("step_started", "step_started"), ("sandbox_free", "sandbox_free"),
                       ("exec_started", "exec_started"), ("stream_open", "stream_open"),
                       ("exec_finished", "exec_finished"), ("reset_checked", "reset_checked")):
        times[point] = observed.get(key)
        if times[point] is None:
            missing[point] = ("`kubectl exec` (the fallback channel) does not tell when its stream opened"
                              if point == "stream_open" else "not recorded (observed.json)")
    for point, event, key in (("process_start", ready, "started_at"), ("imports_done", ready, "imports_done_at"),
                              ("ready", ready, "at"), ("reward", reward, "at")):
        value = event.get(key)
        times[point] = float(value) if isinstance(value, (int, float)) else None
        if times[point] is None:
            missing[point] = "the %s event has no %s" % (event.get("event"), key)
    return times, missing, {}


# A recycled episode's points: no claim is made for it, so the step's own clock starts it.
RECYCLED_TIME_POINTS = {
    "step_started": ("client", 1e-6, "the step began serving its episodes (time.time()): the same for every episode"),
    "sandbox_free": ("client", 1e-6, "the episode was handed a free sandbox of the pool (time.time())"),
    "exec_started": WARM_TIME_POINTS["exec_started"],
    "stream_open": WARM_TIME_POINTS["stream_open"],
    "process_start": TIME_POINTS["process_start"],
    "imports_done": TIME_POINTS["imports_done"],
    "ready": TIME_POINTS["ready"],
    "reward": TIME_POINTS["reward"],
    "exec_finished": ("client", 1e-6, "the episode's exec returned (time.time()), the reset check it ran after the "
                                      "episode included"),
    "reset_checked": ("client", 1e-6, "the reset check's answer arrived (time.time()): with the episode's exec, "
                                      "which runs it, the same moment as exec_finished; as its own exec (after a "
                                      "stream followed through the journal), when that returned"),
}
RECYCLED_PHASES = {
    "waiting_for_sandbox": ("step_started", "sandbox_free", "step started -> a sandbox free"),
    "sandbox_to_exec": ("sandbox_free", "exec_started", "sandbox free -> exec started"),
    "exec_to_stream_open": WARM_PHASES["exec_to_stream_open"],
    "stream_open_to_first_statement": WARM_PHASES["stream_open_to_first_statement"],
    "exec_to_first_statement": WARM_PHASES["exec_to_first_statement"],
    "module_import": PHASES["module_import"],
    "import_done_to_ready": PHASES["import_done_to_ready"],
    "ready_to_reward": PHASES["ready_to_reward"],
    "reward_to_exec_finished": WARM_PHASES["reward_to_exec_finished"],
    "reset_check": ("exec_finished", "reset_checked", "exec returned -> reset check answered (0 when the episode's "
                                                      "exec ran it: its cost is then in reset.seconds_in_sandbox)"),
    "step_to_ready": ("step_started", "ready", "step started -> ready"),
}
RECYCLED_SCHEME = PhaseScheme(
    RECYCLED_TIME_POINTS, RECYCLED_PHASES, "step_to_ready", recycled_episode_times, "step_started",
    identity=lambda record: {"episode": record["metadata"]["name"], "slot": record["spec"].get("slot"),
                             "claim": record["spec"].get("claim"), "sandbox": record["spec"].get("sandbox"),
                             "pod": record["spec"].get("pod"), "sandbox_use": record["spec"].get("sandbox_use"),
                             "episodes_before": record["spec"].get("episodes_before"),
                             "reset": record["spec"].get("reset")},
    row_key="episode", timeline_colours={
        "waiting_for_sandbox": "#e5c494", "sandbox_to_exec": "#17becf",
        **{phase: colour for phase, colour in WARM_TIMELINE_COLOURS.items() if phase in RECYCLED_PHASES},
        "reset_check": "#8c564b"},
    timeline_fallbacks={"exec_to_first_statement": "stream_open"},
    report_phases={"startup": ("waiting_for_sandbox", "sandbox_to_exec", "exec_to_stream_open",
                               "stream_open_to_first_statement", "exec_to_first_statement"),
                   "startup_metric": ("step_to_ready",), "finish": ("reward_to_exec_finished", "reset_check")},
    explained_failures=EXEC_FAILURE_REASONS + ("Evicted",), deadline_failures=("ExecTimedOut",),
    timeline_attributes=("sandbox_use",))


def recycled_summary(output, report):
    """What only a recycled step has: its sandboxes, fresh and recycled episodes apart, every
    claim it made or deleted and why, the quarantined sandboxes with the episode that dirtied
    each and what it left, and the reset check's cost."""
    record = read_json(output / "warm-pool.json", "the recycled pool's record")
    rows = report["pods"]
    uses = collections.Counter(row.get("sandbox_use") for row in rows)
    by_use = {}
    for use in ("fresh", "recycled"):
        subset = [row for row in rows if row.get("sandbox_use") == use]
        if subset:
            by_use[use] = {"episodes": len(subset), "phases": {
                name: {key: phase[key] for key in ("count", "p50", "p95", "max")}
                for name, phase in phase_statistics(subset, RECYCLED_SCHEME).items()}}
    in_sandbox = [row["reset"]["seconds_in_sandbox"] for row in rows if isinstance(row.get("reset"), dict)
                  and isinstance(row["reset"].get("seconds_in_sandbox"), (int, float))]
    return {
        "backend": RecycledPoolBackend.name,
        "recycled_pool": {
            "pool_folder": (record.get("kept_pool") or {}).get("folder"), "sandboxes": record.get("size"),
            "sandbox_use": {"fresh": uses.get("fresh", 0), "recycled": uses.get("recycled", 0)},
            "sandbox_use_definition": "fresh: the first episode its sandbox served since it was claimed; recycled: "
                                      "its sandbox served episodes_before others first (each reset and checked clean)",
            "claims_created": record.get("claims_created") or [], "claims_deleted": record.get("claims_deleted") or [],
            "replaced_at_start": record.get("replaced_at_start") or {},
            "quarantined": record.get("quarantined") or [], "lost_slots": record.get("lost_slots") or [],
            "expiry_extended": record.get("expiry_extended"),
            "reset_check_in_sandbox_seconds": {"count": len(in_sandbox), "p50": percentile(in_sandbox, 0.5),
                                               "max": max(in_sandbox)} if in_sandbox else {"count": 0},
            "reset_check_definition": "in the sandbox: sandbox-reset.py's own monotonic clock, from its start to its "
                                      "answer; the whole exec round trip is the reset_check phase (client clock)",
            "shared_with_earlier_episodes": "a recycled sandbox keeps its kernel (gVisor: its Sentry), its memory "
                                            "and its network identity (pod IP, DNS) across the episodes it serves; "
                                            "the reset check proves processes, the workspace and the writable "
                                            "places it lists, nothing else",
        },
        "phases_by_sandbox_use": by_use,
        "exec_channel": record.get("exec_channel"),
    }


class RecycledPoolBackend(WarmPoolBackend):
    """`--backend recycled-pool --pool POOLDIR`: a step of a recycled kept pool (`pool up --recycle`;
    `--backend warm-pool --pool` of such a pool is this backend's too). Each episode is exec'd into a
    sandbox the pool keeps, one per sandbox at a time, and followed by the reset check; no claim
    is made or deleted unless a sandbox is quarantined or found unusable."""

    name = "recycled-pool"
    help = ("a step of a recycled kept pool (`pool up --recycle`): each episode exec'd into a sandbox the pool keeps, "
            "reset and checked clean after it")
    scheme = RECYCLED_SCHEME
    episodes_file = "episodes.json"  # one pod-shaped record per episode (pods.json keeps the pool's pods)
    uses_cluster = True
    leaves_remote_state = True  # a step leaves nothing of its own, but its output names the pool's
    api_timestamps = False  # its times are the client's and the episodes' clocks
    coarse_batch_keys = ()
    takes_queue = False
    takes_parallelism = False  # one episode per sandbox of the pool at a time
    runs_several_images = False  # one SandboxTemplate
    own_flags = (("--pool", "pool"),)
    batch_origin = "step began serving its episodes"
    startup_label = "Step started -> ready"
    timeline_origin = "step's start"
    phase_words = {}
    REPORT_ROWS = {
        "setup": [("episodes in fresh / recycled sandboxes", "counts", ("recycled_pool.sandbox_use",
                                                                       ("fresh", "recycled")))],
        "ready": [],
        "after": [("sandboxes quarantined", "number", "recycled_pool.quarantined")],
    }

    @classmethod
    def add_arguments(cls, parser):
        """Its one option, --pool, is the warm-pool backend's (declared there)."""

    @classmethod
    def check_options(cls, args, fail):
        for flag, used in (("--parallelism", args.parallelism not in (None, args.count)),
                           ("--rounds", args.rounds != 1), ("--retries", args.retries)):
            if used:
                fail("%s is for the Job backend; a recycled pool's step runs one episode per sandbox at a time (leave "
                     "%s out)" % (flag, flag))
        if args.pool is None:
            fail("--backend recycled-pool runs a step of a recycled kept pool: give --pool POOLDIR (made by `pool up "
                 "--recycle`)")
        derived = kept_pool_options(args, fail)
        record = read_pool_record(Path(args.pool))
        if args.exec_concurrency is not None:
            fail("--exec-concurrency is for --backend warm-pool; a recycled pool's step runs one episode per sandbox "
                 "at a time (leave it out)")
        if not record.get("recycle"):
            fail("--pool %s is a kept pool of fresh claims, not a recycled one: run its steps with --backend warm-pool "
                 "(or bring up a pool with `pool up --recycle`)" % args.pool)
        return dict(derived, backend=cls.name, exec_concurrency=record["size"])

    def dry_run_objects(self, namespace, run_id):
        return []  # a step creates nothing unless a sandbox is quarantined

    def pods_at_once(self):
        return self.spec.pool_size  # the pool's sandboxes, as they are

    def never_fits(self, fit, runtime_class, nodes):
        return None

    def run(self, run):
        """The pool checked and locked, each slot found as recorded (else claimed afresh), every
        episode served, the expiries extended; the slots written back at the end, every way out."""
        spec, cluster, output = self.spec, run.cluster, run.output
        run_info = run.new_run_info(self)
        kept = KeptPoolStep(run)
        run_info.update(kept_pool=kept.info(), pool_size=kept.record["size"])
        run.write_facts(run_info)
        slots = RecycledSlots(kept.folder)
        slots.take("step %s (%s)" % (run.run_id, output))
        where = WARM_DIAGNOSTICS % output
        try:
            self.console.note("step %s of the recycled pool in %s (namespace %s)" % (run.run_id, kept.folder,
                                                                                    run.namespace))
            kept.check(cluster)
            batch = RecycledRun(run, run_info, kept.record["run_id"], slots.read(),
                                kept.record.get("ttl_seconds") or DEFAULT_POOL_TTL_SECONDS)
            batch.generations = slots.generations()
            try:
                batch.open()
                replaced = batch.recheck(kept.record["size"])
                extended_at_start = batch.extend_for_the_step()
                if not batch.slots:
                    raise DemoError("no sandbox of the recycled pool in %s can serve (%s); bring it down with `%s pool "
                                    "down %s` and up again" % (kept.folder, "; ".join(
                                        lost["why"] for lost in batch.lost[:2]), invocation(), kept.folder))
                if spec.count > len(batch.slots):
                    self.console.note("%d episodes on the pool's %d sandboxes: each serves up to %d in turn (a recycled "
                                      "pool claims no more for a step)" % (spec.count, len(batch.slots),
                                                                          -(-spec.count // len(batch.slots))))
                write_json(output / "warm-pool.json", {
                    "name": POOL_NAME, "template": TEMPLATE_NAME, "size": len(batch.slots), "recycled": True,
                    "fill_seconds": None, "ready_at_fire": len(batch.slots), "replaced_at_start": replaced,
                    "kept_pool": dict(kept.info(), changes=kept.changes)})
                batch.serve(["%s%s-%d" % (CLAIM_PREFIX, run.run_id[:8], index) for index in range(spec.count)])
                if batch.over_created is not None:
                    raise batch.stop_over_creation()
                extended = batch.extend_after_the_step()
                record = read_saved(output / "warm-pool.json") or {}
                write_json(output / "warm-pool.json", dict(record, expiry_extended=extended + extended_at_start))
            except DemoError as error:
                batch.stopping.set()
                batch.save_state()
                raise with_context(error, where) from None
            else:
                batch.save_state()
            finally:
                batch.close()
                slots.write(batch.slots, batch.quarantined, batch.generations)
                kept.count_step({"episodes": len(batch.names), "finished_episodes": len(batch.results),
                                 "quarantined": len(batch.quarantined), "claims_created": len(batch.claims_created)})
        finally:
            slots.release()
        unfinished = batch.unfinished_error(where) if not spec.episode else None
        if unfinished:
            raise unfinished
        report = write_results(output, where)
        run.stream.finish(report)
        return conclude(report, run)

    @classmethod
    def describe_results(cls, output, report, observed):
        report.update(recycled_summary(output, report))

    @classmethod
    def cost(cls, output, report, prices, records):
        """Each sandbox pod of the pool from the step's start to its last reset check: an episode's
        share from its exec's send to its reset check's answer, idle otherwise (a sandbox waits
        between steps at the pool's cost, `pool status`)."""
        observed = read_saved(output / "observed.json") or {}
        busy = collections.defaultdict(list)
        for seen in observed.values():
            if seen.get("pod") and seen.get("exec_started") and seen.get("reset_checked"):
                busy[seen["pod"]].append((seen["exec_started"], seen["reset_checked"]))
        begun = min((seen["step_started"] for seen in observed.values() if seen.get("step_started")), default=None)
        end = max((seen["reset_checked"] for seen in observed.values() if seen.get("reset_checked")), default=None)
        pods = [pod for pod in read_saved(output / "pods.json") or [] if pod["metadata"]["name"] in busy]

        def split(pod, start, stop):
            cursor = min(max(start, begun), stop) if begun is not None else start
            parts = []
            for since, until in sorted(busy[pod["metadata"]["name"]]):
                since, until = max(since, cursor), min(until, stop)
                if since > cursor:
                    parts.append(("idle", cursor, since))
                if until > since:
                    parts.append(("episodes", since, until))
                    cursor = until
            return parts + ([("idle", cursor, stop)] if cursor < stop else [])

        return cost_summary(reserved_capacity(pods, end, split), report["successful_episodes"], prices,
                            used_cpu=used_cpu_seconds(report["pods"]))

    @classmethod
    def summary_view(cls, report):
        pool = report["recycled_pool"]
        return {"recycled_pool": {"sandboxes": pool["sandboxes"], **pool["sandbox_use"],
                                  "quarantined": len(pool["quarantined"]), "claims_created": len(pool["claims_created"]),
                                  "claims_deleted": len(pool["claims_deleted"])}}

    @classmethod
    def summary_lines(cls, report):
        pool = report["recycled_pool"]
        lines = ["Recycled pool: %d sandboxes; %d episodes in fresh sandboxes, %d in recycled ones; %d claims made, "
                 "%d deleted." % (pool["sandboxes"], pool["sandbox_use"]["fresh"], pool["sandbox_use"]["recycled"],
                                  len(pool["claims_created"]), len(pool["claims_deleted"]))]
        for entry in pool["quarantined"]:
            lines.append("Quarantined the sandbox of slot %s after %s: %s." % (entry["slot"], entry["episode"],
                                                                              "; ".join(entry["left"][:3])))
        return lines

    @classmethod
    def timeline_where(cls, results):
        pool = results["recycled_pool"]
        return ClusterBackend.timeline_where(results) + ", recycled pool of %s, %d quarantined" % (
            pool["sandboxes"], len(pool["quarantined"]))


def bring_up_recycled_pool(backend, run, template):
    """`pool up --recycle`, once its template is made: a SandboxWarmPool of none, SIZE claims of
    the pool's own, each sandbox baselined; then sandboxes.json. A claim that cannot be Ready, or a
    sandbox whose baseline fails, fails `pool up` (`pool down` deletes what it made)."""
    spec, output, namespace, console = backend.spec, run.output, run.namespace, run.console
    pool = warm_pool_manifest(namespace, run.run_id, 0)
    filled = backend.fill_pool(run, pool)
    ttl = spec.options["ttl"] or DEFAULT_POOL_TTL_SECONDS
    batch = RecycledRun(run, {}, run.run_id, {}, ttl)
    started = time.monotonic()
    try:
        batch.open()
        console.note("recycled pool: claiming %d sandboxes and taking their baselines..." % spec.pool_size)
        made, failed = batch.claim_slots(range(spec.pool_size), "pool up", spec.timeout)
    finally:
        batch.close()
    if failed:
        write_json(output / RECYCLED_STATE_FILE, {"slots": [made[number] for number in sorted(made)], "quarantined": []})
        raise DemoError("%d of %d sandboxes of the recycled pool could not serve (slot %d: %s); `%s pool down %s` "
                        "deletes what pool up made" % (len(failed), spec.pool_size, failed[0][0], failed[0][1],
                                                       invocation(), output))
    write_json(output / RECYCLED_STATE_FILE, {"slots": [made[number] for number in sorted(made)], "quarantined": []})
    return dict(filled, fill_seconds=time.monotonic() - started, ready_at_fire=len(made),
                fill_definition="client monotonic clock: the claims' creates -> every sandbox Ready and baselined; "
                                "setup, not part of any step's figures")


# ============================================================================
# Local backend: the same episodes as local processes, no cluster, no kubectl
# ============================================================================

LOCAL_KIND = "LocalEpisode"  # the local backend's stand-in for a pod in pods.json


def local_record(name, index, created, finished, code, message, timed_out, interrupted, node, image):
    """An episode of a backend without a cluster in the shape of a pod (kind LocalEpisode), so one
    validator serves both; `node` and `image` are its EpisodeHost's words for where it ran."""
    terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                  "startedAt": iso_micro(created), "finishedAt": iso_micro(finished)}
    if message:
        terminated["message"] = message
    status = {"phase": "Succeeded" if code == 0 else "Failed",
              "containerStatuses": [{"name": CONTAINER_NAME, "restartCount": 0, "state": {"terminated": terminated},
                                     "imageID": image}]}
    if timed_out:
        status["reason"], status["message"] = "DeadlineExceeded", "killed at the run's --timeout"
    elif interrupted:
        status["reason"], status["message"] = "Interrupted", "killed when the run was interrupted (Ctrl-C or SIGTERM)"
    return {"apiVersion": "rl-batch-demo/local", "kind": LOCAL_KIND,
            "metadata": {"name": name, "creationTimestamp": iso_micro(created), "annotations": {INDEX_KEY: str(index)}},
            "spec": {"nodeName": node}, "status": status}


def local_episode_times(record, ready, reward, observed=None):
    """A local episode's points: a pod's, with no scheduler and no sandbox to time."""
    times, missing, fallbacks = episode_times(record, ready, reward, observed)
    for point in ("scheduled", "sandbox_ready", "scheduled_seen"):
        missing[point] = "local backend: no scheduler and no sandbox"
    for point in ("pod_seen", "container_started_seen"):
        missing[point] = "local backend: no pod watch (its process start is the container start)"
    return times, missing, fallbacks


LOCAL_SCHEME = dataclasses.replace(POD_SCHEME, times_of=local_episode_times, kubelet_logs=False)


class EpisodeHost:
    """Where a backend without a cluster runs its episodes (an adapter: the backend's
    episode_host() gives one): here, this machine, in a private folder removed at the end. A
    backend that runs them elsewhere (another machine over ssh) gives a subclass: its staging
    there, its way to start a process there, what it calls the machine and its Python. Every
    method takes the episode's index, so that a host may be several machines."""

    def __init__(self, run_id=None):
        self.run_id = run_id  # the run's id when its receipt has one (a remote host's folder is named by it)
        self.root = None  # the staged folder

    def node(self, index):
        """The machine episode `index` runs on, as pods.json's nodeName and nodes.json name it."""
        return "local:" + socket.gethostname()

    def image(self, index):
        """What runs the episode, as pods.json's imageID names it."""
        return "local:%s (Python %s)" % (sys.executable, platform.python_version())

    def stage(self, files):
        """Put `files` ({name: text}: the episode program, the sandbox probe, the tasks) where the
        episodes run, with `python` on their PATH (the episode runs `python` for its tests)."""
        self.root = private_temp_folder("local")
        (self.root / "bin").mkdir()
        (self.root / "bin" / "python").symlink_to(sys.executable)
        for name, text in files.items():
            (self.root / name).write_text(text)

    def path(self, index, name):
        """A staged file's path as episode `index` sees it."""
        return str(self.root / name)

    def make_workspace(self, index, name):
        """Episode `name`'s own empty folder, as it sees it (RL_WORKSPACE)."""
        (self.root / name).mkdir()
        return str(self.root / name)

    def start(self, index, env, workspace, log):
        """Episode `index`'s process in a session of its own (os.killpg stops it, or the command
        that carries it elsewhere), with `env` (the episode's variables) added, its stdout and
        stderr into `log`."""
        return CHILDREN.popen([sys.executable, "-B", self.path(index, SANDBOX_PROBE_FILE), self.path(index, "episode.py")],
                              cwd=workspace, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True, env=dict(os.environ, **env, PATH="%s%s%s" % (
                                  self.root / "bin", os.pathsep, os.environ.get("PATH", ""))))

    def termination(self, index, name):
        """The last 4096 bytes of what episode `name` wrote to its termination file (b"": none)."""
        path = self.root / (name + ".termination")
        return path.read_bytes()[-4096:] if path.exists() else b""

    def close(self):
        """Remove what stage() made (every way out)."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


class LocalBatch:
    """One batch of a backend without a cluster under way: the episode processes on its
    EpisodeHost (the parallelism honoured, retries as --retries says), their records, and what
    an interrupt must stop."""

    def __init__(self, spec, console, folder, stream, backend, run_id=None):
        self.spec, self.console, self.folder, self.stream = spec, console, folder, stream
        self.backend = backend  # a LocalBackend (or a subclass): its scheme, its EpisodeHost
        self.host = backend.episode_host(run_id)
        self.records, self.running = [], set()  # pod-shaped records; episode processes alive
        self.lock, self.stopping = threading.Lock(), threading.Event()  # stopping: set on Ctrl-C or SIGTERM
        self.created = self.deadline = None
        self.not_started = []  # indexes whose turn came after the deadline

    def run(self, run_info):
        spec, folder = self.spec, self.folder
        try:
            self.host.stage(dict({"episode.py": spec.program, SANDBOX_PROBE_FILE: SANDBOX_PROBE_PROGRAM},
                                 **tasks_data(spec.tasks_list or [])))
            self.created = time.time()
            self.stream.begin(time.monotonic(), run_info.get("round"))
            self.deadline = self.created + spec.timeout
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=spec.parallelism)
            try:
                list(pool.map(self.run_index, range(spec.count)))
            except KeyboardInterrupt:
                self.interrupted(pool)
                raise
            pool.shutdown()
        finally:
            self.host.close()
        records = sorted(self.records, key=by_creation)
        failed = [r for r in records if r["status"]["phase"] != "Succeeded"]
        # past the deadline: an episode was killed at it, or one never started before it
        timed_out = any(r["status"].get("reason") == "DeadlineExceeded" for r in records) or self.not_started
        condition = {"type": "Complete", "status": "True", "reason": "CompletionsReached"}
        if timed_out:  # a custom episode's batch too: its episodes are named by what ended them
            condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                         "lastTransitionTime": iso_micro(self.deadline),
                         "message": "the batch's --timeout of %d s passed: %d episode(s) killed at it, %d never "
                                    "started" % (spec.timeout, sum(r["status"].get("reason") == "DeadlineExceeded"
                                                                   for r in records), len(self.not_started))}
        elif failed and not spec.episode:
            condition = {"type": "Failed", "status": "True", "reason": "EpisodeFailed",
                         "message": "an episode failed"}
        job = batch_record(self.backend, "LocalBatch", "local", iso_micro(self.created), {"conditions": [condition]},
                           spec={"completions": spec.count, "parallelism": spec.parallelism,
                                 "activeDeadlineSeconds": spec.timeout})
        run_info["client_job_complete_seconds"] = time.time() - self.created
        write_json(folder / "run.json", run_info)
        write_state(folder, job, records)
        where = "diagnostics saved in %s (job.json, pods.json, episode logs)" % folder
        if condition["type"] == "Failed" and not spec.episode:
            logs = [log_text((folder / (r["metadata"]["name"] + ".log")).read_bytes()) for r in records]
            details = describe_failed_pods(records, logs)
            if timed_out:
                raise BatchTimeout("local batch timed out: %s; raise --timeout if the episodes need longer; %s"
                                   % (condition["message"], where))
            raise BatchFailed("local batch failed: %s; %s" % ("; ".join(details[:3]), where))
        return write_results(folder, where)

    def run_index(self, index):
        """Episode `index`, and its retries while it fails (custom episodes only)."""
        spec, host = self.spec, self.host
        for attempt in range(spec.retries + 1):
            name = "local-%d" % index if not attempt else "local-%d-retry-%d" % (index, attempt)
            workspace = host.make_workspace(index, name)
            env = dict(EPISODE_ID=name, RL_WORKSPACE=workspace, RL_TERMINATION_LOG=host.path(index, name + ".termination"),
                       JOB_COMPLETION_INDEX=str(index),
                       # a process shares its machine's cgroup: its CPU counter is not the
                       # episode's own, so the episode reports none (cpu_usec null)
                       RL_CGROUP="")
            if spec.tasks_list is not None:
                env.update(TASK_INDEX=str(index), TASK_FILE=host.path(index, "task-%d.json" % index))
            created, timed_out = time.time(), False
            if created >= self.deadline:  # its turn came after the deadline: not started, not killed at once
                if not attempt:
                    with self.lock:
                        self.not_started.append(index)
                return
            with open(self.folder / (name + ".log"), "w") as log:
                with self.lock:
                    if self.stopping.is_set():
                        return
                    process = host.start(index, env, workspace, log)
                    self.running.add(process)
                try:
                    code = process.wait(timeout=max(0.0, self.deadline - time.time()))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    code, timed_out = process.wait() or 137, True
                finally:
                    with self.lock:
                        self.running.discard(process)
            message = log_text(host.termination(index, name))
            with self.lock:
                interrupted = self.stopping.is_set() and code != 0  # killed by interrupted() below
                self.records.append(local_record(name, index, created, time.time(), 137 if timed_out else code,
                                                 message, timed_out, interrupted, host.node(index), host.image(index)))
            last = code == 0 or timed_out or not spec.episode or attempt == spec.retries
            if not self.stopping.is_set():  # an episode cut short by Ctrl-C has no verdict
                self.offer(index, name, last)
            if last or self.stopping.is_set():
                return

    def offer(self, index, name, final):
        """This episode's attempts so far, to the stream (--stream)."""
        with self.lock:
            records = [r for r in self.records if pod_index(r) == index]
        tried = [(record, log_text((self.folder / (record["metadata"]["name"] + ".log")).read_bytes()))
                 for record in records]
        created = parse_k8s_time(iso_micro(self.created))  # job.json's creationTimestamp, as validation reads it
        if self.spec.episode:
            self.stream.offer(index, tried, created, {}, self.backend.scheme, final)
        else:
            self.stream.offer(name, tried[-1:], created, {}, self.backend.scheme, final)

    def interrupted(self, pool):
        """Stop every episode's process group at once, keep what is known, leave nothing behind;
        a second Ctrl-C must not cut this short (SIGINT stays ignored until the tool exits)."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.stopping.set()
        with self.lock:
            for process in self.running:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        pool.shutdown(wait=True, cancel_futures=True)
        records = sorted(self.records, key=lambda record: record["metadata"]["name"])
        write_json(self.folder / "pods.json", records)
        interrupted = len([r for r in records if r["status"].get("reason") == "Interrupted"])
        write_json(self.folder / "job.json", batch_record(self.backend, "LocalBatch", "local", iso_micro(self.created), {
            "interrupted": True, "finished_episodes": len(records) - interrupted, "interrupted_episodes": interrupted}))
        self.console.tell("Interrupted: stopped the running episodes; job.json, pods.json and the episode logs are "
                          "in %s" % self.folder)


class LocalBackend(Backend):
    """`--backend local`: the same episodes as local processes (the parallelism honoured), the
    same output folder and results.json shape; no cluster, no kubectl."""

    name = "local"
    help = "local processes, no cluster"
    scheme = LOCAL_SCHEME
    episodes_file = "pods.json"  # LocalEpisode records shaped like pods
    uses_cluster = False
    leaves_remote_state = False
    api_timestamps = False  # every time comes from this machine's clock, to the microsecond
    coarse_batch_keys = ()
    takes_queue = False
    takes_parallelism = True
    runs_several_images = False  # it runs no image at all
    own_flags = ()
    batch_origin = "batch started"
    startup_label = "Episode process launched -> ready"
    timeline_origin = "batch"
    # its "pod" is a process this machine spawned, which is its container too
    phase_words = {"pod created": "process launched", "container started": "process launched",
                   "container finished": "process exited"}
    REPORT_ROWS = {}

    def episode_host(self, run_id):
        """Where its episodes run (an EpisodeHost): this machine here; a backend that runs them
        elsewhere gives its own."""
        return EpisodeHost(run_id)

    def read_facts(self, cluster):
        """What it reads before anything is made (nothing here; a backend with other machines
        checks that it can reach them): refusals are raised here, before the folder exists."""
        return {}

    @classmethod
    def off_cluster_state(cls, folder, receipt):
        """`list`'s STATE of one of its runs, from its folder alone."""
        return "ran on this machine: nothing to clean up"

    def new_receipt(self, context, namespace, run_id):
        return {"backend": self.name, "namespace": None,
                "note": "a %s run: there is nothing on a cluster to clean up" % self.name}

    def run(self, run):
        spec, output = self.spec, run.output
        run_info = run.new_run_info(self)
        write_json(output / "run.json", run_info)
        rounds = []
        for number in range(1, spec.rounds + 1):
            folder = round_folder(output, number, spec.rounds)
            folder.mkdir(exist_ok=True)
            info = dict(run_info, **({"round": number} if spec.rounds > 1 else {}))
            report = LocalBatch(spec, self.console, folder, run.stream, self, run.run_id).run(info)
            run.stream.finish(report)
            rounds.append(report)
        return conclude(pool_round_folders(output, run_info, rounds), run)

    @classmethod
    def describe_results(cls, output, report, observed):
        report.update(image="local-python", runtime="local-process")
        for phase in report["phases"].values():
            phase.update(clocks=["local"], mixed_clocks=False, resolution_seconds=1e-6)

    @classmethod
    def cost(cls, output, report, prices, records):
        return {"definition": COST_DEFINITION, "reserved": None,
                "reason": "local processes reserve no cluster capacity (no requests, no nodes)", "per_reward": None,
                "used": None, "used_note": "not measured: the processes' rusage is not read yet", "price": None}

    @classmethod
    def timeline_where(cls, results):
        return "local backend"

# ============================================================================
# Backend registry: the one place that lists the backends (and so `--backend`'s choices) and the gates
# ============================================================================


BACKENDS = {backend.name: backend for backend in (JobBackend, WarmPoolBackend, RecycledPoolBackend, LocalBackend)}
GATES = (KueueGate,)  # admission gates (Gate); shared code asks each, in this order
DEFAULT_BACKEND = JobBackend.name


# Records written before backends had names (run.json, receipt.json, results.json, a namespace's
# labels) name none: they are the Job backend's, the only one there was.
UNNAMED_BACKEND = JobBackend


def backend_named(name, source="the record"):
    """The backend a run.json, receipt, results.json or namespace label names (`source`, for
    the refusal); None is UNNAMED_BACKEND. A name this version does not know is refused."""
    if name is None:
        return UNNAMED_BACKEND
    if name not in BACKENDS:
        raise DemoError("%s names backend %r, which this rl-batch-demo does not know (it knows %s): was it "
                        "written by a newer version?" % (source, name, ", ".join(sorted(BACKENDS))))
    return BACKENDS[name]


def backend_of(results):
    """The backend a results.json came from."""
    return backend_named(results.get("backend"), "results.json")


def phase_label(results, name):
    """A phase's label for people, in its backend's words (Backend.phase_words): a local run's
    pod_to_ready is "process launched -> ready"."""
    backend = backend_of(results)
    label = backend.scheme.phases[name][2]
    for words, own in backend.phase_words.items():
        label = label.replace(words, own)
    return label


# ============================================================================
# Cleanup, report and list
# ============================================================================


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


CLEANUPS_AT_ONCE = 8  # `cleanup A B C ...`: folders cleaned at the same time (each waits mostly)


def cmd_cleanup(args, console):
    """Clean up the folders at once (most of a cleanup is waiting for the namespace controller:
    five folders one after another took 2 minutes), each folder's lines prefixed with its name;
    one folder's refusal does not stop the others. The exit code is the first failure's, in the
    order the folders were given."""
    if args.receipt:
        return cleanup_receipt(read_receipt_file(args.receipt), args.receipt, None, console, args.delete_foreign)
    if len(args.output) == 1:
        return cleanup_one(Path(args.output[0]), console, args.delete_foreign)
    lock = threading.Lock()

    def clean(folder):
        try:
            cleanup_one(Path(folder), PrefixedConsole(console, folder, lock), args.delete_foreign)
            return EXIT_OK
        except DemoError as error:
            # the folder named once: a missing folder's message names it already
            with lock:
                console.tell("Error: %s" % (error if isinstance(error, NoSuchFolder) else "%s: %s" % (folder, error)))
            return error.exit_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(CLEANUPS_AT_ONCE, len(args.output))) as pool:
        codes = list(pool.map(clean, args.output))
    return next((code for code in codes if code != EXIT_OK), EXIT_OK)


def read_receipt_file(name):
    """`cleanup --receipt FILE`: a receipt saved apart from its folder, or printed by a run whose
    folder failed (`-` reads it from stdin)."""
    if name != "-":
        return read_json(Path(name), "a receipt")
    try:
        receipt = json.loads(sys.stdin.read())
    except ValueError as error:
        raise DemoError("--receipt -: stdin is not a receipt's JSON (%s)" % error) from None
    if not isinstance(receipt, dict):
        raise DemoError("--receipt -: stdin holds JSON, but not a receipt's object")
    return receipt


def cleanup_one(output, console, delete_foreign=False):
    """Delete one run's objects and namespace, after proving each is the one the receipt names."""
    if not output.is_dir():
        raise NoSuchFolder("no such folder: %s (give the output folder of a run, or --receipt FILE)" % output)
    if not (output / "receipt.json").exists() and (output / COMPARE_FILE).exists():
        batches = sorted(str(receipt.parent) for receipt in output.glob("*/round-*/receipt.json"))
        raise DemoError("%s is a comparison's folder, with no receipt of its own: `compare` cleans up each of its "
                        "batches once it ran (ARM/round-N/)%s" % (output, "; to finish one an interrupted comparison "
                        "may have left, give its folder: %s cleanup %s" % (invocation(), " ".join(
                            shlex.quote(batch) for batch in batches)) if batches else ""))
    return cleanup_receipt(read_json(output / "receipt.json", "the receipt"), output / "receipt.json", output,
                           console, delete_foreign)


# Objects that hold no one's work: records about other objects, metrics of pods, and what
# Kubernetes itself puts into every namespace, told apart by what made it, never by when: the
# ServiceAccount controller's `default` and the root CA publisher's ConfigMap, each with the
# managers (managedFields) it may have. Checked with the real kube-controller-manager v1.36.3:
# kube-root-ca.crt is managed by `kube-controller-manager`, `default` lists no manager. A
# colleague's edit adds their own manager (kubectl-edit, ...), and the object becomes foreign.
RECORD_KINDS = ("Event", "PodMetrics")
EVERY_NAMESPACE_HAS = {("ServiceAccount", "default"): {"kube-controller-manager"},
                       ("ConfigMap", "kube-root-ca.crt"): {"kube-controller-manager"}}


class NamespaceListing:
    """What cleanup read of a run's namespace: every object (its metadata at least, with kind and
    apiVersion) of every namespaced kind it could list, records (RECORD_KINDS) left out; and
    whether every kind could be listed. The foreign-object check and the backends' ownership
    checks read it, so that cleanup lists each kind once."""

    def __init__(self, items, complete, resources=None):
        self.items, self.complete = items, complete
        # (apiVersion, kind) -> its Resource, where the listing came through the proxy (discovery
        # named its plural: sweep_namespace deletes by it); empty from kubectl's listing
        self.resources = resources or {}
        self.swept = set()  # uids of the objects cleanup has deleted by name (delete_listed_at_once)

    def of_kind(self, kind):
        """The objects of `kind` (e.g. "SandboxClaim"), or None when some kind could not be listed
        (the caller then reads that kind itself)."""
        return [item for item in self.items if item.get("kind") == kind] if self.complete else None

    def without(self, gone):
        """The listing less the objects [(kind, name, ...)] deleted since (--delete-foreign)."""
        names = {(kind, name) for kind, name, *_ in gone}
        return NamespaceListing([item for item in self.items if (item.get("kind"), item["metadata"]["name"])
                                 not in names], self.complete, self.resources)


def list_namespace(cluster, namespace):
    """A NamespaceListing of the run's namespace: through the command's proxy, or where its
    channel has none, every kind in one kubectl call. Kinds that cannot be listed (RBAC) are named in a note
    and not checked."""
    listed = list_namespace_through_proxy(cluster, namespace)
    if listed is not None:
        items, unlisted, resources = listed
        if unlisted:
            cluster.console.note("could not check %d kind(s) for objects this run did not create: %s"
                                 % (len(unlisted), unlisted[0]))
        return NamespaceListing(items, complete=not unlisted, resources=resources)
    kinds = cluster.read("api-resources", "--verbs=list", "--namespaced=true", "-o", "name").split()
    try:
        raw, unlisted = cluster.read("-n", namespace, "get", ",".join(kinds), "-o", "json", "--show-managed-fields"), []
    except KubectlError as error:
        if not (error.stdout or "").strip():
            raise
        # kubectl prints what it could list, then one error per kind it could not (exit 1).
        raw = error.stdout
        unlisted = [line for line in error.stderr.splitlines() if line.strip()]
        cluster.console.note("could not check %d kind(s) for objects this run did not create: %s"
                             % (len(unlisted), unlisted[0]))
    items = [item for item in json.loads(raw)["items"] if item.get("kind") not in RECORD_KINDS]
    return NamespaceListing(items, complete=not unlisted)


METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


def list_namespace_through_proxy(cluster, namespace):
    """Every object of every namespaced kind the API lists (records left out: a namespace of 1,000
    claims holds some 8,000 Events, 17 pages read one after another), metadata only, through one
    `kubectl proxy`: discovery and the lists in parallel, 500 a page (`kubectl get k1,k2,...` sends them
    one after another, whole objects: 12 s at 1,000 claims with 100 ms a request). (items with
    kind and apiVersion, lines for the kinds that could not be listed, each listed kind's
    Resource), or None when the channel has no proxy or it failed (the caller then asks kubectl)."""
    if not cluster.api.serves:
        return None
    proxy = cluster.api.proxy

    def get_json(path, accept="application/json"):
        status, body = proxy.request("GET", path, headers={"Accept": accept})
        if status != 200:
            raise ProxyAnswer(status, body)
        return json.loads(body)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=API_PROXY_IN_FLIGHT) as pool:
            group_versions = ["/api/v1"] + ["/apis/" + group["preferredVersion"]["groupVersion"]
                                            for group in get_json("/apis").get("groups") or []]
            kinds = []
            for path, listing in zip(group_versions, pool.map(get_json, group_versions)):
                kinds += [(path, resource["name"], resource["kind"], listing["groupVersion"])
                          for resource in listing.get("resources") or []
                          if resource.get("namespaced") and "/" not in resource["name"]
                          and "list" in (resource.get("verbs") or []) and resource["kind"] not in RECORD_KINDS]

            # the listing's equal parts (10,000 pods' labels, owner, managers) held once: only read
            parts = SharedParts()

            def list_kind(kind):
                path, resource, kind_name, api_version = kind
                return [dict(item, kind=kind_name, apiVersion=api_version)
                        for page in list_pages(proxy, "%s/namespaces/%s/%s" % (path, namespace, resource),
                                               headers={"Accept": METADATA_ONLY}, decode=parts.decode)
                        for item in page.get("items") or []], None
            items, unlisted, resources = [], [], {}
            for kind, outcome in zip(kinds, pool.map(lambda kind: catching(list_kind, kind), kinds)):
                if isinstance(outcome, ProxyAnswer):
                    unlisted.append("%s: HTTP %d: %s" % (kind[1], outcome.status, outcome.message))
                else:
                    items += outcome[0]
                    resources[(kind[3], kind[2])] = Resource(kind[2], kind[3], kind[1])
        return items, unlisted, resources
    except (ProxyUnavailable, ProxyAnswer, ValueError, KeyError, TypeError) as error:
        cluster.console.note("listing the namespace through `kubectl proxy` failed (%s); asking kubectl" % error)
        return None


def catching(function, argument):
    """function(argument), or the ProxyAnswer it raised (for pool.map)."""
    try:
        return function(argument)
    except ProxyAnswer as answer:
        return answer


def not_created_by_run(items, run_id, used=frozenset()):
    """[(kind, name, resource for kubectl delete)], sorted: the objects among `items` that the run
    did not create: not labelled with its run id, not owned (through ownerReferences, at any
    depth) by an object that is, not a record or what every namespace has (made_by_the_cluster),
    not one the run went through (`used`, {(kind, name)}: Gate.used_in_namespace). However soon
    after the namespace it appeared, anything else is someone's (a colleague's ConfigMap, a policy
    controller's RoleBinding). Nor an object already going: being deleted (deletionTimestamp), or whose
    controller owner, or every owner, is gone (the garbage collector deletes it), e.g. a finished
    step's Sandbox and pod in a kept pool's namespace, or what a node agent made for that pod (kwok's
    Exec and Logs on the real-control-plane tier): deleting the namespace destroys no one's work there."""
    owned = {item["metadata"].get("uid") for item in items
             if (item["metadata"].get("labels") or {}).get(RUN_LABEL) == run_id}
    while True:
        more = {item["metadata"].get("uid") for item in items if item["metadata"].get("uid") not in owned and any(
            ref.get("uid") in owned for ref in item["metadata"].get("ownerReferences") or [])}
        if not more:
            break
        owned |= more
    present = {item["metadata"].get("uid") for item in items}
    foreign = []
    for item in items:
        meta, kind = item["metadata"], item.get("kind", "")
        if meta.get("uid") in owned or kind in RECORD_KINDS or made_by_the_cluster(kind, meta) or \
                (kind, meta["name"]) in used:
            continue
        owners = meta.get("ownerReferences") or []
        controller = next((ref for ref in owners if ref.get("controller")), None)
        if meta.get("deletionTimestamp") or (controller is not None and controller.get("uid") not in present) or \
                (owners and all(ref.get("uid") not in present for ref in owners)):
            continue
        group = item.get("apiVersion", "v1").rpartition("/")[0]
        foreign.append((kind, meta["name"], kind.lower() + ("." + group if group else "")))
    return sorted(set(foreign))


def made_by_the_cluster(kind, meta):
    """Whether an object is one Kubernetes puts into every namespace (EVERY_NAMESPACE_HAS), by its
    kind, name and the managers of its fields: none listed, or only the expected ones."""
    expected = EVERY_NAMESPACE_HAS.get((kind, meta.get("name")))
    if expected is None:
        return False
    return {field.get("manager") for field in meta.get("managedFields") or []} <= expected


def foreign_refusal(context, namespace, foreign):
    """The line that stops a cleanup: each foreign object, and the two ways forward."""
    named = some_of(["%s %s" % (kind, name) for kind, name, _ in foreign])
    kind, name, resource = foreign[0]
    return ("namespace %s holds %d object(s) this run did not create: %s; deleting the namespace would delete "
            "them too, so cleanup refuses. Move or delete them yourself (e.g. `kubectl --context %s -n %s delete "
            "%s %s`), or run cleanup again with --delete-foreign to delete them with the run"
            % (namespace, len(foreign), named, context, namespace, resource, name))


def sent_entry(kind, name):
    """How receipt.json's "sent" names a create sent before its answer came: "Job/rollout"."""
    return "%s/%s" % (kind, name)


def adopt_unconfirmed(cluster, receipt, output, kind, live, key, yourself):
    """The UID of `live`, an object the receipt names but whose create was never answered (a signal,
    a lost connection): adopted when the receipt says this run sent its create ("sent") and it
    carries the run's id label, then recorded under `key`, a path into the receipt (("uid",),
    ("jobs", NAME)); receipt.json is rewritten when the receipt is a folder's, so that every later
    check is the usual UID check. Otherwise refused,
    naming what is missing; `yourself` is the advice for a person."""
    name = live["metadata"]["name"]
    have = (live["metadata"].get("labels") or {}).get(RUN_LABEL)
    if sent_entry(kind, name) not in (receipt.get("sent") or []):
        why = "receipt.json records no uid for it and does not record its create as sent by this run"
    elif have != receipt["run_id"]:
        why = ("its create was sent but never confirmed, and its label %s must equal %s: current value is %s"
               % (RUN_LABEL, receipt["run_id"], have))
    else:
        why = None
    if why is not None:
        raise DemoError("%s %s exists in %s but %s, so ownership cannot be proven; refusing cleanup: %s"
                        % (kind, name, receipt["namespace"], why, yourself))
    uid = live["metadata"]["uid"]
    *parents, last = key
    place = receipt
    for part in parents:
        place = place.setdefault(part, {})
    place[last] = uid
    cluster.console.note("%s %s: its create was sent and never answered; it carries this run's label, so it is "
                         "this run's (uid %s, recorded as %s)" % (kind, name, uid, ".".join(key)))
    if output is not None:
        write_json(output / "receipt.json", receipt)
    return uid


def cleanup_receipt(receipt, source, output, console, delete_foreign=False):
    """Cleanup from a receipt read from `source`; `output` is its run's folder, None for a
    receipt given on its own: whatever its backend does to clean up (Backend.cleanup)."""
    backend = backend_named(receipt.get("backend"), str(source))
    return backend.cleanup(receipt, source, output, console, delete_foreign)


def cleanup_namespace(receipt, source, output, console, delete_foreign=False):
    """A cluster run's cleanup (ClusterBackend.cleanup): its namespace and what its backend made
    there, each proven against the receipt first. Objects in the namespace that the run did not
    create stop it, unless delete_foreign."""
    backend = backend_named(receipt.get("backend"), str(source))
    try:
        context, namespace, _ = receipt["context"], receipt["namespace"], receipt["run_id"]
    except (KeyError, TypeError):
        raise DemoError("%s lacks context, namespace or run_id; refusing cleanup" % source) from None
    if not str(namespace).startswith(NAMESPACE_PREFIX):
        raise DemoError("%s names namespace %s, which this tool never creates (its namespaces are %s<run id>); "
                        "refusing cleanup: check where the receipt came from" % (
                            source, namespace, NAMESPACE_PREFIX))
    with connected(console, context) as cluster:
        return delete_namespace_of(cluster, backend, receipt, output, delete_foreign)


def delete_namespace_of(cluster, backend, receipt, output, delete_foreign):
    """cleanup_namespace once its channel is open: every check, then every delete, then the wait."""
    console, namespace, run_id = cluster.console, receipt["namespace"], receipt["run_id"]
    live = cluster.api.get(NAMESPACES, namespace)
    if live is None:
        console.tell("The run's namespace is already gone: %s" % namespace)
        return EXIT_OK
    if not receipt.get("uid"):
        # The run stopped while the namespace's create was unanswered: its name is the receipt's,
        # and it is adopted only if the receipt says the create was sent and it carries the run id.
        adopt_unconfirmed(cluster, receipt, output, "Namespace", live, ("uid",),
                          "delete it yourself with `kubectl --context %s delete namespace %s`"
                          % (cluster.context, namespace))
    problems = ownership_mismatches("namespace " + namespace, live,
                                    {"uid": receipt["uid"], "label " + RUN_LABEL: run_id})
    if problems:
        raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))
    if live["metadata"].get("deletionTimestamp"):
        # Already Terminating (an interrupted cleanup, another cleanup, a committed retry): the
        # deletion of this very namespace is under way, so waiting for it is the whole job.
        console.note("Namespace %s is already being deleted; waiting for it to go..." % namespace)
        return wait_for_namespace(cluster, namespace)
    listing = list_namespace(cluster, namespace)
    busy = backend.busy(receipt, listing)
    if busy and not delete_foreign:
        raise DemoError(busy)
    used = set().union(*(gate.used_in_namespace(receipt) for gate in GATES))
    foreign = not_created_by_run(listing.items, run_id, used)
    if foreign and not delete_foreign:
        raise DemoError(foreign_refusal(cluster.context, namespace, foreign))
    for kind, name, kubectl_name in foreign:
        console.note("Deleting %s %s, which this run did not create (--delete-foreign)..." % (kind, name))
        version = next(item.get("apiVersion") for item in listing.items
                       if item.get("kind") == kind and item["metadata"]["name"] == name)
        # The listing's Resource (discovery named its plural) where it came through the proxy;
        # else kubectl's own name for the kind, through kubectl
        resource = listing.resources.get((version, kind))
        if resource is not None:
            cluster.api.delete(resource, name, namespace)
        else:
            deletion = Deletion(Resource(kind, version, kubectl_name.split(".")[0]), namespace, name)
            cluster.retrying("delete %s %s" % (kubectl_name, name), lambda: cluster.api.kubectl_delete(deletion))
    owned = listing.without(foreign)
    backend.delete_objects(cluster, namespace, run_id, receipt, output, owned)
    try:
        cluster.api.delete(NAMESPACES, namespace)
    except KubectlError as error:
        # A second DELETE of a Terminating namespace is refused with 409 Conflict
        # (tests/fakecluster/ASSUMPTIONS.md, fact 24); its UID was checked above, so its
        # deletion is in progress: wait for it.
        if not error.conflict or "ensuring all content is removed" not in error.stderr:
            raise
    console.note("Deleting namespace %s..." % namespace)
    sweep_namespace(cluster, namespace, owned)
    return wait_for_namespace(cluster, namespace, cleanup_wait_seconds(len(listing.items)))


def sweep_namespace(cluster, namespace, listing):
    """Once the run's namespace is Terminating (nothing new can be made in it: NamespaceLifecycle
    admission), the objects cleanup listed there and proved, when there are SWEEP_OBJECTS or
    more, deleted at once (delete_listed_at_once): what the namespace's deletion deletes anyway,
    sooner. The namespace controller deletes a namespace's content kind by kind, each collection
    one object at a time (kube-apiserver's --delete-collection-workers is 1), and the garbage
    collector deletes the Sandboxes of deleted claims at the controller manager's client rate (20
    a second): 1,000 claims' namespace (2,000 Sandboxes and pods with the pool's refill) took
    106 s. Whatever this does not delete, the namespace controller still does."""
    items = [item for item in listing.items if not item["metadata"].get("deletionTimestamp")
             and item["metadata"].get("uid") not in listing.swept]
    if len(items) >= SWEEP_OBJECTS:
        delete_listed_at_once(cluster, namespace, listing, items, "Deleting its %d objects at once...")


def delete_listed_at_once(cluster, namespace, listing, items, saying):
    """The listed `items` (of kinds whose Resource the listing knows), each deleted by name on its
    uid, at once (ApiChannel.delete_all); `saying` (with their count) is noted first. Best effort:
    what is not deleted here is left to the namespace's deletion."""
    deletions = [Deletion(listing.resources[(item.get("apiVersion"), item.get("kind"))], namespace,
                          item["metadata"]["name"], uid=item["metadata"]["uid"])
                 for item in items if (item.get("apiVersion"), item.get("kind")) in listing.resources
                 and item["metadata"].get("uid")]
    if not deletions or not cluster.api.serves:
        return
    listing.swept.update(deletion.uid for deletion in deletions)
    cluster.console.note(saying % len(deletions))
    cluster.api.delete_all(deletions, best_effort=True)


def delete_recorded_jobs(cluster, namespace, receipt, output, listing):
    """Every Job in the namespace must be one the receipt names by UID (or one whose create it
    recorded as sent, adopted by its run label); then each is deleted with its pods, and waited for."""
    # Every key that names a Job's UID must agree with the live Job, each said by name (Helm's
    # ownership check): `jobs` (every Job of the run) and `job_uid` (the tutorial's key, rollout).
    recorded = {name: {"uid (receipt jobs.%s)" % name: uid} for name, uid in (receipt.get("jobs") or {}).items()}
    if receipt.get("job_uid"):
        recorded.setdefault(JOB_NAME, {})["uid (receipt job_uid)"] = receipt["job_uid"]
    live_jobs = listing.of_kind("Job")
    if live_jobs is None:
        live_jobs = cluster.api.list(JOBS, namespace)
    problems = []
    for live_job in live_jobs:
        name = live_job["metadata"]["name"]
        if not any((recorded.get(name) or {}).values()):
            uid = adopt_unconfirmed(cluster, receipt, output, "Job", live_job, ("jobs", name),
                                    "check it and delete it yourself with `kubectl --context %s -n %s delete job %s`"
                                    % (cluster.context, namespace, name))
            recorded[name] = {"uid (adopted)": uid}
        for key, want in recorded[name].items():
            have = live_job["metadata"].get("uid")
            if have != want:
                problems.append("job %s %s must equal %s: current value is %s" % (name, key, want, have))
    if problems:
        raise DemoError("ownership check failed, refusing cleanup: " + "; ".join(problems))
    for live_job in live_jobs:
        name = live_job["metadata"]["name"]
        cluster.api.delete(JOBS, name, namespace, propagation="Foreground")
        cluster.console.note("Deleting Job %s and its pods..." % name)
    # The foreground deletion waits for the garbage collector to delete each pod, at the controller
    # manager's 20 requests a second: from SWEEP_OBJECTS pods on, cleanup deletes them itself.
    deleted = {job["metadata"].get("uid") for job in live_jobs}
    pods = [item for item in listing.items if item.get("kind") == "Pod" and any(
        owner.get("uid") in deleted for owner in item["metadata"].get("ownerReferences") or [])]
    if len(pods) >= SWEEP_OBJECTS:
        delete_listed_at_once(cluster, namespace, listing, pods, "Deleting the Jobs' %d pods at once...")
    if live_jobs:
        cluster.api.wait_until_gone("Jobs or their pods in %s" % namespace, JOBS, namespace,
                                    timeout=cleanup_wait_seconds(len(listing.items)))


def wait_for_namespace(cluster, namespace, wait=CLEANUP_WAIT_SECONDS):
    """Until the namespace is gone (ApiChannel.wait_until_gone: a watch wakes it, a read decides,
    the timeout named)."""
    cluster.api.wait_until_gone("Namespace %s (inspect its finalizers)" % namespace, NAMESPACES, name=namespace,
                                timeout=wait)
    cluster.console.tell("Deleted the run's namespace: %s" % namespace)
    return EXIT_OK


def add_cleanup_parser(commands):
    """`cleanup`'s arguments."""
    cleanup = commands.add_parser("cleanup", help="delete what one run created, after checking "
                                                  "ownership against its receipt.json",
                                  description="Delete what each run created, after checking ownership against "
                                              "its receipt.json.")
    cleanup.add_argument("folders", nargs="*", metavar="DIR", help="the runs' output folders (as for report)")
    cleanup.add_argument("--output", metavar="DIR", nargs="+", help="the same as DIR (kept for scripts)")
    cleanup.add_argument("--receipt", metavar="FILE",
                         help="a receipt on its own (`-`: from stdin), e.g. the one a run prints when its "
                              "output folder failed")
    cleanup.add_argument("--delete-foreign", action="store_true",
                         help="also delete objects in the run's namespace that the run did not create "
                              "(without it, cleanup names them and refuses)")
    cleanup.set_defaults(subparser=cleanup)


def add_report_parser(commands):
    """`report`'s arguments."""
    report = commands.add_parser("report", help="compare saved runs side by side (no cluster needed)",
                                 description="Print one table for saved output folders, a column each, every "
                                             "figure with its ratio to the first column's (above 1: slower).")
    report.add_argument("folders", nargs="+", metavar="DIR", help="output folders with results.json")
    report.add_argument("--label", action="append", metavar="TEXT",
                        help="column label, once per folder in order (default: the folder names)")
    report.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    report.add_argument("--timeline", metavar="FILE.svg", help="also write one timeline stacking every run")
    report.set_defaults(subparser=report)


def add_list_parser(commands):
    """`list`'s arguments."""
    listing = commands.add_parser("list", help="list the runs of this tool on a context, and the local "
                                               "receipts that name them")
    listing.add_argument("--search", metavar="DIR", nargs="+",
                         help="folders holding output folders, searched for receipts (default: .)")
    listing.add_argument("--context", metavar="NAME",
                         help="kubectl context (default: kubectl's current context)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(subparser=listing)


def cmd_report(args, console):
    if len(args.folders) == 1 and (Path(args.folders[0]) / COMPARE_FILE).exists():
        # a comparison's folder: its figures recomputed from the batches' results (same seed, same draws)
        folder = Path(args.folders[0])
        record = read_json(folder / COMPARE_FILE, "the comparison record", keys=("arms", "rounds", "seed", "completed"))
        result = comparison(compare_rounds(folder, record), record["seed"], record.get("resamples", COMPARE_RESAMPLES))
        result.update(order=record["order"], completed=record["completed"], status=record.get("status"))
        console.say(json.dumps(result, indent=2) if args.json else "\n".join(comparison_lines(result)))
        return EXIT_OK
    labels = args.label or [Path(folder).name or str(folder) for folder in args.folders]
    columns = []
    for label, folder in zip(labels, args.folders):
        path = Path(folder) / "results.json"
        if not Path(folder).is_dir():
            raise DemoError("no such folder: %s (give the output folders of runs, e.g. the --output of `run`)"
                            % folder)
        if not path.exists():
            if (Path(folder) / COMPARE_FILE).exists():
                raise DemoError("%s is a comparison's folder: `%s report %s` alone recomputes its figures; a column "
                                "of a table is one of its batches, %s/ARM/round-N" % (folder, invocation(), folder,
                                                                                     folder))
            if (Path(folder).parent / COMPARE_FILE).exists() and (Path(folder) / "round-1").is_dir():
                raise DemoError("%s is an arm of the comparison in %s: its batches are %s/round-N; `%s report %s` "
                                "compares the arms" % (folder, Path(folder).parent, folder, invocation(),
                                                       Path(folder).parent))
            raise DemoError("%s has no results.json (the run failed, was interrupted, or is not an output "
                            "folder)" % folder)
        columns.append((label, read_json(path, "the results", keys=RESULT_KEYS)))
        if not isinstance(columns[-1][1]["pods"], list) or not isinstance(columns[-1][1]["phases"], dict):
            raise DemoError("%s is not the results of rl-batch-demo: its pods or phases have the wrong shape" % path)
    table = report_table(columns)
    if args.timeline:
        drawable = [(label, results) for label, results in columns if timeline_drawable(results)]
        if not drawable:
            raise DemoError("no episode of these runs ran, so --timeline has nothing to draw: leave it out")
        try:
            Path(args.timeline).write_text(timeline_svg(drawable))
        except OSError as error:
            raise DemoError("cannot write the timeline to %s: %s" % (args.timeline, error.strerror or error)) from None
    console.say(json.dumps(table, indent=2) if args.json else report_markdown(table), end="" if not args.json else "\n")
    return EXIT_OK


RESULT_KEYS = ("episodes", "successful_episodes", "reward_sum", "phases", "pods", "parallelism", "runtime")


RECEIPT_SEARCH_DEPTH = 4  # `list --search DIR`: DIR and its subfolders this many levels down


def find_receipts(folders, skipped=None):
    """({namespace: (folder, receipt)}, [(folder, receipt) of runs of backends without a cluster])
    for every receipt.json in the folders and their subfolders (RECEIPT_SEARCH_DEPTH levels down,
    hidden folders skipped: a training loop's steps/step-N). A receipt.json that is not a run's
    receipt is appended to `skipped` as (path, why)."""
    found, off_cluster = {}, []
    for folder in folders:
        folder = Path(folder)
        paths = []
        for root, dirs, files in os.walk(folder):
            depth = len(Path(root).relative_to(folder).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < RECEIPT_SEARCH_DEPTH else []
            if "receipt.json" in files:
                paths.append(Path(root) / "receipt.json")
        for path in sorted(paths):
            try:
                receipt = json.loads(path.read_text())
                if not BACKENDS.get(receipt.get("backend"), UNNAMED_BACKEND).uses_cluster:
                    off_cluster.append((path.parent, receipt))
                    continue
                found[receipt["namespace"]] = (path.parent, receipt)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
                if skipped is not None:
                    skipped.append((path, getattr(error, "strerror", None) or (
                        "no %s" % error if isinstance(error, KeyError) else
                        "not JSON" if isinstance(error, ValueError) else "not a receipt's JSON object")))
    return found, off_cluster


def off_cluster_row(folder, receipt, now):
    """One line of `list` for a run of a backend without a cluster, from its folder alone."""
    backend = backend_named(receipt.get("backend"), str(folder / "receipt.json"))
    try:
        started = parse_k8s_time(read_saved(folder / "run.json")["started_at"])
    except (OSError, ValueError, TypeError, KeyError):
        started = now
    return {"namespace": None, "run_id": receipt.get("run_id"), "backend": backend.name,
            "age_seconds": int(now - started), "state": backend.off_cluster_state(folder, receipt),
            **results_counts(folder), "receipt": str(folder)}


def results_counts(folder):
    """A run's episodes done and failed, from its results.json (None when there is none)."""
    try:
        results = read_saved(folder / "results.json") if folder is not None else None
    except (OSError, ValueError):
        results = None
    if not isinstance(results, dict) or not isinstance(results.get("episodes"), int) or \
            not isinstance(results.get("successful_episodes"), int):
        return {"completions": None, "succeeded": None, "failed": None, "counts_from": None}
    return {"completions": results["episodes"], "succeeded": results["successful_episodes"],
            "failed": results["episodes"] - results["successful_episodes"], "counts_from": "results.json"}


def run_row(namespace, objects, receipts, now):
    """One line of `list`: what the cluster says about a run (`objects`, as its backend's
    list_objects read them: all its Jobs, rounds and prewarm too, and what else it made), what
    its backend adds (list_fields), and which receipt names it."""
    meta = namespace["metadata"]
    name = meta["name"]
    backend = backend_named((meta.get("labels") or {}).get(BACKEND_LABEL), "namespace %s's label %s" % (
        name, BACKEND_LABEL))
    state = "Terminating" if meta.get("deletionTimestamp") else backend.list_state(objects)
    receipt, folder = "-", None
    if name in receipts:
        found, saved = receipts[name]
        receipt = str(found)
        if saved.get("uid") != meta.get("uid"):
            receipt += " (uid differs: not this namespace)"
        else:
            folder = found
    return {"namespace": name, "run_id": meta.get("labels", {}).get(RUN_LABEL), "backend": backend.name,
            "age_seconds": int(now - parse_k8s_time(meta["creationTimestamp"])), "state": state,
            **backend.list_fields(objects, folder), "receipt": receipt}


def human_age(seconds):
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return "%d%s" % (seconds // size, unit)
    return "%ds" % seconds


def cmd_list(args, console):
    """The runs of this tool: those on the context (their namespaces, through kubectl), and the
    runs of backends without a cluster whose receipts the search finds (no kubectl needed).

    Where there is no cluster to ask (no kubectl, no kubeconfig, no current context, and no
    --context), that is no error: the runs found here are listed with a warning, in an empty
    folder too. A context that is named or current but cannot be listed is one: what was found
    here is still printed, then the error (exit 1), so that a script looking for leftovers never
    takes an unreachable cluster for a clean one."""
    skipped = []
    search = args.search or ["."]
    receipts, off_cluster = find_receipts(search, skipped)
    for path, why in skipped:
        console.warn("skipped %s: not a receipt of %s (%s)" % (path, TOOL_NAME, why))
    now = time.time()
    rows = [off_cluster_row(folder, receipt, now) for folder, receipt in off_cluster]
    context, runner, unlisted = None, Kubectl(console), None
    try:
        try:
            context = args.context or runner.current_context()
        except DemoError as error:  # no cluster to ask
            console.warn("runs on a cluster not listed: %s" % error)
        if context is not None:
            try:
                cluster = connect(runner, runner.existing_context(context) if args.context else context)
                for ns in cluster.api.list(NAMESPACES, selector=RUN_LABEL):
                    backend = backend_named(ns["metadata"].get("labels", {}).get(BACKEND_LABEL))
                    rows.append(run_row(ns, backend.list_objects(cluster, ns["metadata"]["name"]), receipts, now))
            except DemoError as error:
                unlisted = error
    finally:
        runner.stop_background()
    if args.json:
        console.say(json.dumps(rows, indent=2))
    elif not rows and unlisted is None:
        console.say("No runs of %s on context %s." % (TOOL_NAME, context) if context else
                    "No runs of %s in %s (none on a cluster could be listed: see the warning)." % (
                        TOOL_NAME, ", ".join(search)))
    elif rows:
        table = [("NAMESPACE", "AGE", "STATE", "EPISODES", "RECEIPT")]
        for row in rows:
            table.append((row["namespace"] or "-", human_age(row["age_seconds"]), row["state"],
                          backend_named(row["backend"]).episodes_cell(row), row["receipt"]))
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
        for line in table:
            console.say("   ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    if unlisted is not None:
        raise DemoError("runs on context %s not listed%s: %s" % (
            context, " (the %d found here are above)" % len(rows) if rows else "", unlisted))
    return EXIT_OK


# ============================================================================
# Compare: arms run interleaved, bootstrap intervals, a verdict only where the data carries one
# ============================================================================
# `compare --arm A='OPTIONS' --arm B='OPTIONS' [shared run options] --rounds R --output DIR`
# runs every arm's batch R times, interleaved (round 1: A B, round 2: B A, ...; the first
# round's order seeded), so that a drift in the cluster's load spreads over every arm. Each
# batch is a full `run` in DIR/<arm>/round-N/ (its own receipt, cleaned up after it). The
# figures: per arm and metric the pooled value and a percentile-bootstrap 95% interval that
# resamples rounds, then episodes within them (so the interval holds round-to-round variation,
# not only episode noise); per pair of arms the ratio and its interval; a verdict only where
# the interval stays on one side of 1 (and the difference is not below the figure's
# resolution). comparison.json and comparison.svg are recomputed from the folder by `report DIR`.

COMPARE_FILE = "compare.json"  # the comparison's record: arms, order, seed, what completed
COMPARISON_FILE = "comparison.json"  # the figures, intervals and verdicts
COMPARE_RESAMPLES = 2000
COMPARE_LEVEL = 0.95
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
ARM_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")


def interleaved_order(arms, rounds, seed):
    """[(round, arm)] in the order the batches run: every arm once a round, the order reversed
    every other round (A B, B A, A B, ...), the first round's order drawn with `seed`."""
    first = list(arms)
    random.Random(seed).shuffle(first)
    return [(number, arm) for number in range(1, rounds + 1)
            for arm in (first if number % 2 == 1 else first[::-1])]


def comparison_metrics(arms):
    """The figures a decision turns on, for {arm: [results.json of each completed round]}: [{key,
    label, level ("episode": one value per episode, "round": one per batch), q (the quantile of
    an episode metric), resolution (seconds; the coarsest of the arms'), values {arm: [per
    round: [episode values] or value]}}]; only those every arm has."""
    metrics = []

    def add(key, label, level, q, resolution, extract, unit="s"):
        values = {arm: [extract(results) for results in rounds] for arm, rounds in arms.items()}
        if level == "episode":
            values = {arm: [v for v in per_round if v] for arm, per_round in values.items()}
        else:
            values = {arm: [v for v in per_round if isinstance(v, (int, float))] for arm, per_round in values.items()}
        if all(values.values()):
            metrics.append({"key": key, "label": label, "level": level, "q": q, "resolution": resolution,
                            "unit": unit, "values": values})

    every = [results for rounds in arms.values() for results in rounds]
    startups = sorted({backend_of(results).scheme.startup_metric for results in every})

    def label_of(name, kind=None):
        """The arms' label of a phase (`name`, or each arm's startup metric): one when they agree, else
        each arm's after `kind` ("startup (local: process launched -> ready; job: pod created -> ready)")."""
        labels = {arm: phase_label(rounds[0], name or backend_of(rounds[0]).scheme.startup_metric)
                  for arm, rounds in arms.items() if rounds}
        if len(set(labels.values())) == 1:
            return next(iter(labels.values()))
        return "%s (%s)" % (kind or name, "; ".join("%s: %s" % item for item in labels.items()))
    startup = label_of(None, "startup")
    for q in (0.5, 0.95):
        add("startup_p%d" % round(q * 100), "%s P%d" % (startup, round(q * 100)), "episode", q,
            max(startup_resolution(r) for r in every),
            lambda results: [row.get(backend_of(results).scheme.startup_metric + "_seconds") for row in results["pods"]
                             if isinstance(row.get(backend_of(results).scheme.startup_metric + "_seconds"),
                                           (int, float))])
    for key, label in (("batch_to_all_ready_seconds", "batch all ready"),
                       ("batch_to_all_rewards_seconds", "batch all rewards")):
        add(key, label, "round", None, max(1.0 if backend_of(r).api_timestamps and key in backend_of(r).coarse_batch_keys
                                           else 1e-6 for r in every), lambda results, key=key: results.get(key))
    shared = set.intersection(*(set(r.get("phases") or {}) for r in every))
    for phase in sorted(shared - set(startups), key=lambda name: list(every[0]["phases"]).index(name)):
        add("phase." + phase, "%s P50" % label_of(phase), "episode", 0.5,
            max(r["phases"][phase].get("resolution_seconds") or 1e-6 for r in every),
            lambda results, phase=phase: [row["phases"][phase] for row in results["pods"]
                                          if isinstance((row.get("phases") or {}).get(phase), (int, float))])
    add("cost.per_reward.cpu_seconds", "reserved CPU per reward", "round", None, 1e-6,
        lambda results: lookup(results, "cost.per_reward.cpu_seconds"), unit="CPU-s")
    return metrics


def startup_resolution(results):
    metric = backend_of(results).scheme.startup_metric
    return (results.get("phases") or {}).get(metric, {}).get("resolution_seconds") or 1e-6


def metric_statistic(metric, per_round):
    """A metric's figure over the rounds given: the quantile of every episode pooled, or the
    mean of the batches' values."""
    if metric["level"] == "episode":
        pooled = [value for values in per_round for value in values]
        return percentile(pooled, metric["q"]) if pooled else None
    return statistics.fmean(per_round) if per_round else None


def bootstrap_statistics(metric, per_round, rng, resamples):
    """The metric's figure over `resamples` resamples: rounds drawn with replacement, then (for
    an episode metric) each drawn round's episodes drawn with replacement."""
    drawn = []
    for _ in range(resamples):
        rounds = [per_round[rng.randrange(len(per_round))] for _ in per_round]
        if metric["level"] == "episode":
            rounds = [[values[rng.randrange(len(values))] for _ in values] for values in rounds]
        drawn.append(metric_statistic(metric, rounds))
    return drawn


def interval(values, level=COMPARE_LEVEL):
    """The percentile interval of bootstrap values (None where a value is None)."""
    known = [value for value in values if value is not None]
    if not known:
        return None, None
    return percentile(known, (1 - level) / 2), percentile(known, 1 - (1 - level) / 2)


def at_resolution(value, resolution):
    """A figure rounded to what its clock can tell (whole seconds for API times)."""
    if value is None or resolution < 1:
        return value
    return round(value / resolution) * resolution


def comparison(arms, seed, resamples=COMPARE_RESAMPLES):
    """comparison.json's figures for {arm: [results of each completed round]}: per arm and
    metric the value and its interval, per pair of arms the ratio, its interval and the verdict."""
    rng = random.Random(seed)
    figures = {arm: {"rounds": len(arms[arm])} for arm in arms if arms[arm]}
    # an arm none of whose batches has a successful episode has no figure: it is named, and the
    # other arms are still measured
    for arm in figures:
        if not any(results.get("successful_episodes") for results in arms[arm]):
            figures[arm]["no_samples"] = first_failure(arms[arm])
        rows = [row for results in arms[arm] for row in results.get("pods") or []]
        figures[arm]["sandbox_kernel"] = {key: value for key, value in isolation_summary(
            rows, arms[arm][0].get("runtime")).items() if key in ("verdict", "kernels_reported", "node_kernels", "finding")}
    names = [arm for arm in figures if "no_samples" not in figures[arm]]
    pairs = []
    for metric in comparison_metrics({arm: arms[arm] for arm in names}) if names else []:
        by_arm, draws = metric_figures(metric, names, rng, resamples)
        for arm in names:
            figures[arm][metric["key"]] = by_arm[arm]
        for position, first in enumerate(names):
            for second in names[position + 1:]:
                pairs.append(pair_verdict(metric, first, second, by_arm, draws))
    return {"method": {"interval": "%d%% percentile bootstrap" % round(COMPARE_LEVEL * 100),
                       "resampling": "rounds with replacement, then the episodes of each drawn round with "
                                     "replacement (episode metrics); rounds with replacement (batch metrics)",
                       "episode_figure": "the quantile of the pooled episodes (linear interpolation, as results.json)",
                       "batch_figure": "the mean over the rounds",
                       "resamples": resamples, "seed": seed,
                       "resolution": "a figure and its interval are rounded to the resolution of its clock; a "
                                     "difference below it is no difference shown"},
            "arms": figures, "pairs": pairs}


def first_failure(rounds):
    """The first reason an arm's batches gave no sample: an infrastructure failure's, or a count."""
    for results in rounds:
        for failure in results.get("infrastructure_failures") or []:
            return "episode %s: %s" % (failure.get("index"), failure.get("reason"))
    return "no successful episode in %d batch(es)" % len(rounds)


def metric_figures(metric, names, rng, resamples):
    """One metric for each arm: ({arm: its figure, interval and size}, {arm: its bootstrap draws})."""
    figures, draws = {}, {}
    resolution = metric["resolution"]
    for arm in names:
        values = metric["values"][arm]
        draws[arm] = bootstrap_statistics(metric, values, rng, resamples)
        low, high = interval(draws[arm])
        figures[arm] = {"label": metric["label"], "value": at_resolution(metric_statistic(metric, values), resolution),
                        "low": at_resolution(low, resolution), "high": at_resolution(high, resolution),
                        "unit": metric["unit"], "resolution_seconds": resolution,
                        "episodes" if metric["level"] == "episode" else "batches":
                        sum(len(v) for v in values) if metric["level"] == "episode" else len(values)}
    return figures, draws


def pair_verdict(metric, first, second, figures, draws):
    """The ratio second/first of one metric (figures and draws of metric_figures) with its
    interval, and the one line a person acts on."""
    a, b = (metric_statistic(metric, metric["values"][arm]) for arm in (first, second))  # not yet rounded
    ratios = [y / x for x, y in zip(draws[first], draws[second]) if x and y is not None]
    low, high = interval(ratios)
    entry = {"metric": metric["key"], "label": metric["label"], "a": first, "b": second,
             "ratio": b / a if a and b is not None else None, "low": low, "high": high}
    resolution = metric["resolution"]
    if entry["ratio"] is None or low is None:
        entry["verdict"] = "%s: no ratio (%s is 0 or unknown)" % (metric["label"], first)
    elif resolution >= 1 and abs(b - a) < resolution:
        entry["verdict"] = "%s: no difference shown at this figure's resolution (%g s): %s %s s, %s %s s" % (
            metric["label"], resolution, first, format_figure(figures[first]["value"]), second,
            format_figure(figures[second]["value"]))
    elif low > 1 or high < 1:
        digits = 2 if round(low, 2) != round(high, 2) or round(low, 2) != 1 else 4  # 1.0003x, not 1.00x
        entry["verdict"] = "%s: %s is %.*fx %s (%.*f-%.*fx)" % (metric["label"], second, digits, entry["ratio"],
                                                               first, digits, low, digits, high)
    else:
        entry["verdict"] = "%s: no difference shown between %s and %s (%.2f-%.2fx); more rounds would tell" % (
            metric["label"], second, first, low, high)
    return entry


def format_figure(value):
    return "%.3g" % value if value is not None else "n/a"


ARM_DASHES = ("", "7 3", "2 2", "9 3 2 3", "4 4", "1 3")  # with the colour: arms apart in grey print too
COMPARISON_WIDTH, COMPARISON_LEFT, COMPARISON_RIGHT, COMPARISON_PLOT_HEIGHT = 820, 86, 24, 170


def comparison_svg(arms, result):
    """comparison.svg: per episode metric, each arm's empirical CDF (a line per arm) with the 95%
    interval of its P50 (and the startup metric's P95) as a band on it, and each arm's figures in
    words above the plot: a person reads the comparison from the picture alone."""
    # one panel per distribution: the startup metric's P50 and P95 bands share one
    metrics = [m for m in comparison_metrics({arm: rounds for arm, rounds in arms.items() if rounds})
               if m["level"] == "episode" and m["key"] != "startup_p95"]
    panels = []
    for metric in metrics:
        figures = {}
        for arm in metric["values"]:
            if metric["key"].startswith("startup_"):
                figures[arm] = {q: result["arms"][arm].get("startup_p%d" % round(q * 100)) for q in (0.5, 0.95)}
            else:
                figures[arm] = {0.5: result["arms"][arm].get(metric["key"])}
        panels.append({"name": metric["label"].rsplit(" P", 1)[0], "figures": figures, "values": {
            arm: sorted(v for per_round in rounds for v in per_round) for arm, rounds in metric["values"].items()}})
    return comparison_picture(panels, {arm: figures["rounds"] for arm, figures in result["arms"].items()})


def comparison_picture(panels, rounds):
    """The SVG of comparison_svg's panels ([{name, values {arm: sorted seconds}, figures {arm: {q:
    figure with value, low, high}}}]) for arms of `rounds` {arm: rounds}: a legend above every
    panel, never over a band; axes with their quantities and ticks at round numbers."""
    from xml.sax.saxutils import escape
    arms = list(rounds)
    room = COMPARISON_WIDTH - 2 * 12
    parts = ['<text x="12" y="22" font-size="14" font-weight="bold">%s</text>' % escape(fit_text(
        "comparison of %s: one panel per episode metric" % ", ".join(arms), 14, room))]
    parts.append('<text x="12" y="40" font-size="11">%s</text>' % escape(fit_text(
        "line: the share of an arm's episodes done within x seconds; band: the 95% interval of its P50 (and "
        "P95)", 11, room)))
    legend_y = 58
    for number, arm in enumerate(arms):
        colour, dash = ARM_COLOURS[number % len(ARM_COLOURS)], ARM_DASHES[number % len(ARM_DASHES)]
        y = legend_y + 16 * number
        parts.append('<line x1="12" y1="%d" x2="42" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>'
                     '<rect x="48" y="%d" width="14" height="6" fill="%s" fill-opacity="0.45"/>' % (
                         y - 4, y - 4, colour, dash, y - 7, colour))
        parts.append('<text x="68" y="%d" font-size="11">%s</text>' % (y, escape(fit_text(
            "%s (%d rounds)" % (arm, rounds[arm]), 11, COMPARISON_WIDTH - 80))))
    top = legend_y + 16 * len(arms) + 8
    for panel in panels:
        drawn, top = comparison_panel(panel, arms, top)
        parts += drawn
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
            '<rect width="100%%" height="100%%" fill="white"/>%s</svg>\n' % (COMPARISON_WIDTH, top + 8, "".join(parts)))


def comparison_panel(panel, arms, top):
    """(SVG parts, the next panel's top) for one metric's panel, drawn from `top` down."""
    from xml.sax.saxutils import escape
    left, right = COMPARISON_LEFT, COMPARISON_WIDTH - COMPARISON_RIGHT
    parts = ['<text x="12" y="%d" font-size="13" font-weight="bold">%s</text>' % (
        top + 16, escape(fit_text("%s, in seconds" % panel["name"], 13, COMPARISON_WIDTH - 24)))]
    y = top + 16
    for number, arm in enumerate(arms):
        y += 15
        words = ["P%d %s" % (round(q * 100), figure_words(figure)) for q, figure in
                 sorted(panel["figures"].get(arm, {}).items()) if figure]
        parts.append('<text x="24" y="%d" font-size="11" fill="%s">%s</text>' % (
            y, ARM_COLOURS[number % len(ARM_COLOURS)], escape(fit_text("%s: %s; %d episodes" % (
                arm, ", ".join(words) or "no figure", len(panel["values"].get(arm, []))), 11, COMPARISON_WIDTH - 36))))
    plot_top, base = y + 14, y + 14 + COMPARISON_PLOT_HEIGHT
    bands = [(figure["low"], figure["high"]) for figures in panel["figures"].values() for figure in figures.values()
             if figure and figure.get("low") is not None]
    everything = [v for values in panel["values"].values() for v in values] + [v for band in bands for v in band]
    ticks = nice_ticks(min([0.0] + everything), max([0.0] + everything))
    low, high = ticks[0], ticks[-1]

    def x_of(value):
        return left + (value - low) / ((high - low) or 1.0) * (right - left)
    parts += comparison_axes(ticks, x_of, plot_top, base, left, right)
    for number, arm in enumerate(arms):
        parts += comparison_arm(panel, arm, number, len(arms), x_of, plot_top, base)
    return parts, base + 44


def comparison_axes(ticks, x_of, plot_top, base, left, right):
    """Grid lines at 0, 50, 95 and 100% of the episodes, the seconds axis with round ticks (and
    zero marked where the axis holds negative values), and both axes' names."""
    parts = []
    for share in (0.0, 0.5, 0.95, 1.0):
        y = base - share * (base - plot_top)
        parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>' % (
            left, y, right, y, "#555" if share == 0 else "#e3e3e3"))
        # 95% and 100% lie 8.5 px apart: 100% sits on its line, 95% just under its own
        label, shift = {0.0: ("0%", 3), 0.5: ("50% (P50)", 3), 0.95: ("95% (P95)", 8), 1.0: ("100%", 1)}[share]
        parts.append('<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>' % (left - 4, y + shift, label))
    parts.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#555"/>' % (left, base, left, plot_top))
    for tick in ticks:
        parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#555"/>'
                     '<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>' % (
                         x_of(tick), base, x_of(tick), base + 4, x_of(tick), base + 15, format_tick(tick)))
    if ticks[0] < 0:
        parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="3 3"/>' % (
            x_of(0), base, x_of(0), plot_top))
    parts.append('<text x="%.1f" y="%d" font-size="11" text-anchor="middle">seconds</text>' % (
        (left + right) / 2, base + 30))
    parts.append('<text transform="translate(14 %.1f) rotate(-90)" font-size="11" text-anchor="middle">share of '
                 'episodes</text>' % ((base + plot_top) / 2))
    return parts


def comparison_arm(panel, arm, number, arms, x_of, plot_top, base):
    """One arm's CDF line and bands: each arm's band a little above or below the quantile's line, so
    that two arms' bands never lie on each other, and at least 4 px wide (a whole-second figure's
    interval may have no width), with the figure itself marked."""
    from xml.sax.saxutils import escape
    colour, dash = ARM_COLOURS[number % len(ARM_COLOURS)], ARM_DASHES[number % len(ARM_DASHES)]
    ordered, height = panel["values"].get(arm, []), base - plot_top
    points = ["%.1f,%.1f" % (x_of(ordered[0]) if ordered else x_of(0), base)]
    for index, value in enumerate(ordered, 1):
        points += ["%.1f,%.1f" % (x_of(value), base - (index - 1) / len(ordered) * height),
                   "%.1f,%.1f" % (x_of(value), base - index / len(ordered) * height)]
    parts = ['<polyline class="ecdf" data-arm="%s" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" '
             'points="%s"/>' % (escape(arm), colour, dash, " ".join(points))]
    offset = (number - (arms - 1) / 2) * 7
    for q, figure in sorted(panel["figures"].get(arm, {}).items()):
        if not figure or figure.get("low") is None:
            continue
        y = base - q * height + offset
        x1, x2 = x_of(figure["low"]), x_of(figure["high"])
        if x2 - x1 < 4:
            x1, x2 = (x1 + x2) / 2 - 2, (x1 + x2) / 2 + 2
        parts.append('<rect class="interval" data-arm="%s" x="%.1f" y="%.1f" width="%.1f" height="6" fill="%s" '
                     'fill-opacity="0.45"/>' % (escape(arm), x1, y - 3, x2 - x1, colour))
        parts.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>' % (
            x_of(figure["value"]), y - 5, x_of(figure["value"]), y + 5, colour))
    return parts


def figure_words(figure):
    return "%s s (%s to %s)" % (format_figure(figure["value"]), format_figure(figure["low"]),
                                format_figure(figure["high"]))


def nice_ticks(low, high, most=6):
    """Axis ticks at round numbers (1, 2 or 5 times a power of ten apart) from at or below `low` to
    at or above `high`, at most `most` of them."""
    span = (high - low) or abs(high) or 1.0
    power = 10 ** math.floor(math.log10(span / (most - 1)))
    for step in (power, 2 * power, 2.5 * power, 5 * power, 10 * power):
        first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
        if last - first + 1 <= most:
            return [round(n * step, 12) for n in range(first, max(last, first + 1) + 1)]
    return [low, high]


def format_tick(value):
    return "%g" % value


def fit_text(text, size, room):
    """`text`, cut short with an ellipsis where its estimated width (text_width) passes `room` px."""
    if text_width(text, size) <= room:
        return text
    while text and text_width(text + "...", size) > room:
        text = text[:-1]
    return text.rstrip() + "..."


def compare_rounds(folder, record):
    """{arm: [results of each completed round, in round order]} from a comparison's folder."""
    arms = {}
    for arm in record["arms"]:
        arms[arm] = []
        for number in range(1, record["rounds"] + 1):
            path = folder / arm / ("round-%d" % number) / "results.json"
            if [number, arm] in record["completed"] and path.exists():
                arms[arm].append(read_json(path, "the results", keys=RESULT_KEYS))
    return arms


def write_comparison(folder, record):
    """comparison.json and comparison.svg from the folder (what `report DIR` recomputes)."""
    arms = compare_rounds(folder, record)
    result = comparison(arms, record["seed"], record["resamples"])
    result.update(order=record["order"], completed=record["completed"], status=record["status"])
    write_json(folder / COMPARISON_FILE, result)
    if sum(1 for rounds in arms.values() if rounds):
        (folder / "comparison.svg").write_text(comparison_svg(arms, result))
    return result


def comparison_lines(result):
    """What `compare` and `report DIR` print for people: each arm's figures, then the verdicts."""
    lines = ["method: %s, %d resamples, seed %s; rounds %s" % (
        result["method"]["interval"], result["method"]["resamples"], result["method"]["seed"],
        ", ".join("%s %d" % (arm, figures["rounds"]) for arm, figures in result["arms"].items()))]
    for arm, figures in result["arms"].items():
        kernel = figures.get("sandbox_kernel") or {}
        if kernel:
            lines.append("  %s: sandbox kernel %s (episodes reported %s; the nodes' %s)" % (
                arm, kernel["verdict"], ", ".join(kernel["kernels_reported"]) or "none",
                ", ".join(kernel["node_kernels"]) or "unknown"))
        for key, figure in figures.items():
            if isinstance(figure, dict) and "label" in figure:
                lines.append("  %s: %s %s %s (%s to %s)" % (arm, figure["label"], format_figure(figure["value"]),
                                                         figure["unit"], format_figure(figure["low"]),
                                                         format_figure(figure["high"])))
        if "no_samples" in figures:
            lines.append("  %s: no figures: no successful episode in its %d batch(es) (first: %s)" % (
                arm, figures["rounds"], figures["no_samples"]))
    lines += [pair["verdict"] for pair in result["pairs"]]
    return lines


def parse_arms(values, fail):
    """--arm NAME=OPTIONS, in the order given: {name: [run options]}."""
    arms = {}
    for value in values or ():
        name, sep, options = value.partition("=")
        if not sep or not ARM_NAME.match(name):
            fail("--arm wants NAME='RUN OPTIONS' (a name of letters, digits, '.', '_', '-'), got %r" % value)
        if name in arms:
            fail("--arm %s is given twice" % name)
        try:
            arms[name] = shlex.split(options)
        except ValueError as error:
            fail("--arm %s: %s" % (name, error))
    if len(arms) < 2:
        fail("compare needs two --arm or more (NAME='RUN OPTIONS' each)")
    return arms


def add_compare_parser(commands):
    """`compare`'s own arguments (every other one is a `run` option the arms share)."""
    compare = commands.add_parser(
        "compare", help="run two or more arms interleaved and compare them with intervals",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run each arm's batch --rounds times, interleaved (A B, B A, ...), each a full `run` in\n"
                    "DIR/ARM/round-N/ cleaned up after it; then per arm and metric the pooled figure with a\n"
                    "95% bootstrap interval (rounds, then episodes, resampled), per pair the ratio with its\n"
                    "interval, and a verdict only where the interval stays on one side of 1. Every other\n"
                    "option is a `run` option shared by every arm.",
        epilog="example (local processes, no cluster):\n  %s compare --arm serial='--parallelism 1' --arm parallel='' "
               "--backend local --count 8 --rounds 4 --output cmp" % program_name())
    compare.add_argument("--arm", action="append", metavar="NAME='RUN OPTIONS'", required=True,
                         help="an arm: its name and its own `run` options (quoted); twice or more")
    compare.add_argument("--rounds", type=int, default=3, metavar="R",
                         help="batches per arm, interleaved (default 3)")
    compare.add_argument("--output", metavar="DIR", required=True, help="a new folder for every batch and the comparison")
    compare.add_argument("--seed", type=int, metavar="N", help="the seed of the order and the bootstrap (default: "
                                                               "drawn, and recorded)")
    compare.add_argument("--resamples", type=int, default=COMPARE_RESAMPLES, metavar="N",
                         help="bootstrap resamples (default %d)" % COMPARE_RESAMPLES)
    compare.add_argument("--json", action="store_true", help="print comparison.json instead of lines")
    compare.set_defaults(subparser=compare)


def cmd_compare(args, console):
    output = Path(args.output)
    if output.exists():
        raise DemoError("output folder %s already exists; choose a new --output so that no comparison is "
                        "overwritten" % output)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    order = interleaved_order(list(args.arms), args.rounds, seed)
    record = {"arms": args.arms, "shared": args.shared, "rounds": args.rounds, "seed": seed,
              "resamples": args.resamples, "order": [[number, arm] for number, arm in order], "completed": [],
              "status": "running", "started_at": utc_now()}
    try:
        output.mkdir(parents=True)
    except OSError as error:
        raise DemoError("cannot create output folder %s: %s" % (output, error.strerror or error)) from None
    try:
        write_json(output / COMPARE_FILE, record)
    except OSError as error:
        # nothing has run yet: the folder just made goes, so that the same --output works later
        shutil.rmtree(output, ignore_errors=True)
        raise DemoError("cannot write %s: %s; nothing was run, and the output folder was removed"
                        % (error.filename or output / COMPARE_FILE, error.strerror or error)) from None
    script = str(Path(__file__).resolve())
    failure, code = None, EXIT_OK
    successes = collections.Counter()  # arm -> successful episodes in its batches so far
    for number, arm in order:
        if number > 1 and any(not successes[ran] for ran in args.arms):
            break  # an arm measured nothing in the first round: said now (below), not after every round
        folder = output / arm / ("round-%d" % number)
        console.note("compare: round %d of %d, arm %s (%s)" % (number, args.rounds, arm,
                                                              " ".join(args.arms[arm] + args.shared) or "defaults"))
        process = CHILDREN.popen([sys.executable, script, "run", *args.arms[arm], *args.shared, "--output",
                                  str(folder), "--quiet"], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, bufsize=1,
                                 start_new_session=True)  # a Ctrl-C reaches it once, from here
        stopping = threading.Event()
        passing = threading.Thread(target=pass_batch_stderr, args=(process, stopping), daemon=True)
        passing.start()
        try:
            returned = process.wait()
            passing.join()
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (Terminated)
            stopping.set()
            stop_batch(process)  # one SIGINT: what it saw is saved, its cleanup printed
            passing.join(timeout=5)
            record["status"] = "interrupted"
            failure = "%s during round %d of arm %s (%s)" % (
                "terminated" if isinstance(interrupt, Terminated) else "interrupted", number, arm, folder)
            code = EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
            break
        finally:
            receipt = read_saved(folder / "receipt.json") if (folder / "receipt.json").exists() else None
            if receipt is not None and backend_named(receipt.get("backend")).leaves_remote_state:
                CHILDREN.popen([sys.executable, script, "cleanup", "--output", str(folder)],
                               stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL).wait()
        if returned in (EXIT_OK, EXIT_INFRA_FAILURES) and (folder / "results.json").exists():
            successes[arm] += read_json(folder / "results.json", "the results").get("successful_episodes") or 0
            record["completed"].append([number, arm])
            write_json(output / COMPARE_FILE, record)
            continue
        record["status"] = "stopped"
        failure = "round %d of arm %s failed (exit code %d; its line is above, %s)" % (
            number, arm, returned, "its folder %s keeps what it saw" % folder if folder.exists() else
            "before it made its folder")
        code = returned if returned else EXIT_ERROR
        break
    else:
        record["status"] = "complete"
    record["finished_at"] = utc_now()
    write_json(output / COMPARE_FILE, record)
    result = write_comparison(output, record)
    console.say(json.dumps(result, indent=2) if args.json else "\n".join(comparison_lines(result)))
    empty = [arm for arm, figures in result["arms"].items() if "no_samples" in figures]
    if empty and not failure:
        failure = "arm %s measured nothing: no successful episode in %s (first: %s)" % (
            empty[0], "its %d batch(es)" % result["arms"][empty[0]]["rounds"], result["arms"][empty[0]]["no_samples"])
        record["status"], code = "no samples", EXIT_BATCH_FAILED
    if failure:
        stopped = DemoError("comparison %s: %s; the %d complete batch(es) are compared above (%s)" % (
            record["status"], failure, len(record["completed"]), output / COMPARISON_FILE))
        stopped.exit_code = code
        raise stopped
    return EXIT_OK


# ============================================================================
# Command line: the parser, the RunSpec built once, main()
# ============================================================================


class ArgumentParser(argparse.ArgumentParser):
    """argparse with no abbreviated long flags (a prefix that works today breaks when a new flag
    makes it ambiguous), and a usage error that points at this command's own --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, "%s: error: %s\nsee '%s --help'\n" % (self.prog, message, self.prog))


RUN_EXAMPLES = """examples:
  %(prog)s --count 10 --output cube-10                       one Job, 10 episodes on RuntimeClass cube
  %(prog)s --no-runtime-class --count 10 --output kind-10    the same on kind (its default runtime)
  %(prog)s --backend warm-pool --count 20 --output warm-20   a claim per episode from a warm pool
  %(prog)s --backend local --count 4 --output local-4        local processes, no cluster
  %(prog)s --count 20 --queue team --cluster-queue team-cq --output queued-20   through Kueue
  %(prog)s --episode my_episode.py --tasks tasks.jsonl --output mine          your own episodes
  %(prog)s --episode my_episode.py --tasks tasks.jsonl --output step-1 --stream   each reward as it is verified"""


def add_sandbox_options(group):
    """The options that shape a sandbox and where it runs, shared by `run` and `pool up` (one
    declaration, one help text): --context, --image, --runtime / --no-runtime-class, --network."""
    group.add_argument("--context", metavar="NAME",
                       help="kubectl context (default: kubectl's current context)")
    group.add_argument("--image",
                       help="image with `python` (3.9+) runnable as UID/GID 1000 (default %s)" % DEFAULT_IMAGE)
    runtime = group.add_mutually_exclusive_group()
    runtime.add_argument("--runtime", metavar="NAME",
                         help="RuntimeClass of the sandboxes (default %s)" % DEFAULT_RUNTIME)
    runtime.add_argument("--no-runtime-class", action="store_true",
                         help="set no RuntimeClass: pods use the nodes' default runtime (e.g. "
                              "runc on a kind cluster); results.json records runtime null")
    group.add_argument("--require-isolation", action="store_true",
                       help="fail the run (exit code %d, results still written) when any episode ran on its "
                            "node's own kernel: the sandbox is not one" % EXIT_NOT_ISOLATED)
    group.add_argument("--network", choices=("default", "none"), default="default",
                       help="`none`: a default-deny NetworkPolicy (ingress and egress) in the namespace; "
                            "needs a CNI that enforces NetworkPolicies (default: default)")


def add_run_parser(commands):
    """`run`'s arguments, grouped as its --help shows them; the backends and gates add theirs."""
    run = commands.add_parser("run", help="run one batch and write results.json",
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=RUN_EXAMPLES,
                              description="Run COUNT episodes (a Job, a warm pool, or local processes), validate\n"
                                          "every one, and write results.json to a new output folder.")
    output = run.add_argument_group("output and safety (--output is required unless --dry-run)")
    output.add_argument("--output", metavar="DIR",
                        help="new folder for receipt, diagnostics and results (must not exist)")
    output.add_argument("--dry-run", action="store_true",
                        help="print the objects a run would create (JSON for `kubectl create -f -`); "
                             "touch neither the cluster nor the output folder")
    output.add_argument("--force", action="store_true",
                        help="submit even when the preflight finds no node that can run an episode pod")
    output.add_argument("--quiet", action="store_true",
                        help="no progress or notes on stderr (errors and warnings still print)")
    output.add_argument("--stream", action="store_true",
                        help="stdout: one JSON line per episode as soon as it is verified (its task, reward or "
                             "infrastructure failure, attempts, phases), then the summary as one line, or the "
                             "error; also kept in DIR/%s" % STREAM_FILE)
    batch = run.add_argument_group("the batch")
    batch.add_argument("--count", type=int,
                       help="episodes in the batch, 1..%d, or up to %d with --allow-large (default %d, or "
                            "the number of --tasks)" % (MAX_COUNT, MAX_LARGE_COUNT, DEFAULT_COUNT))
    batch.add_argument("--backend", choices=tuple(BACKENDS), default=DEFAULT_BACKEND,
                       help="%s (default: %s)" % ("; ".join("`%s`: %s" % (name, backend.help)
                                                            for name, backend in BACKENDS.items()), DEFAULT_BACKEND))
    batch.add_argument("--parallelism", type=int,
                       help="episodes running at once, 1..COUNT (default: COUNT)")
    batch.add_argument("--allow-large", action="store_true",
                       help="lift the demo's bound of %d episodes to %d" % (MAX_COUNT, MAX_LARGE_COUNT))
    batch.add_argument("--rounds", type=int, default=1, metavar="R",
                       help="run the batch R times in sequence, each in round-N/; percentiles pool the "
                            "rounds (default 1)")
    batch.add_argument("--timeout", type=int, metavar="SECONDS",
                       help="the Job's activeDeadlineSeconds; the client waits this plus %d s (default: "
                            "240, plus 30 per further wave of PARALLELISM episodes, plus 1 per 10 "
                            "episodes beyond 20)" % CLIENT_GRACE_SECONDS)
    add_sandbox_options(run.add_argument_group("the cluster"))
    episodes = run.add_argument_group("your own episodes")
    episodes.add_argument("--episode", metavar="FILE.py",
                          help="run this episode program instead of the built-in shipping task (see the "
                               "README's episode protocol); episodes are then samples or infrastructure "
                               "failures, never errors")
    episodes.add_argument("--tasks", metavar="FILE.jsonl",
                          help="with --episode: one JSON task per line; episode i reads task i from "
                               "$TASK_FILE (COUNT defaults to the number of tasks)")
    episodes.add_argument("--retries", type=int, default=0, metavar="N",
                          help="with --episode: retry an episode that failed for infrastructure reasons up to "
                               "N times, per episode (default 0)")
    run.plugin_options = []  # the dests of the options the backends and gates add: RunSpec.options
    for backend in BACKENDS.values():
        if backend.own_flags:
            backend.add_arguments(RecordingGroup(run.add_argument_group("%s backend" % backend.name),
                                                 run.plugin_options))
    for gate in GATES:
        gate.add_arguments(RecordingGroup(run.add_argument_group(gate.argument_group), run.plugin_options))
    cost = run.add_argument_group("cost (results.json's `cost`; no prices: capacity only, never a made-up price)")
    cost.add_argument("--price-cpu-hour", type=float, metavar="PRICE",
                      help="price of one CPU core for an hour, in your currency (with --price-gib-hour)")
    cost.add_argument("--price-gib-hour", type=float, metavar="PRICE",
                      help="price of one GiB of memory for an hour, in the same currency")
    run.set_defaults(subparser=run)


def build_parser():
    parser = ArgumentParser(
        prog=program_name(),
        description="Launch a batch of isolated sandbox episodes for RL rollouts (one Kubernetes Job, a\n"
                    "warm pool of agent-sandbox claims, or local processes), measure batch readiness and\n"
                    "reward latency, verify every episode, and clean up only what was created.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n"
               "  0    ok\n"
               "  1    error (kubectl, cluster, prerequisites, refused cleanup)\n"
               "  2    bad command line\n"
               "  3    timed out (Job deadline, client wait, cleanup wait)\n"
               "  4    batch failed or validation failed\n"
               "  5    custom episodes: results written, some episodes are infrastructure failures\n"
               "  130  interrupted (Ctrl-C)\n"
               "  143  terminated (SIGTERM)\n\n"
               "environment: KUBECTL overrides the kubectl program.\n"
               "Each command has its own help: %s run --help" % program_name(),
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    commands.required = True

    for add_parser in COMMAND_PARSERS:
        add_parser(commands)
    return parser


def compare_args(args, shared):
    """`compare`: the arms, and the `run` options every arm shares (whatever compare does not
    take itself), each arm's options checked as `run` checks them before any batch runs."""
    fail = args.subparser.error
    args.arms, args.shared = parse_arms(args.arm, fail), shared
    if args.rounds < 2:
        fail("compare needs --rounds 2 or more, got %d: the intervals draw rounds, and one round gives none "
             "(a single batch per arm is `run` twice and `report`)" % args.rounds)
    if args.resamples < 100:
        fail("--resamples must be at least 100, got %d" % args.resamples)
    for name, options in args.arms.items():
        given = set(options + shared)
        for flag in ("--output", "--dry-run", "--stream"):
            if flag in given or any(option.startswith(flag + "=") for option in given):
                fail("%s is compare's to choose (arm %s); leave it out" % (flag, name))
        try:
            with contextlib.redirect_stderr(io.StringIO()) as said:
                parse_args(["run", *options, *shared, "--output", str(Path(args.output) / name)])
        except SystemExit:
            said = [line for line in said.getvalue().splitlines() if ": error: " in line]
            fail("arm %s: %s" % (name, said[-1].split(": error: ", 1)[1] if said else "refused by `run`"))
    return args


def read_episode_inputs(args, fail):
    """--episode and --tasks, read and checked before anything touches the cluster or disk:
    (program text, tasks as a tuple or None)."""
    if args.tasks and not args.episode and not getattr(args, "pool", None):  # a kept pool's own episode serves
        fail("--tasks needs --episode: the built-in task takes no input")
    if args.retries and not args.episode:
        fail("--retries needs --episode: the built-in task keeps the tutorial's rule that any failure is an error")
    if args.retries < 0:
        fail("--retries must be 0 or more, got %d" % args.retries)
    program, tasks = EPISODE_PROGRAM, None
    backend = BACKENDS.get(getattr(args, "backend", None))
    in_configmap = backend is None or backend.uses_cluster  # a backend without a cluster ships no ConfigMap
    if args.episode:
        try:
            program = Path(args.episode).read_text()
        except (OSError, UnicodeDecodeError) as error:
            fail("cannot read --episode %s: %s" % (args.episode, getattr(error, "strerror", None) or error))
        size = configmap_bytes({"episode.py": program, EXEC_JOURNAL_FILE: EXEC_JOURNAL_PROGRAM,
                                SANDBOX_PROBE_FILE: SANDBOX_PROBE_PROGRAM, SANDBOX_RESET_FILE: SANDBOX_RESET_PROGRAM})
        if size > CONFIGMAP_MAX_BYTES and in_configmap:
            fail("--episode %s is %d bytes; a ConfigMap holds at most %d: ship a smaller program (or put it in "
                 "the image)" % (args.episode, size, CONFIGMAP_MAX_BYTES))
    if args.tasks:
        try:
            lines = Path(args.tasks).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            fail("cannot read --tasks %s: %s" % (args.tasks, getattr(error, "strerror", None) or error))
        tasks = []
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    tasks.append(json.loads(line))
                except ValueError as error:
                    fail("--tasks %s line %d is not JSON: %s" % (args.tasks, number, error))
                if isinstance(tasks[-1], list):
                    fail("--tasks %s line %d is a JSON array, not a task: write one task a line (JSON Lines), "
                         "each an object such as {\"id\": 0}" % (args.tasks, number))
                image = own_image(tasks[-1])
                if image is not None and not is_image_reference(image):
                    fail('--tasks %s line %d: "%s" must be an image reference such as %s, got %s'
                         % (args.tasks, number, TASK_IMAGE_KEY, DEFAULT_IMAGE, json.dumps(image)))
        if not tasks:
            fail("--tasks %s holds no task" % args.tasks)
        size = configmap_bytes(tasks_data(tasks))
        if size > CONFIGMAP_MAX_BYTES and in_configmap:
            fail("--tasks %s makes a ConfigMap of %d bytes, over Kubernetes' limit of %d (1 MiB): split the tasks "
                 "over several runs, or shrink them" % (args.tasks, size, CONFIGMAP_MAX_BYTES))
        if args.count is not None and args.count != len(tasks):
            fail("--count %d differs from the %d tasks in %s; leave --count out to run every task"
                 % (args.count, len(tasks), args.tasks))
        tasks = tuple(tasks)
    return program, tasks


TASK_IMAGE_KEY = "image"  # a --tasks line's own image; a task without one runs --image


def is_image_reference(value):
    """Whether a task's "image" can name an image: a string without spaces or control characters
    (the registry, not this tool, says whether it exists)."""
    return isinstance(value, str) and bool(value) and len(value) <= 4096 and \
        not any(ch.isspace() or ord(ch) < 32 for ch in value)


def own_image(task):
    """A task's own "image", or None."""
    return task.get(TASK_IMAGE_KEY) if isinstance(task, dict) else None


def task_image(task, default):
    """The image a task's episode runs: its own "image", else the batch's --image."""
    return own_image(task) or default


def distinct_images(images):
    """The distinct images (one however spelt: normalized_image), each as first spelt, in order."""
    distinct = {}
    for image in images:
        distinct.setdefault(normalized_image(image), image)
    return list(distinct.values())


class RecordingGroup:
    """An argument group that notes the dest of every option added to it (a plug-in's options,
    which RunSpec keeps in `options`)."""

    def __init__(self, group, dests):
        self.group, self.dests = group, dests

    def add_argument(self, *args, **kwargs):
        action = self.group.add_argument(*args, **kwargs)
        self.dests.append(action.dest)
        return action


def cluster_only_flags(args):
    """(flag, given) of every `run` option that only a backend on a cluster can honour."""
    return (("--dry-run", args.dry_run), ("--network none", args.network == "none"), ("--context", args.context),
            ("--image", args.image), ("--runtime", args.runtime), ("--no-runtime-class", args.no_runtime_class),
            ("--force", args.force))


def check_shared_bounds(args, fail):
    """The bounds of the options every backend shares (--count, --parallelism, --rounds,
    --timeout, the prices), checked before any gate or backend reads them; the parallelism."""
    bound = MAX_LARGE_COUNT if args.allow_large else MAX_COUNT
    if not 1 <= args.count <= bound:
        fail("--count must be between 1 and %d%s, got %d" % (
            bound, "" if args.allow_large else " (the demo's bound to keep first trials small; "
            "--allow-large lifts it to %d)" % MAX_LARGE_COUNT, args.count))
    parallelism = args.count if args.parallelism is None else args.parallelism
    if not 1 <= parallelism <= args.count:
        fail("--parallelism must be between 1 and --count (%d), got %d" % (args.count, parallelism))
    if args.rounds < 1:
        fail("--rounds must be at least 1, got %d" % args.rounds)
    if args.timeout is not None and args.timeout < 1:
        fail("--timeout must be at least 1 second, got %d" % args.timeout)
    if (args.price_cpu_hour is None) != (args.price_gib_hour is None):
        fail("--price-cpu-hour and --price-gib-hour go together (a price per 1,000 rewards needs both)")
    if any(price is not None and not 0 <= price < float("inf") for price in (args.price_cpu_hour, args.price_gib_hour)):
        fail("prices must be 0 or more")
    return parallelism


def batch_image(args, tasks, backend, default, parallelism, fail):
    """The batch's --image: the one image of its tasks when they all name the same; --image (or its
    default) for tasks that name none or several, which a backend that runs several images runs
    as one Job each (image_parts), at least one episode of each at a time. A backend without a
    cluster runs no image, so tasks naming one are refused there."""
    named = [(number, own_image(task)) for number, task in enumerate(tasks or (), 1) if own_image(task) is not None]
    if not named:
        return default
    if not backend.uses_cluster:
        fail('--backend %s runs no image, and task %d of %s names one (%s): run the tasks on a cluster backend, '
             'or leave "%s" out of them' % (backend.name, named[0][0], args.tasks, named[0][1], TASK_IMAGE_KEY))
    images = distinct_images(task_image(task, default) for task in tasks)
    if len(images) == 1:
        return images[0]
    named = "--tasks %s names %d images (%s)" % (args.tasks, len(images), some_of(images, 3))
    if not backend.runs_several_images:
        fail("%s; --backend %s runs one image a batch (a pool per image is not built yet): run one batch per "
             "image, or --backend kubernetes, which runs a Job per image" % (named, backend.name))
    if parallelism < len(images):
        fail("%s, a Job each, and each runs at least one episode at a time: --parallelism %d is fewer; give at "
             "least %d" % (named, parallelism, len(images)))
    if getattr(args, "queue", None):
        fail("%s; --queue with several images is not built yet: run one batch per image with --queue" % named)
    return default


def run_spec(args):
    """The RunSpec of `run`, checked once: every refusal is one usage line (exit 2)."""
    fail = args.subparser.error
    if not args.output and not args.dry_run:
        fail("--output DIR is required (unless --dry-run)")
    if args.stream and args.dry_run:
        fail("--stream streams a run's episodes; --dry-run runs none (leave one of them out)")
    program, tasks = read_episode_inputs(args, fail)
    fields = {field.name: getattr(args, field.name) for field in dataclasses.fields(RunSpec)
              if hasattr(args, field.name)}
    fields.update(program=program, tasks_list=tasks)
    if tasks is not None:
        fields["count"] = len(tasks)
    elif args.count is None:
        fields["count"] = DEFAULT_COUNT
    args = argparse.Namespace(**dict(vars(args), **fields))  # the checks below read the derived count
    backend = BACKENDS[args.backend]
    # the shared parser's bounds first: a gate or a backend reads --count and the rest as valid
    fields["parallelism"] = check_shared_bounds(args, fail)
    own = {field for _, field in backend.own_flags}
    for other in BACKENDS.values():
        for flag, field in other.own_flags:
            if other is not backend and field not in own and getattr(args, field) is not None:
                fail("%s is for --backend %s" % (flag, other.name))
    for gate in GATES:  # a gate names the backends it serves (before the flags only clusters take)
        gate.check_options(args, fail, backend)
    if not backend.uses_cluster:
        # every cluster-only flag is refused alike for a backend without a cluster, never ignored
        for flag, used in cluster_only_flags(args):
            if used:
                fail("%s is for a backend on a cluster; --backend %s runs without one (leave %s out, or choose "
                     "another --backend)" % (flag, backend.name, flag.split()[0]))
    if backend.uses_cluster:
        fields.update(image=args.image or DEFAULT_IMAGE, runtime=args.runtime or DEFAULT_RUNTIME)
    fields.update(image=batch_image(args, tasks, backend, fields.get("image"), fields["parallelism"], fail))
    fields.update(backend.check_options(args, fail))
    if args.timeout is None:
        fields["timeout"] = default_deadline(args.count, fields["parallelism"])
    plugin = set(args.subparser.plugin_options)
    options = {dest: fields.pop(dest, getattr(args, dest)) for dest in sorted(plugin)}
    return RunSpec(**fields, options=options)


# Each command's parser, in --help's order; each is declared beside its command.
COMMAND_PARSERS = (add_run_parser, add_cleanup_parser, add_report_parser, add_list_parser, add_compare_parser,
                   add_pool_parser)

COMMANDS = {"run": start_run, "cleanup": cmd_cleanup, "report": cmd_report, "list": cmd_list, "compare": cmd_compare,
            "pool": cmd_pool, POOL_UP_COMMAND: start_run}


def parse_args(argv):
    """The command line: a RunSpec for `run`, the parsed arguments for the other subcommands."""
    # Unknown flags are the subcommand's error (its usage, its --help), not the top level's.
    args, unknown = build_parser().parse_known_args(argv)
    if args.command == "compare":
        return compare_args(args, unknown)
    if unknown:
        args.subparser.error("unrecognized arguments: %s" % " ".join(unknown))
    if args.command == "cleanup":
        folders = list(args.folders) + list(args.output or [])
        if bool(folders) == bool(args.receipt):
            args.subparser.error("give the runs' output folders (DIR ...) or --receipt FILE, one of the two")
        args.output = folders
    if args.command == "list":
        missing = [folder for folder in args.search or () if not os.path.isdir(folder)]
        if missing:
            args.subparser.error("--search %s: no such folder" % missing[0])
    if args.command == "report" and args.label and len(args.label) != len(args.folders):
        args.subparser.error("give one --label per folder (%d folders, %d labels)"
                             % (len(args.folders), len(args.label)))
    if args.command == "pool" and args.pool_command == "up":
        return pool_up_spec(args)
    return run_spec(args) if args.command == "run" else args


def on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM stops at once
    raise Terminated()


def main(argv=None):
    options = parse_args(argv)
    console = Console(quiet=getattr(options, "quiet", False))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return COMMANDS[options.command](options, console)
    except DemoError as error:
        return failed(options, console, str(error), error.exit_code)
    except Terminated:
        return failed(options, console, "terminated (SIGTERM)", EXIT_TERMINATED)
    except KeyboardInterrupt:
        return failed(options, console, "interrupted", EXIT_INTERRUPTED)


def failed(options, console, message, exit_code):
    """The one line that ends a failed command (stderr); with --stream also the stream's last line."""
    console.tell("Error: %s" % message)
    if getattr(options, "stream", False):
        console.say(json.dumps({"type": "error", "exit_code": exit_code, "error": message}))
    return exit_code


# ============================================================================
# Python API: run_batch(), stream_batch() and warm_pool(), for a training loop
# ============================================================================
# `import rl_batch_demo` (the installed package's module, which is this file) gives a training
# loop the command without a shell: the same options as `run`, as keyword arguments. Each
# batch is this file run as `run --stream` in a process of its own (its own signal handlers,
# threads and kubectl processes, none in the caller's), read line by line; its stderr (notes,
# warnings) goes on to the caller's. Nothing is ever cleaned up behind the caller's back:
# `cleanup()`, or a `with` block, does it.


class RunEnded:
    """How a run that produced no results ended: the command's one line (`message`, as stderr's
    `Error:` line), its exit code, and its output folder (what it saw is kept there), which
    `cleanup()` finishes."""

    def __init__(self, message, exit_code, output):
        super().__init__(message)
        self.message, self.exit_code, self.output = message, exit_code, output

    def cleanup(self):
        return cleanup_output(self.output)


class RunFailed(RunEnded, Exception):
    """A refused or failed run (exit codes 1 to 4, 143)."""


class RunInterrupted(RunEnded, KeyboardInterrupt):
    """Ctrl-C reached the caller while a batch ran: the batch was stopped (exit code 130) and
    what it saw is kept; a KeyboardInterrupt, so that a loop that does not catch it stops."""


class BatchResult:
    """A finished batch: `rewards` in task order (None where the episode is an infrastructure
    failure, its reason in `failures[task]`), `tasks` (each task's entry, as results.json's
    `tasks`), `results` (all of results.json), `output` (the folder), `exit_code` (0, or 5 when
    some episodes are infrastructure failures). `cleanup()` deletes what the run created; as a
    context manager it does so on exit."""

    def __init__(self, output, results, exit_code, streamed):
        self.output, self.results, self.exit_code, self.streamed = output, results, exit_code, streamed
        # custom episodes: every task in task order; the built-in one: each episode, as in results.json
        self.tasks = results_by_task(results) if "infrastructure_failures" in results else [
            task_entry(None, row, None) for row in results["pods"]]
        self.rewards = [entry["reward"] for entry in self.tasks]
        self.failures = {entry["task"]: entry["infrastructure_failure"] for entry in self.tasks
                         if entry["infrastructure_failure"] is not None}

    def cleanup(self):
        return cleanup_output(self.output)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.cleanup()
        return False

    def __repr__(self):
        return "BatchResult(output=%r, rewards=%r, exit_code=%r)" % (str(self.output), self.rewards, self.exit_code)


def run_arguments(options):
    """`run`'s command line from keyword arguments named as its options' destinations
    (count=8, no_runtime_class=True, cluster_queue="cq"); `tasks` may also be a list of tasks."""
    run_parser = build_parser().parse_known_args(["run"])[0].subparser
    actions = {action.dest: action for action in run_parser._actions
               if action.option_strings and action.dest not in ("help", "stream", "dry_run")}
    if options.get("rounds", 1) != 1:
        raise TypeError("run_batch() runs one batch: call it once per round (rounds=%r)" % options["rounds"])
    argv, scratch = [], None
    for name, value in options.items():
        if name not in actions:
            close = __import__("difflib").get_close_matches(name, actions, 1)
            raise TypeError("run_batch() got an unexpected keyword argument %r%s" % (
                name, "; did you mean %r?" % close[0] if close else ""))
        action = actions[name]
        if name == "tasks" and isinstance(value, (list, tuple)):
            scratch = tempfile.NamedTemporaryFile("w", prefix="rl-batch-demo-tasks-", suffix=".jsonl", delete=False)
            with scratch:
                scratch.write("".join(json.dumps(task) + "\n" for task in value))
            value = scratch.name
        if action.nargs == 0:  # a flag
            argv += [action.option_strings[0]] if value else []
        elif value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv, scratch and scratch.name


def refuse_bad_arguments(argv, output):
    """A bad option value is RunFailed (exit code 2) with `run`'s own words, raised before any
    process starts, not the command's usage text on the caller's stderr."""
    import contextlib
    import io
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parse_args(["run", *argv, "--stream"])
    except SystemExit:
        raise RunFailed(caller_message(said.getvalue().splitlines(), EXIT_USAGE, "run"), EXIT_USAGE, output) from None
    except DemoError:
        pass  # not a usage error: the run says it, as the command would


class BatchStream:
    """stream_batch(...): each episode's line (a dict: task, reward, episode, attempts,
    infrastructure_failure, phases, streamed_after_seconds) as soon as the batch verified it;
    once the iteration ends, `result` holds the BatchResult. Leaving a `with` block stops a
    batch still running and cleans up."""

    def __init__(self, options, caller="stream_batch"):
        if "output" not in options:
            raise TypeError("%s() needs output=DIR: the new folder the run keeps its receipt and results in" % caller)
        self.output = Path(options["output"])
        argv, self.scratch = run_arguments(options)
        try:
            refuse_bad_arguments(argv, self.output)
        except RunFailed:
            self.forget_scratch()
            raise
        self.result, self.streamed, self.last = None, [], None
        self.errors = []  # stderr's lines, passed on as they come
        self.leaving = False  # the caller left its `with` block early: the batch's lines are not news
        self.process = CHILDREN.popen([sys.executable, str(Path(__file__).resolve()), "run", *argv, "--stream"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, bufsize=1, start_new_session=True)
        # own session: a terminal's Ctrl-C reaches the caller only, which stops the batch once
        self.stderr_thread = threading.Thread(target=self.pass_stderr, daemon=True)
        self.stderr_thread.start()
        # Ctrl-C (or any exception) in the loop's own code, between two episodes, never reaches
        # __next__: the batch is stopped when this object goes or the interpreter exits.
        if self.scratch:
            weakref.finalize(self, Path(self.scratch).unlink, missing_ok=True)
        weakref.finalize(self, stop_batch, self.process)  # at exit, finalizers run newest first

    def pass_stderr(self):
        for line in self.process.stderr:
            self.errors.append(line.rstrip("\n"))
            if not self.leaving:
                sys.stderr.write(line)
                sys.stderr.flush()

    def __iter__(self):
        return self

    def __next__(self):
        while self.result is None:
            try:
                line = self.process.stdout.readline()
            except KeyboardInterrupt:
                self.interrupt()
            if not line:
                self.finish()
                break
            record = json.loads(line)
            if record.get("type") == "episode":
                del record["type"]
                self.streamed.append(record)
                return record
            self.last = record
        raise StopIteration

    def interrupt(self):
        """Stop the batch as Ctrl-C stops the command (what it saw is saved), then raise."""
        stop_batch(self.process)
        self.stderr_thread.join()
        self.forget_scratch()
        raise RunInterrupted("interrupted", EXIT_INTERRUPTED, self.output) from None

    def finish(self):
        """The process ended: its result, or the exception carrying its one line."""
        code = self.process.wait()
        self.stderr_thread.join()
        self.forget_scratch()
        if code in (EXIT_OK, EXIT_INFRA_FAILURES) and (self.output / "results.json").exists():
            self.result = BatchResult(self.output, json.loads((self.output / "results.json").read_text()), code,
                                      self.streamed)
            return
        message = (self.last or {}).get("error") or caller_message(self.errors, code, "the run")
        if code == EXIT_USAGE:  # the command line's words, as this API's keywords
            message = as_keywords(message)
        error_type = RunInterrupted if code == EXIT_INTERRUPTED else RunFailed
        raise error_type(message, code, self.output)

    def forget_scratch(self):
        if self.scratch:
            Path(self.scratch).unlink(missing_ok=True)
            self.scratch = None

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if self.result is None and self.process.poll() is None:
            # leaving early is the caller's choice: no "Interrupted ... clean up" line for a batch
            # this block cleans up itself
            self.leaving = True
            try:
                self.interrupt()
            except RunInterrupted:
                pass
        self.process.wait()
        if (self.output / "receipt.json").exists():
            cleanup_output(self.output)
        return False


def pass_batch_stderr(process, stopping):
    """A compare batch's stderr passed on line by line, but for its own `Error: interrupted` once
    the comparison stopped it: the comparison's line says it, with the round and the folder."""
    for line in process.stderr:
        if stopping.is_set() and line.strip() in ("Error: interrupted", "Error: terminated"):
            continue
        sys.stderr.write(line)
        sys.stderr.flush()


def stop_batch(process):
    """A batch's `run` process, stopped as Ctrl-C stops the command (what it saw is saved, its
    cleanup command printed); a second Ctrl-C kills it at once. Nothing if it has ended."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait()
        except KeyboardInterrupt:
            process.kill()  # a second Ctrl-C: at once
            process.wait()


def stream_batch(**options):
    """Start one batch (the options of `run`, as keyword arguments) and iterate its episodes
    as they are verified; see BatchStream."""
    return BatchStream(options)


def run_batch(**options):
    """Run one batch (the options of `run`, as keyword arguments: output="step-3",
    backend="local", episode="my_episode.py", tasks=[...] or "tasks.jsonl", count=..., ...)
    and return its BatchResult, rewards in task order. Raises RunFailed (or RunInterrupted)
    with the command's one line and exit code when the run produced no results."""
    batch = BatchStream(options, caller="run_batch")
    for _ in batch:
        pass
    return batch.result


def cleanup_output(output):
    """`cleanup DIR`: delete what the run of that folder created, after proving it owns it;
    RunFailed when cleanup refuses or fails."""
    return tool_command(["cleanup", str(output)], output)[1]


def tool_command(argv, output, passing_stderr=False):
    """This file run as a command (cleanup, pool ...) in a process of its own: (its stdout, its
    stderr), the stderr passed on line by line as it comes when `passing_stderr` (a pool's fill
    takes a while); RunFailed with its `Error:` line and exit code when it fails."""
    process = CHILDREN.popen([sys.executable, str(Path(__file__).resolve()), *argv], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    said = []

    def pass_stderr():
        for line in process.stderr:
            said.append(line)
            if passing_stderr:
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=pass_stderr, daemon=True)
    reader.start()
    stdout = process.stdout.read()
    code = process.wait()
    reader.join()
    stderr = "".join(said)
    if code != 0:
        raise RunFailed(caller_message(stderr.splitlines(), code, "`%s`" % " ".join(argv[:2])), code, Path(output))
    return stdout, stderr


def caller_message(lines, code, what):
    """The one line a Python caller gets for a command that failed (its stderr `lines`): the
    usage error, its options named as this API's keywords (allow_large=True, not --allow-large),
    or the `Error:` line."""
    for line in reversed(lines):
        if ": error: " in line:
            return as_keywords(line.rstrip("\n").split(": error: ", 1)[1])
    for line in reversed(lines):
        if line.startswith("Error: "):
            return line.rstrip("\n")[len("Error: "):]
    return "%s ended with exit code %d" % (what, code)


def as_keywords(message):
    """A command-line message as a Python caller reads it: each option of `run` or `pool up` named
    as its keyword argument (`--allow-large` -> `allow_large=True`, `--count` -> `count`)."""
    options = {}
    for argv in (["run"], ["pool", "up", "--size", "1", "--output", "-"]):
        for action in build_parser().parse_known_args(argv)[0].subparser._actions:
            for option in action.option_strings:
                options.setdefault(option, action.dest + ("=True" if action.nargs == 0 else ""))

    def keyword(match):
        return options.get(match.group(0), match.group(0))
    return re.sub(r"--[a-z][a-z-]*[a-z]", keyword, message)


class WarmPool:
    """A kept warm pool (warm_pool()): a training loop's steps against it, each a batch in a new
    folder under the pool's (step-0001, ...) unless output= names one. Steps take `run`'s options
    except those the pool fixed (image, RuntimeClass, network, context, size); with a pool of
    custom episodes, its program is the steps' --episode."""

    FIXED = ("backend", "pool", "pool_size", "image", "runtime", "no_runtime_class", "network", "context")

    def __init__(self, folder):
        self.folder = Path(folder)
        self.record = json.loads((self.folder / POOL_RECORD_FILE).read_text())
        self.steps = 0

    def step_options(self, options):
        fixed = [name for name in self.FIXED if name in options]
        if fixed:
            raise TypeError("%s is the kept pool's (fixed by warm_pool()); leave it out of a step" % fixed[0])
        options = dict(options, backend=WarmPoolBackend.name, pool=str(self.folder))
        if "output" not in options:
            while True:
                self.steps += 1
                output = self.folder / ("step-%04d" % self.steps)
                if not output.exists():
                    break
            options["output"] = str(output)
        if self.record.get("episode") and "episode" not in options:
            options["episode"] = str(self.folder / self.record["episode"])
        return options

    def run_batch(self, **options):
        """One step: run_batch() against this pool; rewards in task order. Its claims are deleted
        when it ends; the pool stays."""
        return run_batch(**self.step_options(options))

    def stream_batch(self, **options):
        """One step as stream_batch(): its episodes as they are verified."""
        return stream_batch(**self.step_options(options))

    def status(self):
        """`pool status --json`: Ready sandboxes, size, age, steps served, idle cost per hour."""
        return json.loads(tool_command(["pool", "status", str(self.folder), "--json"], self.folder)[0])

    def down(self):
        """`pool down`: delete what warm_pool() made, after proving it owns it."""
        return tool_command(["pool", "down", str(self.folder)], self.folder)[1]

    def __repr__(self):
        return "WarmPool(%r, size=%r, namespace=%r)" % (str(self.folder), self.record["size"], self.record["namespace"])


@contextlib.contextmanager
def warm_pool(size, output=None, **options):
    """`with warm_pool(size=64, allow_large=True) as pool:` a warm pool kept for the block
    (`pool up`'s options as keyword arguments: image, runtime, no_runtime_class, network, episode,
    context, timeout, allow_large); `pool.run_batch(tasks=...)` per step; leaving the block
    brings the pool down (`pool down`). Its folder is `output`, or a new temporary one."""
    folder = Path(output) if output is not None else Path(tempfile.mkdtemp(prefix="rl-batch-demo-pool-")) / "pool"
    up_parser = build_parser().parse_known_args(["pool", "up", "--size", "1", "--output", "-"])[0].subparser
    actions = {action.dest: action for action in up_parser._actions
               if action.option_strings and action.dest not in ("help", "size", "output")}
    argv = ["pool", "up", "--size", str(size), "--output", str(folder)]
    for name, value in options.items():
        if name not in actions:
            raise TypeError("warm_pool() got an unexpected keyword argument %r" % name)
        if actions[name].nargs == 0:
            argv += [actions[name].option_strings[0]] if value else []
        elif value is not None:
            argv += [actions[name].option_strings[0], str(value)]
    try:
        tool_command(argv, folder, passing_stderr=True)
    except RunFailed:
        if (folder / "receipt.json").exists():
            tool_command(["pool", "down", str(folder)], folder)  # what a failed `pool up` made
        raise
    pool = WarmPool(folder)
    try:
        yield pool
    finally:
        pool.down()


if __name__ == "__main__":
    sys.exit(main())
