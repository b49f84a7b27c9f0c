#!/usr/bin/env python3
"""Build the real node's programs and images: what a Kubernetes node runs, from upstream.

Test infrastructure only (nothing here is shipped). Each folder beside this file is a Go module
that names one upstream module at one version and the programs (`tool` lines) built from it;
the images are made from Debian's packages. Everything goes into a cache folder outside the
checkout, keyed by the go.mod/go.sum files, the patches, this recipe, the Go version and the
Debian release, so that it is rebuilt only when one of those changes:

    $RL_BATCH_DEMO_REALNODE_CACHE (default ~/.cache/rl-batch-demo/realnode)/<key>/
        bin/      kubelet, containerd, containerd-shim-runc-v2, ctr, runc, runsc,
                  containerd-shim-runsc-v1, registry, pause
        cni/      bridge, host-local, loopback (the CNI plugins the node's network uses)
        images/   OCI image layouts: pause, python (Debian bookworm minbase with python3),
                  no-python (an image whose `python` does not exist)
        COMPLETE  written last: a folder without it is unfinished, never trusted

runc is the one program built with cgo (its nsenter is C; seccomp through libseccomp, Debian's
libseccomp-dev); gVisor is built from a copy of its module's source with gvisor/*.patch applied
(ASSUMPTIONS.md says why). Run it alone (`python3 tests/realnode/build.py`) or let the suite's
conftest run it, after the control plane's build (tests/controlplane/build.py). A failed build
prints one line naming the part, its version and the first error, with the log's path, and
exits 1.
"""

import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for a run of this file alone
from controlplane import build as controlplane_build  # noqa: E402  (the control plane's recipe: stamps, errors)

KUBERNETES_VERSION = controlplane_build.KUBERNETES_VERSION
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PYTHON_PACKAGES = "python3"  # Debian bookworm: Python 3.11 with its whole standard library

# (module folder, package, binary name, destination, extra go build arguments, cgo)
PROGRAMS = [
    ("pause", ".", "pause", "bin", [], False),
    ("cni", "github.com/containernetworking/plugins/plugins/main/bridge", "bridge", "cni", [], False),
    ("cni", "github.com/containernetworking/plugins/plugins/ipam/host-local", "host-local", "cni", [], False),
    ("cni", "github.com/containernetworking/plugins/plugins/main/loopback", "loopback", "cni", [], False),
    ("registry", "github.com/distribution/distribution/v3/cmd/registry", "registry", "bin", [], False),
    ("runc", "github.com/opencontainers/runc", "runc", "bin", ["-tags=seccomp urfave_cli_no_docs"], True),
    ("containerd", "github.com/containerd/containerd/v2/cmd/containerd", "containerd", "bin",
     ["-tags=no_btrfs"], False),
    ("containerd", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "containerd-shim-runc-v2",
     "bin", ["-tags=no_btrfs"], False),
    ("containerd", "github.com/containerd/containerd/v2/cmd/ctr", "ctr", "bin", ["-tags=no_btrfs"], False),
    ("gvisor", "./runsc", "runsc", "bin", [], False),
    ("gvisor", "./shim", "containerd-shim-runsc-v1", "bin", [], False),
    ("kubelet", "k8s.io/kubernetes/cmd/kubelet", "kubelet", "bin",
     ["-tags=selinux,notest", "-ldflags=" + controlplane_build.kube_version_ldflags(KUBERNETES_VERSION)], False),
]

# The upstream module each folder builds from (the folder's go.mod pins its version).
UPSTREAM = {
    "pause": None,
    "cni": "github.com/containernetworking/plugins",
    "registry": "github.com/distribution/distribution/v3",
    "runc": "github.com/opencontainers/runc",
    "containerd": "github.com/containerd/containerd/v2",
    "gvisor": "gvisor.dev/gvisor",
    "kubelet": "k8s.io/kubernetes",
}
# Folders built from a patched copy of their upstream module's source (every *.patch in the folder).
PATCHED = ("gvisor",)

IMAGES = ("pause", "python", "no-python")
# Raised when the way an image is written changes (what the key cannot see in the lists above).
RECIPE = 1


class BuildFailed(Exception):
    """One line for the user: which part failed and why."""


def say(line):
    print("realnode: " + line, file=sys.stderr, flush=True)


def cache_root():
    return os.environ.get("RL_BATCH_DEMO_REALNODE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "rl-batch-demo", "realnode")


def module_dirs():
    return sorted({folder for folder, *_ in PROGRAMS})


def cache_key(go):
    digest = hashlib.sha256()
    digest.update(controlplane_build.go_version(go).encode())
    digest.update(json.dumps([RECIPE, PROGRAMS, IMAGES, DEBIAN_SUITE, PYTHON_PACKAGES, ROOTFS_DROPPED]).encode())
    for folder in module_dirs():
        for name in sorted(os.listdir(os.path.join(HERE, folder))):
            if name.endswith((".mod", ".sum", ".patch", ".go")):
                with open(os.path.join(HERE, folder, name), "rb") as f:
                    digest.update(folder.encode() + b"/" + name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def module_info(folder, module):
    out = subprocess.run(["go", "mod", "download", "-json", module], cwd=os.path.join(HERE, folder),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildFailed("%s: go mod download %s failed: %s" % (folder, module,
                                                                controlplane_build.first_error(out.stdout + out.stderr)))
    info = json.loads(out.stdout)
    listed = subprocess.run(["go", "list", "-m", "-json", module], cwd=os.path.join(HERE, folder),
                            capture_output=True, text=True, check=True)
    info.update({key: value for key, value in json.loads(listed.stdout).items() if key in ("Version", "Dir")})
    return info


def patched_source(folder, work_dir):
    """A writable copy of the folder's upstream module with its patches applied; its path."""
    info = module_info(folder, UPSTREAM[folder])
    target = os.path.join(work_dir, "%s@%s" % (folder, info["Version"]))
    if os.path.exists(os.path.join(target, ".patched")):
        return target, info
    if os.path.exists(target):
        shutil.rmtree(target)
    shutil.copytree(info["Dir"], target)
    for root, dirs, files in os.walk(target):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    for patch in sorted(name for name in os.listdir(os.path.join(HERE, folder)) if name.endswith(".patch")):
        done = subprocess.run(["patch", "-p1", "--forward", "-i", os.path.join(HERE, folder, patch)], cwd=target,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildFailed("%s %s: %s does not apply: %s" % (UPSTREAM[folder], info["Version"], patch,
                                                               (done.stdout + done.stderr).strip().splitlines()[-1]))
    open(os.path.join(target, ".patched"), "w").close()
    return target, info


def build_env(cgo):
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1" if cgo else "0"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


def build_program(go, spec, folder_root, log_dir, work_dir, index):
    folder, package, name, dest, extra, cgo = spec
    target = os.path.join(folder_root, dest, name)
    if os.path.exists(target):
        say("[%d/%d] %s: built already" % (index, len(PROGRAMS), name))
        return
    if folder in PATCHED:
        cwd, info = patched_source(folder, work_dir)
        what = "%s %s (patched)" % (info["Path"], info["Version"])
    elif UPSTREAM[folder]:
        cwd, info = os.path.join(HERE, folder), module_info(folder, UPSTREAM[folder])
        what = "%s %s" % (info["Path"], info["Version"])
    else:
        cwd, what = os.path.join(HERE, folder), "tests/realnode/" + folder
    say("[%d/%d] building %s from %s ..." % (index, len(PROGRAMS), name, what))
    started = time.monotonic()
    log_path = os.path.join(log_dir, name + ".log")
    partial = target + ".partial"
    with open(log_path, "w") as log:
        proc = subprocess.run([go, "build", "-trimpath", "-o", partial] + extra + [package], cwd=cwd,
                              env=build_env(cgo), stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        with open(log_path) as log:
            error = controlplane_build.first_error(log.read())
        hint = " (runc needs gcc and Debian's libseccomp-dev)" if cgo else ""
        raise BuildFailed("building %s from %s failed: %s%s (full log: %s)" % (name, what, error, hint, log_path))
    os.replace(partial, target)
    say("[%d/%d] %s built in %.0f s" % (index, len(PROGRAMS), name, time.monotonic() - started))


# ---------------------------------------------------------------- images (OCI image layouts)


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def tar_layer(add):
    """A gzip-compressed layer: `add(tarfile)` writes its members; (compressed bytes, diff id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    data = raw.getvalue()
    return gzip.compress(data, compresslevel=6, mtime=0), "sha256:" + sha256_hex(data)


def write_layout(folder, layers, config):
    """An OCI image layout (oci-layout, index.json, blobs/sha256/...) of one linux/amd64 image."""
    blobs = os.path.join(folder, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def blob(data, media_type):
        digest = sha256_hex(data)
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}

    config = dict(config, architecture="amd64", os="linux",
                  rootfs={"type": "layers", "diff_ids": [diff_id for _, diff_id in layers]})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": blob(json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json"),
                "layers": [blob(data, "application/vnd.oci.image.layer.v1.tar+gzip") for data, _ in layers]}
    described = blob(json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
    with open(os.path.join(folder, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [described]}, f)
    with open(os.path.join(folder, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)


def add_file(tar, name, data, mode=0o755):
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def pause_layer(pause_binary):
    with open(pause_binary, "rb") as f:
        data = f.read()
    return tar_layer(lambda tar: add_file(tar, "pause", data))


# What a rootfs made by debootstrap holds that an image does not: the runtime mounts /dev, /proc
# and /sys; caches, lists and docs only make the pull longer.
ROOTFS_DROPPED = ("dev/", "proc/", "sys/", "run/", "tmp/", "var/cache/apt/", "var/lib/apt/lists/",
                  "usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/", "var/log/")


def rootfs_layer(rootfs):
    def add(tar):
        for root, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(root, name)
                inside = os.path.relpath(path, rootfs)
                if any((inside + "/").startswith(d) and inside + "/" != d for d in ROOTFS_DROPPED):
                    continue
                info = tar.gettarinfo(path, inside)
                info.mtime, info.uname, info.gname = 0, "", ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym() or info.islnk():
                    tar.addfile(info)
        link = tarfile.TarInfo("usr/local/bin/python")
        link.type, link.linkname, link.mode = tarfile.SYMTYPE, "/usr/bin/python3", 0o777
        tar.addfile(link)
    return tar_layer(add)


def debootstrap(target, log_dir):
    if shutil.which("debootstrap") is None:
        raise BuildFailed("no debootstrap on PATH: the python image is made with Debian's debootstrap "
                          "(apt-get install debootstrap)")
    log_path = os.path.join(log_dir, "debootstrap.log")
    partial = target + ".partial"
    if os.path.exists(partial):
        shutil.rmtree(partial)
    with open(log_path, "w") as log:
        done = subprocess.run(["debootstrap", "--variant=minbase", "--include=" + PYTHON_PACKAGES, DEBIAN_SUITE,
                               partial, DEBIAN_MIRROR], stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        with open(log_path) as log:
            error = controlplane_build.first_error(log.read())
        raise BuildFailed("debootstrap of Debian %s with %s failed: %s (full log: %s)" % (
            DEBIAN_SUITE, PYTHON_PACKAGES, error, log_path))
    os.replace(partial, target)


def build_images(folder_root, log_dir, work_dir):
    images = os.path.join(folder_root, "images")
    os.makedirs(images, exist_ok=True)
    pause = pause_layer(os.path.join(folder_root, "bin", "pause"))
    for name, layers, config in (
            ("pause", [pause], {"config": {"Entrypoint": ["/pause"]}}),
            # an image whose `python` does not exist: the kubelet's StartError
            ("no-python", [pause], {"config": {"Cmd": ["/pause"], "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]}})):
        if not os.path.exists(os.path.join(images, name, "index.json")):
            write_layout(os.path.join(images, name), layers, config)
    if not os.path.exists(os.path.join(images, "python", "index.json")):
        # kept beside the keyed folders: a change of recipe need not fetch Debian's packages again
        rootfs = os.path.join(cache_root(), "rootfs", "%s-%s" % (DEBIAN_SUITE, PYTHON_PACKAGES))
        os.makedirs(os.path.dirname(rootfs), exist_ok=True)
        if not os.path.isdir(rootfs):
            say("making the python image's root filesystem (debootstrap %s --include=%s, about a minute) ..." % (
                DEBIAN_SUITE, PYTHON_PACKAGES))
            debootstrap(rootfs, log_dir)
        started = time.monotonic()
        write_layout(os.path.join(images, "python"), [rootfs_layer(rootfs)], {"config": {
            "Cmd": ["python3"], "Env": ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                                        "LANG=C.UTF-8"]}})
        say("python image written in %.0f s" % (time.monotonic() - started))


# Debian's packages the build needs: debootstrap (the python image), gcc's headers for runc's
# seccomp (libseccomp-dev, found through pkg-config). Installed here when missing, as root: one
# build step for the README's test command and .ci/run.
DEBIAN_PACKAGES = ("debootstrap", "libseccomp-dev", "pkg-config", "patch")


def ensure_debian_packages():
    missing = [name for name in DEBIAN_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True,
                                 text=True).stdout.strip() != "install ok installed"]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise BuildFailed("the real node's build needs Debian's %s (apt-get install %s)" % (
            ", ".join(missing), " ".join(missing)))
    say("installing Debian's %s ..." % ", ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise BuildFailed("%s failed: %s" % (" ".join(argv), controlplane_build.first_error(done.stdout + done.stderr)))


def ensure_built():
    """Build what is missing; return the cache folder holding bin/, cni/ and images/."""
    go = controlplane_build.go_command()
    folder = os.path.join(cache_root(), cache_key(go))
    complete = os.path.join(folder, "COMPLETE")
    if os.path.exists(complete):
        return folder
    dirs = [os.path.join(folder, sub) for sub in ("bin", "cni", "images", "logs", "work")]
    for sub in dirs:
        os.makedirs(sub, exist_ok=True)
    log_dir, work_dir = dirs[3], dirs[4]
    with open(os.path.join(folder, ".lock"), "w") as lock:
        if not controlplane_build.try_lock(lock):
            say("another build holds %s; waiting for it" % folder)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(complete):
            return folder
        ensure_debian_packages()
        started = time.monotonic()
        say("building the real node's programs and images into %s (%s)" % (folder, controlplane_build.go_version(go)))
        for index, spec in enumerate(PROGRAMS, 1):
            build_program(go, spec, folder, log_dir, work_dir, index)
        build_images(folder, log_dir, work_dir)
        shutil.rmtree(work_dir)
        with open(complete, "w") as f:
            json.dump({"built_seconds": round(time.monotonic() - started, 1), "go": controlplane_build.go_version(go),
                       "programs": [name for _, _, name, *_ in PROGRAMS], "images": list(IMAGES)}, f)
        say("the real node built in %.0f s" % (time.monotonic() - started))
    return folder


def main():
    try:
        folder = ensure_built()
    except (BuildFailed, controlplane_build.BuildFailed) as exc:
        say(str(exc))
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
