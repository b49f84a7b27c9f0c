#!/usr/bin/env python3
"""Benchmark: with `run --stream`, when does a training loop get each reward, compared with
when results.json (the whole batch) is written?

One batch of COUNT custom episodes of mixed lengths (tests/episodes/scripted.py; episode i
sleeps a long-tailed time between --shortest and --longest seconds after `ready`, the tasks
shuffled so that task order is not length order) runs on the simulated cluster
(tests/fakecluster: real local processes per pod, the controllers' client rate limits of a
default installation) with --stream. Every time is on this benchmark's wall clock (time.time()),
from the batch's start: the moment the tool called create for the Job (or the first claim, or
the local batch's start), recovered as (first line's arrival - its streamed_after_seconds).

  first / median / last line   when the episode lines arrived on the reader's side of the pipe
  results.json written         its mtime
  summary line                 when the last line arrived
  exit                         when the command exited

By default the episodes write no termination message, so the Job backend reads each
episode's log as its pod finishes (the slower path); --termination-message makes them write
it (one watch event then carries the verdict).

Usage: python3 benchmarks/streaming.py [--count 200] [--backend kubernetes|warm-pool|local]
                                       [--shortest 2] [--longest 60] [--termination-message]
"""

import argparse
import json
import os
from pathlib import Path
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402


def episode_lengths(count, shortest, longest, seed=7):
    """Long-tailed: most episodes short, a few long (as agent rollouts are); shuffled."""
    lengths = [shortest + (longest - shortest) * (i / max(1, count - 1)) ** 3 for i in range(count)]
    random.Random(seed).shuffle(lengths)
    return lengths


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--backend", default="kubernetes", choices=("kubernetes", "warm-pool", "local"))
    parser.add_argument("--shortest", type=float, default=2.0)
    parser.add_argument("--longest", type=float, default=60.0)
    parser.add_argument("--termination-message", action="store_true")
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rl-stream-bench-"))
    lengths = episode_lengths(options.count, options.shortest, options.longest)
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": i, "reward": 1, "sleep": round(s, 3),
                                         "termination_message": options.termination_message}) + "\n"
                             for i, s in enumerate(lengths)))
    cluster = None
    if options.backend != "local":
        nodes = [{"name": "bench-%d" % i, "cpu": "64", "memory": "256Gi", "pods": 110}
                 for i in range(max(2, -(-options.count // 100)))]
        config = {"nodes": nodes}
        if options.backend == "warm-pool":
            config["agentSandbox"] = {"version": "v0.5.6", "extensions": True}
        cluster = FakeCluster(work / "k8s", config).start()
    argv = [sys.executable, str(ROOT / "rl-batch-demo.py"), "run", "--backend", options.backend, "--stream",
            "--quiet", "--allow-large", "--episode", str(ROOT / "tests" / "episodes" / "scripted.py"),
            "--tasks", str(tasks), "--output", str(work / "out")]
    if options.backend != "local":
        argv.append("--no-runtime-class")
    try:
        started = time.time()
        process = subprocess.Popen(argv, env=cluster.env() if cluster else dict(os.environ), cwd=str(work),
                                   stdout=subprocess.PIPE, text=True)
        arrivals = []
        for line in process.stdout:
            arrivals.append((time.time(), json.loads(line)))
        process.wait()
        exited = time.time()
    finally:
        if cluster is not None:
            cluster.stop()
    episodes = [(at, line) for at, line in arrivals if line["type"] == "episode"]
    if process.returncode not in (0, 5) or not episodes:
        sys.exit("the run failed (exit %d): %s" % (process.returncode, arrivals[-1][1] if arrivals else "no line"))
    origin = episodes[0][0] - episodes[0][1]["streamed_after_seconds"]
    times = [at - origin for at, _ in episodes]
    results_written = (work / "out" / "results.json").stat().st_mtime - origin
    tool_side = [line["streamed_after_seconds"] for _, line in episodes]
    print("%d episodes, backend %s, episode lengths %.1f-%.1f s (median %.1f s), %s" % (
        len(episodes), options.backend, min(lengths), max(lengths), statistics.median(lengths),
        "termination messages" if options.termination_message else "no termination message (logs read early)"))
    print("seconds from the batch's start (the Job's create call), benchmark wall clock:")
    for label, value in (("first line", times[0]), ("median line", statistics.median(times)),
                         ("last line", times[-1]), ("results.json written", results_written),
                         ("summary line", arrivals[-1][0] - origin), ("exit", exited - origin),
                         ("(the command started)", started - origin)):
        print("  %-24s %8.2f" % (label, value))
    streamed_before = sum(1 for value in times if value < results_written)
    print("lines before results.json: %d of %d; the tool's own streamed_after_seconds: first %.2f, median %.2f, "
          "last %.2f" % (streamed_before, len(times), min(tool_side), statistics.median(tool_side), max(tool_side)))
    print("reader-side delay (arrival - streamed_after_seconds - origin): max %.3f s" % max(
        at - origin - line["streamed_after_seconds"] for at, line in episodes))


if __name__ == "__main__":
    main()
