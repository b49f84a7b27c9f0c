"""The warm-pool backend (kubernetes-sigs/agent-sandbox v1beta1): end to end through the simulated
cluster as a user runs it, and its records and summaries in-process."""

import json

import pytest

from conftest import EPISODE, T0, read, write_tasks


AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}


INSTALL = ("kubectl --context kind-rl apply -f https://github.com/kubernetes-sigs/agent-sandbox/releases/download/"
           "v0.5.6/sandbox-with-extensions.yaml")


@pytest.fixture
def sandbox_cluster(make_cluster):
    return make_cluster(AGENT_SANDBOX)


def warm_run(run_tool, cluster, output, *args):
    return run_tool("run", "--backend", "warm-pool", "--no-runtime-class", "--output", output, *args,
                    cluster=cluster)


def test_a_warm_pool_batch_of_ten_passes_with_every_episode_warm(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "warm", "--count", "10")
    assert done.code == 0, done
    results = read(tmp_path / "warm" / "results.json")
    assert (results["successful_episodes"], results["reward_sum"], results["backend"]) == (10, 10, "warm-pool")
    assert results["launch_types"] == {"warm": 10}
    assert {row["launch_type"] for row in results["pods"]} == {"warm"}
    assert [row["claim"] for row in results["pods"]] == ["episode-%d" % i for i in range(10)]
    # every claim got its own sandbox from the pool, and every phase was measured
    assert len({row["sandbox"] for row in results["pods"]}) == 10
    assert all(row["sandbox"].startswith("episodes-") for row in results["pods"])
    for name in ("claim_binding", "bound_to_claim_ready", "claim_ready_to_exec", "exec_to_first_statement",
                 "module_import", "ready_to_reward", "claim_to_ready"):
        assert results["phases"][name]["count"] == 10, name
    assert results["phases"]["claim_binding"]["clocks"] == ["api-server", "client"]
    # the pool refilled while the batch ran, and the stress test's definition is reported beside ours
    assert results["refill_pods"]["created_during_batch"] == 10
    assert results["pool"]["ready_at_fire"] == 10
    stress = results["agent_sandbox_stress_test"]
    assert stress["time_to_all_ready_seconds"] > 0 and stress["end_to_end_ready_ms"]["count"] == 10
    assert "ceil(p/100 * n)" in stress["percentile_rule"]
    assert results["batch_to_all_claims_ready_seconds"] is not None


def test_episodes_get_their_id_on_the_exec_command_line_never_as_claim_env(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "warm", "--count", "2")
    assert done.code == 0, done
    claims = read(tmp_path / "warm" / "claims.json")
    assert all("env" not in claim["spec"] for claim in claims)
    assert all(claim["spec"]["lifecycle"]["shutdownPolicy"] == "Delete" for claim in claims)
    execs = [call for call in sandbox_cluster.calls() if "exec" in call]
    assert len(execs) == 2
    assert all(call[call.index("--") + 1:call.index("--") + 3][0] == "env" for call in execs)
    assert sorted(arg for call in execs for arg in call if arg.startswith("EPISODE_ID=")) == [
        "EPISODE_ID=episode-0", "EPISODE_ID=episode-1"]


def test_a_pool_smaller_than_the_batch_counts_its_cold_fallbacks_and_their_phases_apart(make_cluster, run_tool,
                                                                                       tmp_path):
    # VM sandboxes take 2-5 s to start, so a refill cannot get an IP within a claim's 2 s wait.
    cluster = make_cluster(dict(AGENT_SANDBOX, profile="vm-sandbox"))
    done = warm_run(run_tool, cluster, "short", "--count", "6", "--pool-size", "3")
    assert done.code == 0, done
    results = read(tmp_path / "short" / "results.json")
    assert results["launch_types"] == {"cold": 3, "warm": 3}
    by_type = results["phases_by_launch_type"]
    assert by_type["warm"]["episodes"] == 3 and by_type["cold"]["episodes"] == 3
    # a cold claim waits for its own sandbox to boot; a warm one does not
    assert by_type["cold"]["phases"]["claim_to_ready"]["p50"] > by_type["warm"]["phases"]["claim_to_ready"]["p50"]
    cold = [row for row in results["pods"] if row["launch_type"] == "cold"]
    assert all(row["sandbox"] == row["claim"] for row in cold)  # the cold path names the Sandbox after its claim


def test_pool_size_zero_runs_every_episode_cold(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "cold", "--count", "4", "--pool-size", "0")
    assert done.code == 0, done
    results = read(tmp_path / "cold" / "results.json")
    assert results["launch_types"] == {"cold": 4}
    assert results["pool"]["size"] == 0 and results["refill_pods"]["created_during_batch"] == 0


def test_report_puts_job_warm_and_cold_runs_side_by_side(sandbox_cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "4", "--no-runtime-class", "--output", "job", cluster=sandbox_cluster).code == 0
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "4").code == 0
    assert warm_run(run_tool, sandbox_cluster, "cold", "--count", "4", "--pool-size", "0").code == 0
    done = run_tool("report", "job", "warm", "cold", "--label", "Job", "--label", "warm pool", "--label", "cold claims",
                    "--timeline", "all.svg", "--json")
    assert done.code == 0, done
    table = json.loads(done.stdout)
    assert table["columns"] == ["Job", "warm pool", "cold claims"]
    rows = {row["measure"]: row for row in table["rows"]}
    assert rows["launch types warm / cold"]["values"] == [None, "4 / 0", "0 / 4"]
    assert rows["batch all rewards"]["ratios"][1] is not None and rows["batch all rewards"]["ratios"][2] is not None
    assert rows["pod created -> ready P50 / P95"]["values"][1:] == [None, None]
    assert rows["claim created -> ready P50 / P95"]["values"][0] is None
    assert all(rows["claim created -> ready P50 / P95"]["values"][1:])
    svg = (tmp_path / "all.svg").read_text()
    assert svg.count('data-claim="episode-') == 8 and svg.count('data-pod="rollout-') == 4
    assert 'data-launch-type="cold"' in svg and "claim created -&gt; bound" in svg


def test_cleanup_of_a_warm_pool_run_leaves_nothing(sandbox_cluster, run_tool, tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "3").code == 0
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    done = run_tool("cleanup", "--output", "warm", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert "Deleting 3 SandboxClaims" in done.stderr
    for resource in ("sandboxclaims", "sandboxwarmpools", "sandboxtemplates", "sandboxes", "pods"):
        assert sandbox_cluster.get_json("-A", resource)["items"] == [] or all(
            item["metadata"]["namespace"] != namespace for item in sandbox_cluster.get_json("-A", resource)["items"])
    assert namespace not in sandbox_cluster.kubectl("get", "namespaces").stdout


def test_cleanup_refuses_a_pool_whose_uid_is_not_the_receipts(sandbox_cluster, run_tool, tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "2").code == 0
    receipt_path = tmp_path / "warm" / "receipt.json"
    receipt = read(receipt_path)
    receipt["pool_uid"] = "00000000-0000-0000-0000-000000000000"
    receipt_path.write_text(json.dumps(receipt))
    done = run_tool("cleanup", "--output", "warm", cluster=sandbox_cluster)
    assert done.code == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "Error: ownership check failed, refusing cleanup: sandboxwarmpools episodes uid must equal "
        "00000000-0000-0000-0000-000000000000")
    assert sandbox_cluster.get_json("-n", receipt["namespace"], "sandboxclaims")["items"]  # nothing was deleted


def test_a_cluster_without_agent_sandbox_gets_one_line_with_the_install_command(cluster, run_tool, tmp_path):
    done = warm_run(run_tool, cluster, "warm", "--count", "2")
    assert done.code == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --backend warm-pool needs kubernetes-sigs/agent-sandbox")
    assert INSTALL in lines[0]
    assert not (tmp_path / "warm").exists()
    assert "agc-rl-" not in cluster.kubectl("get", "namespaces").stdout


def test_a_controller_without_extensions_is_refused_before_anything_is_created(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"agentSandbox": {"version": "v0.5.6", "extensions": False}})
    done = warm_run(run_tool, cluster, "warm", "--count", "2")
    assert done.code == 1
    assert "runs without --extensions" in done.stderr and INSTALL in done.stderr
    assert not (tmp_path / "warm").exists()
    assert "agc-rl-" not in cluster.kubectl("get", "namespaces").stdout


def test_dry_run_prints_the_template_the_pool_and_one_claim_per_episode(run_tool):
    done = run_tool("run", "--backend", "warm-pool", "--count", "3", "--pool-size", "2", "--dry-run")
    assert done.code == 0, done
    items = json.loads(done.stdout)["items"]
    assert [item["kind"] for item in items] == ["Namespace", "ConfigMap", "SandboxTemplate", "SandboxWarmPool",
                                                "SandboxClaim", "SandboxClaim", "SandboxClaim"]
    template = items[2]["spec"]["podTemplate"]
    assert template["spec"]["containers"][0]["command"][:2] == ["sh", "-c"]
    assert template["spec"]["runtimeClassName"] == "cube" and template["spec"]["dnsPolicy"] == "ClusterFirst"
    assert items[2]["spec"]["networkPolicyManagement"] == "Unmanaged"
    assert items[3]["spec"] == {"replicas": 2, "sandboxTemplateRef": {"name": "episode"}}
    assert all(item["metadata"]["labels"]["agc-demo-run"] for item in items)


def test_list_shows_a_warm_pool_run(sandbox_cluster, run_tool, tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "2").code == 0
    done = run_tool("list", "--json", cluster=sandbox_cluster)
    assert done.code == 0, done
    [row] = json.loads(done.stdout)
    assert (row["backend"], row["claims"], row["state"]) == ("warm-pool", 2, "warm pool: 2 of 2 claims Ready")


def test_a_crashing_custom_episode_in_a_warm_sandbox_is_an_infrastructure_failure(sandbox_cluster, run_tool,
                                                                                  tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 0.5}, {"mode": "crash"}])
    done = warm_run(run_tool, sandbox_cluster, "custom", "--episode", EPISODE, "--tasks", "tasks.jsonl")
    assert done.code == 5, done
    results = read(tmp_path / "custom" / "results.json")
    assert results["rewards"]["sum"] == 0.5 and results["successful_episodes"] == 1
    [failure] = results["infrastructure_failures"]
    assert failure["index"] == 1 and failure["reason"].startswith("crashed: exit code 3")


@pytest.mark.parametrize("args, message", [
    (("--parallelism", "2"), "--parallelism is for the Job backend"),
    (("--rounds", "2"), "--rounds is for the Job backend"),
    (("--pool-size", "-1"), "--pool-size must be 0 or more"),
])
def test_flags_the_warm_pool_cannot_honour_are_usage_errors(args, message, run_tool):
    done = run_tool("run", "--backend", "warm-pool", "--count", "4", "--dry-run", *args)
    assert done.code == 2 and message in done.stderr


def test_pool_size_is_refused_without_the_warm_pool_backend(run_tool):
    done = run_tool("run", "--count", "4", "--pool-size", "2", "--dry-run")
    assert done.code == 2 and "--pool-size is for --backend warm-pool" in done.stderr


def test_nearest_rank_is_the_stress_tests_percentile(tool):
    values = [10, 20, 30, 40]
    assert [tool.nearest_rank(values, p) for p in (25, 50, 51, 90, 100)] == [10, 20, 30, 40, 40]
    assert tool.percentile(values, 0.5) == 25  # ours interpolates: the two rules differ on purpose


def test_ctrl_c_during_a_warm_pool_batch_saves_the_claims_and_cleanup_finishes(sandbox_cluster, run_tool, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from conftest import SCRIPT
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 60}] * 2)
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "warm-pool", "--no-runtime-class",
                                "--episode", EPISODE, "--tasks", "tasks.jsonl", "--output", "out"], cwd=str(tmp_path),
                               env=sandbox_cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len([call for call in sandbox_cluster.calls() if "exec" in call]) < 2:
        assert time.monotonic() < deadline and process.poll() is None, "the episodes were never exec'd"
        time.sleep(0.1)
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert time.monotonic() - started < 15  # the running execs were stopped, not waited for
    assert "Clean up with:" in stderr
    assert len(read(tmp_path / "out" / "claims.json")) == 2
    done = run_tool("cleanup", "--output", "out", cluster=sandbox_cluster)
    assert done.code == 0, done
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    assert namespace not in sandbox_cluster.kubectl("get", "namespaces").stdout


def test_a_warm_pool_batch_survives_what_real_clusters_do(make_cluster, run_tool, tmp_path):
    # Facts 25-28: a late ServiceAccount (pool pods refused at first), watches that end with
    # an ERROR Status, etcd errors on claim creates after the commit and on a read, VM sandboxes.
    cluster = make_cluster(dict(AGENT_SANDBOX, profile="vm-sandbox", serviceAccountDelaySeconds=2,
                                watchEnds={"afterSeconds": 1, "with": "expired"}, transientFailures=[
                                    {"verb": "create", "resource": "sandboxclaims", "times": 2,
                                     "kind": "etcd-leader-changed", "afterCommit": True},
                                    {"verb": "get", "resource": "sandboxwarmpools", "times": 1,
                                     "kind": "etcd-timeout"}]))
    done = warm_run(run_tool, cluster, "warm", "--count", "6", "--pool-size", "4")
    assert done.code == 0, done
    results = read(tmp_path / "warm" / "results.json")
    assert (results["successful_episodes"], sum(results["launch_types"].values())) == (6, 6)
    assert len(read(tmp_path / "warm" / "claims.json")) == 6  # the committed creates were adopted, not repeated
    assert run_tool("cleanup", "--output", "warm", cluster=cluster).code == 0


# ---------------------------------------------------------------- in-process: records and summaries

CLAIM = {"metadata": {"name": "episode-3", "creationTimestamp": "2026-11-29T10:00:01Z", "uid": "c-3"}}
SANDBOX = {"metadata": {"name": "episodes-abcde", "labels": {"agents.x-k8s.io/launch-type": "warm"}}}
POD = {"metadata": {"name": "episodes-abcde"}, "spec": {"nodeName": "kind-worker"},
       "status": {"containerStatuses": [{"restartCount": 0, "imageID": "docker.io/library/python@sha256:aa"}]}}


def test_a_warm_episode_record_takes_its_phase_from_the_exit_code_and_its_node_from_the_pod(tool):
    times = {"exec_started": 1795946402.25, "exec_finished": 1795946403.5}
    record = tool.warm_episode_record(CLAIM, 3, SANDBOX, POD, {"code": 0, "error": None}, times)
    assert record["kind"] == "WarmPoolEpisode" and record["metadata"]["name"] == "episode-3"
    assert record["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "3"
    assert record["spec"] == {"nodeName": "kind-worker", "sandbox": "episodes-abcde", "pod": "episodes-abcde",
                              "launch_type": "warm"}
    terminated = record["status"]["containerStatuses"][0]["state"]["terminated"]
    assert record["status"]["phase"] == "Succeeded" and terminated["exitCode"] == 0
    assert terminated["startedAt"] == "2026-11-29T10:00:02.250000Z"


def test_a_warm_episode_whose_exec_failed_carries_the_reason_and_message(tool):
    result = {"code": None, "error": "kubectl did not finish within 3 s", "reason": "ExecTimedOut"}
    record = tool.warm_episode_record(CLAIM, 0, None, None, result, {})
    assert record["status"]["phase"] == "Failed"
    assert (record["status"]["reason"], record["status"]["message"]) == ("ExecTimedOut", result["error"])
    assert record["spec"] == {"nodeName": None, "sandbox": None, "pod": None, "launch_type": None}


def test_nearest_rank_is_the_stress_tests_percentile_not_the_interpolated_one(tool):
    values = [10, 20, 30, 40]
    assert [tool.nearest_rank(values, p) for p in (25, 50, 51, 99, 100)] == [10, 20, 30, 40, 40]
    assert tool.nearest_rank([7], 1) == 7
    assert tool.percentile(values, 0.5) == 25  # the tutorial's interpolation differs


def write_warm_folder(folder, claims, pods, record):
    folder.mkdir()
    (folder / "claims.json").write_text(json.dumps(claims))
    (folder / "pods.json").write_text(json.dumps(pods))
    (folder / "warm-pool.json").write_text(json.dumps(record))


def test_the_warm_pool_summary_counts_refill_pods_and_times_all_claims_ready(tool, tmp_path):
    claims = [{"metadata": {"name": "episode-%d" % i, "creationTimestamp": "2026-11-29T10:00:0%dZ" % i}}
              for i in range(2)]
    refill = {"metadata": {"name": "episodes-new"}, "status": {"containerStatuses": [
        {"state": {"running": {"startedAt": "2026-11-29T10:00:02Z"}}}]}}
    pool_pod = {"metadata": {"name": "episodes-old"}}
    write_warm_folder(tmp_path / "w", claims, [pool_pod, refill],
                      {"size": 2, "fill_seconds": 1.5, "launch_types": {"episode-0": "warm", "episode-1": "cold"},
                       "pool_pods_at_fire": ["episodes-old"]})
    observed = {"episode-0": {"create_called": T0 - 0.5, "create_returned": T0 - 0.4, "ready": T0 + 1.0},
                "episode-1": {"create_called": T0 - 0.5, "create_returned": T0 - 0.3, "ready": T0 + 2.0}}
    report = {"episodes": 2, "pods": [{"pod": "episodes-old", "launch_type": "warm", "times": {"reward": T0 + 3}},
                                      {"pod": "episodes-x", "launch_type": "cold", "times": {"reward": T0 + 4}}]}
    report["pods"] = [dict(row, phases=dict.fromkeys(tool.WARM_PHASES), phase_notes={}) for row in report["pods"]]
    summary = tool.warm_pool_summary(tmp_path / "w", report, observed)
    assert summary["launch_types"] == {"cold": 1, "warm": 1}
    assert summary["refill_pods"] == dict(summary["refill_pods"], created_during_batch=1, started_before_last_reward=1)
    assert summary["batch_to_all_claims_ready_seconds"] == pytest.approx(2.0)  # first claim created at T0
    assert summary["agent_sandbox_stress_test"]["time_to_all_ready_seconds"] == pytest.approx(2.5)
    assert summary["agent_sandbox_stress_test"]["create_ack_ms"]["max"] == pytest.approx(200, abs=1e-3)


def test_a_claim_never_ready_leaves_both_all_ready_times_null(tool, tmp_path):
    claims = [{"metadata": {"name": "episode-0", "creationTimestamp": "2026-11-29T10:00:00Z"}}]
    write_warm_folder(tmp_path / "w", claims, [], {"size": 1})
    summary = tool.warm_pool_summary(tmp_path / "w", {"episodes": 1, "pods": []},
                                     {"episode-0": {"create_called": T0}})
    assert summary["batch_to_all_claims_ready_seconds"] is None
    assert summary["agent_sandbox_stress_test"]["time_to_all_ready_seconds"] is None
