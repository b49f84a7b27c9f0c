"""Tasks that bring their own image (a --tasks line's "image"): references compared as the kubelet
names them, the nodes that hold each image at the preflight, a batch across images as a Job per
image, and the batches refused until a backend runs them."""

import json
import re
import sys

import pytest

from conftest import EPISODE, read, write_tasks


# distribution/reference's ParseDockerRef, as node status.images names images (ASSUMPTIONS.md,
# "Images on a node")
@pytest.mark.parametrize("reference, normalized", [
    ("python:3.12-alpine", "docker.io/library/python:3.12-alpine"),
    ("python", "docker.io/library/python:latest"),
    ("docker.io/python:3", "docker.io/library/python:3"),
    ("index.docker.io/library/python:3", "docker.io/library/python:3"),
    ("swebench/sweb.eval.x86_64.django:v1", "docker.io/swebench/sweb.eval.x86_64.django:v1"),
    ("ghcr.io/org/repo", "ghcr.io/org/repo:latest"),
    ("localhost/repo", "localhost/repo:latest"),
    ("127.0.0.1:5000/repo/sub:tag", "127.0.0.1:5000/repo/sub:tag"),
    ("registry:5000/repo", "registry:5000/repo:latest"),
    ("python:3.12@sha256:" + "a" * 64, "docker.io/library/python@sha256:" + "a" * 64),
])
def test_an_image_reference_is_normalized_as_the_kubelet_names_it(tool, reference, normalized):
    assert tool.normalized_image(reference) == normalized


def node(name, *names):
    return {"metadata": {"name": name}, "status": {"images": [{"names": list(names), "sizeBytes": 1}]}}


def test_the_nodes_holding_an_image_are_found_by_its_normalized_name(tool):
    nodes = [node("n1", "docker.io/library/python@sha256:" + "b" * 64, "docker.io/library/python:3.12-alpine"),
             node("n2", "ghcr.io/org/repo:v1")]
    holders = tool.image_holders(["python:3.12-alpine", "ghcr.io/org/repo:v2"], nodes)
    assert holders == {"python:3.12-alpine": ["n1"], "ghcr.io/org/repo:v2": []}


def test_a_node_listing_as_many_images_as_a_kubelet_reports_may_hold_more(tool):
    full = {"metadata": {"name": "big"}, "status": {"images": [{"names": ["r/%d:1" % n]} for n in range(50)]}}
    assert "big list 50 images" in tool.image_holders_note([full, node("small", "a:1")])
    assert tool.image_holders_note([node("small", "a:1")]) is None


# --- a batch across images: a Job per image ---------------------------------------------------

THREE = ("example.test/a:1", "example.test/b:1", "example.test/c:1")


def cluster_of(make_cluster, images=THREE, **config):
    return make_cluster(dict({"images": {name: {"python": sys.executable} for name in images}}, **config))


def tasks_across(tmp_path, count=7, images=THREE):
    """Task n rewards n and runs image n mod 3: a reward shows which task an episode ran."""
    return write_tasks(tmp_path / "tasks.jsonl", [{"id": n, "reward": n, "image": images[n % len(images)]}
                                                   for n in range(count)])


def test_tasks_across_three_images_run_a_job_each_and_return_every_reward_in_task_order(make_cluster, run_tool,
                                                                                        tmp_path):
    cluster = cluster_of(make_cluster)
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path), "--parallelism", "4",
                    "--output", "out", cluster=cluster)
    assert done.code == 0, done
    results = read(tmp_path / "out" / "results.json")
    # each task's own reward, TASK_INDEX and image: the Jobs' indexes mapped back to the tasks'
    assert [entry["reward"] for entry in results["tasks"]] == list(range(7))
    assert [(row["index"], row["reward_fields"]["index"], row["image"]) for row in results["pods"]] == [
        (n, str(n), THREE[n % 3]) for n in range(7)]
    assert [(part["job"], part["image"], part["parallelism"]) for part in results["image_parts"]] == [
        ("rollout-i0", THREE[0], 2), ("rollout-i1", THREE[1], 1), ("rollout-i2", THREE[2], 1)]
    assert [read(tmp_path / "out" / ("image-%d" % k) / "results.json")["episodes"] for k in range(3)] == [3, 2, 2]
    assert sorted(read(tmp_path / "out" / "receipt.json")["jobs"]) == ["rollout-i0", "rollout-i1", "rollout-i2"]
    cleaned = run_tool("cleanup", "out", cluster=cluster)
    assert cleaned.code == 0, cleaned
    assert cleaned.stderr.count("Deleting Job rollout-i") == 3


def test_a_streamed_batch_across_images_sends_each_task_once_under_its_own_index(make_cluster, run_tool, tmp_path):
    cluster = cluster_of(make_cluster)
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path, 6), "--stream", "--output", "out",
                    cluster=cluster)
    assert done.code == 0, done
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    episodes = [line for line in lines if line["type"] == "episode"]
    assert sorted((line["task"], line["reward"]) for line in episodes) == [(n, n) for n in range(6)]
    assert lines[-1]["type"] == "summary" and "disagrees" not in done.stderr


def test_the_jobs_of_a_batch_across_images_never_run_more_than_its_parallelism_together(tool):
    for total, sizes in [(4, [3, 2, 2]), (3, [1, 1, 1]), (7, [10, 3, 1]), (100, [10, 3, 1]), (4, [2, 100])]:
        shares = tool.split_parallelism(total, sizes)
        assert sum(shares) == min(total, sum(sizes)), (total, sizes, shares)
        assert all(1 <= share <= size for share, size in zip(shares, sizes)), (total, sizes, shares)
    assert tool.split_parallelism(7, [10, 3, 1]) == [4, 2, 1]  # in proportion to what is left after one each
    # one image however spelt: one Job
    assert [(image, indexes) for image, indexes, _ in tool.image_parts(
        ["python:3.12", "docker.io/library/python:3.12", "b:1"], 2)] == [("python:3.12", [0, 1]), ("b:1", [2])]


def test_parallelism_below_the_number_of_images_is_refused_before_anything(make_cluster, run_tool, tmp_path):
    cluster = cluster_of(make_cluster)
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path), "--parallelism", "2",
                    "--output", "out", cluster=cluster)
    assert done.code == 2
    assert "names 3 images (example.test/a:1, example.test/b:1, example.test/c:1), a Job each, and each runs at " \
           "least one episode at a time: --parallelism 2 is fewer; give at least 3" in done.stderr
    assert not (tmp_path / "out").exists() and cluster.calls() == []


@pytest.mark.parametrize("backend, words", [
    ("warm-pool", "--backend warm-pool runs one image a batch (a pool per image is not built yet)"),
])
def test_a_backend_that_runs_one_image_refuses_tasks_across_images(make_cluster, run_tool, tmp_path, backend, words):
    cluster = cluster_of(make_cluster)
    done = run_tool("run", "--backend", backend, "--episode", EPISODE, "--tasks", tasks_across(tmp_path),
                    "--output", "out", cluster=cluster)
    assert done.code == 2
    assert words in done.stderr and not (tmp_path / "out").exists()


def test_a_queue_across_images_is_refused_as_not_built_yet(make_cluster, run_tool, tmp_path):
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path), "--queue", "team", "--output",
                    "out", cluster=cluster_of(make_cluster))
    assert done.code == 2
    assert "--queue with several images is not built yet: run one batch per image" in done.stderr


def test_prewarm_across_images_warms_every_image_on_every_node_and_says_how_each_got_it(make_cluster, run_tool,
                                                                                      tmp_path):
    cluster = cluster_of(make_cluster)
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path, 6), "--prewarm", "--output", "out",
                    cluster=cluster)
    assert done.code == 0, done
    prewarm = read(tmp_path / "out" / "prewarm" / "prewarm.json")
    nodes = prewarm["nodes"]
    assert prewarm["images"] == list(THREE)
    assert sorted((pull["node"], pull["image"]) for pull in prewarm["pulls"]) == sorted(
        (node, image) for node in nodes for image in THREE)
    for image in THREE:  # one line per image, naming every node
        [line] = [line for line in done.stderr.splitlines() if line.startswith("prewarm: image %s: " % image)]
        assert all(node in line for node in nodes), line
    # each warm-up ran its image's first task (task 0, 1, 2: rewards 0, 1, 2), pinned to its node
    warmed = {(read(path)["run"]["flags"]["image"], read(path)["reward_sum"]) for path in
              (tmp_path / "out" / "prewarm").glob("*/results.json")}
    assert warmed == {(THREE[0], 0), (THREE[1], 1), (THREE[2], 2)}
    results = read(tmp_path / "out" / "results.json")
    assert results["cache_state"] == "prewarmed" and [t["reward"] for t in results["tasks"]] == list(range(6))
    assert run_tool("cleanup", "out", cluster=cluster).code == 0


def test_an_image_missing_from_its_registry_fails_its_job_while_the_others_are_kept(make_cluster, run_tool, tmp_path):
    cluster = cluster_of(make_cluster, images=THREE[:2])  # c:1 is in no registry
    done = run_tool("run", "--episode", EPISODE, "--tasks", tasks_across(tmp_path, 6), "--timeout", "300",
                    "--output", "out", cluster=cluster)
    assert done.code == 1, done  # named at once, not at the deadline
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: image example.test/c:1 (Job rollout-i2): the image example.test/c:1 does not "
                           "exist in its registry"), last
    # the tasks' own indexes (2 and 5 run c:1), not their Job's (0 and 1)
    assert re.search(r"; tasks? [25](, [25])? needs? it; check the tasks' \"image\" or --image", last), last
    # the other images' Jobs ran to their results, in their folders
    assert [read(tmp_path / "out" / ("image-%d" % k) / "results.json")["reward_sum"] for k in range(2)] == [0 + 3, 1 + 4]
    assert not (tmp_path / "out" / "results.json").exists()
    assert run_tool("cleanup", "out", cluster=cluster).code == 0


def test_a_task_whose_image_is_its_default_spelt_otherwise_is_one_image(cluster, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "reward": 1},
                                                   {"id": 1, "reward": 1, "image": "docker.io/library/python:3.12-alpine"}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", "--dry-run", cluster=cluster)
    assert result.code == 0, result


@pytest.mark.parametrize("image", ["", "python 3", 3, ["python:3.12"]])
def test_a_task_image_that_is_no_reference_is_refused_with_its_line(cluster, run_tool, tmp_path, image):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0}, {"id": 1, "image": image}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 2
    assert 'line 2: "image" must be an image reference' in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_local_backend_refuses_tasks_that_name_an_image(run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "image": "python:3.12-alpine"}])
    result = run_tool("run", "--backend", "local", "--episode", EPISODE, "--tasks", tasks, "--output", "out")
    assert result.code == 2
    assert "--backend local runs no image, and task 1" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_one_image_the_tasks_name_is_the_batchs_and_the_preflight_names_it(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"images": {"example.test/sweb/task-1:v1": {"python": sys.executable}}})
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": n, "reward": 1, "image": "example.test/sweb/task-1:v1"}
                                                   for n in range(2)])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 0, result
    job = read(tmp_path / "out" / "job-submitted.json")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "example.test/sweb/task-1:v1"
    assert read(tmp_path / "out" / "receipt.json")["images"] == ["example.test/sweb/task-1:v1"]
    # the simulated nodes report no status.images: which of them hold it is unknown, and said so
    assert read(tmp_path / "out" / "run.json")["images"] == [
        {"image": "example.test/sweb/task-1:v1", "episodes": 2, "nodes_holding": None,
         "note": "the usable nodes report no images (status.images)"}]
    assert "preflight: image example.test/sweb/task-1:v1 (2 episode(s)): which nodes hold it is unknown" \
        in result.stderr
    results = read(tmp_path / "out" / "results.json")
    assert results["image"] == "example.test/sweb/task-1:v1"
    assert results["run"]["images"][0]["episodes"] == 2


def waiting_pod(name, index, image, message="rpc error: code = NotFound desc = failed to resolve image: x: not found"):
    return {"metadata": {"name": name, "creationTimestamp": "2026-12-06T00:00:00Z",
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)}},
            "status": {"containerStatuses": [{"image": image, "state": {"waiting": {
                "reason": "ErrImagePull", "message": message}}}]}}


def test_an_image_missing_from_its_registry_is_named_with_the_tasks_that_need_it(tool):
    pods = [waiting_pod("p0", 0, "r/task:1"), waiting_pod("p2", 2, "r/task:1"), waiting_pod("p1", 1, "r/other:1")]
    reason = tool.blocking_reason([], pods)
    assert reason.startswith("the image r/task:1 does not exist in its registry: pod p0 cannot pull it")
    assert reason.endswith('; tasks 0, 2 need it; check the tasks\' "image" or --image')
