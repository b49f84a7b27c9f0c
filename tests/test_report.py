"""Where the time goes: phases and run metadata in results.json, `report`, timeline.svg."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import SCRIPT, SUITE_CLUSTER, T0, read
from fakecluster import FakeCluster


def test_report_sets_a_local_baseline_beside_a_cluster_run(cluster, run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "3", "--output", "bare").code == 0
    assert run_tool("run", "--count", "3", "--output", "sandbox", cluster=cluster).code == 0
    table = run_tool("report", "bare", "sandbox", "--label", "bare process", "--label", "cube")
    assert table.code == 0, table
    assert table.stdout.splitlines()[0] == "| measure | bare process | cube |"


def local_results(run_tool, tmp_path):
    assert run_tool("run", "--backend", "local", "--count", "2", "--output", "out").code == 0
    return tmp_path / "out"


def test_a_timeline_into_a_missing_folder_is_one_line(run_tool, tmp_path):
    local_results(run_tool, tmp_path)
    result = run_tool("report", "out", "--timeline", "/no/such/dir/t.svg")
    assert result.code == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: cannot write the timeline to /no/such/dir/t.svg: No such file or directory"]


@pytest.mark.parametrize("content, holds", [("{}", "it lacks episodes"), ("[]", "it holds list")])
def test_a_results_file_of_the_wrong_shape_is_one_line(run_tool, tmp_path, content, holds):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "results.json").write_text(content)
    result = run_tool("report", "odd")
    assert result.code == 1, result
    line, = result.stderr.strip().splitlines()
    assert line.startswith("Error: odd/results.json is not the results of rl-batch-demo") and holds in line


def test_local_runs_are_titled_and_footnoted_as_local(run_tool, tmp_path):
    out = local_results(run_tool, tmp_path)
    assert "context None" not in (out / "timeline.svg").read_text()
    assert "local backend" in (out / "timeline.svg").read_text()
    report = run_tool("report", "out")
    assert report.code == 0 and "uses Kubernetes timestamps" not in report.stdout
    assert " *" not in report.stdout


def test_a_local_runs_report_shows_each_row_once(run_tool, tmp_path):
    local_results(run_tool, tmp_path)
    report = run_tool("report", "out")
    assert report.code == 0, report
    rows = [line.split("|")[1].strip() for line in report.stdout.splitlines() if line.startswith("| ")]
    assert "pod created -> ready P50 / P95" in rows
    assert len(rows) == len(set(rows)), rows


SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A parallel and a sequential run of 10 episodes, as the tutorial compares them (made once;
    the tests only read them)."""
    root = tmp_path_factory.mktemp("two-runs")
    cluster = FakeCluster(root / "k8s", SUITE_CLUSTER).start()
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
        "module_import", "import_done_to_ready", "ready_to_reward", "reward_to_container_finished", "pod_to_ready",
        "client_scheduling", "client_scheduled_to_container_started", "client_pod_to_ready"}
    for name, phase in results["phases"].items():
        assert {"from", "to", "clocks", "mixed_clocks", "resolution_seconds", "unit", "count", "p50", "p95",
                "p99", "min", "max", "mean", "missing", "missing_reasons", "bounded",
                "bounded_below_seconds"} <= set(phase), name
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
                                 "imports_done", "ready", "reward", "container_finished", "pod_seen", "scheduled_seen",
                                 "container_started_seen"}
    # the client clock's startup: from the watch's first delivery, sub-second, never negative
    client = results["phases"]["client_pod_to_ready"]
    assert client["count"] == 10 and client["clocks"] == ["client", "episode"] and client["resolution_seconds"] == 1e-3
    assert row["times"]["pod_seen"] == observed[row["pod"]]["first_seen"]
    assert row["times"]["sandbox_ready"] == observed[row["pod"]]["sandbox_ready"]
    assert row["events_source"] == "termination-message"
    assert results["clock_skew"] == {"findings": [], "max_seconds": None, "headline_withheld": None}


def test_results_carry_the_run_metadata(two_runs):
    import subprocess
    from fakecluster import REAL_KUBECTL
    run = read(two_runs[0] / "results.json")["run"]
    assert run["tool_version"] == "0.1.0"
    client = json.loads(subprocess.run([REAL_KUBECTL, "version", "--client", "-o", "json"], capture_output=True,
                                       text=True).stdout)["clientVersion"]["gitVersion"]
    assert run["kubectl_client_version"] == client and run["server_version"] == "v1.32.4"
    assert run["runtime_class"] == {"name": "cube", "handler": "cube", "overhead": None, "scheduling": None}
    assert {node["name"] for node in run["nodes"]} == {"kind-worker", "kind-worker2"}
    assert all(node["kubelet"] == "v1.32.4" and node["container_runtime"].startswith("containerd://")
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
    assert rows["episodes passed / run"] == "| episodes passed / run | 10/10 | 10/10 |"
    assert rows["reward sum"] == "| reward sum | 10 | 10 |"
    for measure in ("batch all ready", "batch all rewards", "client sees the batch done"):
        assert "x) |" in rows[measure], measure
    assert "Python module import P50 / P95" in rows and "import done -> ready P50 / P95" in rows
    assert "pod created -> ready P50 / P95" in rows
    assert any(line.startswith("\\* uses Kubernetes timestamps (whole seconds") for line in lines)
    # whole-second rows in seconds, never as milliseconds interpolated between whole seconds
    scheduling = rows["pod created -> scheduled P50 / P95"]
    assert scheduling.split(" | ")[0].endswith(" *") and " ms" not in scheduling, scheduling
    assert " ms" in rows["Python module import P50 / P95"]


def test_report_shows_the_sandbox_kernel_and_how_the_pods_got_their_image(two_runs, run_tool):
    result = run_tool("report", str(two_runs[0]), str(two_runs[1]))
    assert result.code == 0, result
    rows = {line.split(" | ")[0].lstrip("| ").rstrip(" *"): line for line in result.stdout.splitlines()
            if line.startswith("|")}
    # the simulated kubelet says every image was already present; its runtime shares the node's kernel
    assert rows["image pulled / cached / unknown"].endswith("| 0 / 10 / 0 | 0 / 10 / 0 |")
    assert rows["sandbox kernel"].endswith("| node-kernel | node-kernel |")
    assert rows["episodes on the node's kernel / their own / unknown"].endswith("| 10 / 0 / 0 | 10 / 0 / 0 |")


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
    assert result.code == 2  # a bad command line (README's table of exit codes)
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


def test_report_shows_batch_times_per_round(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "2", "--rounds", "3", "--output", "out", cluster=cluster).code == 0
    table = json.loads(run_tool("report", "out", "--json").stdout)
    rows = {row["measure"]: row for row in table["rows"]}
    assert rows["batch all rewards"]["values"][0].count(" / ") == 2
    assert rows["episodes passed / run"]["values"] == ["6/6"]


# ---------------------------------------------------------------- in-process: the table and the picture

def phase(p50, p95, count=1):
    return {"p50": p50, "p95": p95, "count": count}


def results(backend=None, **extra):
    """The parts of a results.json that `report` reads."""
    base = {"episodes": 2, "successful_episodes": 2, "reward_sum": 2, "parallelism": 2, "runtime": "runc",
            "image": "python:3.12-alpine", "context": "kind-rl",
            "batch_to_all_ready_seconds": 2.0, "batch_to_all_rewards_seconds": 3.0,
            "phases": {"scheduling": phase(0.0, 1.0), "module_import": phase(0.0125, 0.02),
                       "pod_to_ready": phase(1.5, 2.0)}, "pods": []}
    if backend:
        base["backend"] = backend
    base.update(extra)
    return base


def test_report_table_gives_ratios_against_the_first_column_for_batch_times(tool):
    table = tool.report_table([("a", results()), ("b", results(batch_to_all_ready_seconds=3.0))])
    rows = {row["measure"]: row for row in table["rows"]}
    assert table["columns"] == ["a", "b"]
    assert rows["batch all ready"]["values"] == ["2.00 s", "3.00 s"]
    assert rows["batch all ready"]["ratios"] == [1.0, 1.5]
    assert rows["episodes passed / run"]["values"] == ["2/2", "2/2"]


def test_report_counts_say_what_they_count_infrastructure_failures_apart(tool):
    # 16 tasks, 2 of them infrastructure failures, rewards summing to 9 (once shown as "14/9")
    failing = results(episodes=16, successful_episodes=14, reward_sum=9.0,
                      infrastructure_failures=[{"index": 3}, {"index": 7}])
    rows = {row["measure"]: row for row in tool.report_table([("a", failing)])["rows"]}
    assert rows["episodes passed / run"]["values"] == ["14/16"]
    assert rows["reward sum"]["values"] == ["9"]
    assert rows["infrastructure failures"]["values"] == ["2"]


def test_report_table_shows_whole_second_rows_in_seconds_and_episode_rows_in_milliseconds(tool):
    rows = {row["measure"]: row for row in tool.report_table([("a", results())])["rows"]}
    assert rows["pod created -> scheduled P50 / P95"]["values"] == ["0 s / 1 s"]
    assert rows["pod created -> scheduled P50 / P95"]["whole_second_resolution"] is True
    assert rows["Python module import P50 / P95"]["values"] == ["12.5 ms / 20.0 ms"]
    assert rows["Python module import P50 / P95"]["whole_second_resolution"] is False


def test_report_table_drops_rows_no_column_has_and_marks_missing_ones_n_a(tool):
    warm = results("warm-pool", launch_types={"warm": 2}, phases={"claim_binding": phase(0.04, 0.1)})
    rows = {row["measure"]: row for row in tool.report_table([("job", results()), ("warm", warm)])["rows"]}
    assert rows["launch types warm / cold"]["values"] == [None, "2 / 0"]
    assert rows["claim created -> bound P50 / P95"]["values"] == [None, "40.0 ms / 100.0 ms"]  # both client clock
    assert "Kueue admission cycles" not in rows  # no column was queued


def test_a_local_column_has_no_whole_second_rows(tool):
    rows = tool.report_table([("local", results("local"))])["rows"]
    assert not any(row["whole_second_resolution"] for row in rows)


def timeline_row(name, start, backend_row=None):
    times = {"pod_created": start, "scheduled": start, "sandbox_ready": start + 0.5, "container_started": start + 1,
             "process_start": start + 1.2, "imports_done": start + 1.25, "ready": start + 1.3, "reward": start + 2,
             "container_finished": start + 2}
    return {"pod": name, "times": times, "batch_to_ready_seconds": times["ready"] - T0}


def test_the_timeline_draws_one_group_per_episode_in_creation_order_on_one_axis(tool):
    run = results(pods=[timeline_row("rollout-b", T0 + 1), timeline_row("rollout-a", T0)])
    svg = tool.timeline_svg([("run", run)])
    root = ET.fromstring(svg.encode())
    groups = root.findall(".//%sg" % SVG)
    assert [group.get("data-pod") for group in groups] == ["rollout-a", "rollout-b"]
    assert "seconds since the Job was created" in svg and "run: 2 episodes" in svg
    # every phase of a pod with a known sandbox-ready time, but not the combined fallback segment
    assert len(groups[0].findall("%srect" % SVG)) == 8


def test_the_timeline_of_a_warm_run_names_claims_and_their_launch_type(tool):
    times = {"claim_created": T0, "claim_bound": T0 + 0.1, "claim_ready": T0 + 0.2, "exec_started": T0 + 0.3,
             "process_start": T0 + 0.5, "imports_done": T0 + 0.55, "ready": T0 + 0.6, "reward": T0 + 1,
             "exec_finished": T0 + 1.1}
    row = {"claim": "episode-0", "pod": "episodes-x", "launch_type": "warm", "times": times,
           "batch_to_ready_seconds": 0.6}
    run = results("warm-pool", pods=[row], pool={"size": 1}, launch_types={"warm": 1})
    svg = tool.timeline_svg([("warm", run)])
    group = ET.fromstring(svg.encode()).find(".//%sg" % SVG)
    assert (group.get("data-claim"), group.get("data-launch-type")) == ("episode-0", "warm")
    assert "seconds since the first claim was created" in svg and "warm pool of 1, launch types warm 1" in svg
    assert "parallelism" not in svg  # an option the warm pool does not take


def test_a_timeline_says_only_what_its_run_has(tool):
    # a local run: no whole-second API times on its axis, no legend entry for a phase it never drew
    run = results("local", pods=[timeline_row("local-0", T0)], runtime="local-process")
    svg = tool.timeline_svg([("local", run)])
    assert "API times are whole seconds" not in svg
    assert "seconds since the batch was created" in svg and "Job" not in svg  # no Job ran
    drawn = {title.text.split(" ")[1].rstrip(":") for title in ET.fromstring(svg.encode()).iter(SVG + "title")}
    legend = [text.text for text in ET.fromstring(svg.encode()).iter(SVG + "text") if text.get("font-size") == "11"]
    assert len(legend) == len(drawn), (legend, drawn)


def test_a_long_timeline_title_widens_the_picture_and_long_legend_labels_their_columns(tool):
    run = results(pods=[timeline_row("rollout-a", T0)], runtime="a-very-long-runtime-class-name-" * 6)
    svg = tool.timeline_svg([("a long label for this run", run)])
    root = ET.fromstring(svg.encode())
    title = next(text.text for text in root.iter(SVG + "text") if text.get("font-weight") == "bold")
    assert int(root.get("width")) >= 7.5 * len(title)


def test_a_title_of_wide_letters_is_not_clipped(tool):
    # bold 13 px capitals and w/m are about 10-12 px wide: 7.5 px a character clipped such titles
    run = results(pods=[timeline_row("rollout-a", T0)], runtime="WMWMWMWMWM" * 12)
    svg = tool.timeline_svg([("run", run)])
    assert int(ET.fromstring(svg.encode()).get("width")) >= 120 * 0.95 * 13


# ---------------------------------------------------------------- a report that cannot mislead

def test_a_stored_negative_p50_keeps_its_sign_in_the_report(two_runs, run_tool, tmp_path):
    folder = tmp_path / "negative"
    subprocess.run(["cp", "-r", str(two_runs[0]), str(folder)], check=True)
    results = read(folder / "results.json")
    # as an older rl-batch-demo stored it (now a negative measurement is a bound, never a figure)
    results["phases"]["reward_to_container_finished"].update(count=10, p50=-0.32, p95=-0.12)
    (folder / "results.json").write_text(json.dumps(results))
    report = run_tool("report", str(folder))
    assert report.code == 0, report
    row = next(line for line in report.stdout.splitlines() if line.startswith("| reward -> container finished"))
    assert "-0.3 s / -0.1 s" in row, row
    rows = json.loads(run_tool("report", str(folder), "--json").stdout)["rows"]
    assert "-0.3 s / -0.1 s" in next(r for r in rows if r["measure"].startswith("reward -> container"))["values"]


def test_a_phase_measured_negative_is_a_bound_and_never_a_figure(tool):
    times = {"reward": 100.7, "container_finished": 100.0}  # finishedAt truncated to its whole second
    phases, notes, bounds = tool.episode_phases(times, {}, tool.POD_SCHEME)
    assert phases["reward_to_container_finished"] is None
    assert bounds == {"reward_to_container_finished": 0.3}
    assert notes["reward_to_container_finished"].startswith("measured negative: under 1 s, a bound")


def test_a_phase_only_bounded_in_every_episode_is_reported_as_its_bound(two_runs, run_tool, tmp_path):
    folder = tmp_path / "bounded"
    subprocess.run(["cp", "-r", str(two_runs[0]), str(folder)], check=True)
    results = read(folder / "results.json")
    results["phases"]["reward_to_container_finished"].update(count=0, p50=None, p95=None, bounded=10,
                                                             bounded_below_seconds=0.4)
    (folder / "results.json").write_text(json.dumps(results))
    report = run_tool("report", str(folder))
    row = next(line for line in report.stdout.splitlines() if line.startswith("| reward -> container finished"))
    assert "under 0.4 s (a bound)" in row, row


def test_whole_second_figures_print_with_the_precision_they_have(tool):
    assert [tool.format_seconds(v, True) for v in (-0.32, -0.04, 0.0, 1.0, 2.25)] == \
        ["-0.3 s", "0 s", "0 s", "1 s", "2.2 s"]


def test_the_report_says_what_its_ratios_are_and_mentions_rounds_only_with_rounds(two_runs, run_tool):
    report = run_tool("report", *map(str, two_runs))
    assert report.code == 0, report
    assert "(1.50x): the column's figure divided by the first column's (par); above 1 is slower" in report.stdout
    assert "several rounds" not in report.stdout


def test_a_missing_folder_is_named_as_missing(run_tool):
    result = run_tool("report", "no-such-folder")
    assert result.code == 1
    assert result.stderr.strip() == ("Error: no such folder: no-such-folder (give the output folders of runs, e.g. "
                                     "the --output of `run`)")


def test_the_timeline_names_a_run_without_runtime_class_and_numbers_its_rows(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    assert run_tool("run", "--count", "3", "--no-runtime-class", "--output", "out", cluster=cluster).code == 0
    svg = (tmp_path / "out" / "timeline.svg").read_text()
    assert "None" not in svg and "no RuntimeClass (the nodes' default runtime)" in svg
    numbers = [t.text for t in ET.fromstring(svg).iter(SVG + "text") if t.get("text-anchor") == "end"]
    assert numbers == ["0", "1", "2"]  # as the episodes are numbered everywhere else


# --- episodes that gave no sample: a row each, what ended them, the deadline -----------------

def test_a_timeline_has_a_row_for_every_episode_and_marks_the_deadline_and_what_it_ended(run_tool, tmp_path):
    from conftest import EPISODE, write_tasks
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok"}, {"mode": "ok", "sleep": 3600},
                                                    {"mode": "ok", "sleep": 3600}, {"mode": "ok"}])
    done = run_tool("run", "--backend", "local", "--episode", EPISODE, "--tasks", tasks, "--parallelism", "2",
                    "--timeout", "2", "--output", "out")
    assert done.code == 5, done
    root = ET.parse(str(tmp_path / "out" / "timeline.svg")).getroot()
    groups = [g for g in root.iter(SVG + "g") if "episode" in (g.get("class") or "").split()]
    assert len(groups) == 4
    failed = {g.get("data-index"): g for g in groups if g.get("class") == "episode failed"}
    # 0 gave its sample; 1 and 2 were killed at the deadline; 3's turn came after it
    assert sorted(failed) == ["1", "2", "3"]
    killed = [rect for index in ("1", "2") for rect in failed[index] if rect.get("class") == "attempt"]
    assert len(killed) == 2 and all("cut short by the deadline" in rect.find(SVG + "title").text for rect in killed)
    assert [t.text for t in failed["3"].iter(SVG + "text")] == ["never started"]
    deadline = [line for line in root.iter(SVG + "line") if line.get("class") == "deadline"]
    assert len(deadline) == 1 and "2 s (--timeout)" in deadline[0].find(SVG + "title").text
    legend = {t.text for t in root.iter(SVG + "text") if t.get("font-size") == "11"}
    assert {"an attempt cut short by the deadline (--timeout)", "the deadline (--timeout): dashed line"} <= legend


def test_a_retried_episodes_failed_attempt_is_drawn_in_its_row_before_its_sample(tool):
    row = dict(timeline_row("rollout-0-b", T0 + 3), index=0, failed_attempts=[
        {"pod": "rollout-0-a", "reason": "crashed: exit code 1 (boom)", "created_at": T0, "ended_at": T0 + 2}])
    svg = tool.timeline_svg([("run", results(pods=[row], infrastructure_failures=[]))])
    [group] = [g for g in ET.fromstring(svg.encode()).iter(SVG + "g")]
    attempt = next(rect for rect in group if rect.get("class") == "attempt")
    assert attempt.find(SVG + "title").text == "episode 0, rollout-0-a: crashed: exit code 1 (boom)"
    assert float(attempt.get("x")) < min(float(rect.get("x")) for rect in group if rect.get("class") != "attempt")
    assert "an attempt that gave no sample (crashed, evicted, malformed)" in svg


def test_a_batch_whose_every_episode_failed_still_draws_its_attempts(tool):
    failure = {"index": 0, "reason": "crashed: exit code 3 (x)", "attempts": [
        {"pod": "local-0", "reason": "crashed: exit code 3 (x)", "created_at": T0, "ended_at": T0 + 1}]}
    run = results("local", pods=[], infrastructure_failures=[failure], successful_episodes=0)
    assert tool.timeline_drawable(run)
    assert 'class="episode failed" data-index="0"' in tool.timeline_svg([("run", run)])
    assert not tool.timeline_drawable(dict(run, infrastructure_failures=[dict(failure, attempts=[])]))


def test_every_phase_a_combined_timeline_shows_has_a_colour_of_its_own(tool):
    runs = [{"backend": "kubernetes", "queue": {"cycles": [{"draining_seconds": 1.0}]}}, {"backend": "warm-pool"},
            {"backend": "local"}]
    legend = tool.timeline_legend(runs)
    assert len(legend) >= 18 and len(set(legend.values())) == len(legend)


def test_report_rows_shared_by_every_backend_name_no_backends_object(tool):
    # a warm-pool or local run has no Job: a shared row says what every backend measures
    shared = [label for rows in tool.SHARED_REPORT_ROWS.values() for label, _, _ in rows]
    assert [label for label in shared if "Job" in label or "claim" in label] == []
