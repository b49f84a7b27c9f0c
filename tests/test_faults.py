"""Nothing lost when the world changes mid-run (issue "Nothing lost"): the Job or its namespace
deleted by someone else, the API server away for a while, a call that hangs. Each test runs the
real script through the simulated cluster and asserts the exit code, the one line and the
files kept."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import SCRIPT, cluster_with_image, first_then_slow, read, start_tool, succeeded_pods, wait_for


def slow_start_cluster(make_cluster, tmp_path, **config):
    """Episodes that start 3 s late, so that a fault lands while the batch runs."""
    return cluster_with_image(make_cluster, tmp_path, "slow-start:1",
                              'case "$*" in *episode.py*) sleep 3;; esac\nexec $PY "$@"', **config)


def run_until_one_pod_succeeded(make_cluster, tmp_path):
    """A two-episode run whose second episode hangs; returns (cluster, process, namespace) once
    the tool's pod watch has delivered the first episode's pod succeeded (--stream prints the
    episode when its watch shows it)."""
    cluster = cluster_with_image(make_cluster, tmp_path, "first-then-slow:1", first_then_slow(tmp_path))
    process = start_tool(cluster, tmp_path, "run", "--count", "2", "--image", "first-then-slow:1", "--output", "out",
                         "--stream")
    line = process.stdout.readline()
    assert json.loads(line)["type"] == "episode", line
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    assert succeeded_pods(cluster, namespace)
    return cluster, process, namespace


def test_a_job_deleted_by_someone_else_is_named_and_what_the_watches_saw_is_kept(make_cluster, tmp_path):
    cluster, process, namespace = run_until_one_pod_succeeded(make_cluster, tmp_path)
    cluster.kubectl("-n", namespace, "delete", "job", "rollout", "--wait=false")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    line = [line for line in stderr.splitlines() if line.startswith("Error: ")][-1]
    assert line.startswith("Error: Job rollout was deleted by someone else while the batch ran"), stderr
    assert line.endswith("cleanup --output out") and "pods.json (2 pod(s)" in line
    out = tmp_path / "out"
    pods = read(out / "pods.json")
    assert [pod["status"]["phase"] for pod in pods].count("Succeeded") == 1
    assert read(out / "job.json")["metadata"]["name"] == "rollout"
    assert (out / "observed.json").exists() and (out / "run.json").exists()


def test_a_namespace_deleted_by_someone_else_is_named(make_cluster, tmp_path):
    cluster, process, namespace = run_until_one_pod_succeeded(make_cluster, tmp_path)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "Error: namespace %s was deleted by someone else while the batch ran" % namespace in stderr
    assert [pod["status"]["phase"] for pod in read(tmp_path / "out" / "pods.json")].count("Succeeded") == 1


def test_an_api_server_away_for_20_s_is_waited_out_and_the_batch_collected(make_cluster, run_tool, tmp_path):
    # A control-plane upgrade: nothing answers for 20 s from 1 s after the Job's creation,
    # longer than the 15 s a single call is retried.
    cluster = slow_start_cluster(make_cluster, tmp_path, apiOutage={"afterJobCreatedSeconds": 1.0, "seconds": 20})
    result = run_tool("run", "--count", "2", "--image", "slow-start:1", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "the API server is not answering (The connection to the server" in result.stderr
    assert "the API server answers again, after" in result.stderr
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 2


def test_an_api_server_away_past_the_deadline_ends_the_wait_with_what_was_seen(make_cluster, run_tool, tmp_path):
    cluster = slow_start_cluster(make_cluster, tmp_path, apiOutage={"afterJobCreatedSeconds": 1.0, "seconds": 600})
    result = run_tool("run", "--count", "2", "--image", "slow-start:1", "--timeout", "2", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result
    assert "Error: the API server did not answer for the last" in result.stderr
    assert "what the run saw is saved in out: job.json, pods.json" in result.stderr
    assert (tmp_path / "out" / "observed.json").exists()


def test_a_poll_that_hangs_does_not_hold_up_a_batch_the_watch_saw_complete(make_cluster, run_tool, tmp_path):
    # The wait's first `get job` hangs 40 s (a stuck connection); its request timeout is 30 s.
    cluster = make_cluster({"transientFailures": [{"verb": "get", "resource": "jobs", "times": 1, "kind": "hang",
                                                   "seconds": 40}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    # Waiting for the hung call would have put the Complete the client saw at least its 30 s
    # request timeout after the wait began: the tool's own figure, not the test's clock.
    seen = read(tmp_path / "out" / "results.json")["client_job_complete_seconds"]
    assert seen < 30, "the run waited for the hung call (%.1f s)" % seen


# ---------------------------------------------------------------- the output folder fails mid-run

def error_line(stderr):
    return [line for line in stderr.splitlines() if line.startswith("Error: ")][-1]


def test_an_output_folder_removed_mid_run_prints_the_receipt_and_cleanup_takes_it(make_cluster, tmp_path):
    cluster = slow_start_cluster(make_cluster, tmp_path)
    process = start_tool(cluster, tmp_path, "run", "--count", "2", "--image", "slow-start:1", "--output", "out")
    receipt = tmp_path / "out" / "receipt.json"
    wait_for("the Job", lambda: receipt.exists() and "job_uid" in receipt.read_text())
    namespace = read(receipt)["namespace"]
    shutil.rmtree(tmp_path / "out")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    line = error_line(stderr)
    assert line.startswith("Error: cannot write to the output folder out: No such file or directory"), stderr
    assert "Traceback" not in stderr
    command = line.split("Clean up with: ", 1)[1].split(" (receipt.json in out is lost")[0]
    assert command.startswith("echo '{") and command.endswith("cleanup --receipt -")
    cleanup = subprocess.run(command, shell=True, cwd=str(tmp_path), env=cluster.env(), text=True,
                             capture_output=True, timeout=120)
    assert cleanup.returncode == 0, cleanup.stderr
    assert cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0


@pytest.mark.parametrize("fault, message", [("fill", "No space left on device"),
                                            ("remount-ro", "Read-only file system")])
def test_an_output_disk_that_fails_mid_run_gets_one_line_and_leaves_no_partial_file(make_cluster, run_tool,
                                                                                    tmp_path, fault, message):
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and `unshare -m` to mount a small tmpfs as the output disk")
    cluster = slow_start_cluster(make_cluster, tmp_path)
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    kept.mkdir()
    how = "head -c 50M /dev/zero > filler 2>/dev/null" if fault == "fill" else 'mount -o remount,ro "%s"' % disk
    script = """set -u
mount -t tmpfs -o size=2m tmpfs "{disk}"
cd "{disk}"
"{python}" "{script}" run --count 2 --image slow-start:1 --output out 2>"{kept}/stderr" &
until grep -q job_uid out/receipt.json 2>/dev/null; do sleep 0.1; done
{how}
wait $!
echo $? > "{kept}/rc"
ls -a out > "{kept}/listing"
cp -r out "{kept}/out"
""".format(disk=disk, python=sys.executable, script=SCRIPT, kept=kept, how=how)
    subprocess.run(["unshare", "-m", "sh", "-c", script], env=cluster.env(), timeout=180, check=True)
    stderr = (kept / "stderr").read_text()
    assert (kept / "rc").read_text().strip() == "1", stderr
    line = error_line(stderr)
    assert line.startswith("Error: cannot write to the output folder out: %s (out/" % message), stderr  # the file
    assert line.endswith("cleanup --output out") and "Traceback" not in stderr
    assert not [name for name in (kept / "listing").read_text().split() if name.endswith(".partial")]
    assert run_tool("cleanup", "--output", str(kept / "out"), cluster=cluster).code == 0
