"""Metrics and validation, in-process: percentiles, phases, clocks, every episode check."""

import json
import statistics

import pytest

from conftest import T0

JOB_CREATED = "2026-11-29T10:00:00Z"


def good_pod(name="rollout-abcde", created="2026-11-29T10:00:01Z", node="kind-worker"):
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"nodeName": node},
        "status": {"phase": "Succeeded", "containerStatuses": [{
            "imageID": "docker.io/library/python@sha256:" + "a" * 64, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]},
    }


def good_log(name="rollout-abcde", ready_at=T0 + 3.5, reward_at=T0 + 5.0, started_at=None, imports_done_at=None,
             **reward_fields):
    reward = dict(event="reward", at=reward_at, episode_id=name, reward=1, baseline_exit=1, tests_exit=0,
                  tests_output="...\nOK\n")
    reward.update(reward_fields)
    ready = dict(event="ready", at=ready_at, episode_id=name)
    if started_at is not None:
        ready.update(started_at=started_at, imports_done_at=imports_done_at)
    return json.dumps(ready) + "\n" + json.dumps(reward) + "\n"


def phased_pod(name="rollout-abcde"):
    """A finished pod with the conditions and container times a real kubelet reports."""
    pod = good_pod(name)
    pod["status"]["conditions"] = [
        {"type": "PodReadyToStartContainers", "status": "False", "lastTransitionTime": "2026-11-29T10:00:07Z"},
        {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-29T10:00:02Z"},
        {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-29T10:00:06Z"},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": "2026-11-29T10:00:06Z"},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-29T10:00:02Z"}]
    pod["status"]["containerStatuses"][0]["state"]["terminated"].update(
        startedAt="2026-11-29T10:00:03Z", finishedAt="2026-11-29T10:00:06Z")
    return pod


JOB = {"metadata": {"creationTimestamp": JOB_CREATED}}


def test_parse_k8s_time_reads_rfc3339_utc(tool):
    assert tool.parse_k8s_time(JOB_CREATED) == T0


def test_percentile_interpolates_between_order_statistics(tool):
    assert tool.percentile([4, 1, 3, 2], 0.5) == 2.5
    assert tool.percentile([1, 2, 3, 4], 0.95) == pytest.approx(3.85)
    assert tool.percentile([1, 2, 3, 4], 0.0) == 1
    assert tool.percentile([1, 2, 3, 4], 1.0) == 4


def test_percentile_of_one_sample_is_that_sample(tool):
    assert tool.percentile([3.25], 0.95) == 3.25


def test_percentile_agrees_with_statistics_inclusive_quantiles(tool):
    values = [0.8, 1.3, 0.9, 2.7, 1.1, 1.0, 0.95, 3.9, 1.2, 1.05]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert tool.percentile(values, 0.5) == pytest.approx(cuts[49])
    assert tool.percentile(values, 0.95) == pytest.approx(cuts[94])


def test_collect_computes_the_tutorial_metrics(tool):
    pods = [good_pod("rollout-aaaaa", "2026-11-29T10:00:01Z", "n1"),
            good_pod("rollout-bbbbb", "2026-11-29T10:00:02Z", "n2")]
    logs = [good_log("rollout-aaaaa", T0 + 3.5, T0 + 5.0), good_log("rollout-bbbbb", T0 + 4.0, T0 + 6.5)]
    result = tool.collect(pods, logs, JOB, 2)
    assert (result["episodes"], result["successful_episodes"], result["reward_sum"]) == (2, 2, 2)
    assert result["batch_to_all_ready_seconds"] == 4.0
    assert result["batch_to_all_rewards_seconds"] == 6.5
    assert result["pod_to_ready_p50_seconds"] == 2.25  # 2.5 and 2.0
    assert result["pod_to_ready_p95_seconds"] == pytest.approx(2.475)
    assert result["pod_to_ready_max_seconds"] == 2.5
    assert result["nodes"] == {"n1": 1, "n2": 1}
    assert result["image_ids"] == ["docker.io/library/python@sha256:" + "a" * 64]
    row = result["pods"][0]
    assert {key: row[key] for key in ("pod", "node", "image_id", "reward", "pod_to_ready_seconds",
                                      "batch_to_ready_seconds", "batch_to_reward_seconds")} == {
        "pod": "rollout-aaaaa", "node": "n1", "image_id": "docker.io/library/python@sha256:" + "a" * 64,
        "reward": 1, "pod_to_ready_seconds": 2.5, "batch_to_ready_seconds": 3.5, "batch_to_reward_seconds": 5.0}


def invalid(tool, pod=None, log=None, count=1):
    with pytest.raises(tool.EpisodeInvalid) as caught:
        tool.collect([pod or good_pod()], [good_log() if log is None else log], JOB, count)
    return str(caught.value)


def test_validation_requires_one_pod_per_episode(tool):
    assert "expected 2 pods for 2 episodes, found 1" in invalid(tool, count=2)


def test_validation_requires_phase_succeeded(tool):
    pod = good_pod()
    pod["status"]["phase"] = "Failed"
    assert invalid(tool, pod=pod) == "pod rollout-abcde: phase is Failed, expected Succeeded"


def test_validation_requires_a_ready_event(tool):
    log = good_log().splitlines()[1] + "\n"
    assert invalid(tool, log=log).startswith("pod rollout-abcde: never ready: no ready event in its log, yet a reward "
                                             "event: the episode did not emit one, or the log's beginning is gone")


def test_validation_requires_exactly_one_reward_event(tool):
    log = good_log() + good_log().splitlines()[1] + "\n"
    assert invalid(tool, log=log) == "pod rollout-abcde: expected exactly one reward event, found 2"


def test_validation_rejects_a_line_that_is_not_json(tool):
    assert "log line 1 is not a JSON event: Traceback" in invalid(tool, log="Traceback (most recent call last):\n")


def test_validation_requires_episode_id_to_equal_the_pod_name(tool):
    log = good_log(name="rollout-other")
    assert invalid(tool, log=log) == ("pod rollout-abcde: ready event has episode_id 'rollout-other', "
                                      "expected the pod name")


def test_validation_requires_reward_one(tool):
    assert invalid(tool, log=good_log(reward=0)) == "pod rollout-abcde: reward is 0, expected 1"


def test_validation_requires_patched_tests_to_pass(tool):
    assert "tests_exit is 1, expected 0" in invalid(tool, log=good_log(tests_exit=1))


def test_validation_requires_the_baseline_to_fail(tool):
    assert "baseline_exit is 0, expected non-zero" in invalid(tool, log=good_log(baseline_exit=0))


def test_validation_rejects_ready_before_pod_creation(tool):
    message = invalid(tool, log=good_log(ready_at=T0 + 0.5))
    assert message.startswith("pod rollout-abcde: the episode clock on node kind-worker is at least 0.5 s behind "
                              "the API server (an episode cannot start before its pod's creation")


def test_validation_rejects_reward_before_ready(tool):
    assert "time order" in invalid(tool, log=good_log(ready_at=T0 + 5, reward_at=T0 + 4))


def test_validation_rejects_a_pod_created_before_its_job(tool):
    assert "time order" in invalid(tool, pod=good_pod(created="2026-11-29T09:59:59Z"))


def test_validation_rejects_a_restarted_container(tool):
    pod = good_pod()
    pod["status"]["containerStatuses"][0]["restartCount"] = 1
    assert invalid(tool, pod=pod) == "pod rollout-abcde: container restarted 1 times, expected 0"


def test_validation_rejects_a_nonzero_exit_code(tool):
    pod = good_pod()
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 2
    assert invalid(tool, pod=pod) == "pod rollout-abcde: container exit code is 2, expected 0"


def test_validation_lists_every_failed_episode(tool):
    pods = [good_pod("rollout-aaaaa"), good_pod("rollout-bbbbb")]
    logs = [good_log("rollout-aaaaa", reward=0), good_log("rollout-bbbbb", tests_exit=3)]
    with pytest.raises(tool.EpisodeInvalid) as caught:
        tool.collect(pods, logs, JOB, 2)
    assert str(caught.value).splitlines() == [
        "pod rollout-aaaaa: reward is 0, expected 1",
        "pod rollout-bbbbb: tests_exit is 3, expected 0 (the patched code must pass)"]


def test_job_outcome_reads_terminal_conditions(tool):
    complete = {"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                                          {"type": "Complete", "status": "True"}]}}
    failed = {"status": {"conditions": [{"type": "FailureTarget", "status": "True"},
                                        {"type": "Failed", "status": "True"}]}}
    assert tool.job_outcome(complete) == "Complete"
    assert tool.job_outcome(failed) == "Failed"
    assert tool.job_outcome({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}) is None
    assert tool.job_outcome({"status": {}}) is None


def phased_result(tool, observed=None, **log_times):
    times = dict(ready_at=T0 + 3.5, reward_at=T0 + 5.0, started_at=T0 + 3.2, imports_done_at=T0 + 3.45)
    times.update(log_times)
    return tool.collect([phased_pod()], [good_log(**times)], JOB, 1, observed)


def test_phases_follow_the_episode_from_creation_to_finish(tool):
    phases = phased_result(tool)["pods"][0]["phases"]
    assert phases["scheduling"] == 1.0
    assert phases["scheduled_to_container_started"] == 1.0
    assert phases["interpreter_start"] == pytest.approx(0.2)
    assert phases["module_import"] == pytest.approx(0.25)
    assert phases["import_done_to_ready"] == pytest.approx(0.05)
    assert phases["ready_to_reward"] == pytest.approx(1.5)
    assert phases["reward_to_container_finished"] == pytest.approx(1.0)
    assert phases["pod_to_ready"] == pytest.approx(2.5)


def test_a_torn_down_sandbox_condition_gives_null_with_a_reason(tool):
    row = phased_result(tool)["pods"][0]
    assert row["phases"]["sandbox_start"] is None and row["phases"]["container_start"] is None
    assert row["phase_notes"]["sandbox_start"] == (
        "PodReadyToStartContainers is False in the saved pod; the API keeps only its last transition")


def test_an_observed_sandbox_ready_time_fills_the_sandbox_phases(tool):
    row = phased_result(tool, observed={"rollout-abcde": {"sandbox_ready": T0 + 2.0}})["pods"][0]
    assert row["phases"]["sandbox_start"] == 0.0
    assert row["phases"]["container_start"] == 1.0
    assert "sandbox_start" not in row["phase_notes"]


def test_old_episode_logs_without_start_times_give_null_phases(tool):
    result = tool.collect([phased_pod()], [good_log()], JOB, 1)
    assert result["pods"][0]["phases"]["module_import"] is None
    assert result["phases"]["module_import"]["missing_reasons"] == {"the ready event has no started_at": 1}


def test_each_phase_states_its_clocks_resolution_and_unit(tool):
    phases = phased_result(tool)["phases"]
    assert phases["module_import"]["clocks"] == ["episode"]
    assert phases["module_import"]["mixed_clocks"] is False
    assert phases["module_import"]["resolution_seconds"] == 1e-6
    assert phases["interpreter_start"]["clocks"] == ["kubelet", "episode"]
    assert phases["interpreter_start"]["mixed_clocks"] is True
    assert phases["interpreter_start"]["resolution_seconds"] == 1.0
    assert phases["scheduling"]["clocks"] == ["api-server"]  # PodScheduled: stamped by the API server
    assert all(phase["unit"] == "seconds" for phase in phases.values())


def test_phase_statistics_cover_the_batch(tool):
    pods = [phased_pod("rollout-%s" % c * 1) for c in "ab"]
    logs = [good_log("rollout-a", started_at=T0 + 3.2, imports_done_at=T0 + 3.4),
            good_log("rollout-b", started_at=T0 + 3.2, imports_done_at=T0 + 3.6)]
    stats = tool.collect(pods, logs, JOB, 2)["phases"]["module_import"]
    assert stats["count"] == 2 and stats["missing"] == 0
    assert stats["min"] == pytest.approx(0.2) and stats["max"] == pytest.approx(0.4)
    assert stats["mean"] == pytest.approx(0.3) and stats["p50"] == pytest.approx(0.3)
    assert stats["p99"] == pytest.approx(0.398)


def test_pod_to_ready_phase_equals_the_seed_metric(tool):
    result = phased_result(tool)
    assert result["phases"]["pod_to_ready"]["p50"] == result["pod_to_ready_p50_seconds"]


def test_clock_skew_is_reported_with_its_size_and_bound(tool):
    # process start 1.5 s before the pod existed: the episode clock is at least 1.5 s behind.
    times = {"pod_created": T0 + 1, "container_started": T0 + 3, "process_start": T0 - 0.5, "ready": T0 + 3.5,
             "reward": T0 + 5.0, "container_finished": T0 + 6}
    findings = tool.episode_skew(times, job_finished=T0 + 6)
    assert [(f["clock"], f["direction"], f["at_least_seconds"]) for f in findings] == [("episode", "behind", 1.5)]
    skew = tool.clock_skew_summary([{"pod": "rollout-abcde", "node": "kind-worker", "clock_skew": findings}])
    assert skew["findings"][0]["node"] == "kind-worker" and skew["findings"][0]["pods"] == 1
    assert skew["max_seconds"] == 1.5
    assert skew["headline_withheld"] == "the episode clock on node kind-worker is at least 1.5 s behind the API server"


def test_a_reward_after_the_job_finished_bounds_an_ahead_clock(tool):
    times = {"pod_created": T0 + 1, "process_start": T0 + 3, "ready": T0 + 3.5, "reward": T0 + 12.25}
    findings = tool.episode_skew(times, job_finished=T0 + 10)
    assert [(f["clock"], f["direction"], f["at_least_seconds"]) for f in findings] == [("episode", "ahead", 1.25)]


def test_skew_within_the_api_resolution_is_not_reported(tool):
    skew = phased_result(tool, started_at=T0 + 2.5)["clock_skew"]
    assert skew["findings"] == [] and skew["max_seconds"] is None


# ---------------------------------------------------------------- clocks of the phases

def test_pod_scheduled_is_on_the_api_server_clock(tool):
    definition = tool.phase_definition("scheduling")
    assert (definition["clocks"], definition["mixed_clocks"]) == (["api-server"], False)


# --- API objects held by the thousand, and the files they are written to ---------------------

POD_A = {"metadata": {"name": "a", "managedFields": [{"manager": "kubelet"}], "labels": {"job-name": "rollout"}},
         "spec": {"containers": [{"image": "python:3.12", "command": ["python", "-B"]}], "nodeName": "n1"}}
POD_B = {"metadata": {"name": "b", "labels": {"job-name": "rollout"}},
         "spec": {"containers": [{"image": "python:3.12", "command": ["python", "-B"]}], "nodeName": "n2"}}


def test_shared_parts_decodes_what_json_loads_does_without_managed_fields(tool):
    decoded = tool.SharedParts(drop=("managedFields",)).decode(json.dumps(POD_A).encode())
    expected = json.loads(json.dumps(POD_A))
    del expected["metadata"]["managedFields"]
    assert decoded == expected


def test_shared_parts_holds_the_equal_parts_of_two_objects_once(tool):
    parts = tool.SharedParts()
    a, b = parts.decode(json.dumps(POD_A)), parts.decode(json.dumps(POD_B))
    assert a["spec"]["containers"] is b["spec"]["containers"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    assert a["spec"] is not b["spec"]  # their nodeName differs


def test_shared_parts_keeps_one_true_and_one_point_zero_apart(tool):
    parts = tool.SharedParts()
    values = [parts.decode(json.dumps({"v": value}))["v"] for value in (1, True, 1.0)]
    assert [type(value) for value in values] == [int, bool, float]


def test_write_json_writes_an_objects_rows_one_a_line(tool, tmp_path):
    report = {"episodes": 2, "pods": [{"pod": "a", "reward": 1}, {"pod": "b", "reward": 1}], "nodes": ["n1"]}
    tool.write_json(tmp_path / "results.json", report)
    text = (tmp_path / "results.json").read_text()
    assert json.loads(text) == report
    assert '    {"pod": "a", "reward": 1},' in text.splitlines()


def counting_decoder(calls):
    def decode(text):
        calls.append(text)
        return json.loads(text)
    return decode


def test_a_list_written_one_object_a_line_is_read_a_line_at_a_time(tool, tmp_path):
    pods = [POD_A, POD_B, {"metadata": {"name": "c,"}}]
    tool.write_json(tmp_path / "pods.json", pods)
    calls = []
    assert tool.decode_file(tmp_path / "pods.json", counting_decoder(calls)) == json.loads(json.dumps(pods))
    assert len(calls) == 3  # one object a call, never the whole text


def test_an_indented_list_is_read_whole_and_equal(tool, tmp_path):
    pods = [POD_A, {"list": [1, 2]}, "text", 3]
    (tmp_path / "pods.json").write_text(json.dumps(pods, indent=2))
    calls = []
    assert tool.decode_file(tmp_path / "pods.json", counting_decoder(calls)) == pods
    assert calls[-1] == json.dumps(pods, indent=2)


def test_lines_without_their_commas_are_not_taken_for_a_list(tool, tmp_path):
    (tmp_path / "pods.json").write_text('[\n  {"a": 1}\n  {"b": 2}\n]\n')
    with pytest.raises(ValueError):
        tool.decode_file(tmp_path / "pods.json", json.loads)


def test_a_list_cut_short_is_refused_in_one_line(tool, tmp_path):
    tool.write_json(tmp_path / "pods.json", [POD_A, POD_B])
    text = (tmp_path / "pods.json").read_text()
    (tmp_path / "pods.json").write_text(text[:text.rindex("]")])
    with pytest.raises(tool.DemoError, match="cannot read the saved episodes"):
        tool.read_json(tmp_path / "pods.json", "the saved episodes", shape=list)


def test_only_the_kept_items_are_read_in_either_layout(tool, tmp_path):
    events = [{"reason": "Scheduled"}, {"reason": "Pulled", "involvedObject": {"kind": "Pod"}}]
    tool.write_json(tmp_path / "events.json", events)
    (tmp_path / "indented.json").write_text(json.dumps(events, indent=2))
    for name in ("events.json", "indented.json"):
        assert tool.decode_file(tmp_path / name, json.loads, tool.is_image_event) == events[1:]


def test_the_run_summary_says_when_its_startup_figures_mix_pulled_and_cached_episodes(tool):
    report = dict(phased_result(tool), backend="kubernetes")
    assert "startup_note" not in tool.summary_view(report)
    report["image_pulls"] = {"mixed_startup": "pod_to_ready's figures mix 1 episode(s) that pulled ..."}
    assert tool.summary_view(report)["startup_note"].startswith("pod_to_ready's figures mix")
