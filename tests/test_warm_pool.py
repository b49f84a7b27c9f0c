"""The warm-pool backend (kubernetes-sigs/agent-sandbox v1beta1): end to end through the simulated
cluster as a user runs it, and its records and summaries in-process."""

import json
import os
import time
import urllib.parse

import pytest

from conftest import EPISODE, T0, read, start_tool, wait_for, write_tasks


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
    assert results["phases"]["claim_binding"]["clocks"] == ["client"]  # the create call's annotation -> the watch
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
    execs = sandbox_cluster.execs()
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


def test_a_pool_whose_watch_delivers_nothing_is_still_seen_full(make_cluster, run_tool, tmp_path):
    # the watch stays open and silent: the pool is read again when the fill seems to stall
    cluster = make_cluster(dict(AGENT_SANDBOX, watchStalls=["sandboxwarmpools"]))
    done = warm_run(run_tool, cluster, "warm", "--count", "2", "--timeout", "60")
    assert done.code == 0, done
    assert read(tmp_path / "warm" / "results.json")["successful_episodes"] == 2


def test_cleanup_of_a_warm_pool_run_leaves_nothing(sandbox_cluster, run_tool, tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "3").code == 0
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    done = run_tool("cleanup", "--output", "warm", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert "Deleting 3 SandboxClaims" in done.stderr
    # by the run's label, in one deletecollection request through a proxy (kubectl would send one
    # DELETE after another, and by name at 5 a second)
    run_id = read(tmp_path / "warm" / "receipt.json")["run_id"]
    assert not [call for call in sandbox_cluster.calls() if "delete" in call and "sandboxclaims" in call]
    [collection] = [r for r in sandbox_cluster.requests() if r["method"] == "DELETE" and "/sandboxclaims?" in r["target"]]
    assert collection["target"].endswith("?labelSelector=agc-demo-run%3D" + run_id)
    for resource in ("sandboxclaims", "sandboxwarmpools", "sandboxtemplates", "sandboxes", "pods"):
        assert sandbox_cluster.get_json("-A", resource)["items"] == [] or all(
            item["metadata"]["namespace"] != namespace for item in sandbox_cluster.get_json("-A", resource)["items"])
    assert namespace not in sandbox_cluster.kubectl("get", "namespaces").stdout


def test_cleanup_of_a_big_namespace_deletes_its_objects_itself_once_the_namespace_is_terminating(
        sandbox_cluster, run_tool, tmp_path):
    # 1,000 claims' namespace took the real namespace controller and garbage collector 106 s,
    # one object at a time or 20 a second; the tool now deletes what it proved, each on its uid
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "40", "--allow-large").code == 0
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    sandboxes = {item["metadata"]["name"] for item in sandbox_cluster.get_json("-n", namespace, "sandboxes")["items"]}
    done = run_tool("cleanup", "--output", "warm", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert "Deleting its " in done.stderr
    requests = sandbox_cluster.requests()
    [namespace_deleted] = [r["at"] for r in requests if r["method"] == "DELETE" and
                           r["target"].split("?")[0] == "/api/v1/namespaces/" + namespace]
    swept = {r["target"].rsplit("/", 1)[1] for r in requests if r["method"] == "DELETE" and not r["command"]
             and "/namespaces/%s/sandboxes/" % namespace in r["target"]}
    assert sandboxes <= swept  # and any the pool's refill made after they were read
    assert all(r["at"] > namespace_deleted for r in requests if r["method"] == "DELETE" and not r["command"]
               and "/namespaces/%s/sandboxes/" % namespace in r["target"])
    # each claim by name, beside the one collection DELETE by the run's label
    by_name = [r for r in requests if r["method"] == "DELETE" and "/sandboxclaims/" in r["target"]]
    assert len(by_name) >= 40
    assert namespace not in sandbox_cluster.kubectl("get", "namespaces").stdout


def test_cleanup_of_a_small_namespace_leaves_its_objects_to_the_namespace_deletion(sandbox_cluster, run_tool,
                                                                                   tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "3").code == 0
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    done = run_tool("cleanup", "--output", "warm", cluster=sandbox_cluster)
    assert done.code == 0, done
    assert "Deleting its " not in done.stderr
    assert not [r for r in sandbox_cluster.requests() if r["method"] == "DELETE" and not r["command"]
                and ("/namespaces/%s/sandboxes/" % namespace in r["target"] or
                     "/namespaces/%s/pods/" % namespace in r["target"])]


def test_cleanup_deletes_the_claims_one_by_one_where_deletecollection_is_forbidden(make_cluster, run_tool,
                                                                                    tmp_path):
    cluster = make_cluster(dict(AGENT_SANDBOX, forbid=[{"verb": "deletecollection", "resource": "sandboxclaims"}]))
    assert warm_run(run_tool, cluster, "warm", "--count", "2").code == 0
    done = run_tool("cleanup", "--output", "warm", cluster=cluster)
    assert done.code == 0, done
    [line] = [line for line in done.stderr.splitlines() if line.startswith("deleting sandboxclaims through")]
    assert line.startswith("deleting sandboxclaims through `kubectl proxy` failed (HTTP 403: ") and \
        line.endswith("; with kubectl instead"), line
    assert cluster.get_json("-A", "sandboxclaims")["items"] == []


def test_a_kubectl_failure_while_the_pool_fills_ends_in_one_line_and_the_cleanup_hint(make_cluster, run_tool,
                                                                                       tmp_path):
    # listing Sandboxes forbidden and a slow image pull: the pool never fills in time, and what
    # the tool reads to explain it fails with a kubectl error (it once ended in a TypeError)
    cluster = make_cluster(dict(AGENT_SANDBOX, imagePullSeconds=60,
                                forbid=[{"verb": "list", "resource": "sandboxes"}]))
    done = warm_run(run_tool, cluster, "warm", "--count", "2", "--timeout", "3")
    assert done.code != 0 and "Traceback" not in done.stderr, done
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "Clean up with: " in last, last


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


def test_list_shows_a_warm_pool_run_with_its_done_and_failed_episodes(sandbox_cluster, run_tool, tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 0.5}, {"mode": "crash"}])
    assert warm_run(run_tool, sandbox_cluster, "warm", "--episode", EPISODE, "--tasks", "tasks.jsonl").code == 5
    done = run_tool("list", "--json", cluster=sandbox_cluster)
    assert done.code == 0, done
    [row] = json.loads(done.stdout)
    assert (row["backend"], row["claims"], row["state"]) == ("warm-pool", 2, "warm pool: 2 of 2 claims Ready")
    assert (row["completions"], row["succeeded"], row["failed"], row["counts_from"]) == (2, 1, 1, "results.json")
    table = run_tool("list", cluster=sandbox_cluster).stdout.splitlines()
    assert "2 claims; 1/2 done, 1 failed" in table[1], table


def test_list_of_a_warm_pool_run_whose_folder_is_elsewhere_says_it_has_no_counts(sandbox_cluster, run_tool,
                                                                                 tmp_path):
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "2").code == 0
    (tmp_path / "elsewhere").mkdir()
    done = run_tool("list", "--search", "elsewhere", "--json", cluster=sandbox_cluster)
    [row] = json.loads(done.stdout)
    assert (row["succeeded"], row["failed"], row["counts_from"]) == (None, None, None)
    table = run_tool("list", "--search", "elsewhere", cluster=sandbox_cluster).stdout.splitlines()
    assert "2 claims, no results.json found" in table[1], table


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


def start_two_endless_warm_episodes(cluster, tmp_path):
    """A warm-pool run (the real script, in the background) whose two episodes run for a minute,
    returned once both are exec'd."""
    import subprocess
    import sys
    import time
    from conftest import SCRIPT
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 3600}] * 2)  # waiting for them would hang
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "warm-pool", "--no-runtime-class",
                                "--episode", EPISODE, "--tasks", "tasks.jsonl", "--output", "out"], cwd=str(tmp_path),
                               env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300  # a safety net against a hang, not a bound
    while len(cluster.execs()) < 2:
        assert time.monotonic() < deadline and process.poll() is None, "the episodes were never exec'd"
        time.sleep(0.1)
    return process


def test_ctrl_c_during_a_warm_pool_batch_saves_the_claims_and_cleanup_finishes(sandbox_cluster, run_tool, tmp_path):
    import signal
    process = start_two_endless_warm_episodes(sandbox_cluster, tmp_path)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)  # the running execs (an hour each) were stopped, not waited for
    assert process.returncode == 130, stderr
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


@pytest.mark.parametrize("channel", ["websocket", "kubectl-exec"])
def test_an_exec_refused_by_an_etcd_error_before_it_starts_is_sent_again(make_cluster, run_tool, tmp_path, channel):
    # The API server reads the pod before it opens an exec stream (fact 27: that read can meet
    # etcd's leader change); nothing ran, so the episode is a sample, not an infrastructure failure.
    proxy = {"refuseUpgrade": True} if channel == "kubectl-exec" else {}
    cluster = make_cluster(dict(AGENT_SANDBOX, kubectlProxy=proxy, transientFailures=[
        {"verb": "get", "resource": "pods", "times": 2, "kind": "etcd-leader-changed"}]),
        # the fallback needs `kubectl exec` to work where WebSocket is refused: the real kubectl then
        # speaks SPDY, which the simulated API server does not serve
        kubectl="fake" if channel == "kubectl-exec" else None)
    done = warm_run(run_tool, cluster, "warm", "--count", "2")
    assert done.code == 0, done
    assert read(tmp_path / "warm" / "results.json")["successful_episodes"] == 2
    assert read(tmp_path / "warm" / "warm-pool.json")["exec_channel"]["kind"] == channel
    # each refusal said once: as a retry note, or, when both execs were refused together, folded
    # into the line that counts them
    assert done.stderr.count("etcdserver: leader changed; retrying in") + done.stderr.count("(2 sent again)") == 2, \
        done.stderr


# ---------------------------------------------------------------- the deadline (--timeout): episodes named by what ended them

def test_a_warm_episode_the_deadline_cut_short_is_named_so_not_as_an_exec_timeout(sandbox_cluster, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok", "sleep": 3600}])
    done = warm_run(run_tool, sandbox_cluster, "warm", "--episode", EPISODE, "--tasks", tasks, "--timeout", "5")
    assert done.code == 5, done  # results written: one sample, one infrastructure failure
    [failure] = read(tmp_path / "warm" / "results.json")["infrastructure_failures"]
    assert failure["index"] == 1 and failure["reason"] == (
        "cut short by the deadline (the batch's, 5 s, from --timeout) (ExecTimedOut: the exec did not finish "
        "within 5 s)")
    assert "1 of them ended by the deadline: raise --timeout if the episodes need longer" in done.stderr
    assert read(tmp_path / "warm" / "job.json")["status"]["conditions"][0]["reason"] == "DeadlineExceeded"


def test_a_warm_episode_whose_claim_was_not_ready_by_the_deadline_never_started(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(dict(AGENT_SANDBOX, timing={"sandboxStartSeconds": [6, 6]}))  # cold sandboxes, slower
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok"}])
    done = warm_run(run_tool, cluster, "warm", "--episode", EPISODE, "--tasks", tasks, "--timeout", "2",
                    "--pool-size", "0")
    assert done.code == 5, done  # not 3: a custom batch's episodes are each a result or a named failure
    assert [failure["reason"] for failure in read(tmp_path / "warm" / "results.json")["infrastructure_failures"]] \
        == ["never started: the deadline came first (the batch's, 2 s, from --timeout)"] * 2
    assert "2 of them ended by the deadline: raise --timeout" in done.stderr
    assert run_tool("cleanup", "warm", cluster=cluster).code == 0


# ---------------------------------------------------------------- in-process: records and summaries

class PagedPods:
    """A `kubectl proxy` stand-in answering a list of 5 pods 2 a page, as the API server words a
    list (kind PodList, no kind on the items, managedFields on each); with `expire`, the first
    continue token it is given has expired (410, as the API server says once etcd compacted)."""

    def __init__(self, expire=False):
        self.expire, self.paths, self.closed = expire, [], False

    def request(self, method, path, obj=None, retry=True, headers=None):
        self.paths.append(path)
        token = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("continue", [""])[0]
        if token and self.expire:
            self.expire = False
            return 410, json.dumps({"kind": "Status", "code": 410, "reason": "Expired", "message": (
                "The provided continue parameter is too old to display a consistent list result.")}).encode()
        start = int(token or 0)
        items = [{"metadata": {"name": "pod-%d" % index, "managedFields": [{"manager": "kubelet"}]}}
                 for index in range(start, min(start + 2, 5))]
        return 200, json.dumps({"kind": "PodList", "apiVersion": "v1", "items": items, "metadata": (
            {"continue": str(start + 2)} if start + 2 < 5 else {})}).encode()


def channel_on(tool, proxy):
    channel = object.__new__(tool.ApiChannel)  # its proxy stood in for, never started
    channel.proxy, channel.watches = proxy, []
    return channel


def test_a_list_through_the_proxy_is_read_a_page_at_a_time_and_kept_as_kubectl_shows_it(tool):
    # at 1,000 warm claims the lists saved at a run's end held 2,000 pods' JSON at once
    proxy = PagedPods()
    pods = channel_on(tool, proxy).list(tool.PODS, "ns", "app=x")
    assert [pod["metadata"]["name"] for pod in pods] == ["pod-%d" % index for index in range(5)]
    assert all(pod["kind"] == "Pod" and "managedFields" not in pod["metadata"] for pod in pods)
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query) for path in proxy.paths]
    assert [query.get("continue") for query in queries] == [None, ["2"], ["4"]]
    assert all(query["limit"] == ["500"] and query["labelSelector"] == ["app=x"] for query in queries)


def test_a_list_whose_continue_token_expired_is_listed_again_from_the_start(tool):
    proxy = PagedPods(expire=True)
    pods = channel_on(tool, proxy).list(tool.PODS, "ns")
    assert [pod["metadata"]["name"] for pod in pods] == ["pod-%d" % index for index in range(5)]
    assert ["continue=" in path for path in proxy.paths] == [False, True, False, True, True]


class DiscoveryFailing:
    """A runner whose `kubectl api-resources` prints what it discovered and exits 1 for one
    group, as kubectl's RunAPIResources does (pkg/cmd/apiresources, v0.36.3)."""

    console = None

    def __init__(self, tool, stdout):
        self.tool, self.stdout = tool, stdout

    def run(self, argv, data, binary, timeout, on_start):
        raise self.tool.KubectlError(argv, 1, "error: unable to retrieve the complete list of server APIs: "
                                     "metrics.k8s.io/v1beta1: stale GroupVersion discovery: metrics.k8s.io/v1beta1\n",
                                     self.stdout)


def test_the_served_resources_are_read_past_a_group_whose_discovery_failed(tool):
    listed = "pods\nsandboxes.agents.x-k8s.io\nsandboxclaims.extensions.agents.x-k8s.io\nworkloads.kueue.x-k8s.io\n"
    cluster = tool.Cluster(DiscoveryFailing(tool, listed), "kind-rl")
    assert cluster.api.served("agents.x-k8s.io", "extensions.agents.x-k8s.io") == {
        "sandboxes.agents.x-k8s.io", "sandboxclaims.extensions.agents.x-k8s.io"}
    with pytest.raises(tool.KubectlError):  # nothing discovered: kubectl's failure is the answer
        tool.Cluster(DiscoveryFailing(tool, ""), "kind-rl").api.served("agents.x-k8s.io")


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


# ---------------------------------------------------------------- the exec channel: one proxy, WebSocket streams

def proxy_processes(cluster):
    """Live `kubectl proxy` processes of this cluster's runs (by their socket path)."""
    sockets = [arg.split("=", 1)[1] for call in cluster.calls() for arg in call if arg.startswith("--unix-socket=")]
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open("/proc/%s/cmdline" % pid, "rb").read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "proxy" in cmdline and any("--unix-socket=" + path in cmdline for path in sockets):
            alive.append(pid)
    return sockets, alive


def test_the_pools_fill_is_read_through_the_runs_proxy_not_a_kubectl_each(sandbox_cluster, run_tool, tmp_path):
    # the fill's polls of the SandboxWarmPool were 7 of a 200-claim run's 32 kubectl processes
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "2").code == 0
    calls = sandbox_cluster.calls()
    assert [call for call in calls if "get" in call and "sandboxwarmpools" in call and "--watch" not in call] == []
    assert len([call for call in calls if "proxy" in call]) == 1
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    assert any(request["target"] == "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/sandboxwarmpools/episodes"
               % namespace and not request["command"] for request in sandbox_cluster.requests())


def test_a_warm_pool_run_watches_through_its_proxy_and_watches_again_when_a_watch_ends(make_cluster, run_tool,
                                                                                       tmp_path):
    # the four kubectl watches and their restarts were 7 to 12 of a 200-claim run's 21 to 26 kubectl processes
    cluster = make_cluster(dict(AGENT_SANDBOX, watchEnds={"afterSeconds": 0.5, "with": "expired"}))
    done = warm_run(run_tool, cluster, "warm", "--count", "3")
    assert done.code == 0, done
    assert read(tmp_path / "warm" / "results.json")["successful_episodes"] == 3
    assert [call for call in cluster.calls() if "--watch" in call] == []
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    watched = [r["target"].split("?")[0].rsplit("/", 1)[1] for r in cluster.requests()
               if not r["command"] and "watch=1" in r["target"] and "/namespaces/%s/" % namespace in r["target"]]
    assert {"sandboxclaims", "sandboxes", "pods", "sandboxwarmpools"} <= set(watched)
    assert watched.count("sandboxclaims") >= 2  # ended by the server, then listed and watched again


@pytest.mark.parametrize("ending", ["close", "expired"])
def test_a_watch_the_server_ends_resumes_where_it_was_and_lists_again_only_when_expired(make_cluster, run_tool,
                                                                                         tmp_path, ending):
    # each kubectl watch restart listed everything again (2,000 pods at 1,000 claims); a reflector
    # watches again from the last resourceVersion it saw, and lists only after 410 Expired
    cluster = make_cluster(dict(AGENT_SANDBOX, watchEnds={"afterSeconds": 0.5, "with": ending}))
    done = warm_run(run_tool, cluster, "warm", "--count", "3", "--episode", EPISODE, "--tasks",
                    write_tasks(tmp_path / "tasks.jsonl", [{"sleep": 2}] * 3))
    assert done.code == 0, done
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    path = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % namespace
    proxied = [r for r in cluster.requests() if not r["command"] and r["target"].split("?")[0] == path]
    watches = [r["target"] for r in proxied if "watch=1" in r["target"]]
    # the watch's own lists, told by their User-Agent from the run's other lists of Sandboxes (such
    # as the one for sandboxes.json, or a stalled fill's)
    lists = [r["target"] for r in proxied if "watch=1" not in r["target"] and r["agent"].endswith(" watch")]
    assert all(r["agent"].startswith("rl-batch-demo/") for r in proxied)  # kubectl proxy passes it on
    assert len(watches) >= 3 and all("resourceVersion=" in target and "resourceVersion=&" not in target
                                     for target in watches)
    # listed once, then watched again from where it was; an expired watch lists again
    assert (len(lists) == 1) is (ending == "close"), lists


def test_the_exec_channel_carries_a_batch_over_one_proxy(sandbox_cluster, run_tool, tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", [
        {"mode": "ok", "reward": 1, "chatter": 4000, "trailing": "the last words, without a newline"},
        {"mode": "crash"},
        {"mode": "ok", "reward": 0.5, "stderr": "a warning the episode wrote to stderr"}])
    done = warm_run(run_tool, sandbox_cluster, "custom", "--episode", EPISODE, "--tasks", "tasks.jsonl")
    assert done.code == 5, done  # one infrastructure failure: the crash
    results = read(tmp_path / "custom" / "results.json")
    assert sorted(row["reward"] for row in results["pods"]) == [0.5, 1]
    [failure] = results["infrastructure_failures"]
    assert failure["index"] == 1 and failure["reason"].startswith("crashed: exit code 3")
    # every episode went over one `kubectl proxy`, none through a `kubectl exec` process
    assert [call for call in sandbox_cluster.calls() if "proxy" in call] != []
    assert len([call for call in sandbox_cluster.calls() if "proxy" in call]) == 1
    assert not [call for call in sandbox_cluster.calls() if "exec" in call]
    channel = read(tmp_path / "custom" / "warm-pool.json")["exec_channel"]
    assert channel["kind"] == "websocket" and channel["protocols"] == {"v5.channel.k8s.io": 3}
    assert results["exec_channel"] == channel  # results.json says which channel ran
    # more than a frame holds (several 100,000-byte messages), and a last line without a newline
    log = (tmp_path / "custom" / "episode-0.log").read_bytes()
    assert len(log) > 240000 and log.endswith(b"the last words, without a newline")
    assert (tmp_path / "custom" / "episode-2.stderr").read_text() == "a warning the episode wrote to stderr\n"
    assert "RuntimeError: the sandbox lost its tools" in (tmp_path / "custom" / "episode-1.stderr").read_text()
    for name in ("exec_to_stream_open", "stream_open_to_first_statement", "client_claim_startup"):
        assert results["phases"][name]["count"] == 2, name
    assert results["phases"]["exec_to_stream_open"]["clocks"] == ["client"]
    # the proxy is gone, and so is its private folder with the socket
    sockets, alive = proxy_processes(sandbox_cluster)
    assert sockets and not alive and not any(os.path.exists(os.path.dirname(path)) for path in sockets)


def test_the_websocket_accept_is_rfc_6455s_own_example_and_wsprotos(tool):
    import base64
    import wsproto.utilities
    # RFC 6455 section 1.3: the key "dGhlIHNhbXBsZSBub25jZQ==" is answered "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert tool.websocket_accept("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    for _ in range(20):  # and for any key, what an independent implementation computes
        key = base64.b64encode(os.urandom(16))
        assert tool.websocket_accept(key.decode()) == wsproto.utilities.generate_accept_token(key).decode()


def test_an_exit_code_over_the_channel_is_read_from_the_causes_reason_field(tool):
    # apimachinery's StatusCause: its Type field is serialised as "reason" (json:"reason")
    status = {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
              "message": "command terminated with non-zero exit code: exit status 3",
              "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}
    result = tool.exec_outcome(status, b"out", b"err", 1.0, 2.0)
    assert (result.code, result.error) == (3, None)


def episode_execs_per_pod(cluster):
    """{pod: how many times the episode program was exec'd into it}, over every channel."""
    counts = {}
    for call in cluster.execs():
        if any("episode.py" in part for part in call):
            pod = call[call.index("exec") + 1]
            counts[pod] = counts.get(pod, 0) + 1
    return counts


def test_every_episode_runs_exactly_once_over_one_websocket_channel(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "warm", "--count", "6")
    assert done.code == 0, done
    assert "falling back" not in done.stderr and "handshake" not in done.stderr
    assert sorted(episode_execs_per_pod(sandbox_cluster).values()) == [1] * 6
    assert not [call for call in sandbox_cluster.calls() if "exec" in call]  # no `kubectl exec` process
    assert read(tmp_path / "warm" / "warm-pool.json")["exec_channel"]["kind"] == "websocket"


def test_a_wrongly_answered_handshake_never_runs_an_episode_twice(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(dict(AGENT_SANDBOX, kubectlProxy={"wrongAccept": True}))
    done = warm_run(run_tool, cluster, "warm", "--count", "4")
    counts = episode_execs_per_pod(cluster)
    assert set(counts.values()) == {1} and len(counts) == 4, counts  # once in each sandbox, never twice
    assert "handshake was answered wrongly (Sec-WebSocket-Accept); falling back" in done.stderr
    assert done.stderr.count("falling back") == 1
    # the episodes that met the broken answer may have run: they are lost, never sent again
    lost = [pod for pod in read(tmp_path / "warm" / "episodes.json")
            if "not sent again" in (pod.get("status") or {}).get("message", "")]
    assert lost and done.code == 4, done


def test_a_background_kubectl_that_writes_much_to_stderr_is_read_and_keeps_serving(tool, tmp_path):
    import io
    import select
    import sys
    # a real `kubectl proxy` logs ~146 bytes for every request it fails; a pipe nobody reads is
    # full after 64 KiB and the proxy then stops answering (issue 30, reproduced with kubectl 1.32.4)
    program = tmp_path / "noisy-proxy"
    program.write_text("#!%s\nimport sys, time\nfor i in range(2000):\n"
                       "    sys.stderr.write('E1201 12:00:00.000000 1 proxy_server.go:147] Error while proxying "
                       "request: dial tcp 127.0.0.1:6443: connect: connection refused %%d\\n' %% i)\n"
                       "    sys.stderr.flush()\nprint('Starting to serve on x', flush=True)\ntime.sleep(60)\n"
                       % sys.executable)
    program.chmod(0o755)
    notes = io.StringIO()
    runner = tool.Kubectl(tool.Console(stderr=notes), program=str(program))
    process = runner.start_background([], what="kubectl proxy")
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        assert ready and process.stdout.readline() == b"Starting to serve on x\n"
    finally:
        runner.stop_background()
    assert "Error while proxying request" in tool.Kubectl.stderr_of(runner, process).splitlines()[-1]
    assert notes.getvalue().count("kubectl proxy: E1201") == 1  # one note, not 2,000


def test_an_exec_into_a_pod_that_has_gone_is_an_exec_failure_not_a_refusal(sandbox_cluster, tool, monkeypatch):
    import subprocess
    for key, value in sandbox_cluster.env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)  # the fake kubectl, as the tool would find it
    runner = tool.Kubectl(tool.Console(quiet=True))
    channel = tool.ProxyExecChannel(tool.connect(runner, "kind-rl"), "agc-rl-gone")
    try:
        result = channel.run("no-such-pod", ["true"], 10)
        assert result.code is None and 'pods "no-such-pod" not found' in result.error
        assert result.sent_at is not None and result.opened_at is None  # no stream was opened
    finally:
        runner.stop_background()  # closes the command's channel: its proxy and socket
    assert not os.path.exists(channel.socket_path)
    assert subprocess.run(["pgrep", "-f", channel.socket_path], capture_output=True).returncode == 1


# a namespace the command's channel serves (channel_accept_paths: the tool's own prefix)
EXEC_NAMESPACE = "agc-rl-exec-test"


def open_channel_on(cluster, tool, monkeypatch, namespace=EXEC_NAMESPACE):
    """The tool's exec channel (over the command's real `kubectl proxy`) on the cluster, in-process;
    the runner's stop_background() closes it."""
    for key, value in cluster.env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    runner = tool.Kubectl(tool.Console(quiet=True))
    return runner, tool.ProxyExecChannel(tool.connect(runner, "kind-rl"), namespace)


def test_an_exec_the_proxy_cannot_deliver_because_the_api_server_is_down_may_be_sent_again(
        sandbox_cluster, tool, monkeypatch):
    # a real proxy answers 500 "error dialing backend: dial tcp ...: connect: connection refused"
    runner, channel = open_channel_on(sandbox_cluster, tool, monkeypatch)
    try:
        sandbox_cluster.stop()  # the API server's listener is gone: connections refused
        result = channel.run("any-pod", ["true"], 10)
    finally:
        runner.stop_background()
    assert result.refused_in_passing and result.opened_at is None, result.error
    assert "connection refused" in result.error


def test_the_proxys_tls_handshake_timeout_is_a_request_never_sent_so_it_is_sent_again(tool):
    # seen on the real plane with its API server coming back (ASSUMPTIONS.md): Go's transport
    # fails the dial before it writes the request
    assert tool.refusal_passes(500, "net/http: TLS handshake timeout")
    assert not tool.refusal_passes(500, "net/http: request canceled")  # maybe sent: never again


def test_an_exec_stream_the_api_server_cuts_is_named_as_cut_not_as_refused(sandbox_cluster, tool, monkeypatch):
    # cut: the command may have run, so the run reads its exec journal rather than sending it again
    import threading
    run_a_long_pod(sandbox_cluster, tool)
    runner, channel = open_channel_on(sandbox_cluster, tool, monkeypatch)
    results = []
    try:
        thread = threading.Thread(target=lambda: results.append(channel.run("long", ["sleep", "60"], 90)))
        thread.start()
        wait_for("the exec to start", lambda: sandbox_cluster.execs())
        sandbox_cluster.stop()  # an outage: the API server's open streams are cut
        thread.join(60)
    finally:
        runner.stop_background()
    [result] = results
    assert result.code is None and result.opened_at is not None and not result.refused_in_passing
    assert result.cut and "was cut" in result.error, result.error


def run_a_long_pod(cluster, tool):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "long", "namespace": EXEC_NAMESPACE},
           "spec": {"containers": [{"name": tool.CONTAINER_NAME, "image": "python:3.12-alpine",
                                    "command": ["python", "-c", "import time; time.sleep(120)"]}]}}
    cluster.kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": EXEC_NAMESPACE}}))
    # a new namespace's `default` ServiceAccount comes a moment later (ASSUMPTIONS.md fact 25)
    wait_for("the pod to be admitted", lambda: cluster.kubectl(
        "create", "-f", "-", stdin=json.dumps(pod), check=False).returncode == 0)
    wait_for("the pod to run", lambda: cluster.get_json("-n", EXEC_NAMESPACE, "pod", "long")["status"].get(
        "phase") == "Running")


def test_a_proxy_that_died_is_started_again_and_the_exec_it_never_carried_may_be_sent_again(
        sandbox_cluster, tool, monkeypatch):
    run_a_long_pod(sandbox_cluster, tool)
    runner, channel = open_channel_on(sandbox_cluster, tool, monkeypatch)
    try:
        channel.proxy.process.kill()
        channel.proxy.process.wait()
        first = channel.run("long", ["true"], 30)
        second = channel.run("long", ["true"], 30)
    finally:
        runner.stop_background()
    assert first.refused_in_passing and first.opened_at is None and "nothing was sent" in first.error
    assert second.code == 0, second.error
    assert channel.record()["proxy_restarts"] == 1
    assert len(sandbox_cluster.execs()) == 1  # the first never reached the API server


def test_a_silent_exec_stream_is_pinged_every_few_seconds_as_client_go_pings(tool, monkeypatch):
    import socket
    import threading
    import wsproto.connection
    import wsproto.events
    monkeypatch.setattr(tool, "EXEC_PING_SECONDS", 0.05)
    client, server = socket.socketpair()
    websocket = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER)
    pings = []

    def serve():  # a command that prints nothing until three pings came
        while len(pings) < 3:
            websocket.receive_data(server.recv(4096))
            for event in websocket.events():
                if isinstance(event, wsproto.events.Ping):
                    pings.append(event)
                    server.sendall(websocket.send(event.response()))
        status = json.dumps({"metadata": {}, "status": "Success"}).encode()
        server.sendall(websocket.send(wsproto.events.BytesMessage(data=b"\x03" + status)))
        server.sendall(websocket.send(wsproto.events.CloseConnection(code=1000)))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    result = tool.read_exec_stream(client, client.makefile("rb"), time.monotonic() + 60, 1.0, 2.0)
    thread.join(10)
    client.close()
    server.close()
    assert result.code == 0 and len(pings) >= 3


@pytest.mark.parametrize("behaviour, line", [
    ({"fails": "error: unknown flag: --unix-socket\nSee 'kubectl proxy --help' for usage."},
     "warning: `kubectl proxy` exited 1: error: unknown flag: --unix-socket; falling back to one kubectl process "
     "per API call of this command (the same answers, slower at scale)"),
    ({"refuseUpgrade": True},
     "warning: the API server (through `kubectl proxy`) refused the exec stream: HTTP 400: requested protocol(s) "
     "are not supported"),
])
def test_a_channel_that_cannot_be_opened_falls_back_to_kubectl_exec_with_one_line(make_cluster, run_tool, tmp_path,
                                                                                  behaviour, line):
    # The fake kubectl: a `kubectl proxy` that exits at once, and a `kubectl exec` that works where
    # WebSocket is refused (the real one then speaks SPDY, which the simulated API server does not serve).
    cluster = make_cluster(dict(AGENT_SANDBOX, kubectlProxy=behaviour), kubectl="fake")
    done = warm_run(run_tool, cluster, "warm", "--count", "3")
    assert done.code == 0, done
    assert line in done.stderr and done.stderr.count("falling back") == 1
    channel = read(tmp_path / "warm" / "warm-pool.json")["exec_channel"]
    assert channel["kind"] == "kubectl-exec" and channel["fallback_reason"]
    assert len([call for call in cluster.calls() if "exec" in call]) == 3
    assert read(tmp_path / "warm" / "results.json")["phases"]["exec_to_stream_open"]["missing"] == 3


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_an_interrupted_warm_batch_leaves_no_proxy_process_or_socket(sandbox_cluster, tmp_path, signal_name):
    import signal
    process = start_two_endless_warm_episodes(sandbox_cluster, tmp_path)
    process.send_signal(getattr(signal, signal_name))
    _, stderr = process.communicate(timeout=60)  # the streams (an hour each) were closed, not waited for
    assert process.returncode == {"SIGINT": 130, "SIGTERM": 143}[signal_name], stderr
    sockets, alive = proxy_processes(sandbox_cluster)
    assert sockets and not alive, alive
    assert not any(os.path.exists(os.path.dirname(path)) for path in sockets)


def test_a_pool_that_can_never_fill_is_refused_before_anything_is_created(make_cluster, run_tool, tmp_path):
    # two nodes of 1 CPU fit 2 x 9 episode pods of 100m: a pool of 20 can never fill
    cluster = make_cluster(dict(AGENT_SANDBOX, nodes=[{"name": "small-%d" % i, "cpu": "1", "memory": "16Gi"}
                                                      for i in range(2)]))
    done = warm_run(run_tool, cluster, "warm", "--count", "4", "--pool-size", "20")
    assert done.code == 1, done
    assert "Error: preflight: the warm pool of 20 sandboxes can never fill: " in done.stderr
    assert "fit 20 such pods" not in done.stderr and "lower --pool-size" in done.stderr
    assert not (tmp_path / "warm").exists()
    assert not [call for call in cluster.calls() if "create" in call]


def test_claim_times_come_from_the_upstream_annotations(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "warm", "--count", "2")
    assert done.code == 0, done
    claims = {claim["metadata"]["name"]: claim for claim in read(tmp_path / "warm" / "claims.json")}
    for row in read(tmp_path / "warm" / "results.json")["pods"]:
        annotations = claims[row["claim"]]["metadata"]["annotations"]
        requested = annotations["agents.x-k8s.io/client-first-requested-at"]
        assert row["times"]["claim_created"] == pytest.approx(tool_time(requested), abs=1e-6)
        assert row["times"]["claim_first_ready"] == pytest.approx(
            tool_time(annotations["agents.x-k8s.io/claim-first-ready-at"]), abs=1e-6)
        assert "time_fallbacks" not in row
        # the create call's microseconds, not a whole-second creationTimestamp (however busy the cluster)
        assert row["phases"]["claim_binding"] >= 0 and row["times"]["claim_created"] % 1 != 0


def tool_time(stamp):
    import datetime
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(whole + "+00:00").timestamp() + float("0." + (fraction or "0"))


def test_a_claim_without_the_client_annotation_falls_back_to_its_creation_time_by_name(tool):
    record = {"metadata": {"name": "episode-0", "creationTimestamp": "2026-11-29T10:00:01Z", "annotations": {
        "agents.x-k8s.io/claim-first-ready-at": "unknown"}}, "spec": {}}
    times, missing, fallbacks = tool.warm_episode_times(record, {"at": T0 + 3}, {"at": T0 + 4}, {})
    assert times["claim_created"] == T0 + 1
    assert fallbacks["claim_created"].startswith("metadata.creationTimestamp (api-server clock, whole seconds)")
    assert times["claim_first_ready"] is None and "'unknown'" in missing["claim_first_ready"]


def test_nanosecond_annotations_keep_their_fraction(tool):
    assert tool.parse_rfc3339_nano("2026-11-29T10:00:01.123456789Z") == pytest.approx(T0 + 1.123456789, abs=1e-6)
    assert tool.parse_rfc3339_nano("2026-11-29T10:00:01Z") == T0 + 1
    assert tool.parse_rfc3339_nano("unknown") is None and tool.parse_rfc3339_nano(None) is None


@pytest.mark.parametrize("arg, on", [
    ("--extensions", True), ("-extensions", True), ("--extensions=true", True), ("--extensions=True", True),
    ("--extensions=1", True), ("--extensions=t", True), ("--extensions=TRUE", True), ("-extensions=T", True),
    ("--extensions=false", False), ("--extensions=0", False), ("--extensions=yes", False),
    ("--extensions-x", False), ("---extensions", False), ("extensions", False),
])
def test_the_extensions_flag_is_read_in_every_form_gos_flag_package_takes(tool, arg, on):
    assert tool.go_bool_flag(arg, "extensions") is on


def test_a_lagging_watch_never_puts_an_older_claim_state_back(tool):
    def state(version):
        return {"metadata": {"name": "episode-0", "resourceVersion": version}}
    assert tool.older_state(state("1200"), state("1300")) is True
    assert tool.older_state(state("1300"), state("1200")) is False
    assert tool.older_state(state("1300"), None) is False
    assert tool.older_state(state("opaque-b"), state("opaque-c")) is False  # not comparable: taken as newer


@pytest.mark.parametrize("behaviour", [None, {"fails": "error: unknown flag: --unix-socket"}])
def test_exec_output_that_is_not_utf8_is_kept_byte_for_byte(make_cluster, run_tool, tmp_path, behaviour):
    # a proxy that fails to start is the fake kubectl's (the real one cannot be made to)
    cluster = make_cluster(dict(AGENT_SANDBOX, kubectlProxy=behaviour or {}), kubectl="fake" if behaviour else None)
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 1, "binary": True}] * 2)
    done = warm_run(run_tool, cluster, "warm", "--episode", EPISODE, "--tasks", "tasks.jsonl")
    assert done.code == 0, done
    assert read(tmp_path / "warm" / "results.json")["reward_sum"] == 2
    for name in ("episode-0", "episode-1"):
        assert b"\xff\xfe a line that is not UTF-8 \xc3\x28\n" in (tmp_path / "warm" / (name + ".log")).read_bytes()


# ---------------------------------------------------------------- failure lines that name the cause

def test_a_pool_whose_image_is_missing_names_it_at_once_and_saves_its_pods(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "warm", "--count", "2", "--image", "nosuch:1", "--timeout", "300")
    assert done.code == 1, done  # not 3: named at the first stall check, not at the deadline
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: the warm pool cannot fill: the image nosuch:1 does not exist in its registry: pod "), line
    assert "stopped early instead of waiting for the deadline" in line
    assert "diagnostics saved in warm (pods.json, sandboxes.json, warm-pool-object.json, events.txt)" in line
    assert len(read(tmp_path / "warm" / "pods.json")) == 2 and len(read(tmp_path / "warm" / "sandboxes.json")) == 2
    assert "ImagePullBackOff" in (tmp_path / "warm" / "events.txt").read_text()


def test_cold_claims_whose_pods_cannot_start_name_the_waiting_reason(sandbox_cluster, run_tool, tmp_path):
    done = warm_run(run_tool, sandbox_cluster, "cold", "--count", "2", "--pool-size", "0", "--image", "nosuch:1",
                    "--timeout", "5")
    assert done.code == 3, done
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: 2 of 2 claims had no finished episode within 5 s ("), line
    assert "; pods not running: ImagePullBackOff: Back-off pulling image \"nosuch:1\"" in line


def test_a_claim_the_controller_never_touched_says_so_not_none(tool):
    batch = object.__new__(tool.WarmPoolRun)
    batch.sandboxes = {"episodes-x": {"status": {"conditions": [
        {"type": "Ready", "status": "False", "message": "Pod exists with phase: Pending"}]}}}
    assert batch.claim_state({"metadata": {"name": "episode-0"}}).startswith("not bound to a Sandbox")
    assert batch.claim_state({"metadata": {"name": "episode-1"}, "status": {"sandbox": {"name": "episodes-x"}}}) == \
        "bound to Sandbox episodes-x, not Ready (Pod exists with phase: Pending)"


def start_with_a_running_second_episode(cluster, tmp_path):
    """A warm-pool run of two custom episodes, the second 30 s long; returns (process, namespace,
    its Sandbox, its pod) once that episode has been exec'd."""
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "reward": 0.5}, {"mode": "ok", "sleep": 30}])
    process = start_tool(cluster, tmp_path, "run", "--backend", "warm-pool", "--no-runtime-class",
                         "--output", "warm", "--episode", EPISODE, "--tasks", "tasks.jsonl")

    def second_claims_sandbox():
        if not (tmp_path / "warm" / "claims-submitted.json").exists():
            return None
        claim = cluster.kubectl("-n", read(tmp_path / "warm" / "receipt.json")["namespace"], "get",
                                "sandboxclaim", "episode-1", "-o", "json", check=False)
        return claim.returncode == 0 and (json.loads(claim.stdout).get("status") or {}).get("sandbox", {}).get("name")

    sandbox = wait_for("the second claim's Sandbox", second_claims_sandbox)
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    pod = (cluster.get_json("-n", namespace, "sandbox", sandbox)["metadata"].get("annotations") or {}).get(
        "agents.x-k8s.io/pod-name", sandbox)
    wait_for("its episode exec'd", lambda: any(call[1] == pod for call in cluster.execs()))
    return process, namespace, sandbox, pod


def test_a_claimed_sandbox_pod_evicted_mid_episode_is_named_as_an_eviction_and_kept(sandbox_cluster, tmp_path):
    process, namespace, sandbox, pod = start_with_a_running_second_episode(sandbox_cluster, tmp_path)
    uid = sandbox_cluster.get_json("-n", namespace, "pod", pod)["metadata"]["uid"]
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    sandbox_cluster.kubectl("create", "--raw", "/api/v1/namespaces/%s/pods/%s/eviction" % (namespace, pod), "-f", "-",
                            stdin=json.dumps(eviction))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr
    [failure] = read(tmp_path / "warm" / "results.json")["infrastructure_failures"]
    assert failure["reason"].startswith("evicted: pod %s of Sandbox %s was evicted while the episode ran "
                                        "(Eviction API: evicting)" % (pod, sandbox)), failure
    # the evicted pod (as the API or, once it is gone, the watch last had it), beside whatever replaced it
    [evicted] = [saved for saved in read(tmp_path / "warm" / "pods.json") if saved["metadata"]["uid"] == uid]
    assert [c["reason"] for c in evicted["status"]["conditions"] if c["type"] == "DisruptionTarget"] == \
        ["EvictionByEvictionAPI"]


def test_a_claimed_sandbox_pod_evicted_by_its_kubelet_is_named_as_an_eviction(sandbox_cluster, tmp_path):
    # node pressure: the kubelet kills the pod's containers (the exec'd episode with them) and
    # leaves the pod Failed, reason Evicted; the exec ends with exit code 137
    process, namespace, sandbox, pod = start_with_a_running_second_episode(sandbox_cluster, tmp_path)
    (sandbox_cluster.state / ("evict-" + pod)).touch()
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr
    [failure] = read(tmp_path / "warm" / "results.json")["infrastructure_failures"]
    assert failure["reason"].startswith("evicted: pod %s of Sandbox %s was evicted by its node while the episode ran "
                                        "(The node was low on resource: memory." % (pod, sandbox)), failure
    assert "exit code 137" not in failure["reason"]


def test_a_sandbox_deleted_mid_episode_is_named_not_reported_as_a_crash(sandbox_cluster, tmp_path):
    process, namespace, sandbox, pod = start_with_a_running_second_episode(sandbox_cluster, tmp_path)
    sandbox_cluster.kubectl("-n", namespace, "delete", "sandbox", sandbox, "--wait=false")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 5, stderr
    [failure] = read(tmp_path / "warm" / "results.json")["infrastructure_failures"]
    assert failure["reason"] == ("SandboxDeleted: its Sandbox %s was deleted while the episode ran, by someone else "
                                 "(this run deletes nothing before its batch ends)" % sandbox), failure


def test_a_controller_deployment_the_user_may_not_read_is_recorded_not_noted_on_every_run(make_cluster, run_tool,
                                                                                         tmp_path):
    # many users may not read the controller's namespace: that is expected, and said only if the
    # pool then does not fill (issue 32 item 17)
    cluster = make_cluster(dict(AGENT_SANDBOX, forbid=[{"verb": "get", "resource": "deployments"}]))
    result = warm_run(run_tool, cluster, "warm", "--count", "2")
    assert result.code == 0, result
    assert "deployment" not in result.stderr, result.stderr
    facts = read(tmp_path / "warm" / "run.json")["agent_sandbox"]
    assert facts["controller"] is None
    assert facts["controller_unread"].startswith("cannot read deployment/agent-sandbox-controller in "
                                                 "agent-sandbox-system (Error from server (Forbidden)")


def test_a_sandbox_without_the_exec_journal_says_its_pool_is_older_than_the_tool(make_cluster, run_tool, tmp_path):
    # a kept pool made by an rl-batch-demo before the exec journal: its ConfigMap has no exec-journal.py
    from conftest import cluster_with_image
    cluster = cluster_with_image(make_cluster, tmp_path, "old-pool:1", 'case "$*" in *exec-journal.py*) echo '
                                 '"python: can\'t open file \'/demo/exec-journal.py\': [Errno 2] No such file or '
                                 'directory" >&2; exit 2;; esac\nexec $PY "$@"', **AGENT_SANDBOX)
    done = warm_run(run_tool, cluster, "warm", "--count", "2", "--image", "old-pool:1")
    assert done.code == 4, done
    assert "the sandbox has no /demo/exec-journal.py: its pool was made by an older rl-batch-demo" in done.stderr


def test_a_sandbox_the_watch_is_late_with_is_read_through_the_proxy_not_a_kubectl_each(sandbox_cluster, run_tool,
                                                                                       tool, monkeypatch, tmp_path):
    # a late Sandbox watch once meant a kubectl process per episode (19 of a 200-claim run's 36)
    assert warm_run(run_tool, sandbox_cluster, "warm", "--count", "1").code == 0
    namespace = read(tmp_path / "warm" / "receipt.json")["namespace"]
    sandbox = sandbox_cluster.get_json("-n", namespace, "sandboxes")["items"][0]  # the pool refills: one or two
    runner = tool.Kubectl(tool.Console(quiet=True))
    for key, value in sandbox_cluster.env().items():
        monkeypatch.setenv(key, value)
    cluster = tool.connect(runner, "kind-rl")
    run = type("Run", (), {"cluster": cluster, "namespace": namespace})()
    try:
        kubectl_calls = len(sandbox_cluster.calls())
        name = sandbox["metadata"]["name"]
        assert tool.WarmPoolRun.read_sandbox(run, name)["metadata"]["uid"] == sandbox["metadata"]["uid"]
        assert cluster.api.get(tool.SANDBOXES, "no-such-sandbox", namespace) is None
        assert len(sandbox_cluster.calls()) == kubectl_calls  # no kubectl process for either read
    finally:
        runner.stop_background()
