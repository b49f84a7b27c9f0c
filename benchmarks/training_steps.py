#!/usr/bin/env python3
"""Benchmark: a training loop's steps three ways, on one simulated cluster.

S steps of M episodes each, with the trainer's own work (--interval seconds) between two steps,
three ways, interleaved step by step (kept, new pool, Job; then the next step) on the same
simulated cluster (tests/fakecluster) with agent-sandbox v0.5.6, in its SYNTHETIC-EPISODE mode
(no episode process runs: an exec returns, and a Job pod completes, after --episode-seconds with
made-up ready/reward events labelled "synthetic"):

  kept      `pool up --size M` once, then each step `run --backend warm-pool --pool POOL --count M`
            (its claims deleted at its end; the pool stays and refills), `pool down` at the end
  new pool  each step `run --backend warm-pool --count M` (its own pool, filled, then claimed),
            then `cleanup`
  job       each step `run --count M` (one Job), then `cleanup`

Cluster: the client rate limits of a default installation (Job controller 20 qps / burst 30,
scheduler 50 / 100), VM-sandbox starts (2-5 s a sandbox, the kubelet's 1 s status lag, the Job
controller's 1 s batching), the real namespace-deletion delay (5 s), every API request answered
--delay seconds late, and the real kubectl (5 requests a second per process, burst 10).

Figures, per step and way:
  all rewards  results.json batch_to_all_rewards_seconds: the batch's creation on the API server
               (whole seconds) -> the last reward (episode clock); the creation's whole
               second makes it up to 1 s long, so ways closer than that are not told apart
  client done  results.json client_job_complete_seconds: client monotonic clock, from just before
               the first claim's (or the Job's) create request to the last episode's end (a
               Job: its Complete condition as the client's watch saw it); no rounding
  step         the `run` command, start to exit: what the trainer waits for (the new pool's fill
               included; cleanup, which a trainer need not wait for, apart)
  cleanup      the `cleanup` command after a new pool's or a Job's step (kept: none per step)
  reserved     results.json cost: CPU core-seconds the step's pods held (kept: its claimed
               sandboxes, the pool's idle ones and the refill, from its first claim to its last
               exec's return; a new pool: its pods from their scheduling, the fill included)
  ready        kept only: Ready sandboxes in the pool when the step fired (kept_pool_step)
  refill       kept only: first claim -> the pool back to M Ready, seconds (watch arrival,
               client clock); "-" when not back to full by the step's end
  warm/cold    launch types of the step's claims
The kept pool holds its M sandboxes through the whole cycle of a step and the trainer's work
after it: rate = M x a sandbox's CPU request (core-seconds a second, from `pool status`), so a
cycle reserves rate x (mean kept step + interval), the refill's overlap left out.

Break-even (capacity): a new pool per step reserves its step's figure (fill included) and
nothing between steps. The two are equal at interval = new-pool reserved / rate - mean kept
step: with steps further apart, the idle pool reserves more than refilling a pool for each step,
and buys only the latency in the `step` column.

CAVEAT: these are the simulated cluster's timings, not a cluster's.

Usage: python3 benchmarks/training_steps.py [--sizes 64 512] [--steps 10] [--interval 10]
       [--episode-seconds 0.5] [--delay 0.1]
"""

import argparse
import json
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakecluster import FakeCluster  # noqa: E402

TOOL = str(ROOT / "rl-batch-demo.py")
WAYS = ("kept", "new pool", "job")


def tool(cluster, *args):
    started = time.monotonic()
    done = subprocess.run([sys.executable, TOOL, *args], env=cluster.env(), capture_output=True, text=True)
    if done.returncode not in (0, 5):
        raise RuntimeError("`%s` failed: %s" % (" ".join(args[:2]), done.stderr.strip().splitlines()[-1]))
    return time.monotonic() - started, done


def step_figures(output, seconds, cleanup=None):
    results = json.loads((output / "results.json").read_text())
    kept = results.get("kept_pool_step") or {}
    launch = results.get("launch_types") or {}
    return {"all rewards": results["batch_to_all_rewards_seconds"],
            "client done": results["client_job_complete_seconds"], "step": seconds, "cleanup": cleanup,
            "reserved": ((results.get("cost") or {}).get("reserved") or {}).get("cpu_seconds"),
            "ready": kept.get("ready_at_start"), "refill": kept.get("refill_seconds"),
            "warm/cold": "%s/%s" % (launch.get("warm", 0), launch.get("cold", 0)) if launch else "-",
            "rewards": results["reward_sum"]}


def run_size(size, steps, interval, episode_seconds, delay, workdir):
    # the kept pool (M), a new pool and its refill (2M) and a Job (M) may overlap: room for 5M pods
    nodes = [{"name": "bench-%03d" % i, "cpu": "256", "memory": "1Ti", "pods": 110}
             for i in range(max(2, -(-5 * size // 100) + 1))]
    cluster = FakeCluster(workdir / ("k8s-%d" % size), {
        "clientRates": "default-installation", "profile": "vm-sandbox", "nodes": nodes,
        "syntheticEpisodes": {"seconds": episode_seconds}, "apiLatencySeconds": delay,
        "agentSandbox": {"version": "v0.5.6", "extensions": True}}).start()
    common = ["--allow-large", "--quiet", "--no-runtime-class"]
    rows, idle = {way: [] for way in WAYS}, None
    pool = workdir / ("pool-%d" % size)
    try:
        seconds, _ = tool(cluster, "pool", "up", "--size", str(size), "--output", str(pool), "--allow-large",
                          "--quiet", "--no-runtime-class")
        print("size %d: pool up (fill) %.2f s" % (size, seconds), flush=True)
        for number in range(1, steps + 1):
            for way in WAYS:
                output = workdir / ("%d-%s-%d" % (size, way.replace(" ", "-"), number))
                if way == "kept":
                    seconds, _ = tool(cluster, "run", "--backend", "warm-pool", "--pool", str(pool), "--count",
                                      str(size), "--output", str(output), "--quiet", "--allow-large")
                    rows[way].append(step_figures(output, seconds))
                    continue
                args = ["--backend", "warm-pool"] if way == "new pool" else []
                seconds, _ = tool(cluster, "run", *args, *common, "--count", str(size), "--output", str(output))
                cleanup, _ = tool(cluster, "cleanup", str(output))
                rows[way].append(step_figures(output, seconds, cleanup))
            print("size %d step %d: %s" % (size, number, "; ".join(
                "%s %.2f s all rewards, %.2f s step" % (way, rows[way][-1]["all rewards"], rows[way][-1]["step"])
                for way in WAYS)), flush=True)
            time.sleep(interval)  # the trainer's own work between two steps
        status = json.loads(tool(cluster, "pool", "status", str(pool), "--json")[1].stdout)
        idle = status["idle_cost_per_hour"]["cpu_core_seconds"] / 3600.0  # core-seconds per second
    finally:
        subprocess.run([sys.executable, TOOL, "pool", "down", str(pool)], env=cluster.env(), capture_output=True)
        cluster.stop()
    return rows, idle


def cell(value):
    if isinstance(value, float):
        return "%.2f" % value
    return "-" if value is None else str(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--interval", type=float, default=10.0, help="the trainer's seconds between two steps")
    parser.add_argument("--episode-seconds", type=float, default=0.5)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds added to every API request")
    args = parser.parse_args()
    version = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout.split("\n")[0]
    print("simulated cluster (default-installation rate limits, VM sandboxes), synthetic episodes of %.1f s, %.0f ms "
          "per API request, %.0f s between steps, real kubectl (%s); NOT a real cluster's timings"
          % (args.episode_seconds, args.delay * 1000, args.interval, version), flush=True)
    columns = ("all rewards", "client done", "step", "cleanup", "reserved", "ready", "refill", "warm/cold")
    with tempfile.TemporaryDirectory(prefix="steps-bench-") as workdir:
        for size in args.sizes:
            rows, idle = run_size(size, args.steps, args.interval, args.episode_seconds, args.delay, Path(workdir))
            print("\n| M | way | step | %s |" % " | ".join(columns))
            print("|---:|---|---:|%s" % ("---:|" * len(columns)))
            for way in WAYS:
                for number, row in enumerate(rows[way], 1):
                    print("| %d | %s | %d | %s |" % (size, way, number, " | ".join(cell(row[c]) for c in columns)))
            print("\n| M | way | steps | mean all rewards | mean client done | mean step | total step | total cleanup "
                  "| reserved per cycle (core-s) |")
            print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
            step_mean = {way: statistics.fmean(row["step"] for row in rows[way]) for way in WAYS}
            for way in WAYS:
                figures = rows[way]
                cycle = idle * (step_mean[way] + args.interval) if way == "kept" else statistics.fmean(
                    row["reserved"] or 0 for row in figures)
                print("| %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %s | %.0f |" % (
                    size, way, len(figures), statistics.fmean(row["all rewards"] for row in figures),
                    statistics.fmean(row["client done"] for row in figures), step_mean[way],
                    sum(row["step"] for row in figures), cell(sum(row["cleanup"] for row in figures)
                                                              if way != "kept" else None), cycle))
            new_pool = statistics.fmean(row["reserved"] or 0 for row in rows["new pool"])
            break_even = new_pool / idle - step_mean["kept"] if idle else None
            print("\nM = %d: the kept pool reserves %.2f core-seconds a second; against a new pool per step it saves "
                  "%.2f s of the trainer's wait a step (%.2f s of all rewards), and reserves less capacity while steps "
                  "come less than %s s apart (interval break-even)" % (
                      size, idle, step_mean["new pool"] - step_mean["kept"], statistics.fmean(
                          row["all rewards"] for row in rows["new pool"]) - statistics.fmean(
                          row["all rewards"] for row in rows["kept"]), cell(break_even)), flush=True)


if __name__ == "__main__":
    main()
