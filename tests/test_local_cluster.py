"""tests/localcluster.py: the local cluster the README's quick start tries the cluster backends on,
run as a user runs it (up, the tool against the kubeconfig it printed, down)."""

import json
import os
from pathlib import Path
import subprocess
import sys

from conftest import ROOT, SCRIPT, Result, processes_under, read
from fakecluster import REAL_KUBECTL

LOCAL_CLUSTER = ROOT / "tests" / "localcluster.py"


def local_cluster(tmp_path, *args, timeout=600):
    done = subprocess.run([sys.executable, str(LOCAL_CLUSTER), *args], cwd=str(tmp_path), text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return Result(done)


def tool_on(kubeconfig, tmp_path, *args):
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    env.pop("KUBECTL", None)
    env["PATH"] = os.pathsep.join([str(Path(REAL_KUBECTL).parent), env.get("PATH", "")])
    done = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=str(tmp_path), env=env, text=True,
                          capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    return Result(done)


def test_the_local_cluster_runs_the_quick_starts_job_and_warm_pool_and_stops_leaving_nothing(
        controlplane_binaries, tmp_path):
    started = local_cluster(tmp_path, "up", "cluster")
    try:
        assert started.code == 0, started
        kubeconfig = started.stdout.strip()  # stdout: only the path, for `export KUBECONFIG=$(... up DIR)`
        assert kubeconfig == str(tmp_path / "cluster" / "control-plane" / "kubeconfig")
        assert "use it:  export KUBECONFIG=%s" % kubeconfig in started.stderr
        assert json.loads(local_cluster(tmp_path, "status", "cluster").stdout)["state"] == "running"
        job = tool_on(kubeconfig, tmp_path, "run", "--count", "3", "--output", "job-3")
        assert job.code == 0, job
        warm = tool_on(kubeconfig, tmp_path, "run", "--backend", "warm-pool", "--count", "2", "--output", "warm-2")
        assert warm.code == 0, warm
        assert [read(tmp_path / folder / "results.json")["reward_sum"] for folder in ("job-3", "warm-2")] == [3, 2]
        cleaned = tool_on(kubeconfig, tmp_path, "cleanup", "job-3", "warm-2")
        assert cleaned.code == 0, cleaned
    finally:
        stopped = local_cluster(tmp_path, "down", "cluster")
    assert stopped.code == 0, stopped
    assert "stopped the local cluster in %s" % (tmp_path / "cluster") in stopped.stderr
    assert not processes_under(tmp_path / "cluster")  # down returns once every part has stopped
    assert json.loads(local_cluster(tmp_path, "status", "cluster").stdout)["state"] == "stopped"


def test_up_into_a_folder_that_holds_files_is_refused_and_starts_nothing(tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine\n")
    done = local_cluster(tmp_path, "up", "busy")
    assert done.code == 2, done
    assert done.stderr.strip() == ("localcluster: %s exists and is not an empty folder: name a new one (nothing is "
                                   "overwritten)" % (tmp_path / "busy"))
    assert sorted(os.listdir(tmp_path / "busy")) == ["notes.txt"]


def test_down_of_a_folder_that_is_no_local_clusters_is_refused(tmp_path):
    (tmp_path / "other").mkdir()
    done = local_cluster(tmp_path, "down", "other")
    assert done.code == 2, done
    assert done.stderr.strip() == ("localcluster: %s is not a local cluster's folder (no localcluster.json): give the "
                                   "folder `up` made" % (tmp_path / "other"))
