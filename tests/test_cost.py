"""Cost per reward (issue "Cost per reward"): what each verified reward held of the cluster, the
arithmetic in-process and whole runs through the simulated cluster."""


import pytest

from conftest import read

GIB = 2 ** 30


def container(requests=None, limits=None, **extra):
    return dict({"name": "c", "resources": {key: value for key, value in (("requests", requests), ("limits", limits))
                                             if value}}, **extra)


def test_a_limit_stands_in_for_a_missing_request(tool):
    request, _ = tool.effective_request({"containers": [container(limits={"cpu": "500m", "memory": "1Gi"})]})
    assert request == {"cpu": pytest.approx(0.5), "memory": GIB}


def test_init_containers_are_a_floor_and_sidecars_add(tool):
    spec = {"initContainers": [container({"cpu": "2"}), container({"cpu": "100m"}, restartPolicy="Always")],
            "containers": [container({"cpu": "250m", "memory": "64Mi"})]}
    request, _ = tool.effective_request(spec)
    assert request["cpu"] == pytest.approx(2.0)  # max(250m + 100m sidecar, 2 init)
    spec["initContainers"][0]["resources"]["requests"]["cpu"] = "100m"
    assert tool.effective_request(spec)[0]["cpu"] == pytest.approx(0.35)


def test_the_pod_overhead_is_added_and_reported_apart(tool):
    spec = {"containers": [container({"cpu": "100m", "memory": "64Mi"})],
            "overhead": {"cpu": "250m", "memory": "160Mi"}}
    request, overhead = tool.effective_request(spec)
    assert request == {"cpu": pytest.approx(0.35), "memory": 224 * 2 ** 20}
    assert overhead == {"cpu": pytest.approx(0.25), "memory": 160 * 2 ** 20}


def pod(scheduled=None, finished=None, deleted=None, name="p"):
    status = {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
              if scheduled else [{"type": "PodScheduled", "status": "False"}],
              "containerStatuses": [{"state": {"terminated": {"finishedAt": finished}} if finished else
                                     {"running": {}}}]}
    meta = {"name": name}
    if deleted:
        meta["deletionTimestamp"] = deleted
    return {"metadata": meta, "spec": {"containers": [container({"cpu": "1", "memory": "1Gi"})]}, "status": status}


def test_a_pod_never_scheduled_holds_nothing(tool):
    assert tool.held_interval(pod(), 2000.0) is None
    assert tool.reserved_capacity([pod()], 2000.0) == {}


def test_a_pod_deleted_before_it_ended_holds_until_its_deletion_and_a_running_one_until_the_runs_end(tool):
    assert tool.held_interval(pod("1970-01-01T00:16:40Z", deleted="1970-01-01T00:16:45Z"), 2000.0) == (1000.0, 1005.0)
    assert tool.held_interval(pod("1970-01-01T00:16:40Z"), 1012.0) == (1000.0, 1012.0)
    assert tool.held_interval(pod("1970-01-01T00:16:40Z", "1970-01-01T00:16:43Z"), 2000.0) == (1000.0, 1003.0)


def test_reserved_capacity_is_request_times_time_held_per_share(tool):
    pods = [pod("1970-01-01T00:16:40Z", "1970-01-01T00:16:43Z", name="a"),
            pod("1970-01-01T00:16:40Z", name="b")]

    def split(p, start, end):
        return [("idle", start, start + 1), ("episodes", start + 1, end)] if p["metadata"]["name"] == "b" else \
            [("episodes", start, end)]

    shares = tool.reserved_capacity(pods, 1010.0, split)
    assert shares["idle"]["cpu_seconds"] == 1.0 and shares["episodes"]["cpu_seconds"] == 3.0 + 9.0
    summary = tool.cost_summary(shares, 4, (0.04, 0.005))
    assert summary["per_reward"] == {"cpu_seconds": 3.25, "gib_seconds": 3.25}
    assert summary["idle_share"] == pytest.approx(1 / 13)
    assert summary["price"]["per_1000_rewards"] == pytest.approx(1000 * (3.25 * 0.04 + 3.25 * 0.005) / 3600, abs=1e-6)
    assert tool.cost_summary(shares, 4, (None, None))["price"] is None  # never a made-up price


# ---------------------------------------------------------------- end to end

RUNTIMES = {"runtimeClasses": [{"name": "cube", "handler": "cube"},
                               {"name": "vm", "handler": "vm", "overhead": {"podFixed": {"cpu": "250m",
                                                                                         "memory": "160Mi"}}}]}


def test_a_runtime_class_overhead_shows_as_its_share_of_the_reserved_capacity(make_cluster, run_tool, tmp_path):
    # a VM sandbox takes seconds to start: at whole-second resolution the pods are held for > 0 s
    cluster = make_cluster(dict(RUNTIMES, profile="vm-sandbox"))
    done = run_tool("run", "--count", "4", "--runtime", "vm", "--price-cpu-hour", "0.04", "--price-gib-hour", "0.005",
                    "--output", "vm", cluster=cluster)
    assert done.code == 0, done
    cost = read(tmp_path / "vm" / "results.json")["cost"]
    # 100m requested + 250m overhead: the overhead is 5/7 of every held CPU-second
    assert cost["overhead_share"] == pytest.approx(250 / 350)
    assert cost["per_reward"]["cpu_seconds"] > 0 and cost["rewards"] == 4
    assert cost["price"]["per_1000_rewards"] > 0
    report = run_tool("report", "vm")
    assert "| Pod overhead share of reserved CPU | 71% |" in report.stdout


def test_a_warm_pool_counts_its_idle_sandboxes_apart(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"agentSandbox": {"version": "v0.5.6", "extensions": True}})
    done = run_tool("run", "--backend", "warm-pool", "--no-runtime-class", "--count", "4", "--output", "warm",
                    cluster=cluster)
    assert done.code == 0, done
    cost = read(tmp_path / "warm" / "results.json")["cost"]
    assert cost["shares"]["episodes"]["pods"] == 4
    assert cost["shares"]["idle"]["pods"] >= 4  # the claimed sandboxes' wait, and the refill
    assert 0 < cost["idle_share"] < 1
    assert cost["pool_idle_rate_per_hour"]["cpu_core_hours"] == pytest.approx(0.4)  # 4 x 100m


def test_prices_go_together(run_tool):
    done = run_tool("run", "--count", "2", "--dry-run", "--price-cpu-hour", "0.04")
    assert done.code == 2 and "--price-cpu-hour and --price-gib-hour go together" in done.stderr


def test_used_cpu_is_the_episodes_own_counter_and_utilisation_is_used_over_reserved(tool):
    assert tool.used_cpu_seconds([{"cpu_usec": 250000}, {"cpu_usec": 750000}]) == 1.0
    assert tool.used_cpu_seconds([{"cpu_usec": 250000}, {"cpu_usec": None}]) is None  # all or nothing
    shares = {"episodes": {"cpu_seconds": 4.0, "gib_seconds": 1.0, "overhead_cpu_seconds": 0.0,
                           "overhead_gib_seconds": 0.0, "pods": 2}}
    used = tool.cost_summary(shares, 2, (None, None), used_cpu=1.0)["used"]
    assert (used["cpu_seconds"], used["utilisation"]) == (1.0, 0.25)
    assert tool.cost_summary(shares, 2, (None, None))["used_note"].startswith("not measured")


def pod_cgroups_possible():
    """Whether the simulated kubelet can give a pod a cgroup of its own here (root, a writable
    cgroup v2 or v1 cpuacct hierarchy, per-pod mount namespaces)."""
    import os
    import shutil
    import subprocess
    if os.geteuid() != 0 or not shutil.which("unshare") or \
            subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        return False
    for hierarchy in ("/sys/fs/cgroup", "/sys/fs/cgroup/cpuacct"):
        probe = os.path.join(hierarchy, "fake-k8s-probe-%d" % os.getpid())
        try:
            os.mkdir(probe)
            os.rmdir(probe)
            return True
        except OSError:
            continue
    return False


def test_the_episodes_own_cpu_time_is_read_from_their_containers_cgroup(make_cluster, run_tool, tmp_path):
    if not pod_cgroups_possible():
        pytest.skip("needs root, unshare and a writable cgroup hierarchy to give each pod a cgroup of its own")
    cluster = make_cluster()
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    results = read(tmp_path / "out" / "results.json")
    assert all(row["cpu_usec"] > 0 for row in results["pods"])  # the episode and its test subprocesses
    assert results["cost"]["used"]["cpu_seconds"] == pytest.approx(sum(r["cpu_usec"] for r in results["pods"]) / 1e6)


def test_without_a_cgroup_of_its_own_no_cpu_time_is_made_up(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"podMountNamespaces": "off"})  # the host's cgroup is not visible to the episode
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    results = read(tmp_path / "out" / "results.json")
    assert [row["cpu_usec"] for row in results["pods"]] == [None, None]
    assert results["cost"]["used"] is None and results["cost"]["used_note"].startswith("not measured")


def test_a_local_episode_reports_no_cpu_time_of_its_machine(run_tool, tmp_path):
    # a local process has no cgroup of its own: /sys/fs/cgroup would count the whole machine's CPU
    assert run_tool("run", "--backend", "local", "--count", "2", "--output", "out").code == 0
    results = read(tmp_path / "out" / "results.json")
    assert [row["cpu_usec"] for row in results["pods"]] == [None, None]
    assert results["cost"]["used"] is None
