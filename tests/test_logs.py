"""The log archive: every episode's <pod>.log, byte for byte what `kubectl logs POD` returns,
from one kubectl process for the whole Job (issue "Collection at the physical limit")."""

from test_custom import EPISODE, read, write_tasks


def log_calls(cluster):
    return [call for call in cluster.calls() if "logs" in call]


def test_every_log_comes_from_one_kubectl_process_byte_for_byte(make_cluster, run_tool, tmp_path):
    cluster = make_cluster()
    # more output than a termination message holds, a crash, a last line without a newline
    tasks = write_tasks(tmp_path / "tasks.jsonl", [
        {"id": 0, "chatter": 200, "termination_message": True}, {"id": 1, "mode": "crash"},
        {"id": 2, "trailing": "no newline at the end"}, {"id": 3}, {"id": 4, "reward": 0}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 5, result
    out = tmp_path / "out"
    pods = [pod["metadata"]["name"] for pod in read(out / "pods.json")]
    before = len(log_calls(cluster))
    for name in pods:
        direct = cluster.kubectl("-n", read(out / "receipt.json")["namespace"], "logs", name, "-c", "episode").stdout
        assert (out / (name + ".log")).read_text() == direct, name
    # the run made two: the four logs that validation needs (no termination message), in one
    # process before results.json, then the fifth
    assert before == 2, log_calls(cluster)
    assert sum("-l" in call for call in log_calls(cluster)) == 1
    assert any("no newline at the end" in (out / (name + ".log")).read_text() for name in pods)
    assert max(len((out / (name + ".log")).read_text()) for name in pods) > 4096
    sources = read(out / "logs.json")
    assert set(sources) == set(pods)
    first = [name for name in pods if name.startswith("rollout-0-")][0]
    assert sources.pop(first) == "kubectl logs POD"
    assert set(sources.values()) == {"kubectl logs -l job-name=JOB --prefix (one process for the Job)"}
    assert read(out / "results.json")["log_archive"]["logs"] == 5


def test_a_pod_gone_before_its_log_was_read_is_recorded_as_such(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker", "apiEvictFirstPodAfterSeconds": 0.3}]})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": i, "sleep": 1, "termination_message": True}
                                                   for i in range(4)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    out = tmp_path / "out"
    gone = read(out / "run.json")["pods_seen_only_by_watch"]
    assert len(gone) == 1
    assert read(out / "logs.json")[gone[0]].startswith("not available: the pod was gone from the API")
    assert not (out / (gone[0] + ".log")).exists()
    assert read(out / "results.json")["log_archive"]["sources"]["not available"] == 1


def test_split_prefixed_logs_keeps_each_pods_bytes(tool):
    raw = (b"[pod/a/episode] one\n[pod/b/episode] x\n[pod/a/episode] two without newline"
           b"[pod/b/episode] y\n[pod/a/episode] [pod/zzz/episode] is content\n[pod/d/episode] not asked for\n")
    assert tool.split_prefixed_logs(raw, ["a", "b", "c"], "episode", ["a", "b", "c", "d"]) == {
        "a": b"one\ntwo without newline[pod/zzz/episode] is content\n", "b": b"x\ny\n", "c": b""}


def test_output_that_does_not_start_with_a_prefix_is_not_split(tool):
    assert tool.split_prefixed_logs(b"error: something\n", ["a"], "episode") is None


def test_prewarm_on_many_nodes_uses_two_watches_in_all(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"nodes": [{"name": "kind-worker%d" % i} for i in range(4)]})
    result = run_tool("run", "--count", "2", "--prewarm", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    watches = [call for call in cluster.calls() if "--watch" in call]
    # prewarm: one pod watch and one Job watch for its four Jobs; the measured round: two more.
    # At most: a watch stopped before the fake kubectl logged its call (a loaded machine) is not
    # counted, and the point is that there is no watch per node or per Job.
    assert 2 <= len(watches) <= 4, watches
    assert len(list((tmp_path / "out" / "prewarm").glob("*/results.json"))) == 4


def test_the_stall_check_reads_only_the_jobs_failed_create_events(make_cluster, run_tool, tmp_path):
    # The pods are refused until the ServiceAccount comes, 7 s after the namespace: a stall of
    # at least the 3 s that starts a check, even when a loaded machine slows the tool's start.
    cluster = make_cluster({"serviceAccountDelaySeconds": 7})
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    event_reads = [call for call in cluster.calls() if "events" in call and "--sort-by" not in " ".join(call)]
    assert event_reads, "the run made no stall check"
    for call in event_reads:
        assert call[call.index("--field-selector") + 1] == (
            "involvedObject.kind=Job,involvedObject.name=rollout,reason=FailedCreate")
