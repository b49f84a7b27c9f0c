"""`compare`: arms run interleaved, bootstrap intervals, a verdict only where the data carries one
(issue "Compare with confidence"). The statistics in-process on synthetic data of known
distributions (seeded); the subcommand end to end on the local backend."""

import json
import random
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

from conftest import EPISODE, SCRIPT, read, wait_for, write_tasks


# ---------------------------------------------------------------- the order of the batches

def test_every_arm_runs_once_a_round_and_the_order_reverses_every_other_round(tool):
    order = tool.interleaved_order(["a", "b"], 4, seed=1)
    rounds = [[arm for number, arm in order if number == r] for r in range(1, 5)]
    assert sorted(rounds[0]) == ["a", "b"] and rounds[1] == rounds[0][::-1]
    assert rounds[2] == rounds[0] and rounds[3] == rounds[1]  # A B, B A, A B, B A


def test_the_first_rounds_order_is_drawn_from_the_seed(tool):
    firsts = {tuple(arm for number, arm in tool.interleaved_order(["a", "b", "c"], 1, seed)) for seed in range(20)}
    assert len(firsts) > 1  # the seed decides, and the same seed decides the same
    assert tool.interleaved_order(["a", "b", "c"], 3, 5) == tool.interleaved_order(["a", "b", "c"], 3, 5)


# ---------------------------------------------------------------- intervals and verdicts (synthetic)

def synthetic(rng, low, high, rounds=6, episodes=30):
    return [[rng.uniform(low, high) for _ in range(episodes)] for _ in range(rounds)]


def verdict_of(tool, values, resolution=1e-6, level="episode"):
    metric = {"key": "x", "label": "x P50", "level": level, "q": 0.5 if level == "episode" else None,
              "resolution": resolution, "unit": "s", "values": values}
    figures, draws = tool.metric_figures(metric, ["a", "b"], random.Random(11), 2000)
    return figures, tool.pair_verdict(metric, "a", "b", figures, draws)


def test_an_interval_holds_a_known_ratio_and_the_verdict_names_it(tool):
    rng = random.Random(3)
    # medians 1.5 and 3.0: b is 2x a
    figures, pair = verdict_of(tool, {"a": synthetic(rng, 1, 2), "b": synthetic(rng, 2, 4)})
    assert pair["low"] < 2.0 < pair["high"] and pair["low"] > 1
    assert pair["verdict"].startswith("x P50: b is %.2fx a (" % pair["ratio"])
    assert figures["a"]["low"] < 1.5 < figures["a"]["high"] and figures["a"]["episodes"] == 180


def test_two_arms_drawn_from_one_distribution_show_no_difference(tool):
    rng = random.Random(4)
    _, pair = verdict_of(tool, {"a": synthetic(rng, 1, 2), "b": synthetic(rng, 1, 2)})
    assert pair["low"] < 1 < pair["high"]
    assert pair["verdict"].startswith("x P50: no difference shown between b and a (")
    assert pair["verdict"].endswith("more rounds would tell")


def test_a_difference_below_the_figures_resolution_is_no_difference(tool):
    # whole-second API times: 10.2 s against 10.6 s cannot be told apart
    _, pair = verdict_of(tool, {"a": [10.2, 10.2, 10.2], "b": [10.6, 10.6, 10.6]}, resolution=1.0, level="round")
    assert pair["verdict"].startswith("x P50: no difference shown at this figure's resolution (1 s)")


def test_round_to_round_variation_widens_the_interval(tool):
    # the same episodes, but rounds that drift: the interval must hold the drift, not only episode noise
    rng = random.Random(5)
    steady = synthetic(rng, 1, 2)
    drifting = [[value + shift for value in values] for values, shift in zip(synthetic(rng, 1, 2), (0, 2, 0, 2, 0, 2))]
    figures, _ = verdict_of(tool, {"a": steady, "b": drifting})
    assert figures["b"]["high"] - figures["b"]["low"] > 2 * (figures["a"]["high"] - figures["a"]["low"])


# ---------------------------------------------------------------- the subcommand on the local backend

def test_a_comparison_of_two_local_arms_writes_every_batch_the_figures_and_the_verdicts(run_tool, tmp_path):
    done = run_tool("compare", "--arm", "serial=--parallelism 1", "--arm", "parallel=", "--backend", "local",
                    "--count", "4", "--rounds", "2", "--output", "cmp", "--seed", "7")
    assert done.code == 0, done
    record = read(tmp_path / "cmp" / "compare.json")
    assert record["status"] == "complete" and record["seed"] == 7 and len(record["completed"]) == 4
    assert [arm for _, arm in record["order"]][:2] == [arm for _, arm in record["order"]][2:][::-1]
    for arm in ("serial", "parallel"):
        for number in (1, 2):
            assert (tmp_path / "cmp" / arm / ("round-%d" % number) / "results.json").exists()
    result = read(tmp_path / "cmp" / "comparison.json")
    assert result["method"]["seed"] == 7 and result["method"]["resamples"] == 2000
    [ready] = [pair for pair in result["pairs"] if pair["metric"] == "batch_to_all_ready_seconds"]
    assert ready["verdict"] in done.stdout and ready["a"] == "serial" and ready["b"] == "parallel"
    svg = (tmp_path / "cmp" / "comparison.svg").read_text()
    assert svg.count('class="ecdf" data-arm="serial"') == svg.count('class="ecdf" data-arm="parallel"') >= 1


def test_report_of_a_comparison_recomputes_the_same_figures_from_the_folder(run_tool, tmp_path):
    assert run_tool("compare", "--arm", "a=", "--arm", "b=--parallelism 1", "--backend", "local", "--count", "3",
                    "--rounds", "2", "--output", "cmp", "--seed", "2").code == 0
    again = run_tool("report", "cmp", "--json")
    assert again.code == 0, again
    assert json.loads(again.stdout) == read(tmp_path / "cmp" / "comparison.json")


def test_a_batch_that_fails_stops_the_comparison_with_what_was_complete(tool, run_tool, tmp_path):
    # an arm on a cluster that cannot be reached fails its first batch (exit 1); the local arm ran first
    seed = next(s for s in range(100) if tool.interleaved_order(["good", "bad"], 2, s)[0][1] == "good")
    done = run_tool("compare", "--arm", "good=--backend local", "--arm", "bad=--backend kubernetes", "--count", "2",
                    "--rounds", "2", "--output", "cmp", "--seed", str(seed),
                    env={"KUBECONFIG": str(tmp_path / "no-such-kubeconfig")})
    assert done.code == 1, done
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("Error: comparison stopped: round 1 of arm bad failed (exit code 1; its line is above"), line
    record = read(tmp_path / "cmp" / "compare.json")
    assert record["status"] == "stopped" and record["completed"] == [[1, "good"]]
    assert read(tmp_path / "cmp" / "comparison.json")["arms"]["good"]["rounds"] == 1


def test_ctrl_c_stops_the_comparison_and_keeps_the_record(tmp_path):
    write_tasks(tmp_path / "tasks.jsonl", [{"mode": "ok", "sleep": 3600}])
    process = subprocess.Popen([sys.executable, str(SCRIPT), "compare", "--arm", "a=", "--arm", "b=",
                                "--backend", "local", "--episode", EPISODE, "--tasks", "tasks.jsonl",
                                "--rounds", "2", "--output", "cmp"], cwd=str(tmp_path),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for("the first batch running", lambda: list((tmp_path / "cmp").glob("*/round-1/run.json")))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)  # an episode of an hour: stopped, not waited for
    assert process.returncode == 130, stderr
    assert "Error: comparison interrupted: interrupted during round 1 of arm" in stderr
    # one line says it: the batch's own "Error: interrupted" is not repeated before it
    assert [line for line in stderr.splitlines() if line.startswith("Error:")] == [stderr.strip().splitlines()[-1]]
    record = read(tmp_path / "cmp" / "compare.json")
    assert record["status"] == "interrupted" and record["completed"] == []


def test_options_compare_chooses_itself_are_refused_in_an_arm(run_tool, tmp_path):
    done = run_tool("compare", "--arm", "a=--output x", "--arm", "b=", "--backend", "local", "--output", "cmp")
    assert done.code == 2 and "--output is compare's to choose (arm a)" in done.stderr
    assert not (tmp_path / "cmp").exists()


def test_an_arm_whose_options_run_would_refuse_is_refused_before_any_batch(run_tool, tmp_path):
    done = run_tool("compare", "--arm", "a=--parallelism 0", "--arm", "b=", "--backend", "local", "--output", "cmp")
    assert done.code == 2 and "arm a: --parallelism must be between 1 and --count" in done.stderr
    assert not (tmp_path / "cmp").exists()


def test_a_disk_that_refuses_compare_json_gives_one_line_and_leaves_no_folder(run_tool, tmp_path):
    from test_faults import refuse_file_writes
    done = subprocess.run([sys.executable, str(SCRIPT), "compare", "--arm", "a=", "--arm", "b=--parallelism 1",
                           "--backend", "local", "--count", "1", "--rounds", "2", "--output", "cmp"],
                          cwd=str(tmp_path), text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL,
                          preexec_fn=refuse_file_writes)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: cannot write cmp/compare.json: File too large; nothing was run, and the output folder was removed"]
    assert not (tmp_path / "cmp").exists()


def test_compare_help_prints_the_percent_sign_once(run_tool):
    done = run_tool("compare", "--help")
    assert done.code == 0
    assert "95% bootstrap interval" in done.stdout and "%%" not in done.stdout


def test_report_of_a_comparison_beside_a_run_or_of_one_arm_says_what_the_folder_is(run_tool, tmp_path):
    assert run_tool("compare", "--arm", "a=", "--arm", "b=", "--backend", "local", "--count", "2", "--rounds", "2",
                    "--output", "cmp").code == 0
    beside = run_tool("report", "cmp", "cmp/a/round-1")
    assert beside.code == 1
    assert beside.stderr.startswith("Error: cmp is a comparison's folder: ") and "run failed" not in beside.stderr
    arm = run_tool("report", "cmp/a")
    assert arm.code == 1
    assert arm.stderr.startswith("Error: cmp/a is an arm of the comparison in cmp: its batches are cmp/a/round-N")


def test_one_round_is_refused_because_it_gives_no_interval(run_tool, tmp_path):
    done = run_tool("compare", "--arm", "a=", "--arm", "b=", "--backend", "local", "--rounds", "1", "--output", "cmp")
    assert done.code == 2
    assert "compare needs --rounds 2 or more, got 1: the intervals draw rounds, and one round gives none" in done.stderr
    assert not (tmp_path / "cmp").exists()


def test_an_arm_without_a_successful_episode_fails_the_comparison_and_the_other_arm_is_still_measured(run_tool,
                                                                                                     tmp_path):
    write_tasks(tmp_path / "ok.jsonl", [{"mode": "ok", "reward": 1}] * 2)
    write_tasks(tmp_path / "crash.jsonl", [{"mode": "crash"}] * 2)
    done = run_tool("compare", "--arm", "good=--tasks ok.jsonl", "--arm", "broken=--tasks crash.jsonl", "--episode",
                    EPISODE, "--backend", "local", "--rounds", "2", "--output", "cmp")
    assert done.code == 4, done
    assert done.stderr.strip().splitlines()[-1].startswith(
        "Error: comparison no samples: arm broken measured nothing: no successful episode in its 1 batch(es) (first: "
        "episode 0: crashed: exit code 3")
    assert "  good: batch all rewards " in done.stdout  # the healthy arm's figures
    assert "  broken: no figures: no successful episode in its 1 batch(es)" in done.stdout
    arms = read(tmp_path / "cmp" / "comparison.json")["arms"]
    assert "batch_to_all_rewards_seconds" in arms["good"] and "no_samples" in arms["broken"]


def test_an_arm_that_measured_nothing_in_the_first_round_stops_the_comparison_there(run_tool, tmp_path):
    write_tasks(tmp_path / "ok.jsonl", [{"mode": "ok", "reward": 1}])
    write_tasks(tmp_path / "crash.jsonl", [{"mode": "crash"}])
    done = run_tool("compare", "--arm", "good=--tasks ok.jsonl", "--arm", "broken=--tasks crash.jsonl", "--episode",
                    EPISODE, "--backend", "local", "--rounds", "3", "--output", "cmp")
    assert done.code == 4, done
    assert sorted(str(path.relative_to(tmp_path / "cmp")) for path in (tmp_path / "cmp").glob("*/round-*")) == [
        "broken/round-1", "good/round-1"]  # not rounds 2 and 3 of a comparison already lost


def test_a_batch_that_fails_before_making_its_folder_is_not_named_by_a_folder(cluster, run_tool, tmp_path):
    done = run_tool("compare", "--arm", "a=--no-runtime-class", "--arm", "b=--runtime nosuch", "--count", "1",
                    "--rounds", "2", "--output", "cmp", cluster=cluster)
    assert done.code == 1, done
    last = done.stderr.strip().splitlines()[-1]
    assert "of arm b failed (exit code 1; its line is above, before it made its folder)" in last, last
    assert "cmp/b/round-" not in last


# ---------------------------------------------------------------- comparison.svg, read without the README

def picture(tool, panels, rounds=None):
    import xml.etree.ElementTree as ElementTree
    svg = tool.comparison_picture(panels, rounds or {"a": 3, "b": 3})
    return ElementTree.fromstring(svg), svg


def tag(element):
    return element.tag.rsplit("}", 1)[-1]


def figure(value, low, high):
    return {"value": value, "low": low, "high": high}


def panel(values, figures, name="pod created -> ready"):
    return {"name": name, "values": values, "figures": figures}


def test_negative_values_and_a_band_past_the_largest_value_stay_on_the_axis(tool):
    root, _ = picture(tool, [panel({"a": [-0.4, 0.2, 1.0], "b": [0.5, 0.7, 0.9]},
                                   {"a": {0.5: figure(0.2, -0.3, 1.6)}, "b": {0.5: figure(0.7, 0.6, 0.8)}})])
    left, right = tool.COMPARISON_LEFT, tool.COMPARISON_WIDTH - tool.COMPARISON_RIGHT
    xs = [float(point.split(",")[0]) for line in root.iter() if tag(line) == "polyline"
          for point in line.get("points").split()]
    for rect in (element for element in root.iter() if element.get("class") == "interval"):
        xs += [float(rect.get("x")), float(rect.get("x")) + float(rect.get("width"))]
    assert xs and all(left - 0.05 <= x <= right + 0.05 for x in xs), xs


def test_a_whole_second_figures_band_is_drawn_visible(tool):
    root, _ = picture(tool, [panel({"a": [2.0, 2.0, 3.0], "b": [3.0, 3.0, 4.0]},
                                   {"a": {0.5: figure(2.0, 2.0, 2.0)}, "b": {0.5: figure(3.0, 3.0, 3.0)}})])
    widths = [float(rect.get("width")) for rect in root.iter() if rect.get("class") == "interval"]
    assert len(widths) == 2 and min(widths) >= 4


def test_two_arms_bands_at_one_quantile_never_lie_on_each_other(tool):
    root, _ = picture(tool, [panel({"a": [1.0, 2.0, 3.0], "b": [1.0, 2.0, 3.0]},
                                   {"a": {0.5: figure(2.0, 1.5, 2.5)}, "b": {0.5: figure(2.0, 1.5, 2.5)}})])
    a, b = [(float(rect.get("y")), float(rect.get("y")) + float(rect.get("height")))
            for rect in root.iter() if rect.get("class") == "interval"]
    assert a[1] <= b[0] or b[1] <= a[0]
    dashes = {line.get("stroke-dasharray") for line in root.iter() if tag(line) == "polyline"}
    assert len(dashes) == 2  # told apart by the dash too, where colours blend


def test_every_text_fits_the_canvas_however_long_the_names(tool):
    long_arm = "an-arm-named-after-a-very-long-runtime-class-and-image-" * 3
    root, _ = picture(tool, [panel({long_arm: [1.0, 2.0], "b": [2.0, 3.0]},
                                   {long_arm: {0.5: figure(1.5, 1.0, 2.0)}, "b": {0.5: figure(2.5, 2.0, 3.0)}},
                                   name="a metric with a name much longer than any panel could hold " * 3)],
                      rounds={long_arm: 3, "b": 3})
    for text in (element for element in root.iter() if tag(element) == "text" and element.get("x")):
        if text.get("text-anchor") in (None, "start"):
            assert float(text.get("x")) + tool.text_width(text.text, float(text.get("font-size"))) <= \
                tool.COMPARISON_WIDTH, text.text


def test_the_legend_sits_above_every_panel_and_the_axes_name_their_quantities(tool):
    root, svg = picture(tool, [panel({"a": [0.01, 0.12, 0.183], "b": [0.05, 0.06]},
                                     {"a": {0.5: figure(0.12, 0.1, 0.15)}, "b": {0.5: figure(0.055, 0.05, 0.06)}})])
    texts = [element for element in root.iter() if tag(element) == "text"]
    legend = [float(t.get("y")) for t in texts if t.text in ("a (3 rounds)", "b (3 rounds)")]
    [title] = [float(t.get("y")) for t in texts if t.text == "pod created -> ready, in seconds"]
    assert len(legend) == 2 and max(legend) < title
    assert "seconds" in [t.text for t in texts] and "share of episodes" in svg
    ticks = [t.text for t in texts if t.get("text-anchor") == "middle" and t.text not in ("seconds", "share of episodes")]
    assert ticks == ["0", "0.05", "0.1", "0.15", "0.2"]  # round numbers, the largest value inside


def test_the_share_axis_names_100_percent_clear_of_95(tool):
    root, _ = picture(tool, [panel({"a": [1.0, 2.0], "b": [2.0, 3.0]},
                                   {"a": {0.5: figure(1.5, 1.0, 2.0)}, "b": {0.5: figure(2.5, 2.0, 3.0)}})])
    shares = {t.text: float(t.get("y")) for t in root.iter() if tag(t) == "text" and t.get("text-anchor") == "end"}
    assert set(shares) == {"0%", "50% (P50)", "95% (P95)", "100%"}
    assert shares["95% (P95)"] - shares["100%"] >= 10  # more than a 10 px line apart: never drawn over each other


def test_a_local_comparisons_panels_name_phases_in_words_and_its_episodes_as_processes(run_tool, tmp_path):
    done = run_tool("compare", "--arm", "a=", "--arm", "b=--parallelism 1", "--backend", "local", "--count", "3",
                    "--rounds", "2", "--output", "cmp", "--seed", "3")
    assert done.code == 0, done
    root = ET.fromstring((tmp_path / "cmp" / "comparison.svg").read_text())
    panels = [t.text for t in root.iter() if tag(t) == "text" and (t.text or "").endswith(", in seconds")]
    assert "process launched -> ready, in seconds" in panels and "Python module import, in seconds" in panels
    assert "process launched -> first statement, in seconds" in panels  # not interpreter_start
    assert not [name for name in panels if "_" in name or "pod" in name or "container" in name], panels
    labels = {pair["label"] for pair in read(tmp_path / "cmp" / "comparison.json")["pairs"]}
    assert "process launched -> ready P50" in labels


def test_arms_whose_backends_name_a_phase_differently_get_each_arms_words(tool):
    def results(backend):
        row = {"phases": {"interpreter_start": 0.1}, "pod_to_ready_seconds": 1.0}
        return {"backend": backend, "pods": [row], "phases": {"interpreter_start": {"resolution_seconds": 1e-6}}}
    labels = [metric["label"] for metric in tool.comparison_metrics({"bare": [results("local")],
                                                                     "job": [results("kubernetes")]})]
    assert "interpreter_start (bare: process launched -> first statement; job: container started -> first " \
           "statement) P50" in labels
    assert "startup (bare: process launched -> ready; job: pod created -> ready) P50" in labels


def test_nice_ticks_cover_the_range_at_round_steps(tool):
    assert tool.nice_ticks(0, 0.183) == [0, 0.05, 0.1, 0.15, 0.2]
    assert tool.nice_ticks(-0.4, 1.6) == [-0.5, 0, 0.5, 1.0, 1.5, 2.0]
    assert tool.nice_ticks(0, 0) == [0, 0.1]  # an axis even for a metric that is all zero
