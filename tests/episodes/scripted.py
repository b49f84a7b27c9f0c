"""A test episode whose behaviour its task chooses: {"mode": ..., "reward": r, "marker": path,
"sleep": seconds of work after ready}.

ok         ready, then reward r
crash      ready, then exit 3 without a reward
malformed  ready, then a reward that is not a number
no_ready   reward only
crash_once crash if `marker` does not exist yet (creating it), else like ok: a flaky episode

"chatter": n prints n lines of its own output after ready; "trailing": text is written last,
without a newline; "stderr": text is written to stderr after ready; "binary": true prints a line
that is not UTF-8 after ready.
"wait_for": path holds the episode after ready until that file exists.
"runs": path gets a line with the episode's EPISODE_ID each time the episode starts.
"termination_message": true also writes the events to the termination-message file.
"on_sigterm": "exit" installs a SIGTERM handler that exits 143 (without it, a `python` that is
a container's PID 1 does not see SIGTERM at all).
"leave": what the episode leaves in its sandbox after its reward (a recycled pool's reset check
finds it): "daemon" a double-forked process that lives as long as the sandbox's keep-alive,
"tmpfile" a file in $TMPDIR (or /tmp), "chmod_workspace" its workspace made mode 000,
"kill_keepalive" the sandbox's keep-alive killed (SIGKILL), the episode then waiting to end with it.
"""
import json
import os
import signal
import sys
import time

started_at = time.time()


EVENTS = []


def emit(event, **fields):
    EVENTS.append(json.dumps(dict(event=event, at=time.time(), episode_id=os.environ["EPISODE_ID"], **fields)))
    print(EVENTS[-1], flush=True)
    if task.get("termination_message"):
        with open(os.environ.get("RL_TERMINATION_LOG", "/dev/termination-log"), "w") as message:
            message.write("\n".join(EVENTS) + "\n")


with open(os.environ["TASK_FILE"]) as task_file:
    task = json.load(task_file)
if task.get("on_sigterm") == "exit":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
if task.get("runs"):
    with open(task["runs"], "a") as runs:
        runs.write(os.environ["EPISODE_ID"] + "\n")
print("episode %s starting task %s" % (os.environ["EPISODE_ID"], task.get("id")), flush=True)
mode = task.get("mode", "ok")
if mode != "no_ready":
    emit("ready", started_at=started_at, imports_done_at=time.time())
time.sleep(task.get("sleep", 0))
while task.get("wait_for") and not os.path.exists(task["wait_for"]):
    time.sleep(0.05)  # held until the test creates the file: a step that stays under way
if task.get("stderr"):
    print(task["stderr"], file=sys.stderr, flush=True)
if task.get("binary"):
    sys.stdout.flush()
    sys.stdout.buffer.write(b"\xff\xfe a line that is not UTF-8 \xc3\x28\n")
    sys.stdout.buffer.flush()
for line in range(task.get("chatter", 0)):
    print("step %d of the episode's own output, which is not an event" % line)
if mode == "crash" or (mode == "crash_once" and not os.path.exists(task["marker"])):
    if mode == "crash_once":
        open(task["marker"], "w").close()
    print("Traceback (most recent call last):\nRuntimeError: the sandbox lost its tools", file=sys.stderr)
    sys.exit(3)
if mode == "malformed":
    emit("reward", reward="high")
    sys.exit(0)
emit("reward", reward=task.get("reward", 1), task_id=task.get("id"), index=os.environ.get("TASK_INDEX"))
if task.get("trailing"):
    sys.stdout.write(task["trailing"])


def keep_alive():
    """The sandbox's keep-alive (a container's PID 1; in a simulated sandbox, the process of its
    RL_SANDBOX_ID whose command is the keep-alive's)."""
    own = os.environ.get("RL_SANDBOX_ID")
    for pid in sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as command:
                words = command.read()
            if b"trap" not in words or b"sleep infinity" not in words:
                continue
            if own is not None:
                with open("/proc/%d/environ" % pid, "rb") as environ:
                    if ("RL_SANDBOX_ID=" + own).encode() not in environ.read().split(b"\0"):
                        continue
            return pid
        except OSError:
            continue
    raise SystemExit("no keep-alive process found")


left = task.get("leave")
if left == "daemon":
    watched = keep_alive()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for descriptor in (0, 1, 2):
                os.dup2(devnull, descriptor)
            os.execvp("sh", ["sh", "-c", "while kill -0 %d 2>/dev/null; do sleep 0.2; done" % watched])
        os._exit(0)
    os.wait()
elif left == "tmpfile":
    with open(os.path.join(os.environ.get("TMPDIR") or "/tmp", "left-behind"), "w") as behind:
        behind.write("what the next episode would find\n")
elif left == "chmod_workspace":
    os.chmod(os.environ.get("RL_WORKSPACE", "/workspace"), 0)
elif left == "kill_keepalive":
    os.kill(keep_alive(), signal.SIGKILL)
    time.sleep(300)  # the container's end ends the episode too (as a real one's processes end with it)
