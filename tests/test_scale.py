"""Scale and the full protocol: rounds, prewarm, resilience, interruption, preflight, bounds."""

import json
from pathlib import Path

import pytest

from conftest import find_python, interrupt_a_run


def read(path):
    return json.loads(Path(path).read_text())


KATA = {"name": "kata", "handler": "kata-qemu", "overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}}


def test_rounds_with_prewarm_keep_each_round_and_pool_the_percentiles(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "3", "--rounds", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    prewarm = read(out / "prewarm" / "prewarm.json")
    assert prewarm["nodes"] == ["kind-worker", "kind-worker2"]
    for node in prewarm["nodes"]:
        warm = read(out / "prewarm" / node / "results.json")
        assert warm["episodes"] == 1 and warm["nodes"] == {node: 1}
    rounds = [read(out / ("round-%d" % n) / "results.json") for n in (1, 2)]
    assert [r["episodes"] for r in rounds] == [3, 3] and [r["round"] for r in rounds] == [1, 2]
    pooled = read(out / "results.json")
    assert (pooled["episodes"], pooled["successful_episodes"], pooled["reward_sum"]) == (6, 6, 6)
    assert [r["round"] for r in pooled["rounds"]] == [1, 2]
    assert pooled["rounds"][0]["batch_to_all_rewards_seconds"] == rounds[0]["batch_to_all_rewards_seconds"]
    assert len(pooled["pods"]) == 6  # the warm-up episodes are not in the figures
    assert pooled["phases"]["pod_to_ready"]["count"] == 6
    assert pooled["cache_state"] == "prewarmed"
    assert pooled["run"]["cache_state"]["nodes"] == ["kind-worker", "kind-worker2"]
    receipt = read(out / "receipt.json")
    assert sorted(receipt["jobs"]) == ["prewarm-1", "prewarm-2", "rollout-1", "rollout-2"]
    cleanup = run_tool("cleanup", "--output", "out", cluster=cluster)
    assert cleanup.code == 0, cleanup
    assert cluster.kubectl("get", "namespace", receipt["namespace"], "--ignore-not-found", "-o", "name").stdout == ""


def test_pooled_rounds_recompute_from_the_folder(cluster, run_tool, tmp_path, tool):
    assert run_tool("run", "--count", "2", "--rounds", "2", "--output", "out", cluster=cluster).code == 0
    assert tool.results_from_folder(tmp_path / "out") == read(tmp_path / "out" / "results.json")


def test_report_shows_batch_times_per_round(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--rounds", "3", "--output", "out", cluster=cluster).code == 0
    table = json.loads(run_tool("report", "out", "--json").stdout)
    rows = {row["measure"]: row for row in table["rows"]}
    assert rows["batch all rewards"]["values"][0].count(" / ") == 2
    assert rows["tasks / rewards"]["values"] == ["6/6"]


def test_transient_kubectl_failures_are_retried(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [{"verb": "get", "resource": "jobs", "times": 2},
                                                  {"verb": "list", "resource": "pods", "times": 1}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "Error from server (InternalError)" in result.stderr and "retrying in" in result.stderr
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 2


def test_a_create_that_timed_out_after_commit_is_adopted_not_repeated(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"transientFailures": [{"verb": "create", "resource": "jobs", "times": 1,
                                                   "kind": "timeout-after-commit"}]})
    result = run_tool("run", "--count", "2", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    receipt = read(tmp_path / "out" / "receipt.json")
    jobs = cluster.get_json("-n", receipt["namespace"], "jobs")["items"]
    assert [job["metadata"]["uid"] for job in jobs] == [receipt["job_uid"]]
    calls = cluster.calls()
    creates = [index for index, call in enumerate(calls) if "create" in call]
    assert len(creates) == 3  # namespace, configmap, Job: never a second create of the Job
    assert calls[creates[-1] + 1][3:6] == ["get", "-n", receipt["namespace"]]  # it looked, found it, adopted it


def test_interrupt_saves_what_is_known(make_cluster, tmp_path):
    _, code, stderr = interrupt_a_run(make_cluster, tmp_path)
    assert code == 130, stderr
    out = tmp_path / "out"
    assert len(read(out / "pods.json")) == 2
    assert read(out / "job.json")["metadata"]["name"] == "rollout"
    assert (out / "events.txt").exists()


def test_preflight_warns_with_the_arithmetic_when_the_batch_cannot_fit(make_cluster, run_tool, tmp_path):
    nodes = [{"name": "kind-worker", "cpu": "8", "memory": "4Gi"}, {"name": "kind-worker2", "cpu": "8", "memory": "4Gi"}]
    cluster = make_cluster({"nodes": nodes, "runtimeClasses": [KATA]})
    result = run_tool("run", "--count", "10", "--runtime", "kata", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert "warning: preflight: only 8 of 10 episode pods fit at once" in result.stderr
    assert "overhead alone: 768Mi x 10 = 7680Mi (7.5GiB)" in result.stderr
    assert "10 at once need 3500m CPU and 8320Mi (8.1GiB) memory" in result.stderr
    preflight = read(tmp_path / "out" / "results.json")["run"]["preflight"]
    assert preflight["pods_that_fit_at_once"] == 8


def test_preflight_refuses_when_no_node_can_run_an_episode(make_cluster, run_tool, tmp_path):
    pinned = dict(KATA, scheduling={"nodeSelector": {"katacontainers.io/kata-runtime": "true"}})
    cluster = make_cluster({"runtimeClasses": [pinned]})
    result = run_tool("run", "--count", "2", "--runtime", "kata", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "preflight: no usable node can run even one episode pod" in result.stderr
    assert "0 usable node(s) of 2" in result.stderr and "--force" in result.stderr
    assert not [call for call in cluster.calls() if "create" in call]
    assert not (tmp_path / "out").exists()  # refused before any change: retry with the same --output


def test_more_than_20_episodes_need_allow_large(cluster, run_tool):
    refused = run_tool("run", "--count", "25", "--output", "out", cluster=cluster)
    assert refused.code == 2 and "--allow-large lifts it to 10000" in refused.stderr
    planned = run_tool("run", "--count", "1000", "--parallelism", "100", "--allow-large", "--dry-run", cluster=cluster)
    job = json.loads(planned.stdout)["items"][-1]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1000, 100)
    assert job["spec"]["activeDeadlineSeconds"] == 240 + 30 * 9 + 98


def test_a_25_episode_batch_runs_with_allow_large(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "25", "--allow-large", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 25


def test_quiet_runs_print_nothing_on_stderr(cluster, run_tool):
    result = run_tool("run", "--count", "2", "--quiet", "--output", "out", cluster=cluster)
    assert result.code == 0 and result.stderr == ""


@pytest.mark.parametrize("count, parallelism, deadline", [(10, 10, 240), (20, 20, 240), (10, 1, 510),
                                                           (1000, 1000, 338), (1000, 100, 608)])
def test_deadline_follows_count_and_parallelism(tool, count, parallelism, deadline):
    assert tool.default_deadline(count, parallelism) == deadline


def test_preflight_counts_requests_and_overhead_per_node(tool):
    node = {"metadata": {"name": "n", "labels": {}}, "spec": {},
            "status": {"allocatable": {"cpu": "2", "memory": "2Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    kata = {"overhead": {"podFixed": {"cpu": "250m", "memory": "768Mi"}}}
    fit, text = tool.preflight(10, kata, [node, dict(node, spec={"unschedulable": True})])
    assert fit == 2  # 2Gi / 832Mi; the cordoned node does not count
    assert "1 usable node(s) of 2 fit 2 such pods at once" in text


def watch_processes(cluster):
    """kubectl watch processes of this cluster still alive (from /proc)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"--watch" in argv and ("FAKE_K8S_DIR=%s" % cluster.state).encode() in environ:
            found.append(proc.name)
    return found


def test_no_watch_is_left_running_after_a_run(cluster, run_tool):
    assert run_tool("run", "--count", "2", "--output", "ok", cluster=cluster).code == 0
    assert run_tool("run", "--count", "2", "--image", "no-such/image:1", "--timeout", "2", "--output", "failed",
                    cluster=cluster).code == 3
    assert watch_processes(cluster) == []


def test_a_batch_runs_with_the_tool_on_python_3_9(cluster, run_tool, tmp_path):
    result = run_tool("run", "--count", "3", "--output", "out", cluster=cluster, python=find_python("3.9"))
    assert result.code == 0, result
    assert read(tmp_path / "out" / "results.json")["reward_sum"] == 3
    assert run_tool("cleanup", "--output", "out", cluster=cluster, python=find_python("3.9")).code == 0
