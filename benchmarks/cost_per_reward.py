#!/usr/bin/env python3
"""Benchmark: what each verified reward holds of the cluster, per backend and runtime.

The same batch (default 20 episodes of the built-in task) three ways on one simulated cluster
(tests/fakecluster, agent-sandbox v0.5.6 installed, the client rate limits of a default
installation):

  job     one Job, no RuntimeClass
  job-vm  one Job on a RuntimeClass with a VM-like Pod overhead (podFixed 250m CPU, 160Mi)
  warm    a warm pool of COUNT sandboxes, a claim per episode

Figures (results.json's `cost`, see the README's "Cost per reward"):
  CPU-s/reward, GiB-s/reward  reserved capacity (effective request x time held, whole-second
                              Kubernetes timestamps) divided by the verified rewards
  overhead                    the Pod overhead's share of the reserved CPU
  idle                        idle sandboxes' share of the reserved CPU (warm pool)
  per 1k rewards              with the given prices (default 0.04 per CPU-hour, 0.005 per GiB-hour:
                              illustrative numbers for the arithmetic, not a quote)

CAVEAT: the simulated cluster's episodes take a second or two, so a whole-second timestamp at
each end makes every pod's held time coarse: compare the ratios, not the third digit.

Usage: python3 benchmarks/cost_per_reward.py [--count 20] [--price-cpu-hour 0.04] [--price-gib-hour 0.005]
"""

import argparse
import json
from pathlib import Path
import subprocess
import sys
import tempfile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fakecluster import FakeCluster  # noqa: E402

CONFIG = {"agentSandbox": {"version": "v0.5.6", "extensions": True},
          "runtimeClasses": [{"name": "cube", "handler": "cube"},
                             {"name": "vm", "handler": "vm", "overhead": {"podFixed": {"cpu": "250m",
                                                                                       "memory": "160Mi"}}}]}
ARMS = {"job": ["--no-runtime-class"], "job-vm": ["--runtime", "vm"],
        "warm": ["--backend", "warm-pool", "--no-runtime-class"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--price-cpu-hour", default="0.04")
    parser.add_argument("--price-gib-hour", default="0.005")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = FakeCluster(Path(tmp) / "k8s", CONFIG).start()
        try:
            print("%-7s %13s %13s %9s %6s %15s" % ("arm", "CPU-s/reward", "GiB-s/reward", "overhead", "idle",
                                                    "per 1k rewards"))
            for arm, extra in ARMS.items():
                output = Path(tmp) / arm
                command = [sys.executable, str(ROOT / "rl-batch-demo.py"), "run", "--count", str(args.count),
                           "--price-cpu-hour", args.price_cpu_hour, "--price-gib-hour", args.price_gib_hour,
                           *extra, "--output", str(output), "--quiet"]
                done = subprocess.run(command, env=cluster.env(), capture_output=True, text=True)
                if done.returncode != 0:
                    print("%-7s failed: %s" % (arm, done.stderr.strip().splitlines()[-1]))
                    continue
                cost = json.loads((output / "results.json").read_text())["cost"]
                print("%-7s %13.3f %13.3f %8.0f%% %5.0f%% %15.5f" % (
                    arm, cost["per_reward"]["cpu_seconds"], cost["per_reward"]["gib_seconds"],
                    100 * (cost["overhead_share"] or 0), 100 * (cost["idle_share"] or 0),
                    cost["price"]["per_1000_rewards"]))
                if "pool_idle_rate_per_hour" in cost:
                    rate = cost["pool_idle_rate_per_hour"]
                    print("        the pool's steady idle rate: %.2f core-hours and %.2f GiB-hours per hour"
                          % (rate["cpu_core_hours"], rate["gib_hours"]))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
