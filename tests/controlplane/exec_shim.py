"""The first program of a `kubectl exec` into a pod of the episode runtime, as kwok runs it: kwok's
`Exec` object for the pod (written by runtime.py) runs the command as a local process with
RL_RUNTIME_MOUNTS set (the pod's volume mount paths and their local folders, JSON); this shim,
installed by cluster.py (its first line this machine's Python) as `env` and `sh` first on
kwok-controller's PATH, appends the command to RL_RUNTIME_EXEC_LOG, translates those mount paths
in the arguments and the environment (there is no mount namespace, as for the pod's own
process) and execs the machine's real program. Without RL_RUNTIME_MOUNTS it is the real program,
untouched (kwok's own use of `sh` or `env`, if any)."""

import json
import os
import re
import sys

name = os.path.basename(sys.argv[0])
here = os.path.dirname(os.path.abspath(sys.argv[0]))
real = next(os.path.join(folder, name) for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if folder and os.path.abspath(folder) != here and os.access(os.path.join(folder, name), os.X_OK))
mounts = json.loads(os.environ.pop("RL_RUNTIME_MOUNTS", "{}"))
args = sys.argv[1:]
exec_log = os.environ.pop("RL_RUNTIME_EXEC_LOG", "")
if exec_log:  # what was exec'd into the pod, one JSON line each (ControlPlane.execs())
    with open(exec_log, "a") as log:
        log.write(json.dumps([name, *args]) + "\n")
synthetic = os.environ.get("RL_RUNTIME_SYNTHETIC_SECONDS")
# benchmark mode: the episode program's run (an `env ... episode.py`, however deep in the exec's
# shells) makes up runtime.py's events; a shell around it (a recycled episode's reset check after it) runs
if synthetic and name == "env" and any(arg.endswith("episode.py") for arg in args):
    import time
    start = time.time()
    time.sleep(float(synthetic))
    episode_id = next((arg.split("=", 1)[1] for arg in args if arg.startswith("EPISODE_ID=")), "")
    from runtime import synthetic_events
    sys.stdout.write(synthetic_events(episode_id, start, time.time()))
    sys.exit(0)
if mounts:
    pattern = re.compile(r"(?<![\w./-])(%s)(?=/|\b|$)" % "|".join(re.escape(path) for path in
                                                               sorted(mounts, key=len, reverse=True)))

    def translated(text):
        return pattern.sub(lambda match: mounts[match.group(1)], text)
    args = [translated(arg) for arg in args]
    for key, value in list(os.environ.items()):
        os.environ[key] = translated(value)
os.execv(real, [name, *args])
