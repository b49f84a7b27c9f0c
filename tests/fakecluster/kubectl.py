"""A fake `kubectl`: parses kubectl's command line, calls the simulated API server, and
prints what real kubectl prints (JSON with 4-space indent, tables, error lines, exit codes).

State directory: FAKE_K8S_DIR (kubeconfig.json names the contexts; server.json the port).
Only the verbs and flags rl-batch-demo and its tests use are implemented; anything else
fails loudly (exit 1, "fake kubectl: unsupported ...") so a gap is never silent.
"""

import datetime
import http.client
import random
import json
import os
from pathlib import Path
import re
import signal
import socket
import stat
import sys
import threading
import time

import wsproto
import wsproto.events

ALIASES = {
    "ns": "namespaces", "namespace": "namespaces", "namespaces": "namespaces",
    "po": "pods", "pod": "pods", "pods": "pods",
    "job": "jobs", "jobs": "jobs", "job.batch": "jobs", "jobs.batch": "jobs",
    "cm": "configmaps", "configmap": "configmaps", "configmaps": "configmaps",
    "ev": "events", "event": "events", "events": "events",
    "runtimeclass": "runtimeclasses", "runtimeclasses": "runtimeclasses",
    "runtimeclass.node.k8s.io": "runtimeclasses",
    "no": "nodes", "node": "nodes", "nodes": "nodes",
    "netpol": "networkpolicies", "networkpolicy": "networkpolicies", "networkpolicies": "networkpolicies",
    "deploy": "deployments", "deployment": "deployments", "deployments": "deployments",
    "deployment.apps": "deployments", "deployments.apps": "deployments",
}
# kubernetes-sigs/agent-sandbox CRDs: served only when installed (discovery decides).
CRD_ALIASES = {
    "sandbox": "sandboxes", "sandboxes": "sandboxes", "sandboxes.agents.x-k8s.io": "sandboxes",
    "sandboxtemplate": "sandboxtemplates", "sandboxtemplates": "sandboxtemplates",
    "sandboxtemplates.extensions.agents.x-k8s.io": "sandboxtemplates",
    "sandboxclaim": "sandboxclaims", "sandboxclaims": "sandboxclaims",
    "sandboxclaims.extensions.agents.x-k8s.io": "sandboxclaims",
    "swp": "sandboxwarmpools", "sandboxwarmpool": "sandboxwarmpools", "sandboxwarmpools": "sandboxwarmpools",
    "sandboxwarmpools.extensions.agents.x-k8s.io": "sandboxwarmpools",
    # kubernetes-sigs/kueue
    "localqueue": "localqueues", "localqueues": "localqueues", "lq": "localqueues", "queue": "localqueues",
    "queues": "localqueues", "localqueues.kueue.x-k8s.io": "localqueues",
    "clusterqueue": "clusterqueues", "clusterqueues": "clusterqueues", "cq": "clusterqueues",
    "clusterqueues.kueue.x-k8s.io": "clusterqueues",
    "workload": "workloads", "workloads": "workloads", "kwl": "workloads", "workloads.kueue.x-k8s.io": "workloads",
    "resourceflavor": "resourceflavors", "resourceflavors": "resourceflavors", "rf": "resourceflavors",
    "resourceflavors.kueue.x-k8s.io": "resourceflavors",
    "cohort": "cohorts", "cohorts": "cohorts", "cohorts.kueue.x-k8s.io": "cohorts",
}
CRD_GROUPS = {"sandboxes": "agents.x-k8s.io", "sandboxtemplates": "extensions.agents.x-k8s.io",
              "sandboxclaims": "extensions.agents.x-k8s.io", "sandboxwarmpools": "extensions.agents.x-k8s.io",
              "localqueues": "kueue.x-k8s.io", "clusterqueues": "kueue.x-k8s.io", "workloads": "kueue.x-k8s.io",
              "resourceflavors": "kueue.x-k8s.io", "cohorts": "kueue.x-k8s.io"}
KIND_TO_RESOURCE = {"Namespace": "namespaces", "Pod": "pods", "Job": "jobs", "ConfigMap": "configmaps",
                    "Event": "events", "RuntimeClass": "runtimeclasses", "Node": "nodes",
                    "NetworkPolicy": "networkpolicies", "Deployment": "deployments", "Sandbox": "sandboxes",
                    "SandboxTemplate": "sandboxtemplates", "SandboxClaim": "sandboxclaims",
                    "SandboxWarmPool": "sandboxwarmpools", "LocalQueue": "localqueues",
                    "ClusterQueue": "clusterqueues", "Workload": "workloads", "ResourceFlavor": "resourceflavors",
                    "Cohort": "cohorts"}
GROUP = {"jobs": ".batch", "runtimeclasses": ".node.k8s.io", "networkpolicies": ".networking.k8s.io",
         "deployments": ".apps", **{resource: "." + group for resource, group in CRD_GROUPS.items()}}
SINGULAR = {"namespaces": "namespace", "pods": "pod", "jobs": "job", "configmaps": "configmap",
            "events": "event", "runtimeclasses": "runtimeclass", "nodes": "node",
            "networkpolicies": "networkpolicy", "deployments": "deployment", "sandboxes": "sandbox",
            "sandboxtemplates": "sandboxtemplate", "sandboxclaims": "sandboxclaim",
            "sandboxwarmpools": "sandboxwarmpool", "localqueues": "localqueue", "clusterqueues": "clusterqueue",
            "workloads": "workload", "resourceflavors": "resourceflavor", "cohorts": "cohort"}
CLUSTER_SCOPED = ("namespaces", "nodes", "runtimeclasses", "clusterqueues", "resourceflavors", "cohorts")
VALUE_FLAGS = {"-n", "--namespace", "--context", "--request-timeout", "-o", "--output", "-l",
               "--selector", "-f", "--filename", "-c", "--container", "--cascade", "--wait",
               "--sort-by", "--kubeconfig", "--field-selector", "--unix-socket", "-u", "--accept-paths",
               "--reject-paths", "--accept-hosts", "--reject-methods", "--port", "-p", "--address", "--api-prefix"}


class Failure(Exception):
    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


def parse(argv):
    """Split kubectl's argv into positionals and flags (global flags may appear anywhere)."""
    positionals, flags = [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # the rest is the command of `exec`
            flags["--"] = argv[i + 1:]
            break
        if arg.startswith("-") and arg != "-":
            if positionals[:1] == ["logs"] and arg in ("-f", "--follow"):
                key, value = "--follow", "true"  # for `logs`, -f is --follow, not --filename
            elif "=" in arg:
                key, value = arg.split("=", 1)
            elif arg in VALUE_FLAGS:
                if i + 1 >= len(argv):
                    raise Failure("error: flag needs an argument: %s" % arg)
                key, value = arg, argv[i + 1]
                i += 1
            else:
                key, value = arg, "true"
            flags[{"--namespace": "-n", "--output": "-o", "--selector": "-l", "--filename": "-f",
                   "--container": "-c"}.get(key, key)] = value
        else:
            positionals.append(arg)
        i += 1
    return positionals, flags


def state_dir():
    path = os.environ.get("FAKE_K8S_DIR")
    if not path:
        raise Failure("fake kubectl: FAKE_K8S_DIR is not set")
    return Path(path)


def kubeconfig():
    path = state_dir() / "kubeconfig.json"
    return json.loads(path.read_text()) if path.exists() else {"contexts": [], "current-context": ""}


class ClientThrottle:
    """client-go's default client-side limit, as the real kubectl has it: a token bucket of 5
    requests a second with a burst of 10 (k8s.io/client-go rest/config.go DefaultQPS, DefaultBurst),
    discovery apart (kubectl lifts it to 50/300 for discovery, pkg/cmd/cmd.go). A wait of more than a
    second is logged as client-go logs it, at most once every 10 s (request.go)."""

    def __init__(self, qps=5.0, burst=10):
        self.qps, self.tokens, self.last, self.logged = qps, float(burst), time.monotonic(), 0.0
        self.burst = burst

    def take(self, request, count=1):
        """`count` requests sent together (a `logs -l` of N pods): the last waits for its token."""
        if self.qps is None:  # `kubectl proxy`: proxied requests are not limited
            return
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
        self.last = now
        wait = max(0.0, (count - self.tokens) / self.qps)
        if wait:
            time.sleep(wait)
            self.last = time.monotonic()
        self.tokens = max(0.0, self.tokens - count) if not wait else 0.0
        if wait > 1.0 and time.monotonic() - self.logged >= 10.0:
            self.logged = time.monotonic()
            sys.stderr.write("I%s %7d request.go:729] Waited for %.2fs due to client-side throttling, not "
                             "priority and fairness, request: %s:%s\n" % (
                                 time.strftime("%m%d %H:%M:%S.000000"), os.getpid(), wait,
                                 "GET" if request["verb"] in ("get", "list", "logs", "logs_many", "watch")
                                 else request["verb"].upper(), request.get("resource") or request["verb"]))
            sys.stderr.flush()


THROTTLE = ClientThrottle()
UNTHROTTLED_VERBS = ("discovery", "config", "version")


def call(request, timeout):
    if request["verb"] not in UNTHROTTLED_VERBS:
        # a `logs -l` of N pods makes N log requests on one bucket
        THROTTLE.take(request, len(request.get("names") or ()) or 1)
    info = json.loads((state_dir() / "server.json").read_text())
    host = "127.0.0.1:%d" % info["port"]
    connection = http.client.HTTPConnection("127.0.0.1", info["port"], timeout=timeout)
    try:
        body = json.dumps(request)
        connection.request("POST", "/rpc", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = json.loads(response.read())
    except (ConnectionRefusedError, socket.timeout, OSError) as error:
        if isinstance(error, socket.timeout):
            raise Failure("Unable to connect to the server: net/http: request canceled (Client.Timeout "
                          "exceeded while awaiting headers)")
        raise Failure("The connection to the server %s was refused - did you specify the right host or "
                      "port?" % host)
    finally:
        connection.close()
    if response.status != 200:
        if data.get("reason") == "ConnectionRefused":  # the simulated API server is down (apiOutage)
            raise Failure("The connection to the server %s was refused - did you specify the right host or "
                          "port?" % host)
        raise ApiFailure(data)
    return data


TRANSPORT_REASON = "TransportError"  # the fake server's marker for a broken connection (no Status)


class ApiFailure(Failure):
    def __init__(self, status):
        self.status = status
        # kubectl's StandardErrorMessage: a Status without a reason prints no parentheses
        # ("Error from server: etcdserver: leader changed", ASSUMPTIONS.md fact 27).
        reason = " (%s)" % status["reason"] if status.get("reason") else ""
        if status.get("reason") == TRANSPORT_REASON:  # **unverified** wording for verbs other than create
            super().__init__("Unable to connect to the server: %s" % status["message"])
            return
        super().__init__("Error from server%s: %s" % (reason, status["message"]))


def ordered(obj):
    """kubectl decodes resources into unstructured maps, and Go's encoder sorts map keys: `get -o
    json` (and `get -w -o json`) prints keys sorted at every level (ASSUMPTIONS.md fact 1)."""
    return obj


def dump(obj):
    return json.dumps(obj, indent=4, sort_keys=True) + "\n"


def age(stamp):
    if not stamp:
        return "<unknown>"
    created = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    seconds = max(0, int(time.time() - created.timestamp()))
    if seconds < 120:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm" % (seconds // 60) if seconds >= 600 else "%dm%ds" % (seconds // 60, seconds % 60)
    return "%dh" % (seconds // 3600)


def table(rows):
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [str(cell).ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("   ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def row_for(resource, obj):
    meta = obj["metadata"]
    if resource == "runtimeclasses":
        return [meta["name"], obj.get("handler", ""), age(meta["creationTimestamp"])]
    if resource == "namespaces":
        return [meta["name"], obj.get("status", {}).get("phase", ""), age(meta["creationTimestamp"])]
    if resource == "nodes":
        return [meta["name"], "Ready", "<none>", age(meta["creationTimestamp"]),
                obj["status"]["nodeInfo"]["kubeletVersion"]]
    if resource == "jobs":
        status = obj.get("status", {})
        conditions = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        state = "Complete" if "Complete" in conditions else "Failed" if "Failed" in conditions else "Running"
        return [meta["name"], state, "%d/%d" % (status.get("succeeded", 0), obj["spec"]["completions"]),
                "-", age(meta["creationTimestamp"])]
    if resource == "pods":
        status = obj.get("status", {})
        containers = status.get("containerStatuses", [])
        ready = sum(1 for c in containers if c.get("ready"))
        shown = status.get("phase", "Pending")
        for c in containers:
            state = c.get("state", {})
            if "waiting" in state:
                shown = state["waiting"]["reason"]
            elif "terminated" in state:
                shown = state["terminated"]["reason"]
        if meta.get("deletionTimestamp"):
            shown = "Terminating"
        return [meta["name"], "%d/%d" % (ready, len(obj["spec"]["containers"])), shown,
                sum(c.get("restartCount", 0) for c in containers), age(meta["creationTimestamp"])]
    if resource == "events":
        involved = obj["involvedObject"]
        return [age(obj.get("lastTimestamp")), obj["type"], obj["reason"],
                "%s/%s" % (involved["kind"].lower(), involved["name"]), obj["message"]]
    if resource == "configmaps":
        return [meta["name"], len(obj.get("data", {})), age(meta["creationTimestamp"])]
    if resource == "networkpolicies":
        return [meta["name"], "<none>", age(meta["creationTimestamp"])]
    if resource in CRD_GROUPS or resource == "deployments":
        return [meta["name"], age(meta["creationTimestamp"])]
    raise Failure("fake kubectl: no table for %s" % resource)


HEADERS = {
    "runtimeclasses": ["NAME", "HANDLER", "AGE"], "namespaces": ["NAME", "STATUS", "AGE"],
    "nodes": ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
    "jobs": ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"],
    "pods": ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
    "events": ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
    "configmaps": ["NAME", "DATA", "AGE"],
    "networkpolicies": ["NAME", "POD-SELECTOR", "AGE"],
    **{resource: ["NAME", "AGE"] for resource in list(CRD_GROUPS) + ["deployments"]},
}


def sort_key(path):
    parts = path.lstrip(".").split(".")

    def key(obj):
        value = obj
        for part in parts:
            value = value.get(part, "") if isinstance(value, dict) else ""
        return value or ""
    return key


def resource_name(token):
    if token in CRD_ALIASES and CRD_ALIASES[token] in call({"verb": "discovery"}, 30)["resources"]:
        return CRD_ALIASES[token]
    if token in ALIASES:
        return ALIASES[token]
    # RESOURCE[.GROUP] with the resource plural or singular, as kubectl's RESTMapper accepts it
    name, _, group = token.lower().partition(".")
    for resource in call({"verb": "discovery"}, 30)["resources"]:
        if name in (resource, SINGULAR.get(resource)) and GROUP.get(resource, "") == ("." + group if group else ""):
            return resource
    raise Failure('error: the server doesn\'t have a resource type "%s"' % token)


def cmd_get_many(kinds, flags, namespace, timeout, out):
    """`get KIND1,KIND2,... -o json`: one List of every kind's items. As kubectl's printGeneric
    (pkg/cmd/get/get.go, ContinueOnError), a kind that cannot be listed does not stop the others:
    their items are printed, then every error, and the exit code is 1."""
    if flags.get("-o") != "json":
        raise Failure("fake kubectl: `get KIND,KIND` is supported with -o json only")
    items, errors = [], []
    for kind in kinds:
        try:
            resource = resource_name(kind)
            items += call({"verb": "list", "resource": resource, "namespace": namespace,
                           "selector": flags.get("-l")}, timeout)["items"]
        except Failure as failure:
            errors.append(str(failure))
    out.write(dump({"apiVersion": "v1", "items": [ordered(o) for o in items], "kind": "List",
                    "metadata": {"resourceVersion": ""}}))
    out.flush()
    if errors:
        raise Failure("\n".join(errors))


def watch_stream(resource, name, flags, namespace, out, since, timeout):
    """`get -w -o json`: print each changed object as it changes, until the request timeout or
    until the server ends the watch. kubectl ignores the end of the stream and exits 0; an
    ERROR event's Status object is printed on stdout like any object (ASSUMPTIONS.md fact 25)."""
    ends = time.time() + timeout if flags.get("--request-timeout") not in (None, "0") else None
    started = time.time()
    while ends is None or time.time() < ends:
        answer = call({"verb": "watch", "resource": resource, "namespace": namespace, "name": name,
                       "selector": flags.get("-l"), "since": since, "started": started}, 60)
        for obj in answer["items"]:
            out.write(dump(ordered(obj)))
            if obj.get("kind") != "Status":
                since = max(int(since), int(obj["metadata"]["resourceVersion"]))
        out.flush()
        if answer.get("ended"):
            return


def cmd_get(positionals, flags, namespace, timeout, out):
    if "," in positionals[0]:
        return cmd_get_many(positionals[0].split(","), flags, namespace, timeout, out)
    resource = resource_name(positionals[0])
    name = positionals[1] if len(positionals) > 1 else None
    output = flags.get("-o")
    watching = flags.get("-w") == "true" or flags.get("--watch") == "true"
    if watching and output != "json":
        raise Failure("fake kubectl: only `get -w -o json` is supported")
    if watching:
        listed = call({"verb": "list", "resource": resource, "namespace": namespace,
                       "selector": flags.get("-l")}, timeout)
        objs = [o for o in listed["items"] if not name or o["metadata"]["name"] == name]
        if name and not objs:
            raise ApiFailure({"reason": "NotFound", "message": '%s%s "%s" not found'
                              % (resource, GROUP.get(resource, ""), name)})
        for obj in objs:
            out.write(dump(ordered(obj)))
        out.flush()
        watch_stream(resource, name, flags, namespace, out, listed["resourceVersion"], timeout)
        return
    if name:
        try:
            objs = [call({"verb": "get", "resource": resource, "namespace": namespace, "name": name}, timeout)]
        except ApiFailure as failure:
            if failure.status["reason"] == "NotFound" and flags.get("--ignore-not-found") == "true":
                return
            raise
    else:
        objs = call({"verb": "list", "resource": resource, "namespace": namespace,
                     "selector": flags.get("-l"), "fieldSelector": flags.get("--field-selector")},
                    timeout)["items"]
        if "--sort-by" in flags:
            objs.sort(key=sort_key(flags["--sort-by"]))
    if output == "json":
        if name:
            out.write(dump(ordered(objs[0])))
        else:
            out.write(dump({"apiVersion": "v1", "items": [ordered(o) for o in objs], "kind": "List",
                            "metadata": {"resourceVersion": ""}}))
    elif output == "name":
        for obj in objs:
            out.write("%s%s/%s\n" % (SINGULAR[resource], GROUP.get(resource, ""), obj["metadata"]["name"]))
    elif output in (None, "wide"):
        if not objs:
            where = (" in %s namespace" % namespace) if namespace and resource not in CLUSTER_SCOPED else ""
            sys.stderr.write("No resources found%s.\n" % where)
            return
        out.write(table([HEADERS[resource]] + [row_for(resource, o) for o in objs]))
    else:
        raise Failure("fake kubectl: unsupported output format %r" % output)


def cmd_create(positionals, flags, namespace, timeout, out, stdin_text):
    if flags.get("-f") != "-":
        raise Failure("fake kubectl: only `create -f -` is supported")
    try:
        body = json.loads(stdin_text)
    except ValueError as error:
        raise Failure("error: error parsing STDIN: %s" % error)
    objects = body["items"] if body.get("kind") == "List" else [body]
    errors = []
    for item in objects:
        resource = KIND_TO_RESOURCE.get(item.get("kind"))
        if resource in CRD_GROUPS and resource not in call({"verb": "discovery"}, timeout)["resources"]:
            # kubectl's RESTMapper finds no such kind (k8s.io/cli-runtime resource builder)
            raise Failure('error: resource mapping not found for name: "%s" namespace: "%s" from "STDIN": no matches '
                          'for kind "%s" in version "%s"\nensure CRDs are installed first' % (
                              item.get("metadata", {}).get("name"), item.get("metadata", {}).get("namespace", ""),
                              item.get("kind"), item.get("apiVersion")))
        if resource is None:
            raise Failure('error: resource mapping not found for name: "%s" namespace: "" from "STDIN": no matches '
                          'for kind "%s"' % (item.get("metadata", {}).get("name"), item.get("kind")))
        target_ns = item.get("metadata", {}).get("namespace") or namespace
        try:
            created = call({"verb": "create", "resource": resource, "namespace": target_ns, "body": item}, timeout)
        except ApiFailure as failure:
            if failure.status.get("reason") == TRANSPORT_REASON:
                # a transport error has no Status: kubectl names the request it was making
                path = "/api%s/%s%s" % ("s/" + item["apiVersion"] if "/" in item.get("apiVersion", "v1") else "/v1",
                                        "namespaces/%s/" % target_ns if resource not in ("namespaces",) else "",
                                        resource)
                errors.append('error: error when creating "STDIN": Post "https://127.0.0.1:6443%s?fieldManager='
                              'kubectl-create&fieldValidation=Strict": %s' % (path, failure.status["message"]))
                continue
            reason = " (%s)" % failure.status["reason"] if failure.status.get("reason") else ""
            errors.append('Error from server%s: error when creating "STDIN": %s' % (reason, failure.status["message"]))
            continue
        if flags.get("-o") == "json":
            out.write(dump(ordered(created)))
        else:
            out.write("%s%s/%s created\n" % (SINGULAR[resource], GROUP.get(resource, ""), created["metadata"]["name"]))
    if errors:
        raise Failure("\n".join(errors))


def cmd_delete(positionals, flags, namespace, timeout, out):
    resource = resource_name(positionals[0])
    cascade = flags.get("--cascade", "background")
    propagation = {"foreground": "Foreground", "background": "Background", "orphan": "Orphan",
                   "true": "Background"}.get(cascade)
    if propagation is None:
        raise Failure('error: invalid cascade value (%s). Must be "background", "foreground", or "orphan"'
                      % cascade)
    for name in positionals[1:]:
        try:
            call({"verb": "delete", "resource": resource, "namespace": namespace, "name": name,
                  "propagation": propagation}, timeout)
        except ApiFailure as failure:
            if failure.status["reason"] == "NotFound" and flags.get("--ignore-not-found") == "true":
                continue
            raise
        # kubectl >= 1.34 names the namespace of a namespaced object (kubernetes/kubernetes#126619)
        where = "" if resource in CLUSTER_SCOPED else " from %s namespace" % namespace
        out.write('%s%s "%s" deleted%s\n' % (SINGULAR[resource], GROUP.get(resource, ""), name, where))
        if flags.get("--wait", "true") == "true":
            while True:
                try:
                    call({"verb": "get", "resource": resource, "namespace": namespace, "name": name}, timeout)
                except ApiFailure:
                    break
                time.sleep(0.1)


def log_of(name, namespace, container, timeout):
    try:
        return call({"verb": "logs", "namespace": namespace, "name": name, "container": container}, timeout)["log"]
    except ApiFailure as failure:
        if failure.status["reason"] == "NotFound":
            # kubectl >= 1.29 wording (kubernetes/kubernetes#120111)
            raise Failure('error: error from server (NotFound): pods "%s" not found in namespace "%s"'
                          % (name, namespace))
        raise


def tail(text, lines):
    if lines < 0:
        return text
    kept = text.splitlines(keepends=True)
    return "".join(kept[-lines:]) if lines else ""


def cmd_logs(positionals, flags, namespace, timeout, out):
    """`kubectl logs POD` or `kubectl logs -l SELECTOR` (ASSUMPTIONS.md fact 32): with a selector
    --tail defaults to 10 and the pods are read one after another, unless -f: then every
    stream at once (at most --max-log-requests, default 5), lines of different pods
    interleaving; --prefix starts each write with `[pod/NAME/CONTAINER] `, and kubectl
    writes a prefix and its line in one write, so lines never interleave inside a line."""
    container = flags.get("-c")
    selector = flags.get("-l")
    if not selector:
        text = log_of(positionals[0], namespace, container, timeout)
        out.write(tail(text, int(flags.get("--tail", "-1"))))
        return
    pods = call({"verb": "list", "resource": "pods", "namespace": namespace, "selector": selector}, timeout)["items"]
    limit = int(flags.get("--max-log-requests", "5"))
    follow = flags.get("--follow") == "true"
    if follow and len(pods) > limit:
        raise Failure("error: you are attempting to follow %d log streams, but maximum allowed concurrency is %d, "
                      "use --max-log-requests to increase the limit" % (len(pods), limit))
    if follow and any(pod.get("status", {}).get("phase") not in ("Succeeded", "Failed") for pod in pods):
        raise Failure("fake kubectl: unsupported: following the log of a running container")
    lines_wanted = int(flags.get("--tail", "10"))

    def prefixed(pod, text):
        name = pod["metadata"]["name"]
        shown = container or pod["spec"]["containers"][0]["name"]
        prefix = "[pod/%s/%s] " % (name, shown) if flags.get("--prefix") == "true" else ""
        return [prefix + line for line in tail(text, lines_wanted).splitlines(keepends=True)]

    if not follow:
        for pod in pods:
            out.write("".join(prefixed(pod, log_of(pod["metadata"]["name"], namespace, container, timeout))))
        return
    # Every stream at once (kubectl's goroutines): the requests go together (one RPC to the
    # simulated server stands for kubectl's multiplexed HTTP/2 requests), and the lines of the
    # pods reach stdout interleaved, in an order no one chooses.
    answers = call({"verb": "logs_many", "namespace": namespace, "container": container,
                    "names": [pod["metadata"]["name"] for pod in pods]}, timeout)
    texts = []
    for pod in pods:
        answer = answers[pod["metadata"]["name"]]
        if "error" in answer:
            raise ApiFailure(answer["error"])
        texts.append(answer["log"])
    streams = [prefixed(pod, text)[::-1] for pod, text in zip(pods, texts)]
    live = [stream for stream in streams if stream]
    while live:
        index = random.randrange(len(live))
        out.write(live[index].pop())
        if not live[index]:
            live[index] = live[-1]
            live.pop()


def cmd_exec(positionals, flags, namespace, timeout, out):
    """`kubectl exec POD [-c C] [-i] -- COMMAND...`. kubectl reads the pod first and refuses a
    finished one (pkg/cmd/exec/exec.go); the remote command's exit code becomes kubectl's,
    after `command terminated with exit code N` on stderr (client-go CodeExitError, printed by
    cmdutil.CheckErr)."""
    command = flags.get("--")
    if not command:
        raise Failure("error: you must specify at least one command for the container")
    name = positionals[0]
    pod = call({"verb": "get", "resource": "pods", "namespace": namespace, "name": name}, timeout)
    phase = pod.get("status", {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        raise Failure("error: cannot exec into a container in a completed pod; current phase is %s" % phase)
    stdin = sys.stdin.read() if flags.get("-i") == "true" or flags.get("--stdin") == "true" else None
    try:
        answer = call({"verb": "exec", "namespace": namespace, "name": name, "container": flags.get("-c"),
                       "command": command, "stdin": stdin}, timeout)
    except ApiFailure as failure:
        if failure.status.get("reason") != "InternalError":
            raise
        # The stream upgrade's failure reaches kubectl as a plain error, not a Status: `error:
        # Internal error occurred: unable to upgrade connection: ...` (see ASSUMPTIONS.md).
        raise Failure("error: " + failure.status["message"])
    out.write(answer["stdout"])
    out.flush()
    sys.stderr.write(answer["stderr"])
    if answer["code"]:
        raise Failure("command terminated with exit code %d" % answer["code"], code=answer["code"])


def cmd_api_resources(flags, timeout, out):
    """`kubectl api-resources [--api-group=G] [--namespaced=true|false] [--verbs=list] -o name`:
    resource.group per line (every resource of the fake can be listed)."""
    if flags.get("-o") != "name":
        raise Failure("fake kubectl: only `api-resources -o name` is supported")
    wanted = flags.get("--api-group")
    namespaced = flags.get("--namespaced")
    for resource in call({"verb": "discovery"}, timeout)["resources"]:
        group = GROUP.get(resource, "").lstrip(".")
        if namespaced is not None and (resource not in CLUSTER_SCOPED) != (namespaced == "true"):
            continue
        if wanted is None or group == wanted:
            out.write(resource + ("." + group if group else "") + "\n")


def cmd_label(positionals, flags, namespace, timeout, out):
    resource = resource_name(positionals[0])
    name = positionals[1]
    labels = {}
    for item in positionals[2:]:
        if item.endswith("-"):
            labels[item[:-1]] = None
        else:
            key, value = item.split("=", 1)
            labels[key] = value
    call({"verb": "label", "resource": resource, "namespace": namespace, "name": name, "labels": labels,
          "overwrite": flags.get("--overwrite") == "true"}, timeout)
    out.write("%s%s/%s labeled\n" % (SINGULAR[resource], GROUP.get(resource, ""), name))


def cmd_version(flags, timeout, out):
    client = {"major": "1", "minor": "34", "gitVersion": "v1.34.3",
              "gitCommit": "df11db1c0f08fab3c0baee1e5ce6efbf816af7f1", "gitTreeState": "clean",
              "buildDate": "2025-12-09T15:06:39Z", "goVersion": "go1.24.11", "compiler": "gc",
              "platform": "linux/amd64"}
    result = {"clientVersion": client, "kustomizeVersion": "v5.7.1"}
    if flags.get("--client") != "true":
        server_version = call({"verb": "version"}, timeout)["gitVersion"]
        major, minor = server_version.lstrip("v").split(".")[:2]
        result["serverVersion"] = {"major": major, "minor": minor, "emulationMajor": major,
                                   "emulationMinor": minor, "minCompatibilityMajor": major,
                                   "minCompatibilityMinor": str(int(minor) - 1), "gitVersion": server_version,
                                   "gitCommit": client["gitCommit"], "gitTreeState": "clean",
                                   "buildDate": "2025-12-09T14:59:13Z", "goVersion": "go1.24.11",
                                   "compiler": "gc", "platform": "linux/amd64"}
    if flags.get("-o") == "json":
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        out.write("Client Version: %s\nKustomize Version: v5.7.1\n" % client["gitVersion"])
        if "serverVersion" in result:
            out.write("Server Version: %s\n" % result["serverVersion"]["gitVersion"])


def parse_timeout(value):
    if not value or value == "0":
        return 3600.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * units[unit]
    return float(value)


# ---------------------------------------------------------------- kubectl proxy (exec over WebSocket)
# kubernetes/kubectl pkg/proxy/proxy_server.go (commit dee3483a3d6a64c07fdf746caf80af446dee99ac):
# the filter rejects a request whose path matches --reject-paths or whose method matches
# --reject-methods, and accepts it
# only when its path matches --accept-paths and its Host --accept-hosts; otherwise 403 with the
# body "Forbidden\n" (http.Error). Each flag is a comma-separated list of regular expressions;
# the empty string is an empty list. ListenUnix removes a stale socket and listens with umask
# 0077; RunProxy prints "Starting to serve on <address>" on stdout. Upgrades (exec) are passed
# through to the API server (UpgradeAwareHandler).
PROXY_DEFAULTS = {"--accept-paths": "^.*", "--reject-paths": "^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach",
                  "--accept-hosts": "^localhost$,^127\\.0\\.0\\.1$,^\\[::1\\]$", "--reject-methods": "^$"}
# The remote-command subprotocols an API server of 1.30+ accepts for exec (v5 behind the
# TranslateStreamCloseWebsocketRequests gate, beta and on since 1.30), newest first.
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io",
                  "channel.k8s.io")
FRAME_CHUNK = 100000  # bytes of output per WebSocket message (simulated: 16- and 64-bit lengths both occur)


def regexps(value):
    return [re.compile(part) for part in value.split(",")] if value else []


def cluster_config():
    path = state_dir() / "cluster.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cmd_proxy(flags, out):
    """`kubectl proxy --unix-socket PATH [filter flags]`: serves until SIGTERM or SIGINT."""
    THROTTLE.qps = None  # what a proxy forwards is not limited (issue 31: 1,000 GETs in 1.88 s)
    behaviour = (cluster_config().get("kubectlProxy") or {})
    if behaviour.get("fails"):
        raise Failure(behaviour["fails"])  # e.g. an old or locked-down kubectl's own error line
    path = flags.get("--unix-socket") or flags.get("-u")
    if not path:
        raise Failure("fake kubectl: only `proxy --unix-socket PATH` is supported")
    if flags.get("--port") or flags.get("-p"):
        raise Failure("error: cannot set --unix-socket and --port at the same time")
    filters = {key: regexps(flags[key] if key in flags else default) for key, default in PROXY_DEFAULTS.items()}
    if flags.get("--disable-filter") == "true":
        filters = None
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.remove(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(path)
    except OSError as error:
        raise Failure("error: listen unix %s: bind: %s" % (path, error.strerror))
    finally:
        os.umask(old)
    listener.listen(4096)  # Go listens with the kernel's somaxconn
    out.write("Starting to serve on %s\n" % path)
    out.flush()

    def stop(*_):
        os._exit(0)  # as a Go program killed by a signal: the socket file stays behind
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=serve_proxied, args=(connection, filters, behaviour), daemon=True).start()


def read_request(connection):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return None
        data += chunk
    raw_head, body = data.split(b"\r\n\r\n", 1)
    head = raw_head.decode("latin-1").split("\r\n")
    method, target, _ = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    while len(body) < length:
        chunk = connection.recv(65536)
        if not chunk:
            break
        body += chunk
    return method, target, headers, body, raw_head + b"\r\n\r\n"


def http_answer(connection, code, reason, body, content_type="application/json"):
    payload = body.encode() if isinstance(body, str) else body
    connection.sendall(("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                        % (code, reason, content_type, len(payload))).encode() + payload)


def serve_proxied(connection, filters, behaviour):
    try:
        request = read_request(connection)
        if request is None:
            return
        method, target, headers, request_body, raw_head = request
        path = target.split("?", 1)[0]
        host = headers.get("host", "").rsplit(":", 1)[0] if not headers.get("host", "").startswith("[") \
            else headers["host"].split("]")[0] + "]"
        if filters is not None and (any(r.search(path) for r in filters["--reject-paths"]) or
                                    any(r.search(method) for r in filters["--reject-methods"]) or
                                    not (any(r.search(path) for r in filters["--accept-paths"]) and
                                         any(r.search(host) for r in filters["--accept-hosts"]))):
            http_answer(connection, 403, "Forbidden", "Forbidden\n", "text/plain; charset=utf-8")
            return
        exec_path = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/exec$", path)
        if not exec_path or headers.get("upgrade", "").lower() != "websocket":
            # as the real proxy: any other request goes to the API server, its answer back as it comes
            serve_forwarded(connection, raw_head, request_body)
            return
        serve_exec(connection, exec_path.group(1), exec_path.group(2), target, headers, behaviour, raw_head)
    except (OSError, ValueError):
        pass
    finally:
        try:
            connection.close()
        except OSError:
            pass


def serve_forwarded(connection, raw_head, body):
    """One request passed to the simulated cluster's HTTP API (httpapi.py, the one the real kubectl
    talks to) with `Connection: close`, and every byte of its answer relayed until the API server
    closes the connection (a watch's stream too), as the real proxy's reverse proxy does."""
    port = json.loads((state_dir() / "server.json").read_text())["api_port"]
    lines = [line for line in raw_head.decode("latin-1").split("\r\n") if line
             and not line.lower().startswith(("connection:", "host:"))]
    head = "\r\n".join(lines[:1] + ["Host: 127.0.0.1:%d" % port, "Connection: close"] + lines[1:]) + "\r\n\r\n"
    upstream = socket.create_connection(("127.0.0.1", port))
    try:
        upstream.sendall(head.encode("latin-1") + body)
        while True:
            chunk = upstream.recv(65536)
            if not chunk:
                return
            connection.sendall(chunk)
    finally:
        upstream.close()


def serve_exec(connection, namespace, name, target, headers, behaviour, raw_head):
    """The API server's WebSocket exec (remote command) for one request. The handshake and the
    framing are wsproto's (a test-only dependency), never the tool's own constants."""
    from urllib.parse import parse_qs, urlsplit
    query = parse_qs(urlsplit(target).query)
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    chosen = next((p for p in offered if p in EXEC_PROTOCOLS), None)
    if behaviour.get("refuseUpgrade") or chosen is None:
        # golang.org/x/net/websocket answers a failed handshake with 400 Bad Request.
        http_answer(connection, 400, "Bad Request", "requested protocol(s) are not supported: %s; supports %s"
                    % (offered, list(EXEC_PROTOCOLS) if not behaviour.get("refuseUpgrade") else []),
                    "text/plain; charset=utf-8")
        return
    try:
        pod = call({"verb": "get", "resource": "pods", "namespace": namespace, "name": name}, 30)
    except ApiFailure as failure:
        http_answer(connection, failure.status.get("code", 500), failure.status.get("reason", "Error"),
                    json.dumps(failure.status))
        return
    if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        # the kubelet cannot find a running container: the upgrade fails
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": 'Internal error occurred: unable to upgrade connection: container not found ("%s")'
                             % (query.get("container") or ["?"])[0], "reason": "InternalError", "code": 500}
        http_answer(connection, 500, "Internal Server Error", json.dumps(status))
        return
    with open(state_dir() / "proxied.jsonl", "a") as proxied:  # for tests: each exec the proxy carried
        proxied.write(json.dumps(["exec", name, "-c", (query.get("container") or [""])[0], "--",
                                  *(query.get("command") or [])]) + "\n")
    websocket = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
    websocket.receive_data(raw_head)
    if not any(isinstance(event, wsproto.events.Request) for event in websocket.events()):
        http_answer(connection, 400, "Bad Request", "not a WebSocket request", "text/plain; charset=utf-8")
        return
    handshake = websocket.send(wsproto.events.AcceptConnection(subprotocol=chosen))
    if behaviour.get("wrongAccept"):  # a broken server (or middlebox): the upgrade is answered wrongly
        handshake = re.sub(rb"(?i)(sec-websocket-accept: )[^\r]+", rb"\1AAAAAAAAAAAAAAAAAAAAAAAAAAA=", handshake)
    connection.sendall(handshake)
    try:
        answer = call({"verb": "exec", "namespace": namespace, "name": name,
                       "container": (query.get("container") or [None])[0], "command": query.get("command") or [],
                       "stdin": None}, 3600)
        from httpapi import remote_command_status  # the simulated API server's own answer
        status = remote_command_status(answer["code"], query.get("command") or [])
        streams = [(1, answer["stdout"].encode("utf-8", "surrogateescape")),
                   (2, answer["stderr"].encode("utf-8", "surrogateescape"))]
    except ApiFailure as failure:
        status, streams = dict(failure.status, metadata={}), []
    for channel, data in streams:
        for start in range(0, len(data), FRAME_CHUNK):
            connection.sendall(websocket.send(wsproto.events.BytesMessage(
                data=bytes([channel]) + data[start:start + FRAME_CHUNK])))
    connection.sendall(websocket.send(wsproto.events.BytesMessage(data=bytes([3]) + json.dumps(status).encode())))
    connection.sendall(websocket.send(wsproto.events.CloseConnection(code=1000)))


def main(argv):
    # kubectl writes a log or an exec's output as the bytes it got (not UTF-8 included)
    sys.stdout.reconfigure(errors="surrogateescape")
    sys.stderr.reconfigure(errors="surrogateescape")
    # A fixed delay per kubectl invocation models API latency and kubectl's own start-up (benchmarks).
    time.sleep(float(os.environ.get("FAKE_K8S_DELAY", "0") or 0))
    positionals, flags = parse(argv)
    config = kubeconfig()
    record = state_dir() / "calls.jsonl"
    with open(record, "a") as calls:
        calls.write(json.dumps(argv) + "\n")
    if positionals[:2] == ["config", "current-context"]:
        if not config.get("current-context"):
            raise Failure("error: current-context is not set")
        sys.stdout.write(config["current-context"] + "\n")
        return 0
    context = flags.get("--context") or config.get("current-context")
    if context and context not in config.get("contexts", []):
        raise Failure("Error in configuration: context was not found for specified context: %s" % context)
    if not context:
        # With no context at all kubectl falls back to localhost:8080 (ASSUMPTIONS.md fact 30).
        raise Failure("The connection to the server localhost:8080 was refused - did you specify the right "
                      "host or port?")
    timeout = parse_timeout(flags.get("--request-timeout"))
    namespace = "*" if flags.get("-A") == "true" or flags.get("--all-namespaces") == "true" else flags.get("-n", "default")
    verb, rest = (positionals[0], positionals[1:]) if positionals else (None, [])
    out = sys.stdout
    if verb == "get" and rest:
        cmd_get(rest, flags, namespace, timeout, out)
    elif verb == "create":
        cmd_create(rest, flags, namespace, timeout, out, sys.stdin.read())
    elif verb == "delete" and len(rest) >= 2:
        cmd_delete(rest, flags, namespace, timeout, out)
    elif verb == "logs" and (rest or "-l" in flags):
        cmd_logs(rest, flags, namespace, timeout, out)
    elif verb == "label" and len(rest) >= 3:
        cmd_label(rest, flags, namespace, timeout, out)
    elif verb == "version":
        cmd_version(flags, timeout, out)
    elif verb == "exec" and rest:
        cmd_exec(rest, flags, namespace, timeout, out)
    elif verb == "api-resources":
        cmd_api_resources(flags, timeout, out)
    elif verb == "proxy":
        cmd_proxy(flags, out)
    else:
        raise Failure("fake kubectl: unsupported command: %s" % " ".join(argv))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Failure as failure:
        sys.stdout.flush()
        sys.stderr.write(str(failure) + "\n")
        sys.exit(failure.code)
