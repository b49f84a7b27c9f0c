"""The command line and its environment: usage errors, exit codes, kubectl and contexts, output
folders, quiet runs, pipes, terminals, dry runs."""

import json
import os
import subprocess
import sys

import pytest

import rl_batch_demo
from conftest import ROOT, SCRIPT, read


def test_every_kubectl_call_names_the_context(cluster, run_tool):
    assert run_tool("run", "--count", "2", "--output", "out", cluster=cluster).code == 0
    calls = cluster.calls()
    assert calls[0] == ["config", "current-context"]
    assert all(call[:2] == ["--context", "kind-rl"] for call in calls[1:])


def test_context_flag_overrides_the_current_context(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(contexts=("kind-rl", "other"), current_context="other")
    assert run_tool("run", "--count", "1", "--context", "kind-rl", "--output", "out", cluster=cluster).code == 0
    assert read(tmp_path / "out" / "receipt.json")["context"] == "kind-rl"
    assert ["config", "current-context"] not in cluster.calls()


def test_kubectl_env_var_selects_the_kubectl_program(cluster, run_tool):
    # Nothing named kubectl on PATH: only KUBECTL can lead the tool to the fake.
    env = {"KUBECTL": str(cluster.bin / "kubectl"), "PATH": "/nonexistent"}
    result = run_tool("run", "--count", "1", "--output", "out", cluster=cluster, env=env)
    assert result.code == 0, result


@pytest.mark.parametrize("backend", list(rl_batch_demo.BACKENDS))
@pytest.mark.parametrize("args, message", [
    (["--count", "0"], "--count must be between 1 and 20"),
    (["--count", "-3"], "--count must be between 1 and 20"),
    (["--count", "21"], "--count must be between 1 and 20"),
    (["--count", "5", "--parallelism", "6"], "--parallelism must be between 1 and --count (5), got 6"),
    (["--count", "5", "--parallelism", "0"], "--parallelism must be between 1 and --count (5), got 0"),
    (["--count", "ten"], "argument --count: invalid int value: 'ten'"),
    (["--timeout", "0"], "--timeout must be at least 1 second"),
    (["--rounds", "0"], "--rounds must be at least 1"),
])
def test_bad_arguments_exit_2_before_touching_anything(backend, args, message, cluster, run_tool, tmp_path):
    # the shared bounds are checked before any backend or gate reads them, whatever the backend
    result = run_tool("run", "--backend", backend, *args, "--output", "out", cluster=cluster)
    assert result.code == 2
    [error] = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert message in error, result.stderr
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


def test_existing_output_folder_is_never_overwritten(cluster, run_tool, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text("precious")
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert result.stderr == ("Error: output folder out already exists; choose a new --output so that no "
                             "experiment record is overwritten\n")
    assert (tmp_path / "out" / "results.json").read_text() == "precious"
    assert cluster.calls() == []


def test_missing_kubectl_is_one_clear_line(run_tool, tmp_path):
    result = run_tool("run", "--output", "out", env={"KUBECTL": "no-such-kubectl"})
    assert result.code == 1
    assert result.stderr.startswith("Error: kubectl not found (looked for 'no-such-kubectl' on PATH)")
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_no_current_context_is_one_clear_line(make_cluster, run_tool, tmp_path):
    cluster = make_cluster(current_context="")
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert result.stderr == ("Error: no current kubectl context (error: current-context is not set); choose one "
                             "with `kubectl config use-context NAME` or pass --context NAME\n")
    assert not (tmp_path / "out").exists()


def test_a_failing_kubectl_command_shows_its_stderr(make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"forbid": [{"verb": "create", "resource": "configmaps"}]})
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert ('Error from server (Forbidden): error when creating "STDIN": configmaps is forbidden: User '
            '"kind-user" cannot create resource "configmaps" in API group "" in the namespace') in result.stderr
    assert "Clean up with: " in result.stderr and "cleanup --output out" in result.stderr
    assert result.stderr.splitlines()[0].startswith("namespace: agc-rl-")  # the one note before the error
    assert len(result.stderr.splitlines()) == 2
    assert run_tool("cleanup", "--output", "out", cluster=cluster).code == 0


def test_unreachable_api_server_is_reported(cluster, run_tool, tmp_path):
    cluster.stop()
    result = run_tool("run", "--output", "out", cluster=cluster)
    assert result.code == 1
    assert "was refused - did you specify the right host or port?" in result.stderr


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_a_run_piped_into_head_ends_cleanly(make_cluster, tmp_path, backend):
    env = make_cluster().env() if backend == "kubernetes" else dict(os.environ)
    done = subprocess.run('"%s" "%s" run --backend %s --count 2 --output out | head -1; echo "exit ${PIPESTATUS[0]}"'
                          % (sys.executable, SCRIPT, backend), shell=True, executable="/bin/bash",
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines()[-1] == "exit 0", done
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert read(tmp_path / "out" / "results.json")["successful_episodes"] == 2


def local_run_on_a_terminal(tmp_path):
    """A local run of two episodes whose stderr is a terminal: (exit code, stdout, what the terminal showed)."""
    import pty
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--backend", "local", "--count", "2", "--output",
                                "out"], cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    shown = b""
    while True:  # read while it runs: a full terminal buffer would block it
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    stdout = process.stdout.read()
    return process.wait(timeout=120), stdout, shown.decode()


def test_a_terminal_gets_a_human_summary_and_scripts_keep_the_json(tmp_path):
    code, stdout, text = local_run_on_a_terminal(tmp_path)
    assert code == 0
    assert json.loads(stdout)["successful_episodes"] == 2
    assert "Done: 2 episodes, 2 with a reward (sum 2)." in text
    assert "Results: out/results.json" in text and "Clean up" not in text


@pytest.mark.parametrize("what", ["a directory", "not executable"])
def test_a_kubectl_that_cannot_run_is_one_line(run_tool, tmp_path, what):
    program = tmp_path / "kubectl-here"
    if what == "a directory":
        program.mkdir()
    else:
        program.write_text("#!/bin/sh\n")
    result = run_tool("run", "--count", "1", "--output", "out", env={"KUBECTL": str(program)})
    assert result.code == 1, result
    assert result.stderr.strip().splitlines() == [
        "Error: cannot run kubectl %r: it is %s; set KUBECTL to the kubectl program itself" % (str(program), what)]


def test_an_unknown_context_shows_kubectls_meaningful_line(cluster, run_tool):
    result = run_tool("run", "--count", "1", "--context", "nosuch", "--output", "out", cluster=cluster)
    assert result.code == 1, result
    assert "context nosuch does not exist in the kubeconfig (error: context nosuch not found)" in result.stderr


def test_the_meaningful_line_keeps_the_bullets_of_several_configuration_errors(tool):
    # kubectl's MultilineError (pkg/cmd/util/helpers.go): a heading, then one "* " line per error
    stderr = ("Error in configuration: \n* context was not found for specified context: nosuch\n"
              "* cluster has no server defined\n")
    assert tool.meaningful_line(stderr) == ("Error in configuration: context was not found for specified context: "
                                            "nosuch; cluster has no server defined")


def test_the_meaningful_line_skips_client_go_logs(tool):
    stderr = ('E1130 06:46:07.123456   12345 memcache.go:265] "Unhandled Error" err="couldn\'t get current server '
              'API group list"\nThe connection to the server localhost:8080 was refused - did you specify the right '
              'host or port?\nI1130 06:46:07.2 12345 helpers.go:1] trailing log line\n')
    assert tool.meaningful_line(stderr).startswith("The connection to the server localhost:8080 was refused")


def test_dry_run_touches_neither_the_cluster_nor_the_output_folder(cluster, run_tool, tmp_path):
    result = run_tool("run", "--dry-run", "--count", "3", "--output", "out", cluster=cluster)
    assert result.code == 0, result
    listing = json.loads(result.stdout)
    assert listing["kind"] == "List"
    assert [item["kind"] for item in listing["items"]] == ["Namespace", "ConfigMap", "Job"]
    assert listing["items"][-1]["spec"]["completions"] == 3
    assert not (tmp_path / "out").exists()
    assert cluster.calls() == []


def test_dry_run_output_is_accepted_by_kubectl_create(cluster, run_tool):
    result = run_tool("run", "--dry-run", "--network", "none", cluster=cluster)
    assert result.code == 0, result
    namespace = json.loads(result.stdout)["items"][0]["metadata"]["name"]
    created = cluster.kubectl("create", "-f", "-", stdin=result.stdout)
    assert created.stdout.splitlines() == [
        "namespace/%s created" % namespace, "configmap/episode created",
        "networkpolicy.networking.k8s.io/deny-all created", "job.batch/rollout created"]


def test_exit_codes_are_documented_in_help_and_readme(run_tool):
    help_text = run_tool("--help").stdout
    readme = (SCRIPT.parent / "README.md").read_text()
    for code, meaning in ((0, "ok"), (1, "error"), (2, "bad command line"), (3, "timed out"),
                          (4, "batch failed or validation failed"), (5, "custom episodes: results written"),
                          (130, "interrupted")):
        assert "  %-4d %s" % (code, meaning) in help_text, code
        assert "| %d |" % code in readme, code


def test_more_than_20_episodes_need_allow_large(cluster, run_tool):
    refused = run_tool("run", "--count", "25", "--output", "out", cluster=cluster)
    assert refused.code == 2 and "--allow-large lifts it to 10000" in refused.stderr
    planned = run_tool("run", "--count", "1000", "--parallelism", "100", "--allow-large", "--dry-run", cluster=cluster)
    job = json.loads(planned.stdout)["items"][-1]
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (1000, 100)
    assert job["spec"]["activeDeadlineSeconds"] == 240 + 30 * 9 + 98


def test_quiet_runs_print_nothing_on_stderr(cluster, run_tool):
    # the nodes' own runtime: the simulated cluster's `cube` runs its episodes on this machine's
    # kernel, which a run names even with --quiet (test_kernel.py)
    result = run_tool("run", "--count", "2", "--quiet", "--no-runtime-class", "--output", "out", cluster=cluster)
    assert result.code == 0 and result.stderr == ""


# ---------------------------------------------------------------- for scripts and for people

@pytest.mark.parametrize("backend", ["kubernetes", "warm-pool", "local"])
def test_stdout_of_a_run_is_json_and_nothing_else(backend, make_cluster, run_tool, tmp_path):
    cluster = make_cluster({"agentSandbox": {"version": "v0.5.6", "extensions": True}})
    runtime = ["--no-runtime-class"] if backend != "local" else []
    for output, quiet in (("out", []), ("out-quiet", ["--quiet"])):
        result = run_tool("run", "--backend", backend, "--count", "2", *runtime, *quiet, "--output", output,
                          cluster=cluster)
        assert result.code == 0, result
        assert json.loads(result.stdout)["episodes"] == 2  # `| python3 -m json.tool` works
    if backend != "local":
        cleanup = run_tool("cleanup", "out", "out-quiet", cluster=cluster)
        assert cleanup.code == 0 and cleanup.stdout == "", cleanup


def test_cleanup_takes_folders_as_report_does(cluster, run_tool, tmp_path):
    assert run_tool("run", "--count", "1", "--output", "kind-1", cluster=cluster).code == 0
    result = run_tool("cleanup", "kind-1", cluster=cluster)
    assert result.code == 0, result
    assert "Deleted the run's namespace: agc-rl-" in result.stderr


def test_a_missing_cleanup_folder_is_named_as_missing(run_tool):
    result = run_tool("cleanup", "nowhere")
    assert result.code == 1
    assert result.stderr.strip() == ("Error: no such folder: nowhere (give the output folder of a run, or --receipt "
                                     "FILE)")


def test_a_mistyped_flag_gets_the_subcommands_usage_and_a_pointer_to_its_help(run_tool):
    result = run_tool("run", "--no-runtime-clas", "--count", "2", "--dry-run")
    assert result.code == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("usage: rl-batch-demo.py run ")
    assert lines[-2] == "rl-batch-demo.py run: error: unrecognized arguments: --no-runtime-clas"
    assert lines[-1] == "see 'rl-batch-demo.py run --help'"


def test_long_flags_are_never_matched_by_prefix(run_tool):
    result = run_tool("run", "--cou", "2", "--dry-run")
    assert result.code == 2 and "unrecognized arguments: --cou 2" in result.stderr


def test_a_kubectl_path_that_does_not_exist_is_named_as_such(run_tool, tmp_path):
    result = run_tool("run", "--count", "1", "--output", "out", env={"KUBECTL": "/nonexistent"})
    assert result.code == 1
    assert result.stderr.strip() == ("Error: KUBECTL is set to '/nonexistent', which does not exist; set it to the "
                                     "kubectl program, or unset it to use kubectl from PATH")


def test_run_help_is_grouped_with_an_example_per_backend(run_tool):
    help_text = run_tool("run", "--help").stdout
    for group in ("output and safety (--output is required unless --dry-run):", "the batch:", "the cluster:",
                  "your own episodes:", "warm-pool backend:", "queue (Kueue, Job backend):", "examples:"):
        assert group in help_text, group
    for backend in ("--backend warm-pool", "--backend local", "--queue team"):
        assert backend in help_text.split("examples:")[1]
    assert "one Kubernetes Job)" not in run_tool("--help").stdout


def test_a_local_runs_terminal_summary_names_its_own_startup(tmp_path):
    code, _, text = local_run_on_a_terminal(tmp_path)
    assert code == 0
    assert "Episode process launched -> ready: P50 " in text and "Pod created" not in text


def test_the_readme_names_the_command_one_way():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("python3 rl-batch-demo.py") == 1  # the one sentence on running it from a clone


def test_a_line_for_people_never_shares_a_line_with_the_progress_text(tool):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    terminal = Terminal()
    console = tool.Console(stderr=terminal)
    console.progress("warm pool: 1 of 2 ready, 3 s")
    console.tell("Interrupted: saving what is known in out (interrupt again to stop at once)...")
    assert terminal.getvalue().splitlines()[-1] == (
        "Interrupted: saving what is known in out (interrupt again to stop at once)...")
