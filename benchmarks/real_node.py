#!/usr/bin/env python3
"""Benchmark: the tool on a real node (tests/realnode/): the kubelet of Kubernetes v1.36.3 with
containerd v2.4.2, runc v1.5.3 and gVisor's runsc (systrap), registered with the real control
plane (tests/controlplane/), its images pulled from a registry on a loopback port. Real
containers: the built-in episode in Debian bookworm's python3, through the tool's hardened pod.

Figures, per case (each case on a node of its own, so that its first batch pulls the image):
  job RUNTIME N   `run --count N --runtime RUNTIME` twice on one node: the first batch pulls the
                  image (one pull; the other pods wait for it), the second finds it cached.
                  Per batch: P50/P95 of pod created -> ready (API server whole seconds vs the
                  episode's clock), pod seen -> ready (the tool's watch, ms), scheduled seen ->
                  container started seen, container started -> first statement, and the image
                  pull (the kubelet's Pulled event: its pull alone, ms); batch_to_all_rewards;
                  and the kubelet's own figures over the batch, from its /metrics through the
                  API server (k8s.io/kubernetes v1.36.3 pkg/kubelet/metrics/metrics.go and
                  util/pod_startup_latency_tracker.go): pod_start_total_duration (pod
                  creationTimestamp -> every container running as the kubelet's watch saw it),
                  pod_start_sli_duration (the same less the image pulls), and
                  pod_start_duration (the kubelet's first sight of the pod, after scheduling,
                  -> Running, pulls included), as means (sum / count over the batch's pods:
                  the histograms' buckets are too coarse for a P50)
  warm N          `run --backend warm-pool --count N --runtime runc` (pool of N filled first, not
                  measured) against the Job of N on the same node: batch_to_all_rewards and
                  claim/pod -> ready P50
  compare N R     `compare --arm runc=--runtime runc --arm gvisor=--runtime gvisor --count N
                  --rounds R`: its figures and verdicts with their intervals
  images K N      a batch across K images (the python image pushed under K names), N tasks over
                  them in turn (tests/episodes/scripted.py), `--rounds 2` on runc: per round and
                  image, the episodes pulled and cached, the pull's P50 and the startup (pod seen
                  -> ready) P50 of pulled and of cached episodes apart (results.json's
                  image_pulls.by_image); then the same tasks with --prewarm on a new node: each
                  image's pull per node as the prewarm said it, and the measured episodes' states

Usage: python3 benchmarks/real_node.py [--job 10 50] [--runtimes runc gvisor] [--warm 50] [--compare 10 3]
                                      [--images 3 12]
Prints one line per case and, at the end, a JSON document of every figure."""

import argparse
import fcntl
import json
from pathlib import Path
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from controlplane import build as controlplane_build  # noqa: E402
from controlplane.cluster import ControlPlane  # noqa: E402
from realnode import build as realnode_build  # noqa: E402
from realnode.node import Registry, RealNode, image_ref, runtime_classes  # noqa: E402

TIMEOUT = ("--timeout", "1800")
PHASES = ("pod_to_ready", "client_pod_to_ready", "client_scheduled_to_container_started", "interpreter_start",
          "claim_to_ready")


class Node:
    """A control plane with one kwok node and one real node, pulling from `registry`."""

    def __init__(self, workdir, registry, parts=()):
        self.workdir = Path(workdir)
        built = controlplane_build.ensure_built()
        self.plane = ControlPlane(self.workdir / "plane", built, nodes=1, parts=parts, episode_runtime=False,
                                  runtime_classes=runtime_classes())
        self.node = RealNode(self.workdir / "node", realnode_build.ensure_built(), self.plane, registry)
        with open(Path(built) / "create.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.plane.start()
        self.node.start()

    def tool(self, *args):
        done = subprocess.run([sys.executable, str(ROOT / "rl-batch-demo.py"), *args], cwd=str(self.workdir),
                              env=self.plane.env(), capture_output=True, text=True, timeout=7200)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
            raise RuntimeError("`rl-batch-demo %s` exited %d: %s" % (" ".join(args[:3]), done.returncode,
                                                                   lines[-1] if lines else done.stderr[-800:]))
        return done

    def kubelet_metrics(self):
        """{metric: (sum, count)} of the kubelet's pod start histograms (its /metrics, proxied)."""
        text = self.plane.kubectl("get", "--raw", "/api/v1/nodes/%s/proxy/metrics" % self.node.name).stdout
        found = {}
        for line in text.splitlines():
            for metric in ("kubelet_pod_start_sli_duration_seconds", "kubelet_pod_start_total_duration_seconds",
                           "kubelet_pod_start_duration_seconds"):
                for part in ("_sum", "_count"):
                    if line.startswith(metric + part + " ") or line.startswith(metric + part + "{"):
                        value = float(line.rsplit(" ", 1)[1])
                        total, count = found.get(metric, (0.0, 0.0))
                        found[metric] = (total + value, count) if part == "_sum" else (total, count + value)
        return found

    def stop(self):
        self.node.stop()
        self.plane.stop()


def phase_figures(results):
    figures = {}
    for name in PHASES:
        phase = results["phases"].get(name)
        if phase and phase["count"]:
            figures[name] = {"p50": round(phase["p50"], 3), "p95": round(phase["p95"], 3), "count": phase["count"],
                             "resolution_seconds": phase["resolution_seconds"], "clocks": phase["clocks"]}
    pulls = results.get("image_pulls") or {}
    figures["image_pulls"] = {key: pulls.get(key) for key in ("pulled", "cached", "unknown")}
    if pulls.get("pull_seconds", {}).get("count"):
        figures["image_pulls"]["pull_seconds_p50"] = pulls["pull_seconds"]["p50"]
        figures["image_pulls"]["including_waiting_p50"] = pulls["pull_seconds_including_waiting"]["p50"]
    figures["batch_to_all_rewards_seconds"] = results["batch_to_all_rewards_seconds"]
    figures["isolation"] = results["isolation"]["verdict"]
    return figures


def kubelet_means(before, after):
    means = {}
    for metric, (total, count) in after.items():
        old_total, old_count = before.get(metric, (0.0, 0.0))
        if count > old_count:
            means[metric.replace("kubelet_", "").replace("_seconds", "_mean_seconds")] = round(
                (total - old_total) / (count - old_count), 3)
    return means


def job_case(runtime, size, workdir, registry):
    node = Node(Path(workdir) / ("job-%s-%d" % (runtime, size)), registry)
    try:
        rows = {}
        for label in ("first_pull", "cached"):
            before = node.kubelet_metrics()
            output = node.workdir / label
            node.tool("run", "--count", str(size), "--runtime", runtime, "--image", image_ref("python"),
                      "--allow-large", "--quiet", "--output", str(output), *TIMEOUT)
            results = json.loads((output / "results.json").read_text())
            assert results["successful_episodes"] == size, results["successful_episodes"]
            rows[label] = dict(phase_figures(results), kubelet=kubelet_means(before, node.kubelet_metrics()))
            node.tool("cleanup", str(output))
        return {"case": "job", "runtime": runtime, "size": size, **rows}
    finally:
        node.stop()


def warm_case(size, workdir, registry):
    node = Node(Path(workdir) / ("warm-%d" % size), registry, parts=("agent-sandbox",))
    try:
        rows = {}
        for label, backend in (("job", ()), ("warm_pool", ("--backend", "warm-pool"))):
            output = node.workdir / label
            node.tool("run", *backend, "--count", str(size), "--runtime", "runc", "--image", image_ref("python"),
                      "--allow-large", "--quiet", "--output", str(output), *TIMEOUT)
            results = json.loads((output / "results.json").read_text())
            assert results["successful_episodes"] == size, results["successful_episodes"]
            rows[label] = phase_figures(results)
            node.tool("cleanup", str(output))
        return {"case": "warm", "size": size, **rows}
    finally:
        node.stop()


def compare_case(size, rounds, workdir, registry):
    node = Node(Path(workdir) / "compare", registry)
    try:
        node.tool("run", "--count", "1", "--runtime", "runc", "--image", image_ref("python"), "--quiet",
                  "--output", str(node.workdir / "pull"))  # the image on the node first: both arms cached
        node.tool("cleanup", str(node.workdir / "pull"))
        output = node.workdir / "cmp"
        node.tool("compare", "--arm", "runc=--runtime runc", "--arm", "gvisor=--runtime gvisor", "--image",
                  image_ref("python"), "--count", str(size), "--rounds", str(rounds), "--seed", "1", "--output",
                  str(output))
        record = json.loads((output / "comparison.json").read_text())
        arms = {arm: {key: {k: figure[k] for k in ("value", "low", "high", "unit")}
                      for key, figure in figures.items() if isinstance(figure, dict) and "label" in figure}
                for arm, figures in record["arms"].items()}
        kernels = {arm: figures.get("sandbox_kernel", {}).get("verdict") for arm, figures in record["arms"].items()}
        return {"case": "compare", "size": size, "rounds": rounds, "arms": arms, "sandbox_kernel": kernels,
                "verdicts": [pair["verdict"] for pair in record["pairs"]]}
    finally:
        node.stop()


def image_figures(results, images):
    by_image = results["image_pulls"]["by_image"]
    return {image: {"pulled": by_image[image]["pulled"], "cached": by_image[image]["cached"],
                    "pull_p50": by_image[image]["pull_seconds"].get("p50"),
                    "startup_p50_pulled": by_image[image]["startup_seconds"]["pulled"].get("p50"),
                    "startup_p50_cached": by_image[image]["startup_seconds"]["cached"].get("p50")}
            for image in images}


def images_case(count, size, workdir, registry):
    names = ["bench-task-%d:1" % number for number in range(count)]
    for name in names:
        registry.push(registry.built / "images" / "python", name)
    images = [image_ref(name) for name in names]
    tasks = Path(workdir) / "image-tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": n, "reward": 1, "image": images[n % count]}) + "\n"
                             for n in range(size)))
    episode = str(ROOT / "tests" / "episodes" / "scripted.py")
    rows = {}
    for label, extra in (("rounds", ("--rounds", "2")), ("prewarm", ("--prewarm",))):
        node = Node(Path(workdir) / ("images-%s" % label), registry)
        try:
            output = node.workdir / "out"
            node.tool("run", "--episode", episode, "--tasks", str(tasks), "--runtime", "runc", "--allow-large",
                      "--quiet", "--output", str(output), *extra, *TIMEOUT)
            if label == "rounds":
                for number in (1, 2):
                    results = json.loads((output / ("round-%d" % number) / "results.json").read_text())
                    assert results["successful_episodes"] == size, results["successful_episodes"]
                    rows["round_%d" % number] = {"all_rewards": results["batch_to_all_rewards_seconds"],
                                                 "by_image": image_figures(results, images)}
            else:
                results = json.loads((output / "results.json").read_text())
                prewarm = json.loads((output / "prewarm" / "prewarm.json").read_text())
                rows["prewarm"] = {"pulls": prewarm["pulls"], "all_rewards": results["batch_to_all_rewards_seconds"],
                                   "measured": {key: results["image_pulls"][key] for key in ("pulled", "cached")}}
            node.tool("cleanup", str(output))
        finally:
            node.stop()
    return {"case": "images", "images": count, "size": size, **rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", type=int, nargs="*", default=[10, 50])
    parser.add_argument("--runtimes", nargs="*", default=["runc", "gvisor"])
    parser.add_argument("--warm", type=int, nargs="*", default=[16])  # a pool must fit the node at once (2 CPUs: 19)
    parser.add_argument("--compare", type=int, nargs="*", default=[10, 3], metavar="N ROUNDS")
    parser.add_argument("--images", type=int, nargs="*", default=[3, 12], metavar="K N")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=str(ROOT), capture_output=True,
                            text=True).stdout.strip()
    cases = []
    with tempfile.TemporaryDirectory(prefix="rlbd-realnode-bench-") as workdir:
        registry = Registry(Path(workdir) / "registry", realnode_build.ensure_built())
        try:
            registry.start().push_built()
            plan = [(job_case, runtime, size) for size in args.job for runtime in args.runtimes]
            plan += [(warm_case, size) for size in args.warm]
            if len(args.compare) == 2:
                plan.append((compare_case, *args.compare))
            if len(args.images) == 2:
                plan.append((images_case, *args.images))
            for case, *values in plan:
                started = time.monotonic()
                try:
                    figures = case(*values, workdir, registry)
                except Exception as failure:  # a case that fails is reported; the others still run
                    figures = {"case": case.__name__, "values": values, "error": str(failure)}
                figures["case_seconds"] = round(time.monotonic() - started, 1)
                cases.append(figures)
                print(json.dumps(figures), flush=True)
        finally:
            registry.stop()
    node_info = {"cores": __import__("os").cpu_count(), "kernel": __import__("os").uname().release}
    print(json.dumps({"commit": commit, "node": "real node: kubelet v1.36.3, containerd v2.4.2, runc v1.5.3, "
                      "runsc (systrap) on this machine", "machine": node_info, "cases": cases}, indent=2))


if __name__ == "__main__":
    main()
