"""Watches: `kubectl get --watch` served from the cluster's history of writes, ended as a real
API server ends them (watchEnds in cluster.json)."""

import time

from api import ApiError, RESOURCES


def watch(cluster, request):
    """Objects changed (or deleted) after resourceVersion `since`, waiting up to 20 s for one."""
    resource, namespace = request["resource"], request.get("namespace")
    since = int(request.get("since") or 0)

    terms = [part.split("=", 1) for part in (request.get("selector") or "").split(",") if part]

    def matching():
        found = []
        for rv, res, obj, _ in reversed(cluster.history):
            if rv <= since:
                break
            meta = obj["metadata"]
            if res != resource or (RESOURCES[resource][2] and meta.get("namespace") != namespace):
                continue
            if request.get("name") and meta["name"] != request["name"]:
                continue
            if any(meta.get("labels", {}).get(key) != value for key, value in terms):
                continue
            found.append(obj)
        return found[::-1]

    deadline = time.time() + 20
    ends = cluster.config.get("watchEnds")
    end_at = request.get("started", time.time()) + ends["afterSeconds"] if ends else None
    if end_at is not None:
        deadline = min(deadline, end_at)
    with cluster.lock:
        items = matching()
        while not items and time.time() < deadline and not cluster.stop.is_set():
            cluster.changed.wait(timeout=max(0.0, min(0.5, deadline - time.time())))
            if cluster.in_outage():  # the API server went away: its open watches break
                raise ApiError(503, "ConnectionRefused", "connection refused")
            items = matching()
        answer = {"items": items, "resourceVersion": str(cluster.resource_version)}
        if end_at is not None and time.time() >= end_at:
            # The server ends the watch: silently, or with an ERROR event (fact 25).
            answer["ended"] = ends.get("with", "close")
            if answer["ended"] == "expired":
                answer["items"].append({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                        "message": "too old resource version: %d (%d)" % (
                                            since, cluster.resource_version), "reason": "Expired", "code": 410})
        return answer
