"""Tasks that bring their own image (a --tasks line's "image"): references compared as the kubelet
names them, the nodes that hold each image at the preflight, and the batches refused until a
backend runs them."""

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


def test_tasks_across_two_images_are_refused_in_one_line_before_anything(cluster, run_tool, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.jsonl", [{"id": 0, "image": "python:3.12-alpine"},
                                                   {"id": 1, "image": "python:3.13-alpine"}])
    result = run_tool("run", "--episode", EPISODE, "--tasks", tasks, "--output", "out", cluster=cluster)
    assert result.code == 2
    assert "names 2 images (python:3.12-alpine, python:3.13-alpine)" in result.stderr
    assert not (tmp_path / "out").exists() and cluster.calls() == []


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
