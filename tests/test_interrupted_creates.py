"""A signal that lands while a create's answer is in flight (the API server committed the object,
the tool never heard): the receipt names the create as sent, and cleanup adopts the object when it
carries the run's id label, records its UID and deletes it; without that proof it stays refused.

The simulated cluster holds the create's answer after the commit (fault kind "hold") until the
test releases it, so the signal lands inside the window with no clock between them."""

import json
import signal
import subprocess
import sys

import pytest

from conftest import SCRIPT, read, wait_for

AGENT_SANDBOX = {"agentSandbox": {"version": "v0.5.6", "extensions": True}}

# (resource whose create is held, its kind, the run's extra options, the cluster's config)
HELD_CREATES = {
    "namespace": ("namespaces", "Namespace", [], {}),
    "job": ("jobs", "Job", [], {}),
    "template": ("sandboxtemplates", "SandboxTemplate", ["--backend", "warm-pool"], AGENT_SANDBOX),
    "pool": ("sandboxwarmpools", "SandboxWarmPool", ["--backend", "warm-pool"], AGENT_SANDBOX),
}


def interrupt_while_a_create_is_held(make_cluster, tmp_path, which):
    """Run a batch whose `which` create commits but is never answered, press Ctrl-C once the object
    exists, release the answer; (cluster, the run's exit code, the live object)."""
    resource, _, options, config = HELD_CREATES[which]
    cluster = make_cluster(dict(config, transientFailures=[
        {"verb": "create", "resource": resource, "times": 1, "kind": "hold"}]))
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--count", "2", *options, "--output", "out"],
                               cwd=str(tmp_path), env=cluster.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)

    def committed():
        items = cluster.get_json(resource, "-A")["items"] if resource != "namespaces" else \
            cluster.get_json("namespaces")["items"]
        return [item for item in items if item["metadata"]["name"].startswith("agc-rl-")
                or item["metadata"].get("namespace", "").startswith("agc-rl-")]
    live = wait_for("the held create to be committed", committed)[0]
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    (cluster.state / "release-held").write_text("")
    return cluster, process.returncode, stderr, live


@pytest.mark.parametrize("which", sorted(HELD_CREATES))
def test_the_receipt_names_a_create_before_it_is_sent(make_cluster, tmp_path, which):
    cluster, code, stderr, live = interrupt_while_a_create_is_held(make_cluster, tmp_path, which)
    assert code == 130, stderr
    receipt = read(tmp_path / "out" / "receipt.json")
    assert "%s/%s" % (HELD_CREATES[which][1], live["metadata"]["name"]) in receipt["sent"]


@pytest.mark.parametrize("which", sorted(HELD_CREATES))
def test_cleanup_adopts_an_unanswered_create_that_carries_the_run_id(make_cluster, run_tool, tmp_path, which):
    cluster, code, _, live = interrupt_while_a_create_is_held(make_cluster, tmp_path, which)
    assert code == 130
    namespace = read(tmp_path / "out" / "receipt.json")["namespace"]
    result = run_tool("cleanup", "out", cluster=cluster)
    assert result.code == 0, result
    kind, name = HELD_CREATES[which][1], live["metadata"]["name"]
    assert "%s %s: its create was sent and never answered; it carries this run's label" % (kind, name) in result.stderr
    assert live["metadata"]["uid"] in json.dumps(read(tmp_path / "out" / "receipt.json"))
    assert cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name").stdout == ""


def test_cleanup_refuses_an_unanswered_job_whose_run_label_differs(make_cluster, run_tool, tmp_path):
    cluster, _, _, live = interrupt_while_a_create_is_held(make_cluster, tmp_path, "job")
    namespace = live["metadata"]["namespace"]
    cluster.kubectl("-n", namespace, "label", "job", "rollout", "agc-demo-run=someone-else", "--overwrite")
    result = run_tool("cleanup", "out", cluster=cluster)
    assert result.code == 1, result
    run_id = read(tmp_path / "out" / "receipt.json")["run_id"]
    # Not the run's by its label: the foreign-object check names it before any adoption is considered.
    assert ("Error: namespace %s holds 1 object(s) this run did not create: Job rollout" % namespace) in result.stderr
    now = cluster.get_json("-n", namespace, "job", "rollout")["metadata"]
    assert (now["uid"], now["labels"]["agc-demo-run"]) == (live["metadata"]["uid"], "someone-else")  # untouched
    assert run_id != "someone-else"


def test_cleanup_refuses_a_job_the_receipt_never_sent(make_cluster, run_tool, tmp_path):
    cluster, _, _, live = interrupt_while_a_create_is_held(make_cluster, tmp_path, "job")
    receipt = read(tmp_path / "out" / "receipt.json")
    receipt["sent"].remove("Job/rollout")
    (tmp_path / "out" / "receipt.json").write_text(json.dumps(receipt))
    result = run_tool("cleanup", "out", cluster=cluster)
    assert result.code == 1, result
    assert ("Job rollout exists in %s but receipt.json records no uid for it and does not record its create as "
            "sent by this run" % live["metadata"]["namespace"]) in result.stderr
