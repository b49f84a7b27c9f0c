#!/usr/bin/env python3
"""The tutorial's way of running and collecting a batch, for benchmarks/collection.py only.

It follows the tutorial's script step for step (../shared/seed: `run`): receipt, RuntimeClass
check, namespace, ConfigMap, Job; then poll `get job` every second until Complete or
Failed; one `get pods`; `get events`; one `kubectl logs POD` per episode with four worker
threads; validate from the logs; write results.json. Two things differ, both to measure
only the collection: the manifests are rl-batch-demo's (the same pod), and the tutorial's
20-episode bound is lifted. Not a supported tool: no cleanup, no safety checks.

Usage: tutorial_approach.py run --count N --output DIR
"""

import argparse
import concurrent.futures
import json
from pathlib import Path
import subprocess
import sys
import time
import uuid

ROOT = Path(__file__).resolve().parent.parent


def load_tool():
    """The tool as a module (rl_batch_demo.py is a symlink to rl-batch-demo.py)."""
    sys.path.insert(0, str(ROOT))
    import rl_batch_demo
    return rl_batch_demo


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["run"])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    tool = load_tool()
    output = Path(args.output)
    context = subprocess.check_output(["kubectl", "config", "current-context"], text=True).strip()

    def kubectl(*parts, data=None):
        return subprocess.check_output(["kubectl", "--context", context, "--request-timeout=30s", *parts],
                                       input=json.dumps(data) if data is not None else None, text=True, timeout=60)

    def create(obj):
        return json.loads(kubectl("create", "-f", "-", "-o", "json", data=obj))

    output.mkdir(parents=True, exist_ok=False)
    run_id = uuid.uuid4().hex[:12]
    namespace = "agc-rl-" + run_id
    (output / "receipt.json").write_text(json.dumps({"context": context, "namespace": namespace, "run_id": run_id}))
    kubectl("get", "runtimeclass", tool.DEFAULT_RUNTIME)
    create(tool.namespace_manifest(namespace, run_id))
    create(tool.configmap_manifest(namespace, run_id))
    job = tool.job_manifest(namespace, run_id, args.count, args.count, tool.DEFAULT_IMAGE, tool.DEFAULT_RUNTIME,
                            deadline=tool.default_deadline(args.count, args.count))
    start = time.monotonic()
    create(job)
    while True:  # the tutorial's one-second poll
        live = json.loads(kubectl("-n", namespace, "get", "job", "rollout", "-o", "json"))
        conditions = {c["type"]: c["status"] for c in live.get("status", {}).get("conditions", [])}
        if conditions.get("Complete") == "True" or conditions.get("Failed") == "True":
            break
        time.sleep(1)
    observed = time.monotonic() - start
    pods = json.loads(kubectl("-n", namespace, "get", "pods", "-l", "job-name=rollout", "-o", "json"))["items"]
    (output / "job.json").write_text(json.dumps(live, indent=2))
    (output / "pods.json").write_text(json.dumps(pods, indent=2))
    (output / "events.txt").write_text(kubectl("-n", namespace, "get", "events",
                                               "--sort-by=.metadata.creationTimestamp"))

    def get_log(pod):
        name = pod["metadata"]["name"]
        try:
            log = kubectl("-n", namespace, "logs", name, "-c", "episode")
        except subprocess.SubprocessError:
            log = ""
        (output / (name + ".log")).write_text(log)
        return log

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        logs = list(pool.map(get_log, pods))
    if conditions.get("Complete") != "True":
        raise SystemExit("Job failed or timed out")
    for pod in pods:  # validate from the logs, as the tutorial does
        pod["status"]["containerStatuses"][0]["state"]["terminated"].pop("message", None)
    report = tool.collect(pods, logs, live, args.count)
    report.update(context=context, namespace=namespace, client_job_complete_seconds=observed)
    (output / "results.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({key: value for key, value in report.items() if key != "pods"}, indent=2))


if __name__ == "__main__":
    main()
