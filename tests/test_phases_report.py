"""Where the time goes: phases and run metadata in results.json, `report`, timeline.svg."""

import json
from pathlib import Path
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import SCRIPT
from fakecluster import FakeCluster

SVG = "{http://www.w3.org/2000/svg}"


def read(path):
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A parallel and a sequential run of 10 episodes, as the tutorial compares them (made once;
    the tests only read them)."""
    root = tmp_path_factory.mktemp("two-runs")
    cluster = FakeCluster(root / "k8s").start()
    try:
        for args in (["--output", "par"], ["--parallelism", "1", "--output", "seq"]):
            done = subprocess.run([sys.executable, str(SCRIPT), "run", "--count", "10", *args], cwd=str(root),
                                  env=cluster.env(), capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
    finally:
        cluster.stop()
    return root / "par", root / "seq"


def test_results_carry_every_phase_with_quantiles_clocks_and_precision(two_runs):
    results = read(two_runs[0] / "results.json")
    assert set(results["phases"]) == {
        "scheduling", "sandbox_start", "container_start", "scheduled_to_container_started", "interpreter_start",
        "module_import", "import_done_to_ready", "ready_to_reward", "reward_to_container_finished", "pod_to_ready"}
    for name, phase in results["phases"].items():
        assert {"from", "to", "clocks", "mixed_clocks", "resolution_seconds", "unit", "count", "p50", "p95",
                "p99", "min", "max", "mean", "missing", "missing_reasons"} <= set(phase), name
        assert phase["count"] + phase["missing"] == 10, name
    assert results["phases"]["module_import"]["count"] == 10
    assert results["phases"]["module_import"]["p50"] > 0
    assert results["phases"]["pod_to_ready"]["p50"] == results["pod_to_ready_p50_seconds"]
    # A finished pod's PodReadyToStartContainers is False; the pod watch saw it True while it ran.
    assert results["phases"]["sandbox_start"]["count"] == 10
    observed = read(two_runs[0] / "observed.json")
    assert sorted(observed) == sorted(row["pod"] for row in results["pods"])
    row = results["pods"][0]
    assert set(row["times"]) == {"pod_created", "scheduled", "sandbox_ready", "container_started", "process_start",
                                 "imports_done", "ready", "reward", "container_finished"}
    assert row["times"]["sandbox_ready"] == observed[row["pod"]]["sandbox_ready"]
    assert row["events_source"] == "termination-message"
    assert results["clock_skew"] == {"findings": [], "max_seconds": None, "headline_withheld": None}


def test_results_carry_the_run_metadata(two_runs):
    run = read(two_runs[0] / "results.json")["run"]
    assert run["tool_version"] == "0.1.0"
    assert run["kubectl_client_version"] == "v1.34.3" and run["server_version"] == "v1.34.3"
    assert run["runtime_class"] == {"name": "cube", "handler": "cube", "overhead": None, "scheduling": None}
    assert {node["name"] for node in run["nodes"]} == {"kind-worker", "kind-worker2"}
    assert all(node["kubelet"] == "v1.34.3" and node["container_runtime"].startswith("containerd://")
               and node["kernel"] and node["os"] for node in run["nodes"])
    assert run["flags"]["count"] == 10 and run["flags"]["parallelism"] == 10 and run["flags"]["image"]
    assert run["started_at"].endswith("Z")
    assert run["cache_state"]["state"] == "uncontrolled"
    results = read(two_runs[0] / "results.json")
    assert results["image_ids"] and sum(results["nodes"].values()) == 10


def test_metadata_that_cannot_be_read_is_null_with_a_reason(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"forbid": [{"verb": "list", "resource": "nodes"}]})
    assert run_tool("run", "--count", "1", "--output", "out", cluster=cluster).code == 0
    run = read(tmp_path / "out" / "results.json")["run"]
    assert run["nodes"] is None
    assert run["nodes_note"] == ('nodes unknown: Error from server (Forbidden): nodes is forbidden: User "kind-user" '
                                 'cannot list resource "nodes" in API group "" at the cluster scope')


def test_recomputing_a_folder_gives_exactly_its_results(two_runs, tool):
    for folder in two_runs:
        assert tool.results_from_folder(folder) == read(folder / "results.json")


def test_report_prints_the_side_by_side_table_with_ratios(two_runs, run_tool):
    result = run_tool("report", str(two_runs[0]), str(two_runs[1]), "--label", "10 parallel", "--label", "sequential")
    assert result.code == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "| measure | 10 parallel | sequential |"
    rows = {line.split(" | ")[0].lstrip("| ").rstrip(" *"): line for line in lines[2:] if line.startswith("|")}
    assert rows["tasks / rewards"] == "| tasks / rewards | 10/10 | 10/10 |"
    for measure in ("batch all ready", "batch all rewards", "client sees Job complete"):
        assert "x) |" in rows[measure], measure
    assert "Python module import P50 / P95" in rows and "import done -> ready P50 / P95" in rows
    assert "pod created -> ready P50 / P95" in rows
    assert lines[-2].startswith("\\* uses Kubernetes timestamps (whole seconds")
    # whole-second rows in seconds, never as milliseconds interpolated between whole seconds
    scheduling = rows["pod created -> scheduled P50 / P95"]
    assert scheduling.split(" | ")[0].endswith(" *") and " ms" not in scheduling, scheduling
    assert " ms" in rows["Python module import P50 / P95"]


def test_report_json_matches_the_saved_results(two_runs, run_tool):
    table = json.loads(run_tool("report", str(two_runs[0]), str(two_runs[1]), "--json").stdout)
    assert table["columns"] == ["par", "seq"]
    rows = {row["measure"]: row for row in table["rows"]}
    par, seq = (read(folder / "results.json") for folder in two_runs)
    ratio = rows["batch all rewards"]["ratios"][1]
    assert ratio == pytest.approx(seq["batch_to_all_rewards_seconds"] / par["batch_to_all_rewards_seconds"])


def test_report_needs_results(run_tool, tmp_path):
    (tmp_path / "failed").mkdir()
    result = run_tool("report", "failed")
    assert result.code == 1
    assert result.stderr.startswith("Error: failed has no results.json")


def test_report_wants_one_label_per_folder(two_runs, run_tool):
    result = run_tool("report", str(two_runs[0]), str(two_runs[1]), "--label", "only one")
    assert result.code == 1
    assert "one --label per folder (2 folders, 1 labels)" in result.stderr


def episode_rows(svg_path):
    root = ET.parse(str(svg_path)).getroot()
    assert root.tag == SVG + "svg"
    return [g for g in root.iter(SVG + "g") if g.get("class") == "episode"]


def test_every_run_draws_a_timeline_with_one_row_per_episode(two_runs):
    rows = episode_rows(two_runs[0] / "timeline.svg")
    pods = [row["pod"] for row in read(two_runs[0] / "results.json")["pods"]]
    assert sorted(g.get("data-pod") for g in rows) == sorted(pods)
    assert all(len(list(g)) >= 4 for g in rows)  # a segment per known phase
    text = (two_runs[0] / "timeline.svg").read_text()
    assert "seconds since the Job was created" in text and "Python module import" in text
    assert "10 episodes, parallelism 10, runtime cube" in text


def test_timeline_rows_follow_pod_creation_order(two_runs):
    results = read(two_runs[1] / "results.json")
    created = {row["pod"]: (row["times"]["pod_created"], row["pod"]) for row in results["pods"]}
    order = [g.get("data-pod") for g in episode_rows(two_runs[1] / "timeline.svg")]
    assert order == sorted(order, key=created.get)


def test_report_stacks_several_runs_in_one_timeline(two_runs, run_tool, tmp_path):
    assert run_tool("report", str(two_runs[0]), str(two_runs[1]), "--timeline", "both.svg").code == 0
    assert len(episode_rows(tmp_path / "both.svg")) == 20
