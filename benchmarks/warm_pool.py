#!/usr/bin/env python3
"""Benchmark: warm pool vs cold claims vs one Job, on the same simulated cluster.

For each batch size, three runs of rl-batch-demo against the simulated cluster
(tests/fakecluster) with agent-sandbox v0.5.6 installed, in its SYNTHETIC-EPISODE mode (no
episode process runs: a Job pod completes, and an exec returns, after --episode-seconds with
made-up ready/reward events labelled "synthetic"):

  job    --backend kubernetes: one Job, a pod per episode
  warm   --backend warm-pool, pool size = count: every claim finds a Running sandbox
  cold   --backend warm-pool --pool-size 0: every claim starts its own sandbox

Figures (seconds):
  create->all rewards  batch_to_all_rewards_seconds: the Job's (or first claim's) creation on
                       the API server (whole seconds) -> the last reward (episode clock)
  create->all ready    warm/cold: the agent-sandbox stress test's timeToAllReadySeconds (first
                       claim create call -> last claim Ready seen by the watch, client clock)
  client batch         client_job_complete_seconds: Job create -> Complete seen; or first claim
                       create call -> every exec returned
  pool fill            pool created -> all replicas Ready (setup, not in the batch figures)
  command              the whole `run` command, start to exit (includes pool fill)

CAVEAT: these are the simulated cluster's timings, not a cluster's. The fake starts a sandbox
in no time (default profile), runs its controllers every 20 ms under one lock, and its
kubectl is a Python program (about 0.1 s to start, --delay more per call). What the figures
show is the tool's own overhead and how it scales (claims created in parallel chunks, execs
bounded by --exec-concurrency), not what a real runtime's cold start costs.

Usage: python3 benchmarks/warm_pool.py [--sizes 20 200 1000] [--episode-seconds 0.5] [--delay 0]
"""

import argparse
import json
from pathlib import Path
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402

ARMS = {
    "job": ["--backend", "kubernetes"],
    "warm": ["--backend", "warm-pool"],
    "cold": ["--backend", "warm-pool", "--pool-size", "0"],
}


def measure(arm, size, episode_seconds, delay, workdir):
    # A pool and its refill hold about 2 x size pods at once; 100 pods a node.
    nodes = [{"name": "bench-%03d" % i, "cpu": "256", "memory": "1Ti", "pods": 110}
             for i in range(max(2, -(-2 * size // 100) + 1))]
    cluster = FakeCluster(workdir / ("k8s-%s-%d" % (arm, size)), {
        "nodes": nodes, "syntheticEpisodes": {"seconds": episode_seconds},
        "agentSandbox": {"version": "v0.5.6", "extensions": True}}).start()
    output = workdir / ("out-%s-%d" % (arm, size))
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "rl-batch-demo.py"), "run", "--allow-large", "--quiet",
                               "--no-runtime-class", "--count", str(size), "--output", str(output), *ARMS[arm]],
                              env=cluster.env(FAKE_K8S_DELAY=str(delay)), capture_output=True, text=True)
        command = time.monotonic() - started
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1]}
        results = json.loads((output / "results.json").read_text())
        return {"create->all rewards": results["batch_to_all_rewards_seconds"],
                "create->all ready": (results.get("agent_sandbox_stress_test") or {}).get("time_to_all_ready_seconds"),
                "client batch": results["client_job_complete_seconds"],
                "pool fill": (results.get("pool") or {}).get("fill_seconds"),
                "launch types": results.get("launch_types"), "command": command}
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000])
    parser.add_argument("--episode-seconds", type=float, default=0.5)
    parser.add_argument("--delay", type=float, default=0.0, help="extra seconds per kubectl call")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = parser.parse_args()
    print("simulated cluster, synthetic episodes of %.1f s, kubectl delay %.2f s; NOT a real cluster's timings"
          % (args.episode_seconds, args.delay))
    print("%6s  %-5s  %19s  %17s  %12s  %9s  %8s  %s" % ("size", "arm", "create->all rewards", "create->all ready",
                                                         "client batch", "pool fill", "command", "launch types"))

    def cell(value, width):
        return ("%*.2f" % (width, value)) if isinstance(value, (int, float)) else "%*s" % (width, "-")

    with tempfile.TemporaryDirectory(prefix="warm-bench-") as workdir:
        for size in args.sizes:
            for arm in args.arms:
                figures = measure(arm, size, args.episode_seconds, args.delay, Path(workdir))
                if "error" in figures:
                    print("%6d  %-5s  failed: %s" % (size, arm, figures["error"]), flush=True)
                    continue
                print("%6d  %-5s  %19s  %17s  %12s  %9s  %8s  %s" % (
                    size, arm, cell(figures["create->all rewards"], 19), cell(figures["create->all ready"], 17),
                    cell(figures["client batch"], 12), cell(figures["pool fill"], 9), cell(figures["command"], 8),
                    json.dumps(figures["launch types"]) if figures["launch types"] else "-"), flush=True)


if __name__ == "__main__":
    main()
