"""The simulated cluster's Kubernetes HTTP API: what the real kubectl (and a real `kubectl proxy`
in front of it) sends, answered from the cluster's state.

Its protocol layers are well-kept libraries, test-only dependencies, never code or constants of
the tool: h11 parses and writes HTTP/1.1, wsproto frames the exec WebSocket and computes its
handshake. Served (found by logging what the real kubectl v1.32.4 asks for, ASSUMPTIONS.md
"The HTTP API"): /version; legacy discovery (/api, /apis, each group version); get, list (label
and field selectors, limit/continue), watch (chunked JSON events; watches the server ends, 410
ERROR events), create, delete (and deletecollection), patch (merge and strategic merge on
metadata, JSON patch) of every kind the cluster serves, with the API server's Status bodies and
codes; tables (`as=Table`) for human output; pods/log (follow, tailLines, limitBytes,
timestamps, previous); pods/exec over WebSocket (v5.channel.k8s.io, v4.channel.k8s.io).

Faults live here, at the HTTP layer, so that kubectl prints its own messages: transient Status
errors (faults.py), a connection dropped before the answer, slow answers, and outages in which
the listener is closed (connections refused) and every open stream is cut.
"""

import base64
import datetime
import io
import json
from pathlib import Path
import re
import socket
import threading
import time
import urllib.parse

import h11
import wsproto.connection
import wsproto.events
import wsproto.utilities

from api import ApiError, RESOURCES
from faults import fault_error, inject_fault


# What discovery says of each kind beyond RESOURCES (the real API server's definitions and the
# CRDs' `names`): singular name and short names.
SHORT_NAMES = {"namespaces": ["ns"], "nodes": ["no"], "configmaps": ["cm"], "pods": ["po"], "events": ["ev"],
               "networkpolicies": ["netpol"], "deployments": ["deploy"], "localqueues": ["queue", "queues", "lq"],
               "clusterqueues": ["cq"], "workloads": ["wl"], "resourceflavors": ["flavor", "flavors", "rf"]}
SINGULAR = {"namespaces": "namespace", "nodes": "node", "configmaps": "configmap", "pods": "pod", "events": "event",
            "jobs": "job", "runtimeclasses": "runtimeclass", "networkpolicies": "networkpolicy",
            "deployments": "deployment", "sandboxes": "sandbox", "sandboxtemplates": "sandboxtemplate",
            "sandboxclaims": "sandboxclaim", "sandboxwarmpools": "sandboxwarmpool", "localqueues": "localqueue",
            "clusterqueues": "clusterqueue", "workloads": "workload", "resourceflavors": "resourceflavor",
            "cohorts": "cohort"}
SUBRESOURCES = {"pods": ["log", "exec", "status", "eviction"], "jobs": ["status"], "namespaces": ["status", "finalize"],
                "deployments": ["status", "scale"]}
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
BUILT_IN_GROUPS = ("", "batch", "apps", "node.k8s.io", "networking.k8s.io")
EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")


def group_version(resource):
    api_version = RESOURCES[resource][0]
    return ("", api_version) if "/" not in api_version else tuple(api_version.split("/", 1))


def status_body(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


class Abort(Exception):
    """Drop the connection without an answer (a connection lost before the answer)."""


# ---------------------------------------------------------------- label selectors (apimachinery labels.Parse)

def split_terms(text):
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return [term.strip() for term in terms if term.strip()]


def label_matcher(text):
    """A predicate over a labels map for a selector: =, ==, !=, in, notin, key, !key."""
    tests = []
    for term in split_terms(text or ""):
        match = re.match(r"^(\S+)\s+(in|notin)\s*\((.*)\)$", term)
        if match:
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            if op == "in":
                tests.append(lambda labels, k=key, v=values: labels.get(k) in v)
            else:
                tests.append(lambda labels, k=key, v=values: labels.get(k) not in v)
        elif term.startswith("!"):
            tests.append(lambda labels, k=term[1:].strip(): k not in labels)
        elif "!=" in term:
            key, value = (part.strip() for part in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (part.strip() for part in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        else:
            tests.append(lambda labels, k=term: k in labels)
    return lambda labels: all(test(labels or {}) for test in tests)


def field_matcher(text):
    """metadata.name/metadata.namespace terms (what watches and kubectl's waits use)."""
    terms = []
    for term in split_terms(text or ""):
        negated = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        terms.append((key.strip(), value.strip(), negated))

    def matches(obj):
        for key, value, negated in terms:
            if key in ("metadata.name", "metadata.namespace"):
                actual = obj["metadata"].get(key.split(".", 1)[1], "")
                if (actual == value) == negated:
                    return False
        return True
    return matches


# ---------------------------------------------------------------- tables (the API server's printers)

def age(stamp):
    """The API server's translateTimestampSince (duration.HumanDuration)."""
    if not stamp:
        return "<unknown>"
    created = datetime.datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    seconds = max(0, int(time.time() - created.timestamp()))
    if seconds < 120:
        return "%ds" % seconds
    minutes = seconds // 60
    if minutes < 10:
        return "%dm%ds" % (minutes, seconds % 60) if seconds % 60 else "%dm" % minutes
    if minutes < 180:
        return "%dm" % minutes
    hours = seconds // 3600
    return "%dh" % hours if hours < 48 else "%dd" % (hours // 24)


def table_columns(resource):
    return {
        "runtimeclasses": ["Name", "Handler", "Age"], "namespaces": ["Name", "Status", "Age"],
        "nodes": ["Name", "Status", "Roles", "Age", "Version"],
        "jobs": ["Name", "Status", "Completions", "Duration", "Age"],
        "pods": ["Name", "Ready", "Status", "Restarts", "Age"],
        "events": ["Last Seen", "Type", "Reason", "Object", "Message"],
        "configmaps": ["Name", "Data", "Age"], "networkpolicies": ["Name", "Pod-Selector", "Age"],
    }.get(resource, ["Name", "Age"])


def table_row(resource, obj):
    meta = obj["metadata"]
    created = meta.get("creationTimestamp")
    if resource == "runtimeclasses":
        return [meta["name"], obj.get("handler", ""), age(created)]
    if resource == "namespaces":
        return [meta["name"], obj.get("status", {}).get("phase", ""), age(created)]
    if resource == "nodes":
        return [meta["name"], "Ready", "<none>", age(created), obj["status"]["nodeInfo"]["kubeletVersion"]]
    if resource == "jobs":
        status = obj.get("status", {})
        conditions = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        state = "Complete" if "Complete" in conditions else "Failed" if "Failed" in conditions else \
            "Suspended" if obj["spec"].get("suspend") else "Running"
        return [meta["name"], state, "%d/%d" % (status.get("succeeded", 0), obj["spec"].get("completions") or 1),
                "", age(created)]
    if resource == "pods":
        status = obj.get("status", {})
        containers = status.get("containerStatuses", [])
        ready = sum(1 for c in containers if c.get("ready"))
        shown = status.get("reason") or status.get("phase", "Pending")
        for c in containers:
            state = c.get("state", {})
            if "waiting" in state:
                shown = state["waiting"].get("reason", shown)
            elif "terminated" in state:
                shown = state["terminated"].get("reason", shown)
        if meta.get("deletionTimestamp"):
            shown = "Terminating"
        return [meta["name"], "%d/%d" % (ready, len(obj["spec"]["containers"])), shown,
                sum(c.get("restartCount", 0) for c in containers), age(created)]
    if resource == "events":
        involved = obj.get("involvedObject", {})
        return [age(obj.get("lastTimestamp") or obj.get("eventTime")), obj.get("type", ""), obj.get("reason", ""),
                "%s/%s" % (involved.get("kind", "").lower(), involved.get("name", "")), obj.get("message", "")]
    if resource == "configmaps":
        return [meta["name"], len(obj.get("data", {})), age(created)]
    if resource == "networkpolicies":
        return [meta["name"], "<none>", age(created)]
    return [meta["name"], age(created)]


def as_table(resource, objects, resource_version, include_object):
    def embedded(obj):
        if include_object == "Object":
            return obj
        return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    columns = [{"name": name, "type": "integer" if name == "Restarts" else "string",
                "format": "name" if name == "Name" else "", "description": "", "priority": 0}
               for name in table_columns(resource)]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns,
            "rows": [{"cells": table_row(resource, obj), "object": embedded(obj)} for obj in objects]}


# ---------------------------------------------------------------- patches

def merge_patch(target, patch):
    """RFC 7386 JSON merge patch (strategic merge patch treated alike: maps merge, lists replace)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target, operations):
    """RFC 6902, the operations kubectl sends (add, remove, replace, test)."""
    doc = json.loads(json.dumps(target))
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                del parent[int(last)]
            else:
                parent.pop(last, None)
        elif op["op"] == "test":
            value = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if value != op.get("value"):
                raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request")
    return doc


# ---------------------------------------------------------------- the server

class HttpApi:
    """The cluster's HTTP API on 127.0.0.1 (plain HTTP, any bearer token)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.lock = threading.Lock()
        self.connections = set()  # open client sockets, cut by an outage
        self.exec_processes = {}  # client socket: the processes exec'd for it, killed when it is cut
        self.listener = None
        self.port = None
        self.stopped = threading.Event()
        self.record_lock = threading.Lock()
        self.requests_log = open(Path(cluster.dir) / "requests.jsonl", "a")

    # -- listening, and outages (the listener closed: connections refused; open streams cut)

    def listen(self):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port or 0))
        listener.listen(1024)
        self.port = listener.getsockname()[1]
        self.listener = listener

    def start(self):
        self.listen()
        threading.Thread(target=self.accept_loop, daemon=True).start()
        threading.Thread(target=self.outage_loop, daemon=True).start()
        return self.port

    def accept_loop(self):
        while not self.stopped.is_set():
            listener = self.listener
            if listener is None:
                time.sleep(0.02)
                continue
            try:
                sock, _ = listener.accept()
            except OSError:
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.connections.add(sock)
            threading.Thread(target=self.serve_connection, args=(sock,), daemon=True).start()

    def outage_loop(self):
        while not self.stopped.wait(0.02):
            down = self.cluster.in_outage()
            if down and self.listener is not None:
                listener, self.listener = self.listener, None
                listener.close()
                self.cut_connections()
            elif not down and self.listener is None:
                try:
                    self.listen()
                except OSError:
                    pass  # the port is not free yet: try again next round

    def stop(self):
        self.stopped.set()
        if self.listener is not None:
            self.listener.close()
        self.cut_connections()

    def cut_connections(self):
        """Every open connection ends now (an outage, a stop): streams are cut, not finished, and
        each exec'd process whose stream is cut is killed, as the kubelet's runtime kills it when
        its stream ends (SIGKILL to that process alone: ASSUMPTIONS.md "Exec")."""
        with self.lock:
            for sock in list(self.connections):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                for process in self.exec_processes.pop(sock, ()):
                    if process.poll() is None:
                        process.kill()

    def exec_started(self, sock, process):
        """An exec'd process, killed if its client's connection is cut before it ends."""
        with self.lock:
            if sock in self.connections:
                self.exec_processes.setdefault(sock, []).append(process)
            elif process.poll() is None:
                process.kill()  # cut already

    # -- HTTP/1.1 with h11

    def serve_connection(self, sock):
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = self.next_event(conn, sock)
                if not isinstance(request, h11.Request):
                    return
                body = b""
                while True:
                    event = self.next_event(conn, sock)
                    if isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                keep = self.handle(conn, sock, request, body)
                if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (OSError, h11.ProtocolError, Abort):
            return
        finally:
            with self.lock:
                self.connections.discard(sock)
                self.exec_processes.pop(sock, None)
            try:
                sock.close()
            except OSError:
                pass

    @staticmethod
    def next_event(conn, sock):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = sock.recv(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            return event

    @staticmethod
    def send(conn, sock, *events):
        for event in events:
            data = conn.send(event)
            if data:
                sock.sendall(data)

    def answer(self, conn, sock, code, body, content_type="application/json", headers=()):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send(conn, sock, h11.Response(status_code=code, headers=[
            ("Content-Type", content_type), ("Content-Length", str(len(data))), ("Date", http_date()),
            *headers]), h11.Data(data=data), h11.EndOfMessage())
        return True

    def record(self, method, target, headers):
        entry = {"at": time.time(), "method": method, "target": target,
                 "agent": headers.get("user-agent", ""), "command": headers.get("kubectl-command", ""),
                 "session": headers.get("kubectl-session", "")}
        with self.record_lock:
            self.requests_log.write(json.dumps(entry) + "\n")
            self.requests_log.flush()

    def handle(self, conn, sock, request, body):
        method = request.method.decode()
        target = request.target.decode()
        headers = {k.decode().lower(): v.decode() for k, v in request.headers}
        url = urllib.parse.urlsplit(target)
        multi = urllib.parse.parse_qs(url.query, keep_blank_values=True)  # every value (exec's command)
        query = {key: values[-1] for key, values in multi.items()}
        path = url.path.rstrip("/") or "/"
        self.record(method, target, headers)
        latency = float(self.cluster.config.get("apiLatencySeconds") or 0)
        if latency:
            time.sleep(latency)
        try:
            if path == "/version":
                return self.answer(conn, sock, 200, self.version())
            discovery = self.discovery(path)
            if discovery is not None:
                return self.answer(conn, sock, 200, discovery)
            if path.startswith("/openapi/v3"):
                return self.answer(conn, sock, 200, self.openapi_v3(path))
            if path == "/openapi/v2":
                # kubectl validates a List (and kinds whose v3 says nothing) against OpenAPI v2, which
                # it reads as protobuf (gnostic openapi_v2.Document); a document without definitions
                # makes it skip every kind it finds no model for (kubectl validation.go). Field 1,
                # swagger = "2.0", is the whole document.
                return self.answer(conn, sock, 200, b"\x0a\x032.0",
                                   "application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
            if path.startswith("/openapi") or path in ("/", "/healthz", "/livez", "/readyz"):
                return self.answer(conn, sock, 404, b"404 page not found\n", "text/plain; charset=utf-8")
            resource, namespace, name, sub = self.parse_path(path)
            return self.serve_resource(conn, sock, method, resource, namespace, name, sub, query, multi, headers,
                                       body)
        except ApiError as error:
            if error.status.get("reason") == "TooManyRequests":  # APF's own answer: plain text (faults.py)
                return self.answer(conn, sock, 429, (error.status["message"] + "\n").encode(),
                                   "text/plain; charset=utf-8", headers=self.retry_after(429))
            return self.answer(conn, sock, error.status["code"], error.status,
                               headers=self.retry_after(error.status["code"]))

    @staticmethod
    def retry_after(code):
        return [("Retry-After", "1")] if code == 429 else []

    # -- discovery

    def version(self):
        git_version = self.cluster.config["kubernetesVersion"]
        major, minor = git_version.lstrip("v").split(".")[:2]
        return {"major": major, "minor": minor, "gitVersion": git_version,
                "gitCommit": "4cb5f07cd54f5e7a8b3a3bb7b5f8d06b2a1e5e10", "gitTreeState": "clean",
                "buildDate": "2025-04-22T16:00:00Z", "goVersion": "go1.23.8", "compiler": "gc",
                "platform": "linux/amd64"}

    def discovery(self, path):
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]}
        if path == "/apis":
            groups = {}
            for resource in self.cluster.discovery():
                group, version = group_version(resource)
                if group:
                    groups.setdefault(group, set()).add(version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": group, "versions": [{"groupVersion": "%s/%s" % (group, v), "version": v}
                                             for v in sorted(versions)],
                 "preferredVersion": {"groupVersion": "%s/%s" % (group, sorted(versions)[-1]),
                                      "version": sorted(versions)[-1]}}
                for group, versions in sorted(groups.items(), key=lambda g: (g[0] not in BUILT_IN_GROUPS, g[0]))]}
        match = re.match(r"^/api/(v1)$|^/apis/([^/]+)/([^/]+)$", path)
        if not match:
            return None
        group, version = ("", "v1") if match.group(1) else (match.group(2), match.group(3))
        resources = [r for r in self.cluster.discovery() if group_version(r) == (group, version)]
        if not resources:
            if match.group(1):
                return None
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        listed = []
        for resource in resources:
            _, kind, namespaced, _ = RESOURCES[resource]
            entry = {"name": resource, "singularName": SINGULAR.get(resource, ""), "namespaced": namespaced,
                     "kind": kind, "verbs": VERBS}
            if resource in SHORT_NAMES:
                entry["shortNames"] = SHORT_NAMES[resource]
            listed.append(entry)
            for sub in SUBRESOURCES.get(resource, []):
                listed.append({"name": "%s/%s" % (resource, sub), "singularName": "", "namespaced": namespaced,
                               "kind": "Status" if sub in ("log", "exec") else kind,
                               "verbs": ["get"] if sub in ("log", "exec") else ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "%s/%s" % (group, version) if group else version, "resources": listed}

    def openapi_v3(self, path):
        """Just enough OpenAPI v3 for kubectl's --validate=strict (the default): kubectl asks whether
        each kind's PATCH operation takes the `fieldValidation` query parameter (cli-runtime
        query_param_verifier_v3.go), and when it does leaves validation to the server."""
        served = self.cluster.discovery()
        versions = sorted({group_version(resource) for resource in served})

        def gv_path(group, version):
            return "api/%s" % version if not group else "apis/%s/%s" % (group, version)
        if path == "/openapi/v3":
            return {"paths": {gv_path(g, v): {"serverRelativeURL": "/openapi/v3/%s?hash=simulated%d"
                                              % (gv_path(g, v), len(served))} for g, v in versions}}
        wanted = path[len("/openapi/v3/"):]
        paths = {}
        for resource in served:
            group, version = group_version(resource)
            if gv_path(group, version) != wanted:
                continue
            scope = "/namespaces/{namespace}" if RESOURCES[resource][2] else ""
            paths["/%s%s/%s/{name}" % (gv_path(group, version), scope, resource)] = {"patch": {
                "x-kubernetes-group-version-kind": {"group": group, "version": version,
                                                    "kind": RESOURCES[resource][1]},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}}}}
        if not paths:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": self.version()["gitVersion"]},
                "paths": paths, "components": {}}

    # -- paths

    def parse_path(self, path):
        """(resource, namespace or None, name or None, subresource or None) of a REST path."""
        match = re.match(r"^/api/v1/(.*)$", path) or re.match(r"^/apis/[^/]+/[^/]+/(.*)$", path)
        not_found = ApiError(404, "NotFound", "the server could not find the requested resource")
        if not match:
            raise not_found
        prefix = path[:len(path) - len(match.group(1))].rstrip("/")
        api_version = "v1" if prefix == "/api/v1" else prefix[len("/apis/"):]
        parts = match.group(1).split("/")
        namespace = None
        if parts[0] == "namespaces" and len(parts) >= 3 and parts[2] not in ("status", "finalize"):
            namespace, parts = parts[1], parts[2:]
        resource = parts[0]
        if resource not in RESOURCES or RESOURCES[resource][0] != api_version or \
                resource not in self.cluster.discovery():
            raise not_found
        if namespace is not None and not RESOURCES[resource][2]:
            raise not_found
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        if len(parts) > 3 or (sub and sub not in SUBRESOURCES.get(resource, [])):
            raise not_found
        return resource, namespace, name, sub

    # -- the verbs

    def call(self, verb, resource, action, writes=False):
        """Run one API action with the configured faults of (verb, resource) around it."""
        request = {"verb": verb, "resource": resource}
        with self.cluster.lock:
            fault = inject_fault(self.cluster, request)
        if fault and fault[0] == "hang":
            time.sleep(fault[2])
            fault = None
        if fault and fault[0] == "connection-lost" and not fault[1]:
            raise Abort()
        if fault and not fault[1]:
            raise fault_error(fault[0], request)
        result = action()
        if fault and fault[0] == "hold":
            # After the commit, the answer is held until the test writes the file `release-held`
            # into the state folder (a signal can land while a create's answer is in flight, with
            # no clock between them); then the connection drops without an answer.
            while not (self.cluster.dir / "release-held").exists():
                time.sleep(0.05)
            raise Abort()
        if fault:  # after the commit: the change is made, the client hears an error
            if fault[0] == "connection-lost":
                raise Abort()
            raise fault_error(fault[0], request)
        return result

    def serve_resource(self, conn, sock, method, resource, namespace, name, sub, query, multi, headers, body):
        cluster = self.cluster
        wants_table = "as=Table" in headers.get("accept", "")
        if sub == "log":
            return self.serve_log(conn, sock, namespace, name, query)
        if sub == "exec":
            return self.serve_exec(conn, sock, namespace, name, query, multi, headers)
        if sub == "eviction" and method == "POST":
            return self.answer(conn, sock, 201, self.call("create", "pods", lambda: locked(
                cluster, cluster.api_evict, namespace, name)))
        if method == "GET" and name is None and query.get("watch") in ("true", "1"):
            return self.serve_watch(conn, sock, resource, namespace, query)
        if method == "GET" and name is None:
            return self.serve_list(conn, sock, resource, namespace, query, headers.get("accept", ""))
        if method == "GET":
            obj = self.call("get", resource, lambda: locked(cluster, cluster.api_get, resource, namespace, name))
            if wants_table:
                return self.answer(conn, sock, 200, as_table(resource, [obj], obj["metadata"]["resourceVersion"],
                                                             query.get("includeObject")))
            return self.answer(conn, sock, 200, obj)
        if method == "POST" and name is None:
            try:
                obj = json.loads(body or b"{}")
            except ValueError as error:
                raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: %s" % error)
            if query.get("dryRun") == "All":
                return self.answer(conn, sock, 201, obj)
            created = self.call("create", resource, lambda: locked(cluster, cluster.api_create, resource,
                                                                    namespace, obj))
            return self.answer(conn, sock, 201, created)
        if method == "DELETE":
            options = json.loads(body) if body.strip() else {}
            propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or "Background"
            if name is None:  # deletecollection
                def delete_all():
                    with cluster.lock:
                        cluster.check_rbac("deletecollection", resource, namespace)
                        matches = label_matcher(query.get("labelSelector"))
                        doomed = [o for o in cluster.api_list(resource, namespace if namespace else "*", None)
                                  if matches(o["metadata"].get("labels"))]
                        return [cluster.api_delete(resource, o["metadata"].get("namespace"), o["metadata"]["name"],
                                                   propagation) for o in doomed]
                deleted = self.call("delete", resource, delete_all)
                kind = RESOURCES[resource][1]
                return self.answer(conn, sock, 200, {"kind": kind + "List", "apiVersion": RESOURCES[resource][0],
                                                     "metadata": {}, "items": deleted})
            uid = (options.get("preconditions") or {}).get("uid")
            deleted = self.call("delete", resource, lambda: locked(cluster, cluster.api_delete, resource, namespace,
                                                                    name, propagation, uid))
            return self.answer(conn, sock, 200, deleted)
        if method == "PATCH" and name is not None:
            patch_type = headers.get("content-type", "")
            try:
                patch = json.loads(body or b"{}")
            except ValueError as error:
                raise ApiError(400, "BadRequest", "the body of the request was in an unknown format: %s" % error)

            def patched():
                with cluster.lock:
                    obj = cluster.api_get(resource, namespace, name)
                    if "json-patch" in patch_type:
                        new = json_patch(obj, patch)
                    elif "merge-patch" in patch_type:
                        new = merge_patch(obj, patch)
                    else:
                        raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                       "format - accepted media types include: application/json-patch+json, "
                                       "application/merge-patch+json, application/apply-patch+yaml")
                    for key in ("uid", "creationTimestamp", "namespace", "name", "resourceVersion"):
                        if key in obj["metadata"]:
                            new["metadata"][key] = obj["metadata"][key]
                    obj.clear()
                    obj.update(new)
                    cluster.put(resource, obj)
                    return obj
            return self.answer(conn, sock, 200, self.call("patch", resource, patched))
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def serve_list(self, conn, sock, resource, namespace, query, accept):
        cluster = self.cluster
        matches = label_matcher(query.get("labelSelector"))
        fields = query.get("fieldSelector") or ""
        api_fields = ",".join(t.replace("==", "=") for t in split_terms(fields) if "!=" not in t)

        def listed():
            with cluster.lock:
                items = cluster.api_list(resource, namespace if namespace is not None else "*", None, api_fields)
                return [o for o in items if matches(o["metadata"].get("labels"))
                        and field_matcher(fields)(o)], str(cluster.resource_version)
        items, resource_version = self.call("list", resource, listed)
        start = 0
        if query.get("continue"):
            try:
                token = json.loads(base64.b64decode(query["continue"]))
                start = int(token["start"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid: invalid continue token")
        limit = int(query.get("limit") or 0)
        page = items[start:start + limit] if limit else items[start:]
        meta = {"resourceVersion": resource_version}
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(json.dumps({"start": start + limit}).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        if "as=Table" in accept:
            table = as_table(resource, page, resource_version, query.get("includeObject"))
            table["metadata"].update(meta)
            return self.answer(conn, sock, 200, table)
        api_version, kind, _, _ = RESOURCES[resource]
        if "as=PartialObjectMetadataList" in accept:
            # metadata only, as a metadata informer asks for it
            return self.answer(conn, sock, 200, {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                                 "metadata": meta, "items": [
                {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
                for o in page]})
        built_in = group_version(resource)[0] in BUILT_IN_GROUPS
        shown = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} if built_in else o for o in page]
        return self.answer(conn, sock, 200, {"kind": kind + "List", "apiVersion": api_version, "metadata": meta,
                                             "items": shown})

    # -- watch: chunked JSON events from the cluster's history of writes

    def serve_watch(self, conn, sock, resource, namespace, query):
        cluster = self.cluster
        matches = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"))
        since = query.get("resourceVersion") or ""
        started = time.time()
        timeout = float(query.get("timeoutSeconds") or 0) or None
        ends = cluster.config.get("watchEnds")

        def wanted(res, obj):
            meta = obj["metadata"]
            return res == resource and (namespace is None or meta.get("namespace") == namespace) and \
                matches(meta.get("labels")) and fields(obj)

        self.call("watch", resource, lambda: locked(cluster, cluster.api_list, resource,
                                                     namespace if namespace is not None else "*", None))
        self.send(conn, sock, h11.Response(status_code=200, headers=[
            ("Content-Type", "application/json"), ("Transfer-Encoding", "chunked"), ("Date", http_date())]))

        def event(kind, obj):
            self.send(conn, sock, h11.Data(data=json.dumps({"type": kind, "object": obj}).encode() + b"\n"))

        if resource in (cluster.config.get("watchStalls") or ()):
            # a watch that stays open and delivers nothing (stuck behind a broken intermediary)
            while not self.stopped.wait(1.0) and not cluster.stop.is_set():
                pass
            return False

        with cluster.lock:
            if since in ("", "0"):  # every object as ADDED first
                for obj in cluster.api_list(resource, namespace if namespace is not None else "*", None):
                    if wanted(resource, obj):
                        event("ADDED", obj)
                position = len(cluster.history)
            else:
                rv = int(since)
                history = cluster.history
                if history and rv < history[0][0] - 1:
                    event("ERROR", status_body(410, "Expired", "too old resource version: %d (%d)"
                                               % (rv, history[0][0] - 1)))
                    self.send(conn, sock, h11.EndOfMessage())
                    return True
                position = first_after(history, rv)
        while not self.stopped.is_set() and not cluster.stop.is_set():
            if ends and time.time() >= started + ends["afterSeconds"]:
                if ends.get("with") == "expired":
                    event("ERROR", status_body(410, "Expired", "too old resource version: %s (%d)"
                                               % (since, cluster.resource_version)))
                break
            if timeout and time.time() >= started + timeout:
                break
            with cluster.lock:
                history = cluster.history
                if position > len(history) or (position < len(history) and position > 0 and
                                               history[position - 1][0] > history[position][0]):
                    position = len(history)  # trimmed under us: carry on from now
                fresh = history[position:]
                position = len(history)
                if not fresh:
                    cluster.changed.wait(0.5)
            for rv, res, obj, kind in fresh:
                if wanted(res, obj):
                    event(kind, obj)
                    since = str(rv)
        self.send(conn, sock, h11.EndOfMessage())
        return False  # a real server ends a watch with the response; the connection may go

    # -- pods/log

    def serve_log(self, conn, sock, namespace, name, query):
        cluster = self.cluster
        container = query.get("container")

        pod, chosen = self.call("logs", "pods", lambda: pod_container(cluster, namespace, name, container))
        if query.get("previous") == "true":
            raise ApiError(400, "BadRequest", 'previous terminated container "%s" in pod "%s" not found'
                           % (chosen, name))
        text = cluster.api_logs(namespace, name, chosen)
        tail = int(query.get("tailLines")) if query.get("tailLines") not in (None, "") else None
        limit = int(query.get("limitBytes")) if query.get("limitBytes") not in (None, "") else None
        stamps = query.get("timestamps") == "true"

        def shaped(chunk, first):
            lines = chunk.splitlines(keepends=True)
            if first and tail is not None:
                lines = lines[-tail:] if tail else []
            if stamps:
                stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                lines = ["%s %s" % (stamp, line) for line in lines]
            return "".join(lines).encode("utf-8", "surrogateescape")

        if query.get("follow") != "true":
            data = shaped(text, True)
            return self.answer(conn, sock, 200, data[:limit] if limit is not None else data,
                               "text/plain")
        self.send(conn, sock, h11.Response(status_code=200, headers=[
            ("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked"), ("Date", http_date())]))
        sent, first, written = 0, True, 0
        try:
            log, drop = cluster.api_log_file(namespace, name, chosen)
        except ApiError:
            log, drop = io.BytesIO(), 0  # the pod went meanwhile: the stream ends empty
        read = b""
        while True:
            done = self.container_done(namespace, name, chosen)
            read += log.read()  # to the end of what the container has written so far
            text = read.decode("utf-8", "surrogateescape")
            if drop:
                text = "".join(text.splitlines(keepends=True)[drop:])
            complete = text if done else text[:text.rfind("\n") + 1]
            if len(complete) > sent:
                data = shaped(complete[sent:], first)
                first = False
                sent = len(complete)
                if limit is not None:
                    data = data[:max(0, limit - written)]
                if data:
                    self.send(conn, sock, h11.Data(data=data))
                    written += len(data)
            if done or (limit is not None and written >= limit) or self.stopped.is_set():
                break
            self.stopped.wait(0.1)  # the kubelet's log is a file: read it again a moment later
        log.close()
        self.send(conn, sock, h11.EndOfMessage())
        return True

    def container_done(self, namespace, name, container):
        with self.cluster.lock:
            pod = self.cluster.get("pods", namespace, name)
            if pod is None or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return True
            for status in pod.get("status", {}).get("containerStatuses", []):
                if status.get("name") == container and "terminated" in status.get("state", {}):
                    return True
        return False

    # -- pods/exec over WebSocket

    def serve_exec(self, conn, sock, namespace, name, query, multi, headers):
        cluster = self.cluster
        behaviour = cluster.config.get("kubectlProxy") or {}
        container = query.get("container")
        command = multi.get("command") or []

        def located():
            # ExecREST.Connect -> pod.ExecLocation: the pod is read before any stream opens
            pod, chosen = pod_container(cluster, namespace, name, container)
            if not pod["spec"].get("nodeName"):
                raise ApiError(400, "BadRequest", "pod %s does not have a host assigned" % name)
            return chosen
        chosen = self.call("get", "pods", located)  # a read of the pod, which can meet etcd's errors
        if headers.get("upgrade", "").lower() != "websocket":
            # SPDY (kubectl's fallback) is not served: the upgrade is refused
            raise ApiError(400, "BadRequest", "Upgrade request required")
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        protocol = next((p for p in offered if p in EXEC_PROTOCOLS), None)
        if protocol is None or behaviour.get("refuseUpgrade"):
            # golang.org/x/net/websocket's handshake failure: 403, an empty body
            return self.answer(conn, sock, 403, b"", "text/plain; charset=utf-8")
        with open(Path(cluster.dir) / "execs.jsonl", "a") as execs:  # for tests: every exec the API carried
            execs.write(json.dumps(["exec", name, "-c", chosen, "--", *command]) + "\n")
        accept = wsproto.utilities.generate_accept_token(headers.get("sec-websocket-key", "").encode())
        if behaviour.get("wrongAccept"):
            accept = b"AAAAAAAAAAAAAAAAAAAAAAAAAAA="
        self.send(conn, sock, h11.InformationalResponse(status_code=101, headers=[
            ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Accept", accept),
            ("Sec-WebSocket-Protocol", protocol)]))
        websocket = wsproto.connection.Connection(wsproto.connection.ConnectionType.SERVER,
                                                  trailing_data=conn.trailing_data[0])
        stdin = None
        if query.get("stdin") == "true":
            stdin = self.read_stdin(websocket, sock, protocol)
        stall = exec_stalls(cluster, command)
        if stall is not None and not stall.get("stallAt"):
            hold_until_closed(cluster, sock)
            return False
        try:
            dial = kubelet_dial_failure(cluster, namespace, name, chosen)
            if dial is not None:
                if dial["started"]:
                    cluster.api_exec(namespace, name, chosen, command, stdin)  # it ran; its answer was lost
                failure = ApiError(500, "InternalError", "Internal error occurred: " + dial["error"])
                failure.status["details"] = {"causes": [{"message": dial["error"]}]}
                raise failure
            answer = cluster.api_exec(namespace, name, chosen, command, stdin,
                                      started=lambda process: self.exec_started(sock, process))
            status = remote_command_status(answer["code"], command)
            streams = [(1, answer["stdout"].encode("utf-8", "surrogateescape")),
                       (2, answer["stderr"].encode("utf-8", "surrogateescape"))]
        except ApiError as error:
            # the kubelet's refusal reaches the client on the error channel (the stream is open)
            status, streams = dict(error.status, metadata={}), []
        if stall is not None and streams:
            # the command's output up to the stall's text, then silence (what came after it hung)
            streams = [(channel, data.split(stall["stallAt"].encode(), 1)[0]) for channel, data in streams]
        for channel, data in streams:
            for start in range(0, len(data), 32768):
                sock.sendall(websocket.send(wsproto.events.BytesMessage(data=bytes([channel]) +
                                                                         data[start:start + 32768])))
        if stall is not None:
            hold_until_closed(cluster, sock)
            return False
        sock.sendall(websocket.send(wsproto.events.BytesMessage(data=bytes([3]) + json.dumps(status).encode())))
        sock.sendall(websocket.send(wsproto.events.CloseConnection(code=1000)))
        return False

    @staticmethod
    def read_stdin(websocket, sock, protocol):
        """Channel 0 until the v5 close signal for stdin (channel 255, [0]) or the client's close."""
        data = bytearray()
        sock.settimeout(60)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            websocket.receive_data(chunk)
            for event in websocket.events():
                if isinstance(event, wsproto.events.BytesMessage) and event.data:
                    if event.data[0] == 0:
                        data += event.data[1:]
                    elif event.data[0] == 255:
                        return data.decode("utf-8", "surrogateescape")
                elif isinstance(event, wsproto.events.CloseConnection):
                    return data.decode("utf-8", "surrogateescape")
            if protocol != "v5.channel.k8s.io" and data:
                return data.decode("utf-8", "surrogateescape")
        return data.decode("utf-8", "surrogateescape")


def remote_command_status(code, command):
    """The error channel's metav1.Status for a command that exited with `code` (the stream
    translator's, streamtranslator.go: NonZeroExitCode with an ExitCode cause; the message's
    wording after its prefix is **unverified**)."""
    if not code:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: error executing command [%s], exit code %d"
                       % (" ".join(command), code),
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def pod_container(cluster, namespace, name, container):
    """(pod, container name) for pods/log and pods/exec, refused as the API server words it."""
    with cluster.lock:
        pod = cluster.api_get("pods", namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        chosen = container or (names[0] if len(names) == 1 else None)
        if chosen is None:
            raise ApiError(400, "BadRequest", "a container name must be specified for pod %s, choose one of: [%s]"
                           % (name, " ".join(names)))
        if chosen not in names:
            raise ApiError(400, "BadRequest", "container %s is not valid for pod %s" % (chosen, name))
        return pod, chosen


def locked(cluster, function, *args):
    with cluster.lock:
        return function(*args)


def first_after(history, rv):
    """Index of the first history entry with a resourceVersion above rv (history is in rv order)."""
    low, high = 0, len(history)
    while low < high:
        middle = (low + high) // 2
        if history[middle][0] <= rv:
            low = middle + 1
        else:
            high = middle
    return low


def http_date():
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime())


def exec_stalls(cluster, command):
    """`execStalls` ({"words": [...], "times": N, "stallAt": TEXT}): the fault, when this exec,
    whose command holds every word, is one of the first N such execs, else None. Such an exec
    stalls: without stallAt no command runs and nothing is sent; with it the command runs and
    its output is sent up to TEXT's first occurrence, then nothing more (no exit status)."""
    fault = cluster.config.get("execStalls") or {}
    if not fault or not all(any(word in arg for arg in command) for word in fault.get("words", [])):
        return None
    with cluster.lock:
        used = getattr(cluster, "exec_stalls", 0)
        if used >= fault.get("times", 1):
            return None
        cluster.exec_stalls = used + 1
    return fault


def hold_until_closed(cluster, sock):
    """A stalled stream: the connection held open, silent, until the client closes it or the cluster stops."""
    sock.settimeout(0.5)
    while not cluster.stop.is_set():
        try:
            if not sock.recv(65536):
                return
        except socket.timeout:
            continue
        except OSError:
            return


def kubelet_dial_failure(cluster, namespace, name, container):
    """`kubeletDialFailures` ({"execs": N, "started": bool}): the API server's dial of the kubelet
    for each of the first N execs fails after the client's WebSocket was upgraded, as the stream
    translator reports it (an InternalError on the error channel, client-go's "error sending
    request: " and the transport's error); with "started", the kubelet had begun the command."""
    fault = cluster.config.get("kubeletDialFailures") or {}
    with cluster.lock:
        used = getattr(cluster, "kubelet_dial_failures", 0)
        if used >= fault.get("execs", 0):
            return None
        cluster.kubelet_dial_failures = used + 1
    return {"started": bool(fault.get("started")), "error": (
        'error sending request: Post "https://127.0.0.1:10250/exec/%s/%s/%s?command=...&error=1&output=1": '
        "read tcp 127.0.0.1:40112->127.0.0.1:10250: read: connection reset by peer" % (namespace, name, container))}
