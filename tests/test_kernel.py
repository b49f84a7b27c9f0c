"""Which kernel each episode ran on (the sandbox probe, isolation_summary) and the kubelet's own
words for a failed container (kubelet_reason): pure functions, in-process."""

import json
import os
import subprocess
import sys


def rows(*releases, node="6.18.44"):
    return [{"pod": "p%d" % i, "kernel": {"release": r, "node_kernel": node,
                                          "shared_node_kernel": None if r is None else r == node}}
            for i, r in enumerate(releases)]


def test_gvisors_own_kernel_on_every_episode_is_a_separate_kernel(tool):
    summary = tool.isolation_summary(rows("4.19.0-gvisor", "4.19.0-gvisor"), "gvisor")
    assert summary["verdict"] == "separate-kernel"
    assert "finding" not in summary


def test_a_sandbox_class_sharing_the_nodes_kernel_is_named_in_one_line(tool):
    summary = tool.isolation_summary(rows("6.18.44", "6.18.44"), "cube")
    assert summary["verdict"] == "node-kernel"
    assert summary["finding"] == ("RuntimeClass cube: every episode ran on the node's own kernel 6.18.44: "
                                  "this is not a sandbox on this cluster")


def test_runc_sharing_the_nodes_kernel_is_no_finding(tool):
    assert "finding" not in tool.isolation_summary(rows("6.18.44"), "runc")


def test_some_episodes_on_the_nodes_kernel_are_mixed_and_counted(tool):
    summary = tool.isolation_summary(rows("6.18.44", "4.19.0-gvisor", None), "gvisor")
    assert (summary["verdict"], summary["episodes_on_node_kernel"], summary["episodes_unknown"]) == ("mixed", 1, 1)
    assert summary["finding"].startswith("RuntimeClass gvisor: 1 of 3 episodes ran on the node's own kernel")


def test_no_probe_event_is_unknown(tool):
    assert tool.isolation_summary(rows(None), "gvisor")["verdict"] == "unknown"


def test_the_probe_reports_the_kernel_and_runs_the_episode_in_the_same_interpreter(tool, tmp_path):
    (tmp_path / "sandbox.py").write_text(tool.SANDBOX_PROBE_PROGRAM)
    (tmp_path / "episode.py").write_text("import sys\nprint('episode', __name__, sys.argv[1:])\nraise SystemExit(3)\n")
    message = tmp_path / "termination-log"
    message.write_text('{"event": "ready"}\n')  # as if the episode wrote its events there
    done = subprocess.run([sys.executable, "-B", str(tmp_path / "sandbox.py"), str(tmp_path / "episode.py"), "x"],
                          capture_output=True, text=True,
                          env=dict(os.environ, EPISODE_ID='e-"1', RL_TERMINATION_LOG=str(message)))
    assert done.returncode == 3
    first, second = done.stdout.splitlines()
    report = json.loads(first)
    assert (report["event"], report["episode_id"], report["kernel_release"]) == ("sandbox", 'e-"1', os.uname().release)
    assert second == "episode __main__ ['x']"
    assert tool.sandbox_report(message.read_text()) == report  # appended beside the episode's own events


def test_the_probe_adds_no_termination_message_of_its_own(tool, tmp_path):
    (tmp_path / "sandbox.py").write_text(tool.SANDBOX_PROBE_PROGRAM)
    (tmp_path / "episode.py").write_text("pass\n")
    message = tmp_path / "termination-log"
    message.write_text("")
    subprocess.run([sys.executable, "-B", str(tmp_path / "sandbox.py"), str(tmp_path / "episode.py")], check=True,
                   capture_output=True, env=dict(os.environ, RL_TERMINATION_LOG=str(message)))
    assert message.read_text() == ""


def test_the_kubelets_oomkilled_and_start_error_are_named_a_plain_error_is_not(tool):
    assert tool.kubelet_reason({"reason": "OOMKilled", "exitCode": 137}).startswith("OOMKilled: killed at its memory limit")
    assert tool.kubelet_reason({"reason": "StartError", "message": 'exec: "python": executable file not found'}) == \
        'StartError: exec: "python": executable file not found'
    assert tool.kubelet_reason({"reason": "Error", "exitCode": 1}) is None


def test_an_image_the_registry_does_not_have_blocks_the_batch_a_registry_down_does_not(tool):
    def pod(message):
        return {"metadata": {"name": "p", "creationTimestamp": "2026-12-06T00:00:00Z"}, "status": {"containerStatuses": [
            {"image": "r/python:x", "state": {"waiting": {"reason": "ErrImagePull", "message": message}}}]}}
    missing = pod('rpc error: code = NotFound desc = failed to resolve image: r/python:x: not found')
    assert "the image r/python:x does not exist in its registry" in tool.blocking_reason([], [missing])
    down = pod("dial tcp 127.0.0.1:5000: connect: connection refused")
    assert tool.blocking_reason([], [down]) is None
