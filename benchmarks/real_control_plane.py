#!/usr/bin/env python3
"""Benchmark: the tool against the real control plane (tests/controlplane/): Kubernetes v1.36.3's
API server, controller manager and scheduler at their default rates, etcd, kwok's nodes, and
agent-sandbox v0.5.6's controller, with synthetic episodes (the episode runtime starts no
process: an episode pod's log gets made-up ready/reward events after --episode-seconds, a
sandbox's exec prints them after as long; runtime.py) so that 1,000 episodes fit 2 cores.
The tool drives it through this machine's kubectl (v1.32.4), as a user's would.

Figures, per case:
  job N        `run --count N`: complete->exit, the Job's Complete condition first seen by a
               poll of the API every 20 ms (client clock, about 20 ms precision) -> the
               command's exit; kubectl processes the command started (a counting wrapper named
               by KUBECTL: every process, however short); peak resident MB of the command alone
               and with its kubectl children (/proc every 50 ms); logs archived;
               batch_to_all_rewards_seconds and client_job_complete_seconds from results.json;
               after Complete, when each file the run writes last was first and last written
               (polled every 20 ms): where complete->exit goes; with --images K, the N
               episodes are custom ones (--episode, --tasks) whose tasks name K synthetic images
               in turn (a Job per image when K > 1; K = 1 is the same shape in one Job), the
               comparison of the tool's own cost of many Jobs
  warm N       `run --backend warm-pool --count N` (pool of N filled first, not measured):
               batch_to_all_rewards_seconds, client_job_complete_seconds, kubectl processes,
               peak MB; then `cleanup` of its N claims, its pool and namespace: seconds
  kept M       `pool up --size M`, then 3 steps `run --backend warm-pool --pool POOL --count M`:
               each step's wall time, its slowest episode (exec started -> finished, client
               clock) and the overhead, step minus slowest episode, split into the tool's own
               share (its start -> the first claim's create call; the last episode's end -> its
               exit) and the controller's (first create call -> the last claim Ready, as the
               tool's watch delivered it); `pool down` at the end
  recycled M   `pool up --size M --recycle`, then 3 steps `run --pool POOL --count M` in the
               sandboxes it keeps: each step's wall time, slowest episode, overhead, the tool's
               share (start -> first exec sent, the execs' launch spread, each reset check's round
               trip and its in-sandbox seconds, last check -> exit) and the controller's (claims
               created or deleted in the step: none without a quarantine); `pool up` and
               `pool down` seconds

Usage: python3 benchmarks/real_control_plane.py [--job 200 1000] [--warm 200 1000] [--kept 64 512]
                                                [--recycled 64 512]
                                                [--episode-seconds 1.0] [--large-cluster-rates]
                                                [--images K]
Prints one line per case and, at the end, a JSON document of every figure."""

import argparse
import collections
import json
import signal
from pathlib import Path
import subprocess
import sys
import tempfile
import threading
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from collection import tree_rss_mb  # noqa: E402
from controlplane import build  # noqa: E402
from controlplane.cluster import ControlPlane, machine_kubectl  # noqa: E402
from controlplane.runtime import Api  # noqa: E402

# The batches' deadline: generous, so that a slow cluster shows as a slow figure, not a failure
# (the default for 1,000 episodes at once is 338 s, which the real plane on 2 cores missed)
TIMEOUT = ("--timeout", "1800")


def kubectl_words(call):
    """`get pods`, `proxy`, ...: what a kubectl process of the counter's line (pid, argv) was for."""
    words, valued = call.split()[1:], ("--context", "-n", "-l", "-o", "-c", "--field-selector", "--sort-by")
    plain = [word for index, word in enumerate(words)
             if not word.startswith("-") and (index == 0 or words[index - 1] not in valued)]
    if plain[:1] in (["get"], ["create"], ["delete"], ["config"]):
        return " ".join(plain[:2])
    return plain[0] if plain else ""


class CaseFailed(Exception):
    """A command of a case failed: the case is reported with its error line, the others still run."""


class Measured:
    """One command of the tool run against the plane, sampled while it runs."""

    def __init__(self, plane, workdir, *args):
        self.plane, self.workdir = plane, Path(workdir)
        counter = self.workdir / ("kubectl-calls-%d" % time.monotonic_ns())
        wrapper = self.workdir / ("kubectl-%d" % time.monotonic_ns())
        # each process's pid and its first words (verb and kind), for what the processes were
        wrapper.write_text('#!/bin/sh\necho "$$ $*" | cut -c1-200 >> %s\nexec %s "$@"\n' % (counter, machine_kubectl()))
        wrapper.chmod(0o755)
        env = plane.env(KUBECTL=str(wrapper))
        self.peak = [0.0, 0.0]
        started = time.monotonic()
        self.process = subprocess.Popen([sys.executable, str(ROOT / "rl-batch-demo.py"), *args], cwd=str(workdir),
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampler = threading.Thread(target=self.sample, daemon=True)
        sampler.start()
        self.stdout, self.stderr = self.process.communicate(timeout=7200)
        self.exited = time.time()
        self.seconds = time.monotonic() - started
        sampler.join()
        calls = counter.read_text().splitlines() if counter.exists() else []
        self.kubectl_processes = len(calls)
        self.kubectl_verbs = dict(collections.Counter(kubectl_words(call) for call in calls).most_common(16))
        if self.process.returncode != 0:
            lines = [line for line in self.stderr.splitlines() if line.startswith("Error: ")]
            raise CaseFailed("`rl-batch-demo %s` exited %d: %s" % (" ".join(args[:2]), self.process.returncode,
                                                                  lines[-1] if lines else self.stderr[-500:]))

    def sample(self):
        while self.process.poll() is None:
            tree, alone = tree_rss_mb(self.process.pid)
            self.peak = [max(self.peak[0], tree), max(self.peak[1], alone)]
            time.sleep(0.05)


# the files a Job run writes after Complete, in the order it writes them: when each was first
# and last written tells where the time from Complete to exit goes
END_FILES = ("observed.json", "pods.json", "events.json", "results.json", "logs.json")


def watch_end_files(output, seen):
    """Each of END_FILES' first and last modification time (client clock, polled every 20 ms)."""
    times = seen.setdefault("end_files", {})
    while not seen.get("stop"):
        for name in END_FILES:
            try:
                mtime = (Path(output) / name).stat().st_mtime
            except OSError:
                continue
            first, last = times.get(name, (mtime, mtime))
            times[name] = (min(first, mtime), max(last, mtime))
        time.sleep(0.02)


def watch_complete(api, output, seen, jobs=1):
    """The client time the run writing `output` is first seen with its `jobs` Jobs all Complete
    (`rollout`, or a batch across images' `rollout-iK`)."""
    receipt = Path(output) / "receipt.json"
    while not seen.get("stop"):
        try:
            namespace = json.loads(receipt.read_text())["namespace"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
            continue
        status, listed = api.call("GET", "/apis/batch/v1/namespaces/%s/jobs" % namespace)
        done = [job for job in (listed.get("items") or [] if status == 200 else [])
                if any(c["type"] == "Complete" and c["status"] == "True"
                       for c in (job.get("status") or {}).get("conditions") or [])]
        if len(done) >= jobs:
            seen["complete_at"] = time.time()
            return
        time.sleep(0.02)


def timed_cleanup(plane, workdir, output):
    """`cleanup` of a case's run: its seconds, or its error line (the run's figures are kept)."""
    started = time.monotonic()
    try:
        Measured(plane, workdir, "cleanup", str(output))
    except CaseFailed as failure:
        return {"cleanup_error": str(failure), "cleanup_seconds": round(time.monotonic() - started, 2)}
    return {"cleanup_seconds": round(time.monotonic() - started, 2)}


# --large-cluster-rates: the controller manager's and scheduler's client rates of Kubernetes' own
# 5,000-node scalability validation (kubernetes/sig-release releases/release-1.9/
# scalability_validation_report.md: SCHEDULER_TEST_ARGS, CONTROLLER_MANAGER_TEST_ARGS); by default
# both run at their defaults (the controller manager 20 requests a second, burst 30)
LARGE_CLUSTER_RATES = {"kube-controller-manager": [("kube-api-qps", "100"), ("kube-api-burst", "100")],
                       "kube-scheduler": [("kube-api-qps", "100")]}
RATES = {}  # the rates of this run's planes: main() sets them from the flag


def plane_for(size, workdir, seconds, parts=()):
    nodes = max(2, -(-size // 100) + 1)  # kwok's default node holds 110 pods
    plane = ControlPlane(Path(workdir) / "plane", build.ensure_built(), nodes=nodes, parts=parts,
                         synthetic_seconds=seconds, component_flags=RATES)
    return plane.start()


# A custom episode for --images: the synthetic runtime runs no process, it makes up its events
BENCH_EPISODE = "raise SystemExit('synthetic episodes only: the benchmark runtime makes up their events')\n"


def image_tasks(workdir, size, images):
    """--episode and --tasks of `size` custom episodes whose tasks name `images` images in turn
    (names only: kwok's nodes pull nothing; the episode runtime runs an image whose name starts with
    "python")."""
    episode, tasks = Path(workdir) / "bench_episode.py", Path(workdir) / "tasks.jsonl"
    episode.write_text(BENCH_EPISODE)
    tasks.write_text("".join(json.dumps({"id": n, "image": "bench.test/python-task-%d:1" % (n % images)}) + "\n"
                             for n in range(size)))
    return ("--episode", str(episode), "--tasks", str(tasks))


def job_case(size, workdir, seconds, images=None):
    plane = plane_for(size, workdir, seconds)
    try:
        api, seen, output = Api(plane.kubectl_program, str(plane.kubeconfig)), {}, Path(workdir) / "job-out"
        watcher = threading.Thread(target=watch_complete, args=(api, output, seen, images or 1), daemon=True)
        watcher.start()
        files = threading.Thread(target=watch_end_files, args=(output, seen), daemon=True)
        files.start()
        episodes = image_tasks(workdir, size, images) if images else ("--count", str(size))
        run = Measured(plane, workdir, "run", "--allow-large", "--quiet", *episodes, "--output", str(output), *TIMEOUT)
        seen["stop"] = True
        files.join()
        results = json.loads((output / "results.json").read_text())
        complete = seen.get("complete_at")
        # seconds after Complete each file was first and last written (Complete -> exit's parts)
        end_files = {name: [round(first - complete, 2), round(last - complete, 2)]
                     for name, (first, last) in seen.get("end_files", {}).items()} if complete else {}
        assert results["successful_episodes"] == size, results["successful_episodes"]
        logs = len(list(output.glob("rollout-*.log"))) + len(list(output.glob("image-*/rollout-*.log")))
        figures = {"case": "job", "size": size, "images": images, "complete_to_exit_seconds": run.exited - seen["complete_at"]
                   if "complete_at" in seen else None, "kubectl_processes": run.kubectl_processes, "kubectl_verbs": run.kubectl_verbs,
                   "peak_mb_with_kubectl": round(run.peak[0], 1), "peak_mb_tool": round(run.peak[1], 1),
                   "logs_archived": logs, "run_seconds": round(run.seconds, 2),
                   "after_complete_first_last_written": end_files,
                   "batch_to_all_rewards_seconds": results["batch_to_all_rewards_seconds"],
                   "client_job_complete_seconds": results["client_job_complete_seconds"]}
        figures.update(timed_cleanup(plane, workdir, output))
        return figures
    finally:
        plane.stop()


def warm_case(size, workdir, seconds):
    plane = plane_for(size, workdir, seconds, parts=("agent-sandbox",))
    try:
        output = Path(workdir) / "warm-out"
        run = Measured(plane, workdir, "run", "--backend", "warm-pool", "--allow-large", "--quiet", "--count",
                       str(size), "--output", str(output), *TIMEOUT)
        results = json.loads((output / "results.json").read_text())
        assert results["successful_episodes"] == size, results["successful_episodes"]
        return {"case": "warm", "size": size, "batch_to_all_rewards_seconds": results["batch_to_all_rewards_seconds"],
                "client_job_complete_seconds": results["client_job_complete_seconds"],
                "launch_types": results["launch_types"], "pool_fill_seconds": results["pool"]["fill_seconds"],
                "kubectl_processes": run.kubectl_processes, "kubectl_verbs": run.kubectl_verbs, "peak_mb_tool": round(run.peak[1], 1),
                "run_seconds": round(run.seconds, 2), **timed_cleanup(plane, workdir, output)}
    finally:
        plane.stop()


def timed_pool_down(plane, workdir, pool):
    """`pool down` of a case's pool: its seconds, and its error line if it failed."""
    started, figures = time.monotonic(), {}
    try:
        Measured(plane, workdir, "pool", "down", str(pool))
    except CaseFailed as failure:
        figures["pool_down_error"] = str(failure)
    figures["pool_down_seconds"] = round(time.monotonic() - started, 2)
    return figures


def kept_case(size, workdir, seconds, steps=3):
    # room for the pool, a step's claimed sandboxes and the pool's refill at once (2 x size: the
    # second step of 512 once waited 8 minutes for room on nodes sized for the pool alone)
    plane = plane_for(2 * size, workdir, seconds, parts=("agent-sandbox",))
    try:
        pool = Path(workdir) / "pool"
        Measured(plane, workdir, "pool", "up", "--size", str(size), "--allow-large", "--quiet", "--output", str(pool),
                 *TIMEOUT)
        rows = []
        for number in range(1, steps + 1):
            output = Path(workdir) / ("step-%d" % number)
            step = Measured(plane, workdir, "run", "--backend", "warm-pool", "--pool", str(pool), "--allow-large",
                            "--quiet", "--count", str(size), "--output", str(output), *TIMEOUT)
            results = json.loads((output / "results.json").read_text())
            observed = json.loads((output / "observed.json").read_text()).values()
            slowest = max(row["times"]["exec_finished"] - row["times"]["exec_started"] for row in results["pods"])
            began = step.exited - step.seconds
            rows.append({"step_seconds": round(step.seconds, 2), "slowest_episode_seconds": round(slowest, 2),
                         "overhead_seconds": round(step.seconds - slowest, 2),
                         # the tool's own share: its start to the first claim's create call, and the
                         # last episode's end to its exit; between them, the claims bound by the
                         # controller (first create call -> last claim Ready as the watch saw it)
                         "start_to_first_create_seconds": round(min(o["create_called"] for o in observed) - began, 2),
                         "claims_ready_spread_seconds": round(max(o["ready"] for o in observed)
                                                              - min(o["create_called"] for o in observed), 2),
                         "last_episode_to_exit_seconds": round(step.exited - max(o["exec_finished"] for o in observed), 2),
                         "kubectl_processes": step.kubectl_processes,
                         "warm": results["kept_pool_step"]["warm"], "cold": results["kept_pool_step"]["cold"]})
        figures = {"case": "kept", "size": size, "steps": rows}
        return dict(figures, **timed_pool_down(plane, workdir, pool))
    finally:
        plane.stop()


def recycled_case(size, workdir, seconds, steps=3):
    """`pool up --size M --recycle`, then `steps` steps of M episodes in the sandboxes it keeps."""
    plane = plane_for(size, workdir, seconds, parts=("agent-sandbox",))
    try:
        pool = Path(workdir) / "pool"
        up = Measured(plane, workdir, "pool", "up", "--size", str(size), "--recycle", "--allow-large", "--quiet",
                      "--output", str(pool), *TIMEOUT)
        rows = []
        for number in range(1, steps + 1):
            output = Path(workdir) / ("step-%d" % number)
            step = Measured(plane, workdir, "run", "--backend", "warm-pool", "--pool", str(pool), "--allow-large",
                            "--quiet", "--count", str(size), "--output", str(output), *TIMEOUT)
            results = json.loads((output / "results.json").read_text())
            assert results["successful_episodes"] == size, results["successful_episodes"]
            observed = list(json.loads((output / "observed.json").read_text()).values())
            began = step.exited - step.seconds
            slowest = max(o["exec_finished"] - o["exec_started"] for o in observed)
            checks = sorted(o["reset_checked"] - o["exec_finished"] for o in observed)
            recycled = results["recycled_pool"]
            rows.append({"step_seconds": round(step.seconds, 2), "slowest_episode_seconds": round(slowest, 2),
                         "overhead_seconds": round(step.seconds - slowest, 2),
                         # the tool's own share: its start -> the first exec sent (the pool's lock, its
                         # slots checked, the claims' expiry extended), the execs' launch spread, each
                         # episode's reset check (its exec round trip), the last check -> exit
                         "start_to_first_exec_seconds": round(min(o["exec_started"] for o in observed) - began, 2),
                         "exec_launch_spread_seconds": round(max(o["exec_started"] for o in observed)
                                                             - min(o["exec_started"] for o in observed), 2),
                         "reset_check_round_trip_p50_max_seconds": [round(checks[len(checks) // 2], 3),
                                                                    round(checks[-1], 3)],
                         "reset_check_in_sandbox": recycled["reset_check_in_sandbox_seconds"],
                         "last_check_to_exit_seconds": round(step.exited - max(o["reset_checked"] for o in observed), 2),
                         # the controller's share: claims it had to bind for this step (none without
                         # a quarantine or a lost slot)
                         "claims_created": len(recycled["claims_created"]),
                         "claims_deleted": len(recycled["claims_deleted"]),
                         "quarantined": len(recycled["quarantined"]),
                         "sandbox_use": recycled["sandbox_use"], "kubectl_processes": step.kubectl_processes})
        figures = {"case": "recycled", "size": size, "pool_up_seconds": round(up.seconds, 2), "steps": rows}
        return dict(figures, **timed_pool_down(plane, workdir, pool))
    finally:
        plane.stop()


def stop_once(*_):
    """SIGTERM: end the benchmark, once. `timeout` and `pkill -f` can deliver it twice (to the process
    group, and to the process): a second SystemExit inside a case's `finally` left its plane running."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(143)


def main():
    # the whole docstring: its first line alone stopped mid-sentence
    parser = argparse.ArgumentParser(description=__doc__.split("\n\nUsage:")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=int, nargs="*", default=[200, 1000], metavar="N",
                        help="Job batches of these sizes (none: --job alone)")
    parser.add_argument("--warm", type=int, nargs="*", default=[200, 1000], metavar="N",
                        help="warm-pool batches of these sizes, each from a pool of its size")
    parser.add_argument("--kept", type=int, nargs="*", default=[64, 512], metavar="M",
                        help="kept pools of these sizes, three steps each")
    parser.add_argument("--recycled", type=int, nargs="*", default=[64, 512], metavar="M",
                        help="recycled kept pools (pool up --recycle) of these sizes, three steps each")
    parser.add_argument("--episode-seconds", type=float, default=1.0,
                        help="how long each synthetic episode runs (default 1.0)")
    parser.add_argument("--images", type=int, metavar="K",
                        help="the Job cases as custom episodes whose tasks name K images in turn (a Job per image "
                             "when K > 1)")
    parser.add_argument("--large-cluster-rates", action="store_true",
                        help="the controller manager and scheduler at 100 requests a second, as Kubernetes' "
                             "5,000-node validation ran them (default: their default rates)")
    args = parser.parse_args()
    RATES.update(LARGE_CLUSTER_RATES if args.large_cluster_rates else {})
    # `timeout` or a CI runner ends a long benchmark with SIGTERM: each case's plane is stopped by
    # its `finally` (its parts run in sessions of their own, so nothing else stops them)
    signal.signal(signal.SIGTERM, stop_once)
    every = []
    for case, sizes in ((job_case, args.job), (warm_case, args.warm), (kept_case, args.kept),
                        (recycled_case, args.recycled)):
        for size in sizes:
            with tempfile.TemporaryDirectory(prefix="rl-bench-real-") as workdir:
                try:
                    figures = case(size, workdir, args.episode_seconds, *(
                        (args.images,) if case is job_case and args.images else ()))
                except CaseFailed as failure:
                    figures = {"case": case.__name__.split("_")[0], "size": size, "error": str(failure)}
            every.append(figures)
            print(json.dumps(figures), flush=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(json.dumps({"commit": commit, "cluster": "real control plane: Kubernetes v1.36.3, etcd v3.6.13, kwok "
                      "v0.8.0, agent-sandbox v0.5.6; kubectl v1.32.4", "component_flags": RATES, "figures": every}, indent=1))


if __name__ == "__main__":
    main()
