"""`run` and `cleanup` end to end, as a user runs them, through the simulated cluster."""

import json
from pathlib import Path
import sys

import pytest

PYTHON = sys.executable


def make_image(tmp_path, name, body):
    """A test image: its `python` is a shell script around the real interpreter."""
    path = tmp_path / ("image-" + name)
    path.write_text("#!/bin/sh\n" + body.replace("$PY", '"%s"' % PYTHON) + "\n")
    path.chmod(0o755)
    return str(path)


def cluster_with_image(make_cluster, tmp_path, name, body, **config):
    images = {"python:3.12-alpine": {"python": PYTHON}, name: {"python": make_image(tmp_path, name, body)}}
    return make_cluster({"images": images, **config})


def read(path):
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------- the happy paths


def test_run_10_parallel_writes_results(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "10", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    results = read(out / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10)
    assert (results["parallelism"], results["runtime"], results["image"]) == (10, "cube", "python:3.12-alpine")
    assert results["cache_state"] == "uncontrolled"
    assert results["context"] == "kind-rl"
    assert sum(results["nodes"].values()) == 10
    assert len(results["pods"]) == 10
    assert 0 < results["pod_to_ready_p50_seconds"] <= results["pod_to_ready_p95_seconds"] <= results[
        "pod_to_ready_max_seconds"]
    assert results["batch_to_all_ready_seconds"] <= results["batch_to_all_rewards_seconds"]
    assert results["client_job_complete_seconds"] > 0
    for name in ("receipt.json", "job-submitted.json", "job.json", "pods.json", "events.txt"):
        assert (out / name).is_file(), name
    assert sorted(p.name for p in out.glob("rollout-*.log")) == sorted(row["pod"] + ".log" for row in results["pods"])
    assert "Test namespace: " + results["namespace"] in result.stdout
    summary = json.loads(result.stdout.split("\n", 1)[1])
    assert "pods" not in summary and summary["reward_sum"] == 10


def test_run_records_ownership_in_the_receipt(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = cluster.get_json("namespace", receipt["namespace"])
    job = cluster.get_json("-n", receipt["namespace"], "job", "rollout")
    assert receipt == {"context": "kind-rl", "namespace": "agc-rl-" + receipt["run_id"], "run_id": receipt["run_id"],
                       "uid": namespace["metadata"]["uid"], "job_uid": job["metadata"]["uid"],
                       "jobs": {"rollout": job["metadata"]["uid"]}}
    assert namespace["metadata"]["labels"]["agc-demo-run"] == receipt["run_id"]


def test_run_10_sequential_runs_one_episode_at_a_time(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "10", "--parallelism", "1", "--output", "seq", cluster=cluster)
    assert result.code == 0, result
    results = read(tmp_path / "seq" / "results.json")
    assert (results["episodes"], results["successful_episodes"], results["reward_sum"]) == (10, 10, 10)
    assert results["parallelism"] == 1
    assert read(tmp_path / "seq" / "job.json")["spec"]["parallelism"] == 1
    rows = sorted(results["pods"], key=lambda row: row["batch_to_ready_seconds"])
    for earlier, later in zip(rows, rows[1:]):
        assert earlier["batch_to_reward_seconds"] < later["batch_to_ready_seconds"]
    assert run_tool("cleanup", "--output", "seq", cluster=cluster).code == 0
    gone = cluster.kubectl("get", "namespace", results["namespace"], "--ignore-not-found", "-o", "name")
    assert gone.stdout == ""


def test_every_kubectl_call_names_the_context(cluster, run_tool):
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    calls = cluster.calls()
    assert calls[0] == ["config", "current-context"]
    assert all(call[:2] == ["--context", "kind-rl"] for call in calls[1:])


def test_context_flag_overrides_the_current_context(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(contexts=("kind-rl", "other"), current_context="other")
    assert run_tool("run", "--count", "1", "--context", "kind-rl", "--output", "out", cluster=cluster).code == 0
    assert read(tmp_path / "out" / "receipt.json")["context"] == "kind-rl"
    assert ["config", "current-context"] not in cluster.calls()


def test_no_runtime_class_runs_on_the_default_runtime(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"runtimeClasses": []})
    result = run_tool("run", "--count", "2", "--no-runtime-class", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["runtime"] is None
    assert "runtimeClassName" not in read(tmp_path / "out" / "job-submitted.json")["spec"]["template"]["spec"]


def test_kubectl_env_var_selects_the_kubectl_program(cluster, run_tool):
    # Nothing named kubectl on PATH: only KUBECTL can lead the tool to the fake.
    env = {"KUBECTL": str(cluster.bin / "kubectl"), "PATH": "/nonexistent"}
    result = run_tool("run", "--count", "1", "--output", "out", cluster=cluster, env=env)
    assert result.code == 0, result


# ---------------------------------------------------------------- cleanup


def test_cleanup_deletes_the_namespace_and_keeps_the_output(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "3", "--output", "out", cluster=cluster).code == 0
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Deleted test namespace: " + namespace in result.stdout
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""
    assert (tmp_path / "out" / "results.json").is_file()
    deletes = [call for call in cluster.calls() if "delete" in call]
    assert deletes[0][-4:] == ["job", "rollout", "--cascade=foreground", "--wait=false"]
    assert deletes[1][-3:] == ["namespace", namespace, "--wait=false"]


def test_cleanup_of_an_absent_namespace_says_so(cluster, run_tool):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0
    assert "Namespace already absent" in result.stdout


def test_cleanup_without_receipt_fails(cluster, run_tool, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_tool("cleanup", "--output", "empty", cluster=cluster)
    assert result.code == 1
    assert result.stderr.startswith("Error: no receipt.json in empty")
    assert "Traceback" not in result.stderr


def test_cleanup_refuses_a_namespace_whose_uid_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    cluster.kubectl("delete", "namespace", receipt["namespace"])
    impostor = {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": receipt["namespace"], "labels": {"agc-demo-run": receipt["run_id"]}}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(impostor))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "ownership check failed, refusing cleanup: namespace %s uid must equal %s: current value is " % (
        receipt["namespace"], receipt["uid"]) in result.stderr
    assert cluster.kubectl("get", "namespace", receipt["namespace"], "-o", "name").stdout.strip()


def test_cleanup_refuses_a_namespace_whose_run_label_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    cluster.kubectl("label", "namespace", receipt["namespace"], "agc-demo-run=someone-else", "--overwrite")
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert ("label agc-demo-run must equal %s: current value is someone-else" % receipt["run_id"]) in result.stderr
    assert not [call for call in cluster.calls() if "delete" in call]


def test_cleanup_refuses_a_job_whose_uid_differs(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt = read(tmp_path / "out" / "receipt.json")
    namespace = receipt["namespace"]
    cluster.kubectl("-n", namespace, "delete", "job", "rollout")
    other = read(tmp_path / "out" / "job-submitted.json")
    cluster.kubectl("create", "-f", "-", stdin=json.dumps(other))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "job rollout uid must equal %s: current value is " % receipt["job_uid"] in result.stderr
    assert cluster.kubectl("-n", namespace, "get", "job", "rollout", "-o", "name").stdout.strip() == "job.batch/rollout"


def test_cleanup_takes_the_job_uid_from_job_json_when_the_receipt_lacks_it(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    receipt_path = tmp_path / "out" / "receipt.json"
    receipt = read(receipt_path)
    del receipt["job_uid"]
    receipt_path.write_text(json.dumps(receipt))
    result = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert result.code == 0, result


# ---------------------------------------------------------------- errors before the cluster is touched


@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "--count must be between 1 and 20"),
    (["--count", "21"], "--count must be between 1 and 20"),
    (["--count", "5", "--parallelism", "6"], "--parallelism must be between 1 and --count (5), got 6"),
    (["--count", "5", "--parallelism", "0"], "--parallelism must be between 1 and --count (5), got 0"),
    (["--count", "ten"], "argument --count: invalid int value: 'ten'"),
    (["--timeout", "0"], "--timeout must be at least 1 second"),
])
def test_bad_arguments_exit_2_before_touching_anything(args, message, cluster, run_tool, tmp_path):
    result = run_tool("run", *args, "--output", "out", cluster=cluster)
    assert result.code == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


def test_existing_output_folder_is_never_overwritten(cluster, run_tool, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("precious")
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert result.stderr == ("Error: output folder out already exists; choose a new --output so that no "
                             "experiment record is overwritten\n")
    assert (tmp_path / "out" / "results.json").read_text() == "precious"
    assert cluster.calls() == []


def test_missing_kubectl_is_one_clear_line(run_tool, tmp_path):
    result = run_tool("run", "--output", "out", env={"KUBECTL": str(tmp_path / "no-such-kubectl")})
    assert result.code == 1
    assert result.stderr.startswith("Error: kubectl not found")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_no_current_context_is_one_clear_line(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(current_context="")
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert result.stderr == ("Error: no current kubectl context (error: current-context is not set); choose one "
                             "with `kubectl config use-context NAME` or pass --context NAME\n")
    assert not (tmp_path / "out").exists()


def test_missing_runtime_class_is_named_with_how_to_list_them(cluster, run_tool, tmp_path):
    result = run_tool("run", "--runtime", "kata-qemu", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "Error: RuntimeClass 'kata-qemu' not found on context kind-rl" in result.stderr
    assert "kubectl --context kind-rl get runtimeclass" in result.stderr
    # refused by a read-only check: nothing to clean up, and the same --output can be used again
    assert "cleanup" not in result.stderr
    assert not (tmp_path / "out").exists()
    assert not [call for call in cluster.calls() if "create" in call]


def test_a_failing_kubectl_command_shows_its_stderr(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"forbid": [{"verb": "create", "resource": "configmaps"}]})
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert ('Error from server (Forbidden): error when creating "STDIN": configmaps is forbidden: User '
            '"kind-user" cannot create resource "configmaps" in API group "" in the namespace') in result.stderr
    assert "Clean up with: " in result.stderr and "cleanup --output out" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_unreachable_api_server_is_reported(cluster, run_tool, tmp_path):
    cluster.stop()
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "was refused - did you specify the right host or port?" in result.stderr


# ---------------------------------------------------------------- failed batches and validation


def test_failing_episode_fails_the_batch_with_diagnostics(make_cluster, run_tool, tmp_path):
    # An image whose test runner always fails: the patched code "fails" its tests.
    cluster = cluster_with_image(make_cluster, tmp_path, "broken:tests",
                                 '[ "$2" = test_shipping.py ] && exit 1\nexec $PY "$@"')
    result = run_tool("run", "--count", "2", "--image", "broken:tests", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "Error: Job rollout failed (BackoffLimitExceeded: Job has reached the specified backoff limit)" in result.stderr
    assert "RuntimeError: patched code failed its tests" in result.stderr
    assert "diagnostics saved in out" in result.stderr and "cleanup --output out" in result.stderr
    out = tmp_path / "out"
    assert not (out / "results.json").exists()
    for name in ("job.json", "pods.json", "events.txt"):
        assert (out / name).is_file()
    assert any('"reward": 0' in log.read_text() for log in out.glob("rollout-*.log"))
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_baseline_that_passes_fails_the_batch(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "broken:baseline",
                                 '[ "$2" = test_shipping.py ] && exit 0\nexec $PY "$@"')
    result = run_tool("run", "--count", "1", "--image", "broken:baseline", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "RuntimeError: baseline must fail the boundary test" in result.stderr
    assert not (tmp_path / "out" / "results.json").exists()


def test_restarted_container_fails_validation(make_cluster, run_tool, tmp_path):
    nodes = [{"name": "kind-worker", "restartContainersOnce": True}]
    cluster = make_cluster({"nodes": nodes})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "validation failed, no results.json written: pod rollout-" in result.stderr
    assert "container restarted 1 times, expected 0" in result.stderr
    errors = (tmp_path / "out" / "validation-errors.txt").read_text().splitlines()
    assert len(errors) == 2 and all("restarted 1 times" in line for line in errors)
    assert not (tmp_path / "out" / "results.json").exists()


def test_missing_ready_event_fails_validation(make_cluster, run_tool, tmp_path):
    # The node's runtime returns no termination message, so the log is read; its rotation dropped
    # the first line, so the log lacks the ready event.
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "logDropFirstLines": 1, "dropTerminationMessages": True}]})
    result = run_tool("run", "--count", "1", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "expected exactly one ready event, found 0" in result.stderr


def test_mismatched_episode_id_fails_validation(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "odd:id", 'EPISODE_ID=someone-else exec $PY "$@"')
    result = run_tool("run", "--count", "1", "--image", "odd:id", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "ready event has episode_id 'someone-else', expected the pod name" in result.stderr


def test_clock_skew_fails_validation_with_out_of_order_timestamps(make_cluster, run_tool, tmp_path):
    nodes = [{"name": "kind-worker", "clockOffsetSeconds": -30}]
    cluster = make_cluster({"nodes": nodes})
    result = run_tool("run", "--count", "1", "--output", "out", cluster=cluster)
    assert result.code == 4, result
    assert "the episode clock on node kind-worker is at least 2" in result.stderr
    assert "synchronise that node's clock with the API server's (NTP)" in result.stderr


def test_job_past_its_deadline_times_out(make_cluster, run_tool, tmp_path):
    cluster = cluster_with_image(make_cluster, tmp_path, "slow:1", "exec sleep 60")
    result = run_tool("run", "--count", "2", "--image", "slow:1", "--timeout", "2", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result
    assert "Job rollout failed (DeadlineExceeded: Job was active longer than specified deadline)" in result.stderr
    assert "cleanup --output out" in result.stderr
    assert read(tmp_path / "out" / "job.json")["status"]["conditions"][-1]["reason"] == "DeadlineExceeded"
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_image_that_cannot_be_pulled_times_out_with_saved_events(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "1", "--image", "no-such/image:1", "--timeout", "2", "--output", "out",
                      cluster=cluster)
    assert result.code == 3, result
    assert "ErrImagePull" in (tmp_path / "out" / "events.txt").read_text()
    assert (tmp_path / "out").glob("rollout-*.log")
