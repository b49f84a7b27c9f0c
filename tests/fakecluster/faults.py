"""Transient API failures configured in cluster.json (`transientFailures`): which request meets
one, and the Status it answers with. Shared by the simulated cluster's two front ends (the
HTTP API the real kubectl calls, httpapi.py, and the fake kubectl's RPC, server.py)."""

from api import ApiError, RESOURCES


FAULTS = {
    # kind: (HTTP code, Status reason, message); "" reason prints as `Error from server: ...`
    "internal": (500, "InternalError", 'an error on the server ("") has prevented the request from succeeding'),
    "timeout": (504, "Timeout", "the server was unable to return a response in the time allotted, but may still "
                                "be processing the request"),
    "etcd-leader-changed": (500, "", "etcdserver: leader changed"),
    "etcd-timeout": (500, "", "etcdserver: request timed out"),
    "etcd-too-many-requests": (429, "", "etcdserver: too many requests"),
    # API Priority and Fairness rejecting a request: text/plain, not a Status, with Retry-After
    # (k8s.io/apiserver v0.36.3 pkg/server/filters/priority-and-fairness.go, tooManyRequests)
    "too-many-requests": (429, "TooManyRequests", "Too many requests, please try again later."),
    # Not a Status: the connection broke before the answer (a load balancer, an API server
    # restart); kubectl prints the transport error (kubectl.py, TRANSPORT_REASON).
    "connection-lost": (502, "TransportError", "unexpected EOF"),
}


def inject_fault(cluster, request):
    """Transient failures configured in cluster.json (`transientFailures`), consumed in order:
    {"verb": "get", "resource": "jobs", "times": 2, "kind": "etcd-leader-changed",
     "afterCommit": false, "afterJobComplete": false}. afterCommit: a write is carried out and
    then answered with the error (the client cannot tell). afterJobComplete: armed only once a
    Job has its Complete or Failed condition. Kind "hang" with "seconds": the answer comes that
    late. Kind "hold" (always after the commit): the write is made and its answer held until the
    test writes `release-held` into the state folder, then the connection drops. Returns (kind,
    after_commit, seconds) or None."""
    for fault in cluster.faults:
        if fault.get("times", 0) <= 0 or fault.get("verb") not in (None, request["verb"]) or \
                fault.get("resource") not in (None, request.get("resource")):
            continue
        if fault.get("afterJobComplete") and not any(
                c.get("type") in ("Complete", "Failed") for job in cluster.items("jobs")
                for c in job.get("status", {}).get("conditions", [])):
            continue
        fault["times"] -= 1
        kind = fault.get("kind", "internal")
        if kind == "timeout-after-commit":  # the original spelling
            return "timeout", True, 0
        if kind == "hold":
            return "hold", True, 0
        return kind, bool(fault.get("afterCommit")), fault.get("seconds", 0)
    return None


def fault_error(kind, request):
    code, reason, message = FAULTS[kind]
    if kind == "timeout" and request.get("resource"):
        message += " (%s %s%s)" % ({"create": "post", "delete": "delete"}.get(request["verb"], "get"),
                                   request["resource"], RESOURCES[request["resource"]][3])
    return ApiError(code, reason, message)


# The API server's listener is down: not a Status. The fake kubectl prints what kubectl prints
# when its TCP connection is refused (kubectl.py, call()).
CONNECTION_REFUSED = "ConnectionRefused"
