"""The simulated API server: storage, discovery, admission, the verbs kubectl calls, events.

A mixin of server.Cluster: `self` is the cluster (its lock is held while controllers run).
"""

import json
import os
import random
import shutil
import subprocess
import time
import uuid

import agentsandbox
from api import ApiError, FIELD_LABELS, NAME_CHARS, PSA_ENFORCE, PSA_ENFORCE_VERSION, RESOURCES, field_of, not_found, now_rfc3339, restricted_violations
from kubelet import pod_cgroup_procs, translated_argv
import kueue


class ApiServer:
    def next_rv(self):
        self.resource_version += 1
        return str(self.resource_version)

    def put(self, resource, obj):
        obj["metadata"]["resourceVersion"] = self.next_rv()
        stored = self.objects.setdefault(resource, {})
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        event = "MODIFIED" if key in stored else "ADDED"
        if event == "ADDED":
            self.sorted_keys.pop(resource, None)
        stored[key] = obj
        self.remember(resource, obj, event)

    def get(self, resource, namespace, name):
        return self.objects.get(resource, {}).get((namespace or "", name))

    def items(self, resource, namespace=None):
        """The stored objects of `resource` (of one namespace), by namespace and name. The order is
        kept between passes (sorted_keys, dropped when an object is added or removed): sorting
        10,000 pods several times a pass made the simulated cluster slower than its rate limits."""
        stored = self.objects.get(resource, {})
        keys = self.sorted_keys.get(resource)
        if keys is None:
            keys = self.sorted_keys[resource] = sorted(stored)
        return [stored[key] for key in keys if namespace is None or key[0] == namespace]

    def remove(self, resource, obj):
        if self.objects.get(resource, {}).pop((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]),
                                              None) is not None:
            self.sorted_keys.pop(resource, None)
        obj["metadata"]["resourceVersion"] = self.next_rv()
        self.remember(resource, obj, "DELETED")

    def remember(self, resource, obj, event):
        """Every state an object passes through, as a watch delivers them (not only the latest),
        with the watch event's type (ADDED, MODIFIED, DELETED)."""
        self.history.append((int(obj["metadata"]["resourceVersion"]), resource, json.loads(json.dumps(obj)), event))
        if len(self.history) > 200000:
            del self.history[:50000]
        self.changed.notify_all()

    def new_metadata(self, metadata, namespace, resource=None):
        meta = dict(metadata)
        if not meta.get("name") and meta.get("generateName"):
            # A generated name that is taken is drawn again, 8 attempts in all (RetryGenerateName,
            # ASSUMPTIONS.md "generateName"): 5 characters of 27 collide among 10,000 pods.
            for _ in range(8):
                meta["name"] = meta["generateName"] + "".join(random.choice(NAME_CHARS) for _ in range(5))
                if resource is None or self.get(resource, namespace or "", meta["name"]) is None:
                    break
            else:
                raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (resource, meta["name"]))
        if namespace:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        return meta

    def seed_objects(self):
        for node in self.config["nodes"]:
            meta = self.new_metadata({"name": node["name"], "labels": {
                # usually the node's name, but not always (--hostname-override; fact 31)
                "kubernetes.io/hostname": node.get("hostname", node["name"]), "kubernetes.io/os": "linux",
                **node.get("labels", {})}}, "")
            allocatable = {"cpu": node.get("cpu", "8"), "memory": node.get("memory", "16Gi"),
                           "pods": str(node.get("pods", 110))}
            spec = {"unschedulable": True} if node.get("unschedulable") else {}
            if node.get("taints"):
                spec["taints"] = node["taints"]
            obj = {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
                   "status": {"allocatable": allocatable, "capacity": dict(allocatable),
                              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                              "message": "kubelet is posting ready status",
                                              "lastHeartbeatTime": meta["creationTimestamp"],
                                              "lastTransitionTime": meta["creationTimestamp"]}],
                              "nodeInfo": {"kernelVersion": os.uname().release,
                                           "osImage": "Debian GNU/Linux 12 (bookworm)",
                                           "containerRuntimeVersion": "containerd://2.1.1",
                                           "kubeletVersion": self.config["kubernetesVersion"],
                                           "kubeProxyVersion": "", "operatingSystem": "linux",
                                           "architecture": "amd64"}}}
            self.put("nodes", obj)
        for rc in self.config["runtimeClasses"]:
            obj = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                   "metadata": self.new_metadata({"name": rc["name"]}, ""), "handler": rc["handler"]}
            for key in ("overhead", "scheduling"):
                if key in rc:
                    obj[key] = rc[key]
            self.put("runtimeclasses", obj)
        for name in ("default", "kube-system"):
            self.create_namespace({"metadata": {"name": name}})
            self.namespace_born[name] = 0.0
        if agentsandbox.installed(self.config):
            self.create_namespace({"metadata": {"name": agentsandbox.CONTROLLER_NAMESPACE}})
            self.namespace_born[agentsandbox.CONTROLLER_NAMESPACE] = 0.0
            self.put("deployments", agentsandbox.controller_deployment(self.config, self.new_metadata))
        if kueue.installed(self.config):
            self.kueue.seed(self.new_metadata)

    def served(self, resource):
        """Whether the API server serves the resource (CRDs only once installed)."""
        if resource not in RESOURCES:
            return False
        if resource in kueue.RESOURCES:
            return kueue.installed(self.config)
        return resource not in agentsandbox.RESOURCES or agentsandbox.installed(self.config)

    def discovery(self):
        # A kubectl whose discovery cache predates Kueue's uninstall still maps its kinds
        # (uninstall.discoveryCached): the request then gets the API server's 404.
        stale = kueue.RESOURCES if (self.config.get("kueue") or {}).get("uninstall", {}).get("discoveryCached") \
            else ()
        return sorted(resource for resource in RESOURCES if self.served(resource) or resource in stale)

    def check_rbac(self, verb, resource, namespace, name=None):
        """Denials worded as the API server words them (apiserver responsewriters.forbiddenMessage
        wrapped in errors.NewForbidden: `<resource>[.<group>] ["<name>"] is forbidden: ...`)."""
        for rule in self.config.get("forbid", []):
            if rule.get("verb") == verb and rule.get("resource") == resource:
                group = RESOURCES[resource][3].lstrip(".")
                scope = ('in the namespace "%s"' % namespace) if namespace and RESOURCES[resource][2] \
                    else "at the cluster scope"
                qualified = resource + RESOURCES[resource][3] + (' "%s"' % name if name else "")
                raise ApiError(403, "Forbidden", '%s is forbidden: User "kind-user" cannot %s resource "%s" in '
                               'API group "%s" %s' % (qualified, verb, resource, group, scope))

    def api_create(self, resource, namespace, body):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        api_version, kind, namespaced, _ = RESOURCES[resource]
        namespace = (namespace or body.get("metadata", {}).get("namespace") or "default") if namespaced else ""
        self.check_rbac("create", resource, namespace)
        if body.get("kind") != kind:
            raise ApiError(400, "BadRequest", "the object kind %r does not match %s" % (body.get("kind"), kind))
        name = body.get("metadata", {}).get("name")
        if namespaced:
            ns = self.get("namespaces", "", namespace)
            if ns is None:
                raise not_found("namespaces", namespace)
            if ns["metadata"].get("deletionTimestamp"):
                raise ApiError(403, "Forbidden", '%s "%s" is forbidden: unable to create new content in '
                               'namespace %s because it is being terminated' % (resource, name, namespace))
        if name and self.get(resource, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", '%s%s "%s" already exists' % (resource, RESOURCES[resource][3], name))
        if resource == "namespaces":
            created = self.create_namespace(body)
            self.namespace_born[created["metadata"]["name"]] = time.time()
            return created
        obj = json.loads(json.dumps(body))
        obj["apiVersion"], obj["kind"] = api_version, kind
        # Mutating admission runs before the name is generated, so its refusals name the pod by
        # its generateName prefix (`pods "rollout-" is forbidden`, ASSUMPTIONS.md fact 26).
        requested_name = name or obj.get("metadata", {}).get("generateName", "")
        obj["metadata"] = self.new_metadata(obj.get("metadata", {}), namespace, resource)
        self.first_created.setdefault(resource, time.time())
        if resource == "jobs":
            if self.first_job_at is None:
                self.first_job_at = time.time()
            self.jobs_created.append(time.time())
            if kueue.installed(self.config):
                self.kueue.webhook(obj)
            self.default_job(obj)
        elif resource in kueue.RESOURCES:
            obj["metadata"]["generation"] = 1
        elif resource in agentsandbox.RESOURCES:
            if resource == "sandboxclaims" and not (obj.get("spec", {}).get("warmPoolRef") or {}).get("name"):
                raise ApiError(422, "Invalid", 'SandboxClaim.extensions.agents.x-k8s.io "%s" is invalid: '
                               'spec.warmPoolRef.name: Required value' % obj["metadata"]["name"])
            obj["metadata"]["generation"] = 1
        elif resource == "pods":
            self.mutate_pod(obj)
            self.admit_pod(obj, requested_name)
        self.put(resource, obj)
        return obj

    def mutate_pod(self, pod):
        """Mutating admission webhooks configured on the cluster (e.g. a sidecar injector)."""
        sidecar = self.config.get("injectSidecar")
        if sidecar:
            pod["spec"]["containers"].append(dict(sidecar))

    def create_namespace(self, body):
        meta = self.new_metadata(body.get("metadata", {}), "")
        meta["labels"] = {**meta.get("labels", {}), "kubernetes.io/metadata.name": meta["name"]}
        obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
               "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
        self.put("namespaces", obj)
        return obj

    def default_job(self, job):
        """What the API server's Job strategy and defaulting add at creation."""
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        labels = {"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                  "controller-uid": uid, "job-name": name}
        job["metadata"]["generation"] = 1
        job["metadata"]["labels"] = {**labels, **job["metadata"].get("labels", {})}
        spec = job.setdefault("spec", {})
        # With backoffLimitPerIndex the global backoffLimit defaults to the maximum int32.
        spec.setdefault("backoffLimit", 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("completions", 1)
        spec.setdefault("manualSelector", False)
        spec.setdefault("parallelism", 1)
        # With a podFailurePolicy only `Failed` is allowed, and it is the default (job validation,
        # KEP-3939): a terminating pod is replaced only once it has failed. Otherwise at once.
        spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        spec.setdefault("suspend", False)
        template = spec.setdefault("template", {})
        template_meta = template.setdefault("metadata", {})
        template_meta["labels"] = {**template_meta.get("labels", {}), **labels}
        pod_spec = template.setdefault("spec", {})
        for container in pod_spec.get("containers", []):
            image = container.get("image", "")
            default_policy = "Always" if image.endswith(":latest") or ":" not in image.split("/")[-1] else "IfNotPresent"
            container.setdefault("imagePullPolicy", default_policy)
            container.setdefault("resources", {})
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
        pod_spec.setdefault("dnsPolicy", "ClusterFirst")
        pod_spec.setdefault("schedulerName", "default-scheduler")
        pod_spec.setdefault("securityContext", {})
        pod_spec.setdefault("terminationGracePeriodSeconds", 30)
        for volume in pod_spec.get("volumes", []):
            if "configMap" in volume:
                volume["configMap"].setdefault("defaultMode", 420)
        job["status"] = {}
        self.job_books[uid] = {"succeeded": set(), "failed": set(), "ignored": set(), "create_backoff_until": 0.0,
                               "create_failures": 0, "indexes_succeeded": set(), "indexes_failed": set(),
                               "index_failures": {}, "index_retry_at": {}}

    def admit_pod(self, pod, requested_name):
        """The admission chain for a pod, in the API server's plugin order: ServiceAccount,
        RuntimeClass (both mutating: refusals name the generateName prefix), PodSecurity
        (validating: the generated name), ResourceQuota (prefix, as recorded in fact 26)."""
        spec, namespace = pod["spec"], pod["metadata"]["namespace"]
        born = self.namespace_born.get(namespace, 0.0)
        if time.time() - born < self.config.get("serviceAccountDelaySeconds", 0):
            raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: error looking up service account %s/default: '
                           'serviceaccount "default" not found' % (requested_name, namespace))
        rc_name = spec.get("runtimeClassName")
        if rc_name:
            rc = self.get("runtimeclasses", "", rc_name)
            if rc is None:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: pod rejected: RuntimeClass "%s" '
                               'not found' % (requested_name, rc_name))
            if "overhead" in rc:
                spec["overhead"] = dict(rc["overhead"].get("podFixed", {}))
            selector = rc.get("scheduling", {}).get("nodeSelector")
            if selector:
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **selector}
            # setScheduling: the class's tolerations are added to the pod's (fact 31)
            for toleration in rc.get("scheduling", {}).get("tolerations") or []:
                if toleration not in spec.setdefault("tolerations", []):
                    spec["tolerations"].append(dict(toleration))
        ns_labels = self.get("namespaces", "", namespace)["metadata"].get("labels", {})
        level = ns_labels.get(PSA_ENFORCE)
        if level == "restricted":
            violations = restricted_violations(spec)
            if violations:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: violates PodSecurity "restricted:%s": %s'
                               % (pod["metadata"]["name"], ns_labels.get(PSA_ENFORCE_VERSION, "latest"),
                                  ", ".join(violations)))
        quota = self.config.get("namespaceQuota")
        if quota and born:
            used = sum(1 for other in self.items("pods", namespace)
                       if other["status"].get("phase") not in ("Succeeded", "Failed"))
            if used + 1 > quota["pods"]:
                raise ApiError(403, "Forbidden", 'pods "%s" is forbidden: exceeded quota: %s, requested: pods=1, '
                               'used: pods=%d, limited: pods=%d' % (requested_name, quota.get("name", "pod-quota"),
                                                                    used, quota["pods"]))
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        spec.setdefault("priority", 0)
        spec.setdefault("serviceAccount", "default")
        spec.setdefault("serviceAccountName", "default")
        # DefaultTolerationSeconds: not-ready/unreachable for 300 s, unless already tolerated
        tolerations = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"effect": "NoExecute", "key": key, "operator": "Exists",
                                    "tolerationSeconds": 300})
        pod["metadata"]["generation"] = 1
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}

    def api_get(self, resource, namespace, name):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.check_rbac("get", resource, namespace, name)
        obj = self.get(resource, namespace if RESOURCES[resource][2] else "", name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def api_list(self, resource, namespace, selector, field_selector=None):
        if not self.served(resource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.check_rbac("list", resource, namespace)
        fields = [part.split("=", 1) for part in (field_selector or "").split(",") if part]
        for key, _ in fields:
            if key not in FIELD_LABELS.get(resource, ()) and key not in ("metadata.name", "metadata.namespace"):
                raise ApiError(400, "BadRequest", 'Unable to find "%s, Resource=%s" that match label selector "%s", '
                               'field selector "%s": field label not supported: %s' % (
                                   ("" if "/" in RESOURCES[resource][0] else "/") + RESOURCES[resource][0], resource,
                                   selector or "", field_selector, key))
        terms = [part.split("=", 1) if "=" in part else [part, None] for part in (selector or "").split(",") if part]
        scope = None if namespace == "*" or not RESOURCES[resource][2] else namespace
        found = self.items(resource, scope)

        def matches(obj):
            labels = obj["metadata"].get("labels", {})
            return all(key in labels if value is None else labels.get(key) == value for key, value in terms) and \
                all(str(field_of(obj, key)) == value for key, value in fields)
        return [obj for obj in found if matches(obj)]

    def api_delete(self, resource, namespace, name, propagation, uid=None):
        self.check_rbac("delete", resource, namespace, name)
        obj = self.api_get(resource, namespace, name)
        if uid is not None and uid != obj["metadata"]["uid"]:
            # DeleteOptions.preconditions.uid (ASSUMPTIONS.md "Delete preconditions")
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s%s "%s": StorageError: invalid object, '
                           'Code: 4, Key: /registry/%s/%s/%s, ResourceVersion: 0, AdditionalErrorMsg: Precondition '
                           'failed: UID in precondition: %s, UID in object meta: %s' % (
                               resource, RESOURCES[resource][3], name, resource, namespace, name, uid,
                               obj["metadata"]["uid"]))
        if obj["metadata"].get("deletionTimestamp") and resource == "namespaces":
            # A second DELETE of a Terminating namespace is refused (ASSUMPTIONS.md fact 24).
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on namespaces "%s": The system is ensuring '
                           'all content is removed from this namespace.  Upon completion, this namespace will '
                           'automatically be purged by the system.' % name)
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        obj["metadata"]["deletionTimestamp"] = now_rfc3339()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        if resource == "namespaces":
            obj["status"]["phase"] = "Terminating"
            self.job_books.setdefault("ns:" + obj["metadata"]["uid"], {"deleted_at": time.time()})
        elif resource == "jobs" and propagation == "Foreground":
            obj["metadata"]["finalizers"] = obj["metadata"].get("finalizers", []) + ["foregroundDeletion"]
        elif resource == "pods":
            self.begin_pod_termination(obj)
        else:
            self.remove(resource, obj)
            return obj
        self.put(resource, obj)
        return obj

    def api_evict(self, namespace, name):
        """POST pods/NAME/eviction (kubectl drain; no PodDisruptionBudget is simulated): the pod
        gets DisruptionTarget (EvictionByEvictionAPI) and is deleted with its grace period; the
        answer is a Status Success (ASSUMPTIONS.md "The Eviction API")."""
        self.check_rbac("create", "pods", namespace, name)
        pod = self.api_get("pods", namespace, name)
        if not pod["metadata"].get("deletionTimestamp"):
            pod.setdefault("status", {}).setdefault("conditions", []).append({
                "type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(), "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting"})
            self.begin_pod_termination(pod)
            self.put("pods", pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}

    def api_label(self, resource, namespace, name, labels, overwrite):
        obj = self.api_get(resource, namespace, name)
        current = obj["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
                continue
            if key in current and current[key] != value and not overwrite:
                raise ApiError(400, "BadRequest", "'%s' already has a value (%s), and --overwrite is false"
                               % (key, current[key]))
            current[key] = value
        self.put(resource, obj)
        return obj

    def api_logs(self, namespace, name, container):
        """The kubelet serves logs: the API server only looks the pod up (briefly, under the
        lock); the file is read outside it, so that reading 10,000 logs waits for no controller."""
        log, drop = self.api_log_file(namespace, name, container)
        with log:
            text = log.read().decode("utf-8", "surrogateescape")
        return "".join(text.splitlines(keepends=True)[drop:]) if drop else text

    def api_log_file(self, namespace, name, container):
        """(the container's log file opened for reading, lines to drop from its start). A follow
        holds it open as the kubelet's reader does: a pod deleted meanwhile (its file removed)
        still yields every line its container wrote before it exited."""
        with self.lock:
            pod = self.get("pods", namespace, name)
            if pod is None:
                raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
            record = dict(self.processes.get(pod["metadata"]["uid"]) or {})
            if not record.get("log_path"):
                reason = "ContainerCreating"
                for status in pod.get("status", {}).get("containerStatuses", []):
                    reason = status.get("state", {}).get("waiting", {}).get("reason", reason)
                if reason in ("ErrImagePull", "ImagePullBackOff"):
                    reason = "image can't be pulled"
                raise ApiError(400, "BadRequest", 'container "%s" in pod "%s" is waiting to start: %s'
                               % (container, name, reason))
        self.first_created.setdefault("log", time.time())  # an apiOutage may count from the first log read
        try:
            # bytes that are not UTF-8 travel as lone surrogates and leave kubectl as the bytes they were
            return open(record["log_path"], "rb"), record.get("log_drop_first_lines", 0)
        except FileNotFoundError:  # the pod was deleted meanwhile (its folder goes with it)
            raise ApiError(404, "NotFound", 'pods "%s" not found' % name)

    def api_exec(self, namespace, name, container, command, stdin, started=None):
        """`kubectl exec`: the kubelet runs the command in the running container (its mount
        namespace and root, the container's environment), streams stdout and stderr, and
        reports the exit code. Errors as the kubelet words them (see ASSUMPTIONS.md).
        `started(process)` is told the exec'd process, for the API to kill when its stream ends."""
        with self.lock:
            pod = self.get("pods", namespace, name)
            if pod is None:
                raise ApiError(404, "NotFound", 'pods "%s" not found' % name)
            record = self.processes.get(pod["metadata"]["uid"]) or {}
            names = [c["name"] for c in pod["spec"]["containers"]]
            container = container or names[0]
            running = record.get("synthetic_keepalive") or (
                record.get("process") is not None and record["process"].poll() is None)
            if container not in names or not running or pod["metadata"].get("deletionTimestamp"):
                raise ApiError(500, "InternalError", 'Internal error occurred: unable to upgrade connection: '
                               'container not found ("%s")' % container)
            env = dict(record.get("env") or {})
            argv = list(command)
            if record.get("synthetic_keepalive"):
                seconds = (self.config.get("syntheticEpisodes") or {}).get("seconds", 0.5)
                process = None
            elif self.mount_namespaces:
                argv = [shutil.which("nsenter"), "--target", str(record["process"].pid), "--mount", "--root",
                        "--wd"] + argv
                # An exec'd process runs in the container's cgroup, as runc's exec puts it there.
                cgroup = pod_cgroup_procs(record["uid"]) if record.get("uid") else None
                if cgroup:
                    argv = ["/bin/sh", "-c", 'echo $$ > "$0" 2>/dev/null; exec "$@"', cgroup] + argv
                process = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, start_new_session=True)
            else:
                mounts = record["mounts"]
                translated = translated_argv(argv, mounts, record["bin_dir"])
                process = subprocess.Popen(translated, env=env, cwd=str(mounts.get("/workspace", self.dir)),
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           start_new_session=True)
            if process is not None:
                record.setdefault("execs", []).append(process)
                if started is not None:
                    started(process)
            self.first_created.setdefault("exec", time.time())  # apiOutage can count from the first exec
        if process is None:
            return self.synthetic_exec(command, seconds)
        stdout, stderr = process.communicate(stdin.encode() if stdin else None)
        with self.lock:
            if process in record.get("execs", []):
                record["execs"].remove(process)
        code = process.returncode if process.returncode >= 0 else 128 - process.returncode
        return {"stdout": stdout.decode("utf-8", "surrogateescape"), "stderr": stderr.decode("utf-8", "surrogateescape"),
                "code": code}

    @staticmethod
    def synthetic_exec(command, seconds):
        """Benchmark mode: the events an episode would print, made up, after `seconds`."""
        env = dict(arg.split("=", 1) for arg in command[1:] if "=" in arg) if command[:1] == ["env"] else {}
        start = time.time()
        time.sleep(seconds)
        name = env.get("EPISODE_ID", "")
        ready = {"event": "ready", "at": start + 0.02, "episode_id": name, "started_at": start + 0.005,
                 "imports_done_at": start + 0.015, "synthetic": True}
        reward = {"event": "reward", "at": time.time() - 0.01, "episode_id": name, "reward": 1, "baseline_exit": 1,
                  "tests_exit": 0, "tests_output": "synthetic episode: no tests ran\n", "synthetic": True}
        return {"stdout": json.dumps(ready) + "\n" + json.dumps(reward) + "\n", "stderr": "", "code": 0}

    def record_event(self, obj, type_, reason, message, component="job-controller", host=None):
        namespace = obj["metadata"].get("namespace", "default")
        involved = {"kind": obj["kind"], "namespace": namespace, "name": obj["metadata"]["name"],
                    "uid": obj["metadata"]["uid"], "apiVersion": obj["apiVersion"],
                    "resourceVersion": obj["metadata"].get("resourceVersion", "")}
        if obj["kind"] == "Pod" and component == "kubelet" and reason not in ("SandboxChanged",):
            involved["fieldPath"] = "spec.containers{%s}" % obj["spec"]["containers"][0]["name"]
        stamp = now_rfc3339()
        key = (namespace, involved["uid"], reason, message)
        existing = self.event_index.get(key)
        if existing is not None and self.get("events", namespace, existing["metadata"]["name"]) is existing:
            existing["count"] += 1
            existing["lastTimestamp"] = stamp
            self.put("events", existing)
            return
        source = {"component": component}
        if host:
            source["host"] = host
        # client-go names events <object>.<UnixNano in hex>, so a list by name is chronological
        event = {"metadata": {"name": "%s.%x" % (involved["name"], time.time_ns()),
                              "namespace": namespace, "uid": str(uuid.uuid4()),
                              "creationTimestamp": stamp},
                 "involvedObject": involved, "reason": reason, "message": message, "source": source,
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1, "type": type_,
                 "eventTime": None, "reportingComponent": component, "reportingInstance": host or "",
                 "apiVersion": "v1", "kind": "Event"}
        self.event_index[key] = event
        self.put("events", event)

    def node_now(self, node):
        """The node's own clock (kubelet timestamps): the API server's plus the node's offset."""
        return time.time() + float(self.node_config(node).get("clockOffsetSeconds", 0) or 0)
