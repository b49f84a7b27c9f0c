#!/usr/bin/env python3
"""Benchmark: `rl-batch-demo compare` on the simulated cluster, through the real kubectl.

One simulated cluster (agent-sandbox v0.5.6 installed, synthetic episodes, every API request
--delay seconds late, the default profile's client rate limits and VM-sandbox starts), then
`compare` with the arms given: each arm's batch --rounds times, interleaved, every batch
cleaned up after it. Prints compare's verdict lines (and leaves the folder with --keep).

Usage: python3 benchmarks/compare_arms.py --arm job='' --arm warm='--backend warm-pool'
                                          [--count 50] [--rounds 3] [--seed 1] [--keep DIR]
"""

import argparse
from pathlib import Path
import subprocess
import sys
import tempfile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", required=True, metavar="NAME='RUN OPTIONS'")
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--episode-seconds", type=float, default=0.5)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--keep", metavar="DIR", help="keep the cluster's state and the comparison here")
    args = parser.parse_args()
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="compare-"))
    nodes = [{"name": "bench-%03d" % i, "cpu": "256", "memory": "1Ti", "pods": 110}
             for i in range(max(2, -(-2 * args.count // 100) + 1))]
    cluster = FakeCluster(workdir / "k8s", {
        "clientRates": "default-installation", "profile": "vm-sandbox", "nodes": nodes,
        "syntheticEpisodes": {"seconds": args.episode_seconds},
        "agentSandbox": {"version": "v0.5.6", "extensions": True}, "apiLatencySeconds": args.delay}).start()
    try:
        argv = [sys.executable, str(ROOT / "rl-batch-demo.py"), "compare", "--no-runtime-class",
                "--count", str(args.count), "--rounds", str(args.rounds), "--seed", str(args.seed),
                "--output", str(workdir / "comparison")]
        for arm in args.arm:
            argv += ["--arm", arm]
        if args.count > 20:
            argv.append("--allow-large")
        done = subprocess.run(argv, env=cluster.env(), text=True, capture_output=True)
        print(done.stdout, end="")
        if done.returncode != 0:
            print(done.stderr.strip().splitlines()[-1], file=sys.stderr)
        return done.returncode
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
