#!/usr/bin/env python3
"""Benchmark: how fast does rl-batch-demo notice a finished batch and write results.json?

Runs the real script against the simulated cluster (tests/fakecluster) in its SYNTHETIC-
EPISODE mode: the simulated kubelet runs no process, it completes each pod after
--episode-seconds with made-up ready/reward events (labelled "synthetic" in every event).
Every kubectl invocation is delayed by --delay seconds (default 0.1) to model API latency
and kubectl's own start-up. For each batch size it prints:

  kubectl calls      every kubectl invocation the tool made (watches count once)
  calls/episode      (calls - constant) / episodes, the constant taken from the smallest size
  complete->notice   the Job controller setting Complete -> the tool seeing it (seconds)
  complete->results  the Job controller setting Complete -> results.json on disk (seconds)
  run total          the tool's wall time, start to exit (logs are archived after results.json)
  client CPU s       user+system CPU of the tool's own process (not its kubectl children)
  peak MB            the tool's peak resident memory

Usage: python3 benchmarks/collection.py [--sizes 20 200 1000] [--delay 0.1]
"""

import argparse
import json
import os
from pathlib import Path
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402

# Runs the tool in-process so that RUSAGE_SELF is the tool's own CPU and memory.
RUNNER = """
import json, resource, runpy, sys
sys.argv = [sys.argv[1]] + sys.argv[3:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as exit:
    code = exit.code or 0
usage = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(RUSAGE_PATH, "w") as out:
    json.dump({"code": code, "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss,
               "children_cpu": children.ru_utime + children.ru_stime}, out)
sys.exit(code)
"""


def measure(size, delay, episode_seconds, workdir):
    nodes = [{"name": "bench-%02d" % i, "cpu": "64", "memory": "256Gi", "pods": 110}
             for i in range(max(2, -(-size // 100)))]
    cluster = FakeCluster(workdir / ("k8s-%d" % size), {"nodes": nodes,
                                                        "syntheticEpisodes": {"seconds": episode_seconds}}).start()
    output = workdir / ("out-%d" % size)
    rusage_path = workdir / ("rusage-%d.json" % size)
    env = cluster.env(FAKE_K8S_DELAY=str(delay))
    try:
        started = time.time()
        done = subprocess.run([sys.executable, "-c", RUNNER.replace("RUSAGE_PATH", repr(str(rusage_path))),
                               str(ROOT / "rl-batch-demo.py"), "--", "run", "--count", str(size), "--allow-large",
                               "--quiet", "--output", str(output)],
                              env=env, capture_output=True, text=True, timeout=3600)
        finished = time.time()
    finally:
        cluster.stop()
    if done.returncode != 0:
        raise SystemExit("run of %d episodes failed: %s" % (size, done.stderr[-2000:]))
    marks = [json.loads(line) for line in (cluster.state / "marks.jsonl").read_text().splitlines()]
    complete_at = [m["complete_at"] for m in marks if m["job"] == "rollout"][0]
    run_info = json.loads((output / "run.json").read_text())
    results = json.loads((output / "results.json").read_text())
    usage = json.loads(rusage_path.read_text())
    assert results["reward_sum"] == size and results["successful_episodes"] == size
    return {
        "episodes": size,
        "kubectl_calls": len(cluster.calls()),
        "complete_to_noticed_seconds": run_info["outcome_observed_at"] - complete_at,
        "complete_to_results_seconds": os.stat(output / "results.json").st_mtime - complete_at,
        "run_seconds": finished - started,
        "client_cpu_seconds": usage["cpu"],
        "client_peak_mb": usage["maxrss_kb"] / 1024.0,
        "kubectl_children_cpu_seconds": usage["children_cpu"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000])
    parser.add_argument("--delay", type=float, default=0.1, help="seconds added to every kubectl call")
    parser.add_argument("--episode-seconds", type=float, default=2.0, help="synthetic episode duration")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
        rows = [measure(size, args.delay, args.episode_seconds, Path(tmp)) for size in args.sizes]
    constant = rows[0]["kubectl_calls"] - rows[0]["episodes"]
    for row in rows:
        row["calls_per_episode_beyond_constant"] = (row["kubectl_calls"] - constant) / row["episodes"]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("synthetic episodes (%.1f s each), %.0f ms per kubectl call, %s" % (
        args.episode_seconds, args.delay * 1000, time.strftime("%Y-%m-%d")))
    header = ("episodes", "kubectl calls", "calls/episode", "complete->notice s", "complete->results s",
              "run total s", "client CPU s", "peak MB")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| %d | %d | %.2f | %.3f | %.2f | %.1f | %.2f | %.0f |" % (
            row["episodes"], row["kubectl_calls"], row["calls_per_episode_beyond_constant"],
            row["complete_to_noticed_seconds"], row["complete_to_results_seconds"], row["run_seconds"],
            row["client_cpu_seconds"], row["client_peak_mb"]))


if __name__ == "__main__":
    main()
