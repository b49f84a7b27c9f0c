#!/usr/bin/env python3
"""Benchmark: warm pool vs cold claims vs one Job, on the same simulated cluster.

For each profile and batch size, three runs of rl-batch-demo against the simulated cluster
(tests/fakecluster) with agent-sandbox v0.5.6 installed, in its SYNTHETIC-EPISODE mode (no
episode process runs: a Job pod completes, and an exec returns, after --episode-seconds with
made-up ready/reward events labelled "synthetic"):

  job    --backend kubernetes: one Job, a pod per episode
  warm   --backend warm-pool, pool size = count: every claim finds a Running sandbox
  cold   --backend warm-pool --pool-size 0: every claim starts its own sandbox

Profiles:
  default  the client rate limits of a default installation (Job controller 20 qps / burst 30,
           scheduler 50 / 100, agent-sandbox unlimited) and VM-sandbox starts (2-5 s per sandbox,
           the kubelet's 1 s status lag, the Job controller's 1 s batching): what a user of a
           Kata-like runtime on a default cluster waits for
  fast     no client rate limits and instant sandbox starts: the fake's old behaviour, which
           flatters the Job baseline; kept for contrast

Figures:
  create->all rewards  batch_to_all_rewards_seconds (s): the Job's (or first claim's) creation on
                       the API server (whole seconds) -> the last reward (episode clock)
  ready->stmt p99      claim Ready (watch arrival, client clock) -> the episode's first statement
                       (episode clock), 99th percentile by nearest rank (warm and cold only)
  kubectl              kubectl processes the run started (the fake kubectl logs each)
  client CPU           user + system CPU seconds of the tool and its children (kubectl), from
                       getrusage(RUSAGE_CHILDREN) around the command; and per episode, in ms
  pool fill            pool created -> all replicas Ready (setup, not in the batch figures)
  command              the whole `run` command, start to exit (includes pool fill)
  cleanup              the `cleanup` command after it, start to exit (claims, pool, template,
                       the namespace and its wait)

Every kubectl is the real one on PATH (5 requests a second per process, burst 10), against the
simulated cluster's HTTP API, each request answered --delay seconds late (apiLatencySeconds).

CAVEAT: these are the simulated cluster's timings, not a cluster's. Its controllers run every
20 ms under one lock; a real API server, its etcd and a real network differ.

Usage: python3 benchmarks/warm_pool.py [--sizes 20 200 1000] [--profiles default fast]
       [--episode-seconds 0.5] [--arms job warm cold]
"""

import argparse
import json
from pathlib import Path
import resource
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


PROFILES = {
    "default": {"clientRates": "default-installation", "profile": "vm-sandbox"},
    "fast": {"clientRates": "unlimited", "profile": "default"},
}


def nearest_rank(values, p):
    ordered = sorted(values)
    return ordered[max(1, -(-p * len(ordered) // 100)) - 1] if ordered else None


def measure(arm, size, profile, episode_seconds, delay, workdir, tool):
    # A pool and its refill hold about 2 x size pods at once; 100 pods a node.
    nodes = [{"name": "bench-%03d" % i, "cpu": "256", "memory": "1Ti", "pods": 110}
             for i in range(max(2, -(-2 * size // 100) + 1))]
    cluster = FakeCluster(workdir / ("k8s-%s-%s-%d" % (profile, arm, size)), dict(PROFILES[profile], **{
        "nodes": nodes, "syntheticEpisodes": {"seconds": episode_seconds},
        "agentSandbox": {"version": "v0.5.6", "extensions": True}, "apiLatencySeconds": delay})).start()
    output = workdir / ("out-%s-%s-%d" % (profile, arm, size))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        done = subprocess.run([sys.executable, tool, "run", "--allow-large", "--quiet",
                               "--no-runtime-class", "--count", str(size), "--output", str(output), *ARMS[arm]],
                              env=cluster.env(), capture_output=True, text=True)
        command = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1]}
        results = json.loads((output / "results.json").read_text())
        started = time.monotonic()
        cleaned = subprocess.run([sys.executable, tool, "cleanup", "--output", str(output)], env=cluster.env(),
                                 capture_output=True, text=True)
        cleanup = time.monotonic() - started if cleaned.returncode == 0 else None
        waits = [row["times"]["process_start"] - row["times"]["claim_ready"] for row in results["pods"]
                 if row["times"].get("claim_ready") and row["times"].get("process_start")]
        return {"create->all rewards": results["batch_to_all_rewards_seconds"],
                "ready->stmt p99": nearest_rank(waits, 99),
                "kubectl": len(cluster.calls()), "client cpu": cpu, "cpu/episode ms": 1000 * cpu / size,
                "pool fill": (results.get("pool") or {}).get("fill_seconds"),
                "channel": ((json.loads((output / "warm-pool.json").read_text()).get("exec_channel") or {}).get("kind")
                            if (output / "warm-pool.json").exists() else "-"),
                "launch types": results.get("launch_types"), "command": command, "cleanup": cleanup}
    finally:
        cluster.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 200, 1000])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    parser.add_argument("--episode-seconds", type=float, default=0.5)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds added to every API request")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--tool", default=str(ROOT / "rl-batch-demo.py"),
                        help="the rl-batch-demo.py to measure (another version, for a before/after)")
    args = parser.parse_args()
    version = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout.split("\n")[0]
    print("simulated cluster, synthetic episodes of %.1f s, %.0f ms per API request, real kubectl (%s); NOT a real "
          "cluster's timings" % (args.episode_seconds, args.delay * 1000, version))
    columns = ("create->all rewards", "ready->stmt p99", "kubectl", "client cpu", "cpu/episode ms", "pool fill",
               "command", "cleanup")
    print("| profile | size | arm | %s | channel | launch types |" % " | ".join(columns))
    print("|---|---:|---|%s---|---|" % ("---:|" * len(columns)))

    def cell(value):
        if isinstance(value, float):
            return "%.2f" % value
        return "-" if value is None else str(value)

    with tempfile.TemporaryDirectory(prefix="warm-bench-") as workdir:
        for profile in args.profiles:
            for size in args.sizes:
                for arm in args.arms:
                    figures = measure(arm, size, profile, args.episode_seconds, args.delay, Path(workdir),
                                      args.tool)
                    if "error" in figures:
                        print("| %s | %d | %s | failed: %s |" % (profile, size, arm, figures["error"]), flush=True)
                        continue
                    print("| %s | %d | %s | %s | %s | %s |" % (
                        profile, size, arm, " | ".join(cell(figures[c]) for c in columns), figures["channel"],
                        json.dumps(figures["launch types"]) if figures["launch types"] else "-"), flush=True)


if __name__ == "__main__":
    main()
