#!/usr/bin/env python3
"""Benchmark: after the batch completes, how long until results.json, and until the command
exits? rl-batch-demo against the tutorial's approach, on the same simulated cluster.

Both run against the simulated cluster (tests/fakecluster) in its SYNTHETIC-EPISODE mode:
the simulated kubelet runs no process, it completes each pod after --episode-seconds with
made-up ready/reward events (labelled "synthetic" in every event) in its log and its
termination message. Every API request is answered --delay seconds late (default 0.1, the
simulated API server's apiLatencySeconds), and every kubectl is the real one on PATH (as the
suite runs it; --kubectl fake for the fake, whose invocations are delayed instead). The real
kubectl limits each process to 5 requests a second after a burst of 10. For each approach and
batch size:

  complete->results  the Job controller setting Complete -> results.json first on disk
                     (seconds; watched for every 10 ms)
  complete->exit     the Job controller setting Complete -> the command's exit (seconds):
                     what the user waits for
  kubectl procs      kubectl processes started during the whole run (watches count once
                     per start)
  peak MB            peak resident memory of the command plus its kubectl children, summed
                     (sampled every 50 ms from /proc; the fake kubectl is a Python program,
                     about 20 MB, the real one a Go program of 40-50 MB)
  tool's peak MB     the same, of the command's own process alone (the Python interpreter)
  run total          the command's wall time, start to exit

"tutorial" is the tutorial's approach (benchmarks/tutorial_approach.py): poll the Job every
second, one `get pods`, then one `kubectl logs` process per episode, four at a time, then
validate from the logs and write results.json. Its 20-episode bound is lifted here.

Usage: python3 benchmarks/collection.py [--sizes 20 200 1000 10000] [--delay 0.1]
                                         [--approaches rl-batch-demo tutorial] [--kubectl real|fake]
"""

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import tempfile
import threading
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402

COMMANDS = {
    "rl-batch-demo": [str(ROOT / "rl-batch-demo.py"), "run", "--allow-large", "--quiet"],
    "tutorial": [str(ROOT / "benchmarks" / "tutorial_approach.py"), "run"],
}


def tree_rss_mb(root_pid):
    """Resident memory of a process and all its descendants, and of the process alone, in MB
    (from /proc)."""
    children, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total / 2 ** 20, rss.get(root_pid, 0) / 2 ** 20


def measure(approach, size, delay, episode_seconds, workdir, kubectl="real"):
    nodes = [{"name": "bench-%03d" % i, "cpu": "64", "memory": "256Gi", "pods": 110}
             for i in range(max(2, -(-size // 100)))]
    config = {"nodes": nodes, "syntheticEpisodes": {"seconds": episode_seconds}}
    if kubectl == "real":
        config["apiLatencySeconds"] = delay
    cluster = FakeCluster(workdir / ("k8s-%s-%d" % (approach, size)), config, kubectl=kubectl).start()
    output = workdir / ("out-%s-%d" % (approach, size))
    env = cluster.env(FAKE_K8S_DELAY=str(delay)) if kubectl == "fake" else cluster.env()
    peak = [0.0, 0.0]
    try:
        started = time.time()
        process = subprocess.Popen([sys.executable, *COMMANDS[approach], "--count", str(size), "--output",
                                    str(output)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def sample():
            while process.poll() is None:
                tree, alone = tree_rss_mb(process.pid)
                peak[0], peak[1] = max(peak[0], tree), max(peak[1], alone)
                time.sleep(0.05)

        def spot_results():  # rl-batch-demo later adds the log archive's summary to the file
            while process.poll() is None and not appeared:
                if (output / "results.json").exists():
                    appeared.append(time.time())
                time.sleep(0.01)
        appeared = []
        sampler = threading.Thread(target=sample, daemon=True)
        spotter = threading.Thread(target=spot_results, daemon=True)
        sampler.start()
        spotter.start()
        stdout, stderr = process.communicate(timeout=7200)
        finished = time.time()
        sampler.join()
        spotter.join()
    finally:
        cluster.stop()
    if process.returncode != 0:
        raise SystemExit("%s with %d episodes failed: %s" % (approach, size, stderr[-2000:]))
    marks = [json.loads(line) for line in (cluster.state / "marks.jsonl").read_text().splitlines()]
    complete_at = [m["complete_at"] for m in marks if m["job"] == "rollout"][0]
    results = json.loads((output / "results.json").read_text())
    assert results["reward_sum"] == size and results["successful_episodes"] == size
    assert len(list(output.glob("rollout-*.log"))) == size, "not every log was archived"
    return {"approach": approach, "episodes": size,
            "complete_to_results_seconds": (appeared[0] if appeared else os.stat(output / "results.json").st_mtime)
            - complete_at,
            "complete_to_exit_seconds": finished - complete_at,
            "kubectl_processes": len(cluster.calls()),
            "peak_mb_with_children": peak[0],
            "peak_mb_tool": peak[1],
            "run_seconds": finished - started}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000, 10000])
    parser.add_argument("--approaches", nargs="+", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--delay", type=float, default=0.1, help="seconds added to every API request")
    parser.add_argument("--kubectl", choices=["real", "fake"], default="real")
    parser.add_argument("--tool", help="another rl-batch-demo.py to measure (e.g. an earlier commit's, for before/after)")
    parser.add_argument("--episode-seconds", type=float, default=2.0, help="synthetic episode duration")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", help="keep the simulated clusters and output folders in this folder (for their "
                                       "requests.jsonl, the API server's log of every request)")
    args = parser.parse_args()
    if args.tool:
        COMMANDS["rl-batch-demo"][0] = str(Path(args.tool).resolve())
    rows = []
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        if args.keep:
            tmp = Path(args.keep)
            tmp.mkdir(parents=True, exist_ok=False)
        for size in args.sizes:
            for approach in args.approaches:
                rows.append(measure(approach, size, args.delay, args.episode_seconds, Path(tmp), args.kubectl))
                print("measured %s at %d episodes" % (approach, size), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    version = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout.split("\n")[0]
    print("synthetic episodes (%.1f s each), %.0f ms per %s, %s kubectl (%s), %s" % (
        args.episode_seconds, args.delay * 1000, "API request" if args.kubectl == "real" else "kubectl call",
        args.kubectl, version if args.kubectl == "real" else "tests/fakecluster/kubectl.py", time.strftime("%Y-%m-%d")))
    header = ("episodes", "approach", "complete->results s", "complete->exit s", "kubectl procs",
              "peak MB (with kubectl)", "tool's peak MB", "run total s")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| %d | %s | %.2f | %.2f | %d | %.0f | %.0f | %.1f |" % (
            row["episodes"], row["approach"], row["complete_to_results_seconds"], row["complete_to_exit_seconds"],
            row["kubectl_processes"], row["peak_mb_with_children"], row["peak_mb_tool"], row["run_seconds"]))


if __name__ == "__main__":
    main()
