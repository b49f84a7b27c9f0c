"""A simulated Kubernetes cluster: API server, Job controller, scheduler, kubelet, GC.

Run as `python server.py STATE_DIR`. It serves a small JSON RPC on 127.0.0.1 (the port is
written to STATE_DIR/server.json) that the fake `kubectl` (kubectl.py) calls. Controllers
run in real time in a background thread; every pod's container is a real local process.

The cluster is one object composed of its concerns, each in a module of its own: apiserver.py
(storage, admission, verbs, events), jobcontroller.py, scheduler.py, kubelet.py (containers as
processes), namespaces.py (garbage collection, namespace deletion), watches.py; api.py holds
what they share and apitypes.py the API's value semantics (quantities, tolerations), written
from the Kubernetes sources. The add-ons agentsandbox.py and kueue.py plug in through one seam.

Configuration: STATE_DIR/cluster.json (read at start), see DEFAULT_CONFIG. Everything
this simulation assumes about real Kubernetes is listed in tests/fakecluster/ASSUMPTIONS.md."""

import http.server
import json
import os
from pathlib import Path
import signal
import sys
import threading
import time

import agentsandbox
from api import ApiError, DEFAULT_CONFIG, PROFILES, client_rate_limiters
from faults import CONNECTION_REFUSED, fault_error, inject_fault
from httpapi import HttpApi
from apiserver import ApiServer
from jobcontroller import JobController
from kubelet import Kubelet, pod_mount_namespaces_available, remove_pod_cgroups
import kueue
from namespaces import NamespaceLifecycle
from scheduler import Scheduler
from watches import watch


class Cluster(ApiServer, JobController, Scheduler, Kubelet, NamespaceLifecycle):
    """The simulated cluster: its state, and its controllers reconciled in one loop. Each concern lives in
    a module of its own (apiserver, jobcontroller, scheduler, kubelet, namespaces); the add-ons
    (agentsandbox, kueue) are reconciled through their one seam."""

    def __init__(self, state_dir, config):
        self.dir = Path(state_dir)
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # notified on every write, for watches
        self.faults = [dict(f) for f in config.get("transientFailures", [])]
        self.objects = {}  # resource -> {(namespace or "", name) -> object}
        self.sorted_keys = {}  # resource -> its keys in self.objects, sorted (ApiServer.items)
        self.resource_version = 1000
        self.processes = {}  # pod uid -> runtime record
        self.job_books = {}  # job uid -> {"succeeded": set(), "failed": set(), ...}
        self.history = []  # (resourceVersion, resource, state, event type) of every write and removal, for watches
        self.evicted_nodes = set()
        self.event_index = {}  # (namespace, object uid, reason, message) -> event, to aggregate repeats
        self.namespace_born = {}  # namespace -> when it was created (its ServiceAccount comes later)
        self.timing = dict(PROFILES[config.get("profile", "default")], **config.get("timing", {}))
        self.job_synced = {}  # job uid -> when the Job controller last synced it (batching)
        self.job_specs_synced = {}  # job uid -> its spec (JSON) at that sync: a spec change is synced at once
        self.image_pulled = {}  # (node, image) -> when its pull is done (imagePullSeconds)
        self.mount_namespaces = pod_mount_namespaces_available(config.get("podMountNamespaces", "auto"))
        self.client_limits = client_rate_limiters(config)
        self.agent_sandbox = agentsandbox.AgentSandbox(self)
        self.kueue = kueue.Kueue(self)
        self.stop = threading.Event()
        self.first_job_at = None  # when the first Job was created
        self.first_created = {}  # resource -> when its first object was created (apiOutage counts from one)
        self.pod_cgroups = set()  # uids of pods given a cgroup of their own, until it is removed
        self.jobs_created = []  # when each Job was created, in order (Kueue's uninstall fault counts them)
        with self.lock:
            self.seed_objects()

    def reconcile(self):
        if self.in_outage():
            return  # the controllers cannot reach the API server either
        with self.lock:
            if self.stop.is_set():
                return  # shutting down: start no container after shutdown() killed them all
            self.job_controller()
            self.scheduler()
            self.kubelet()
            self.garbage_collector()
            self.agent_sandbox.reconcile()
            if kueue.installed(self.config):
                self.kueue.reconcile()
            self.namespace_controller()

    def in_outage(self):
        """Whether the API server is unreachable now (apiOutage in cluster.json)."""
        outage = self.config.get("apiOutage")
        # counted from the first create of `afterCreateOf` (the first Job unless it names another)
        started = self.first_created.get(outage.get("afterCreateOf", "jobs")) if outage else None
        if started is None:
            return False
        begins = started + outage.get("afterJobCreatedSeconds", outage.get("afterSeconds", 0))
        return begins <= time.time() < begins + outage["seconds"]

    def client_call(self, controller):
        """Whether `controller` may make one more API call now (its client-side rate limit)."""
        limiter = self.client_limits.get(controller)
        return limiter is None or limiter.take()

    def shutdown(self):
        with self.lock:
            for record in self.processes.values():
                # the container's process and every exec'd one (each in a session of its own),
                # each group whether or not its first process still runs: what an exec'd process
                # left running (an exec journal's keeper, whose start a cut stream killed) is in it
                for process in [record.get("process")] + list(record.get("execs") or []):
                    if process is not None:
                        try:
                            os.killpg(process.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            if self.mount_namespaces:
                remove_pod_cgroups(self.pod_cgroups, patience=2.0)  # no pod cgroup outlives the cluster


def dispatch(cluster, request):
    verb = request["verb"]
    if verb != "config" and cluster.in_outage():
        raise ApiError(503, CONNECTION_REFUSED, "connection refused")
    with cluster.lock:
        fault = inject_fault(cluster, request) if verb != "config" else None
    if fault and fault[0] == "hang":
        # A call that hangs (a stuck connection): answered only after `seconds`, unless the
        # client's request timeout ends it first.
        time.sleep(fault[2])
        fault = None
    if fault and not fault[1]:
        raise fault_error(fault[0], request)
    if verb == "watch":
        answer = watch(cluster, request)
    elif verb == "logs":
        answer = {"log": cluster.api_logs(request.get("namespace"), request.get("name"), request.get("container"))}
    elif verb == "exec":
        answer = cluster.api_exec(request.get("namespace"), request["name"], request.get("container"),
                                  request["command"], request.get("stdin"))
    elif verb == "logs_many":
        # The fake kubectl's shortcut for many concurrent log requests (real kubectl multiplexes
        # them over one HTTP/2 connection): one RPC, each pod's log or its error Status.
        answer = {}
        for name in request["names"]:
            try:
                answer[name] = {"log": cluster.api_logs(request.get("namespace"), name, request.get("container"))}
            except ApiError as error:
                answer[name] = {"error": error.status}
    else:
        with cluster.lock:
            answer = serve_verb(cluster, request)
    if fault:  # after the commit: the change is made, the client hears an error
        raise fault_error(fault[0], request)
    return answer


def serve_verb(cluster, request):
    verb = request["verb"]
    resource, namespace, name = request.get("resource"), request.get("namespace"), request.get("name")
    if verb == "create":
        return cluster.api_create(resource, namespace, request["body"])
    if verb == "get":
        return cluster.api_get(resource, namespace, name)
    if verb == "list":
        return {"items": cluster.api_list(resource, namespace, request.get("selector"),
                                          request.get("fieldSelector")),
                "resourceVersion": str(cluster.resource_version)}
    if verb == "delete":
        return cluster.api_delete(resource, namespace, name, request.get("propagation", "Background"))
    if verb == "label":
        return cluster.api_label(resource, namespace, name, request["labels"], request.get("overwrite"))
    if verb == "logs":
        return {"log": cluster.api_logs(namespace, name, request.get("container"))}
    if verb == "version":
        return {"gitVersion": cluster.config["kubernetesVersion"]}
    if verb == "discovery":
        return {"resources": cluster.discovery()}
    if verb == "config":
        return cluster.config
    raise ApiError(400, "BadRequest", "unknown verb %r" % verb)


def serve(state_dir):
    state_dir = Path(state_dir)
    config = dict(DEFAULT_CONFIG)
    config_path = state_dir / "cluster.json"
    if config_path.exists():
        config.update(json.loads(config_path.read_text()))
    cluster = Cluster(state_dir, config)
    print("pod mount namespaces: %s" % ("on" if cluster.mount_namespaces else "off"), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                body, code = dispatch(cluster, request), 200
            except ApiError as error:
                body, code = error.status, error.status["code"]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    class Server(http.server.ThreadingHTTPServer):
        # Real kubectl multiplexes its requests over one HTTP/2 connection; the fake opens one
        # connection per request, so the listen backlog must take a burst of them.
        request_queue_size = 512

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True

    def control_loop():
        while not cluster.stop.is_set():
            try:
                cluster.reconcile()
            except Exception as error:  # keep the cluster alive; the log shows the bug
                print("controller error: %r" % error, file=sys.stderr, flush=True)
                import traceback
                traceback.print_exc()
            time.sleep(0.02)

    threading.Thread(target=control_loop, daemon=True).start()

    http_api = HttpApi(cluster)
    api_port = http_api.start()

    def stop(*_):
        cluster.stop.set()
        http_api.stop()
        cluster.shutdown()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    info = {"port": server.server_address[1], "api_port": api_port, "pid": os.getpid()}
    partial = state_dir / "server.json.partial"
    partial.write_text(json.dumps(info))
    os.replace(partial, state_dir / "server.json")
    server.serve_forever()
    cluster.shutdown()


if __name__ == "__main__":
    serve(sys.argv[1])
