#!/usr/bin/env python3
"""Build the upstream control plane programs the real-control-plane tier runs.

Test infrastructure only (nothing here is shipped): each folder beside this file is a Go
module that names one upstream module at one version and the programs (`tool` lines) to
build from it. The binaries go into a cache folder outside the checkout, keyed by the
go.mod/go.sum files, this recipe and the Go version, so they are rebuilt only when one of
those changes:

    $RL_BATCH_DEMO_CONTROLPLANE_CACHE (default ~/.cache/rl-batch-demo/controlplane)/<key>/
        bin/      etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
                  kwok, kwokctl, agent-sandbox-controller (v0.5.6) and -v1 (v1.0.1), kueue
        share/    the CRDs and manifests of those same module versions (agent-sandbox's
                  k8s/crds, Kueue's config/components/crd, kwok's default stages)
        COMPLETE  written last: a folder without it is finished, never trusted

Run it alone (`python3 tests/controlplane/build.py`) or let the test suite's conftest run
it: one build step for the README's test command and .ci/run. A failed build prints one
line naming the module, its version and the first compiler error, with the log's path, and
exits 1.
"""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

KUBERNETES_VERSION = "v1.36.3"


def kube_version_ldflags(version):
    """The official build's version stamps: without them /version says v0.0.0-master,
    which kwokctl and Kueue parse (kubernetes hack/lib/version.sh)."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            "-X %s.gitVersion=%s" % (pkg, version),
            "-X %s.gitMajor=%s" % (pkg, major),
            "-X %s.gitMinor=%s" % (pkg, minor),
            "-X %s.gitTreeState=clean" % pkg,
            "-X %s.buildDate=1970-01-01T00:00:00Z" % pkg,
        ]
    return " ".join(flags)


# (module folder, package, binary name, extra go build arguments). The order is the
# order of the build: the small programs first, so a broken proxy shows in seconds.
PROGRAMS = [
    ("etcd", "go.etcd.io/etcd/server/v3", "etcd", []),
    ("kwok", "sigs.k8s.io/kwok/cmd/kwok", "kwok", []),
    ("kwok", "sigs.k8s.io/kwok/cmd/kwokctl", "kwokctl", []),
    ("agent-sandbox", "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller",
     "agent-sandbox-controller", []),
    ("agent-sandbox-v1", "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller",
     "agent-sandbox-controller-v1", []),
    ("kueue", "sigs.k8s.io/kueue/cmd/kueue", "kueue", []),
] + [
    ("kubernetes", "k8s.io/kubernetes/cmd/" + name, name,
     ["-tags=selinux,notest", "-ldflags=" + kube_version_ldflags(KUBERNETES_VERSION)])
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
]

# (module folder, upstream module, folder inside it, destination under share/)
SHARED_FILES = [
    ("agent-sandbox", "sigs.k8s.io/agent-sandbox", "k8s/crds", "agent-sandbox/crds"),
    ("agent-sandbox-v1", "sigs.k8s.io/agent-sandbox", "k8s/crds", "agent-sandbox-v1/crds"),
    ("kueue", "sigs.k8s.io/kueue", "config/components/crd/bases", "kueue/crds"),
    ("kueue", "sigs.k8s.io/kueue", "config/components/webhook", "kueue/webhook"),
    ("kueue", "sigs.k8s.io/kueue", "config/components/rbac", "kueue/rbac"),
    ("kwok", "sigs.k8s.io/kwok", "kustomize/stage", "kwok/stage"),
]

BINARIES = [name for _, _, name, _ in PROGRAMS]

# The upstream module each folder builds from (the folder's go.mod pins its version).
UPSTREAM = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kwok": "sigs.k8s.io/kwok",
    "agent-sandbox": "sigs.k8s.io/agent-sandbox",
    "agent-sandbox-v1": "sigs.k8s.io/agent-sandbox",
    "kueue": "sigs.k8s.io/kueue",
    "kubernetes": "k8s.io/kubernetes",
}


class BuildFailed(Exception):
    """One line for the user: which module failed and why."""


def say(line):
    print("controlplane: " + line, file=sys.stderr, flush=True)


def go_command():
    go = shutil.which("go")
    if not go:
        raise BuildFailed("no 'go' on PATH: the real-control-plane tier needs Go 1.26 "
                          "(install it, or run the simulated tier alone with "
                          "-m 'not controlplane')")
    return go


def go_version(go):
    return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                          check=True).stdout.strip()


def module_dirs():
    return sorted({folder for folder, _, _, _ in PROGRAMS})


def cache_root():
    return os.environ.get("RL_BATCH_DEMO_CONTROLPLANE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rl-batch-demo", "controlplane")


def cache_key(go):
    """What the binaries depend on: every go.mod and go.sum, this recipe, the Go version."""
    digest = hashlib.sha256()
    digest.update(go_version(go).encode())
    digest.update(json.dumps([PROGRAMS, SHARED_FILES]).encode())
    for folder in module_dirs():
        for name in ("go.mod", "go.sum"):
            with open(os.path.join(HERE, folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def module_version(folder, module):
    """The version of an upstream module as the folder's go.mod resolves it."""
    out = subprocess.run(["go", "list", "-m", "-json", module], cwd=os.path.join(HERE, folder),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildFailed("%s: go list -m %s failed: %s" % (folder, module,
                                                           first_error(out.stderr)))
    return json.loads(out.stdout)


def first_error(text):
    lines = [line for line in text.splitlines()
             if line.strip() and not line.startswith("go: downloading")]
    for line in lines:
        if ": " in line and ("error" in line.lower() or ".go:" in line or "go: " in line):
            return line.strip()
    return lines[-1].strip() if lines else "(no output)"


def build_env():
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def build_program(go, folder, package, name, extra, bin_dir, log_dir, index):
    target = os.path.join(bin_dir, name)
    if os.path.exists(target):
        say("[%d/%d] %s: built already" % (index, len(PROGRAMS), name))
        return
    upstream = module_version(folder, UPSTREAM[folder])
    say("[%d/%d] building %s from %s %s ..." % (index, len(PROGRAMS), name, upstream["Path"],
                                                upstream["Version"]))
    started = time.monotonic()
    log_path = os.path.join(log_dir, name + ".log")
    partial = target + ".partial"
    with open(log_path, "w") as log:
        proc = subprocess.run([go, "build", "-trimpath", "-o", partial] + extra + [package],
                              cwd=os.path.join(HERE, folder), env=build_env(),
                              stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log_path) as log:
            error = first_error(log.read())
        raise BuildFailed("building %s from %s %s failed: %s (full log: %s)" % (
            name, upstream["Path"], upstream["Version"], error, log_path))
    os.replace(partial, target)
    say("[%d/%d] %s built in %.0f s" % (index, len(PROGRAMS), name,
                                        time.monotonic() - started))


def copy_shared_files(share_dir):
    for folder, module, inner, dest in SHARED_FILES:
        info = module_version(folder, module)
        source = os.path.join(info["Dir"], inner)
        if not os.path.isdir(source):
            raise BuildFailed("%s %s has no folder %s" % (module, info["Version"], inner))
        target = os.path.join(share_dir, dest)
        if os.path.isdir(target):
            shutil.rmtree(target)
        shutil.copytree(source, target)
        # The module cache is read-only; the copies must be removable with the cache.
        for root, dirs, files in os.walk(target):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
            os.chmod(root, 0o755)


def ensure_built():
    """Build what is missing; return the cache folder holding bin/ and share/."""
    go = go_command()
    folder = os.path.join(cache_root(), cache_key(go))
    complete = os.path.join(folder, "COMPLETE")
    if os.path.exists(complete):
        return folder
    bin_dir, share_dir, log_dir = (os.path.join(folder, sub) for sub in ("bin", "share", "logs"))
    for sub in (bin_dir, share_dir, log_dir):
        os.makedirs(sub, exist_ok=True)
    # Two suites at once build once: the second waits on the lock, then finds COMPLETE.
    with open(os.path.join(folder, ".lock"), "w") as lock:
        if not try_lock(lock):
            say("another build holds %s; waiting for it" % folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(complete):
            return folder
        started = time.monotonic()
        say("building the upstream programs into %s (%s; a first build takes tens of "
            "minutes on 2 cores)" % (folder, go_version(go)))
        for index, (module_folder, package, name, extra) in enumerate(PROGRAMS, 1):
            build_program(go, module_folder, package, name, extra, bin_dir, log_dir, index)
        copy_shared_files(share_dir)
        with open(complete, "w") as f:
            json.dump({"built_seconds": round(time.monotonic() - started, 1),
                       "go": go_version(go), "binaries": BINARIES}, f)
        say("all %d programs built in %.0f s" % (len(PROGRAMS), time.monotonic() - started))
    return folder


def try_lock(lock):
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def main():
    try:
        folder = ensure_built()
    except BuildFailed as exc:
        say(str(exc))
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
