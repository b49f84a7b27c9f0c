"""The simulated kube-scheduler: requests plus Pod overhead against allocatable, taints, node selectors; binds pending pods.

A mixin of server.Cluster: `self` is the cluster (its lock is held while controllers run).
"""

from api import now_rfc3339
from apitypes import parse_quantity, tolerates


class Scheduler:
    def pod_requests(self, pod):
        """Container requests plus Pod overhead: what the scheduler reserves for a pod."""
        cpu = memory = 0.0
        for container in pod["spec"].get("containers", []):
            requests = container.get("resources", {}).get("requests", {})
            cpu += parse_quantity(requests.get("cpu", 0))
            memory += parse_quantity(requests.get("memory", 0))
        overhead = pod["spec"].get("overhead", {})
        return cpu + parse_quantity(overhead.get("cpu", 0)), memory + parse_quantity(overhead.get("memory", 0))

    def node_fits(self, node, pod, reserved):
        """None when the pod fits the node, else the scheduler's reason for this node."""
        if node.get("spec", {}).get("unschedulable"):
            return "node(s) were unschedulable"
        for taint in node.get("spec", {}).get("taints", []):
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                    pod["spec"].get("tolerations"), taint):
                return "node(s) had untolerated taint {%s: %s}" % (taint["key"], taint.get("value", ""))
        labels = node["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in pod["spec"].get("nodeSelector", {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        cpu, memory = self.pod_requests(pod)
        used_cpu, used_memory, used_pods = reserved.get(node["metadata"]["name"], (0.0, 0.0, 0))
        allocatable = node["status"]["allocatable"]
        if used_pods + 1 > int(allocatable.get("pods", 110)):
            return "Too many pods"
        if used_cpu + cpu > parse_quantity(allocatable["cpu"]) + 1e-9:
            return "Insufficient cpu"
        if used_memory + memory > parse_quantity(allocatable["memory"]):
            return "Insufficient memory"
        return None

    def scheduler(self):
        nodes = self.items("nodes")
        reserved = {}  # node -> (cpu, memory, pods) held by its non-terminal pods
        pods = self.items("pods")
        for other in pods:
            if other["spec"].get("nodeName") and other["status"].get("phase") in ("Pending", "Running"):
                cpu, memory = self.pod_requests(other)
                used = reserved.get(other["spec"]["nodeName"], (0.0, 0.0, 0))
                reserved[other["spec"]["nodeName"]] = (used[0] + cpu, used[1] + memory, used[2] + 1)
        for pod in pods:
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            reasons = {n["metadata"]["name"]: self.node_fits(n, pod, reserved) for n in nodes}
            candidates = [n for n in nodes if reasons[n["metadata"]["name"]] is None]
            if not candidates:
                counts = {}
                for reason in reasons.values():
                    counts[reason] = counts.get(reason, 0) + 1
                message = "0/%d nodes are available: %s." % (len(nodes), ", ".join(
                    "%d %s" % (n, reason) for reason, n in sorted(counts.items())))
                if not any(c["type"] == "PodScheduled" for c in pod["status"].get("conditions", [])):
                    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                                    "lastProbeTime": None,
                                                    "lastTransitionTime": now_rfc3339(),
                                                    "reason": "Unschedulable", "message": message}]
                    self.put("pods", pod)
                    self.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
                continue
            if not self.client_call("scheduler"):
                break  # the binding is an API call: out of tokens, the rest on a later pass
            node = min(candidates, key=lambda n: (reserved.get(n["metadata"]["name"], (0, 0, 0))[2],
                                                  n["metadata"]["name"]))
            name = node["metadata"]["name"]
            cpu, memory = self.pod_requests(pod)
            used = reserved.get(name, (0.0, 0.0, 0))
            reserved[name] = (used[0] + cpu, used[1] + memory, used[2] + 1)
            pod["spec"]["nodeName"] = name
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": now_rfc3339()}]
            self.put("pods", pod)
            self.record_event(pod, "Normal", "Scheduled", "Successfully assigned %s/%s to %s" % (
                pod["metadata"]["namespace"], pod["metadata"]["name"], name), "default-scheduler")
