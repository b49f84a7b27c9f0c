"""How each episode's pod got its image, from the kubelet's Pulled events (image_pulls_by_pod,
go_duration_seconds, image_pull_summary): pure functions, in-process."""

PULLED = 'Successfully pulled image "rlbd.test/python:3.11" in 54ms (1.936s including waiting). Image size: 43052880 bytes.'
CACHED = 'Container image "rlbd.test/python:3.11" already present on machine'


def event(pod, reason, message, kind="Pod"):
    return {"involvedObject": {"kind": kind, "name": pod}, "reason": reason, "message": message,
            "lastTimestamp": "2026-12-06T22:00:00Z"}


def test_go_durations_are_read_in_every_unit_and_anything_else_is_none(tool):
    assert [tool.go_duration_seconds(text) for text in ("54ms", "1.936s", "1m2.5s", "1h0m0s", "1.5µs", "0s")] == [
        0.054, 1.936, 62.5, 3600.0, 1.5e-06, 0.0]
    assert [tool.go_duration_seconds(text) for text in ("", "fast", "5s3", "3 s")] == [None] * 4


def test_a_pulled_event_gives_the_pull_its_wait_and_the_image_size(tool):
    assert tool.image_pulls_by_pod([event("a", "Pulled", PULLED)]) == {"a": {
        "state": "pulled", "image": "rlbd.test/python:3.11", "pull_seconds": 0.054,
        "pull_seconds_including_waiting": 1.936, "image_size_bytes": 43052880}}


def test_an_image_already_present_is_cached_with_either_wording(tool):
    pulls = tool.image_pulls_by_pod([event("a", "Pulled", CACHED),
                                     event("b", "Pulled", CACHED + " and can be accessed by the pod")])
    assert {pod: pull["state"] for pod, pull in pulls.items()} == {"a": "cached", "b": "cached"}


def test_events_of_other_objects_and_reasons_are_not_pulls(tool):
    assert tool.image_pulls_by_pod([event("a", "Pulling", 'Pulling image "x"'), event("j", "Pulled", PULLED, "Job"),
                                    event("b", "Failed", 'Failed to pull image "x": not found')]) == {}


def test_a_row_without_an_event_is_unknown_and_the_summary_counts_each_state(tool):
    rows = [{"pod": "a"}, {"pod": "b"}, {"pod": "c"}]
    tool.add_image_pulls(rows, [event("a", "Pulled", PULLED), event("b", "Pulled", CACHED)])
    assert [row["image_pull"]["state"] for row in rows] == ["pulled", "cached", "unknown"]
    summary = tool.image_pull_summary(rows)
    assert (summary["pulled"], summary["cached"], summary["unknown"]) == (1, 1, 1)
    assert summary["pull_seconds"]["p50"] == 0.054 and summary["pull_seconds_including_waiting"]["max"] == 1.936


def test_a_folder_without_events_says_so(tool):
    rows = [{"pod": "a"}]
    tool.add_image_pulls(rows, None)
    assert rows[0]["image_pull"] == {"state": "unknown", "why": "the folder has no events.json"}


def pull_rows(tool, *specs):
    """Rows of (pod, image, node, startup seconds, Pulled message) with their image_pull filled in."""
    rows = [{"pod": pod, "image": image, "node": node, "pod_to_ready_seconds": startup}
            for pod, image, node, startup, _ in specs]
    tool.add_image_pulls(rows, [event(pod, "Pulled", message) for pod, _, _, _, message in specs])
    return rows


def test_each_image_has_its_pulls_its_nodes_and_its_pulled_and_cached_startups_apart(tool):
    other = PULLED.replace("python:3.11", "task-2:v1")
    rows = pull_rows(tool, ("a", "rlbd.test/python:3.11", "n1", 3.0, PULLED),
                     ("b", "rlbd.test/python:3.11", "n1", 1.0, CACHED), ("c", "rlbd.test/python:3.11", "n2", 5.0, PULLED),
                     ("d", "rlbd.test/task-2:v1", "n2", 7.0, other))
    by_image = tool.image_pull_summary(rows)["by_image"]
    assert list(by_image) == ["rlbd.test/python:3.11", "rlbd.test/task-2:v1"]
    python = by_image["rlbd.test/python:3.11"]
    assert (python["episodes"], python["pulled"], python["cached"], python["pulled_on_nodes"]) == (3, 2, 1, ["n1", "n2"])
    assert (python["startup_seconds"]["pulled"]["max"], python["startup_seconds"]["cached"]["max"]) == (5.0, 1.0)
    assert by_image["rlbd.test/task-2:v1"]["startup_seconds"]["cached"]["count"] == 0


def test_startup_figures_that_mix_pulled_and_cached_episodes_say_so(tool):
    mixed = tool.image_pull_summary(pull_rows(tool, ("a", "i", "n1", 3.0, PULLED), ("b", "i", "n1", 1.0, CACHED)))
    assert mixed["mixed_startup"] == ("pod_to_ready's figures mix 1 episode(s) that pulled their image with 1 that "
                                      "found it cached: by_image has each apart")
    cached = tool.image_pull_summary(pull_rows(tool, ("a", "i", "n1", 1.0, CACHED), ("b", "i", "n1", 1.0, CACHED)))
    assert cached["mixed_startup"] is None
