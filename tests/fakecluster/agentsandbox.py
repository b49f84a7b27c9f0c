"""kubernetes-sigs/agent-sandbox (v1beta1) in the simulated cluster: the four kinds, the core
Sandbox controller and the extensions controllers (SandboxWarmPool, SandboxClaim), as upstream
v0.5.6 behaves (mirror HEAD 2fd412d5; see ASSUMPTIONS.md, "agent-sandbox").

Installed only when cluster.json has "agentSandbox": {"version": "v0.5.6", "extensions": true}.
Without it the API server does not serve the kinds (kubectl: `the server doesn't have a
resource type`); with "extensions": false the CRDs exist but nothing reconciles pools and
claims (the controller's --extensions flag defaults to false).
"""

import datetime
import json
import time

GROUP_CORE = "agents.x-k8s.io/v1beta1"
GROUP_EXT = "extensions.agents.x-k8s.io/v1beta1"
RESOURCES = {
    "sandboxes": (GROUP_CORE, "Sandbox", True, ".agents.x-k8s.io"),
    "sandboxtemplates": (GROUP_EXT, "SandboxTemplate", True, ".extensions.agents.x-k8s.io"),
    "sandboxclaims": (GROUP_EXT, "SandboxClaim", True, ".extensions.agents.x-k8s.io"),
    "sandboxwarmpools": (GROUP_EXT, "SandboxWarmPool", True, ".extensions.agents.x-k8s.io"),
}
CONTROLLER_NAMESPACE = "agent-sandbox-system"
CONTROLLER_NAME = "agent-sandbox-controller"

POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-hash"
LAUNCH_TYPE = "agents.x-k8s.io/launch-type"
CLAIM_UID = "agents.x-k8s.io/claim-uid"
NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
POD_NAME = "agents.x-k8s.io/pod-name"
TEMPLATE_REF = "agents.x-k8s.io/sandbox-template-ref"
SANDBOX_NAME = "agents.x-k8s.io/sandbox-name"  # on the claim
FIRST_OBSERVED = "agents.x-k8s.io/controller-first-observed-at"
FIRST_READY = "agents.x-k8s.io/claim-first-ready-at"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
WARM_CANDIDATE_GRACE_SECONDS = 2.0  # warmCandidateGracePeriod in sandboxclaim_controller.go
MAX_REFILL_BATCH = 300


def name_hash(name):
    """controllers.NameHash: 8 hex digits of a 32-bit hash of the name (FNV-1a here; upstream's
    GetNumericHash differs, and clients read the pool's status.selector, never compute it)."""
    value = 0x811C9DC5
    for byte in name.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "%08x" % value


def rfc3339_nano(at=None):
    at = time.time() if at is None else at
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def installed(config):
    return bool(config.get("agentSandbox"))


def extensions_on(config):
    return installed(config) and bool(config["agentSandbox"].get("extensions"))


def controller_deployment(config, new_metadata):
    """The Deployment of sandbox-with-extensions.yaml (k8s/controller.yaml patched with
    --extensions by k8s/kustomization.yaml)."""
    args = ["--leader-elect=true"] + (["--extensions"] if extensions_on(config) else [])
    version = config["agentSandbox"].get("version", "v0.5.6")
    meta = new_metadata({"name": CONTROLLER_NAME, "labels": {"app": CONTROLLER_NAME}}, CONTROLLER_NAMESPACE)
    meta["generation"] = 1
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": CONTROLLER_NAME}},
                     "template": {"metadata": {"labels": {"app": CONTROLLER_NAME}},
                                  "spec": {"serviceAccountName": CONTROLLER_NAME, "containers": [{
                                      "name": CONTROLLER_NAME, "args": args,
                                      "image": "registry.k8s.io/agent-sandbox/agent-sandbox-controller:" + version}]}}},
            "status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1,
                       "observedGeneration": 1}}


def condition(type_, status, reason, message, generation=None, at=None):
    """metav1.Condition: lastTransitionTime whole seconds (metav1.Time), reason and message required."""
    found = {"type": type_, "status": status, "reason": reason, "message": message,
             "lastTransitionTime": datetime.datetime.fromtimestamp(int(at or time.time()), datetime.timezone.utc)
             .strftime("%Y-%m-%dT%H:%M:%SZ")}
    if generation is not None:
        found["observedGeneration"] = generation
    return found


def merge_condition(conditions, new):
    """meta.SetStatusCondition: the transition time changes only when the status does."""
    for index, old in enumerate(conditions):
        if old["type"] == new["type"]:
            if old["status"] == new["status"]:
                new = dict(new, lastTransitionTime=old["lastTransitionTime"])
            conditions[index] = new
            return conditions
    conditions.append(new)
    return conditions


def controller_owner(obj):
    return next((ref for ref in obj["metadata"].get("ownerReferences") or [] if ref.get("controller")), None)


def owner_ref(obj):
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def secure_pod_spec(spec):
    """ApplySandboxSecureDefaults: no dnsPolicy -> None with public resolvers; the token is
    not mounted unless the template says so."""
    spec = json.loads(json.dumps(spec))
    if not spec.get("dnsPolicy"):
        spec["dnsPolicy"] = "None"
        spec["dnsConfig"] = {"nameservers": ["8.8.8.8", "1.1.1.1"]}
    spec.setdefault("automountServiceAccountToken", False)
    return spec


class AgentSandbox:
    """The controllers; `cluster` is server.Cluster (its lock is held while they run)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.retry_at = {}  # sandbox uid -> when to try creating its pod again
        # Controllers are event-driven: an object is reconciled again only when it, or what it
        # follows, changed (resourceVersions as of its last pass), or a retry is due.
        self.synced = {}

    def reconcile(self):
        if not installed(self.cluster.config):
            return
        if extensions_on(self.cluster.config):
            self.claim_controller()
            self.pool_controller()
        self.sandbox_controller()
        self.garbage_collector()

    # ------------------------------------------------------------ the core controller

    def sandbox_controller(self):
        c = self.cluster
        for sandbox in c.items("sandboxes"):
            if sandbox["metadata"].get("deletionTimestamp"):
                continue
            namespace = sandbox["metadata"]["namespace"]
            pod_name = sandbox["metadata"].get("annotations", {}).get(POD_NAME, sandbox["metadata"]["name"])
            pod = c.get("pods", namespace, pod_name)
            if pod is None and POD_NAME in (sandbox["metadata"].get("annotations") or {}):
                # reconcilePod: the annotated pod is gone (evicted, deleted): the annotation is
                # cleared and a new pod is made, named after the Sandbox
                del sandbox["metadata"]["annotations"][POD_NAME]
                c.put("sandboxes", sandbox)
                sandbox = c.get("sandboxes", namespace, sandbox["metadata"]["name"])
                pod_name = sandbox["metadata"]["name"]
                pod = c.get("pods", namespace, pod_name)
            key = (sandbox["metadata"]["resourceVersion"], (pod or {}).get("metadata", {}).get("resourceVersion"))
            if self.synced.get(sandbox["metadata"]["uid"]) == key:
                continue
            status = json.loads(json.dumps(sandbox.get("status") or {}))
            generation = sandbox["metadata"].get("generation", 1)
            if pod is None:
                if time.time() < self.retry_at.get(sandbox["metadata"]["uid"], 0):
                    continue
                template = sandbox["spec"].get("podTemplate") or {}
                labels = {k: v for k, v in (template.get("metadata") or {}).get("labels", {}).items()
                          if not k.startswith("agents.x-k8s.io/") or k in (POOL_LABEL, TEMPLATE_REF_HASH)}
                labels[NAME_HASH] = name_hash(sandbox["metadata"]["name"])
                body = {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod_name, "labels": labels,
                                     "annotations": dict((template.get("metadata") or {}).get("annotations", {})),
                                     "ownerReferences": [owner_ref(sandbox)]},
                        "spec": json.loads(json.dumps(template.get("spec") or {}))}
                try:
                    pod = c.api_create("pods", namespace, body)
                except Exception as error:  # ApiError: the reconciler retries with backoff
                    self.retry_at[sandbox["metadata"]["uid"]] = time.time() + 1.0
                    status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                        "Ready", "False", "ReconcilerError", "Error seen: failed to create pod: %s" % error, generation))
                    self.write_status("sandboxes", sandbox, status)
                    continue
            ready = False
            message = "Pod does not exist"
            if pod is not None:
                pod_status = pod.get("status") or {}
                phase = pod_status.get("phase")
                pod_ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                                for x in pod_status.get("conditions") or [])
                ips = [entry["ip"] for entry in pod_status.get("podIPs") or []]
                ready = phase == "Running" and pod_ready and bool(ips)
                message = "Pod is Ready" if ready else "Pod exists with phase: %s; Pod is Not Ready" % phase
                status["podIPs"] = ips or None
                status["nodeName"] = pod["spec"].get("nodeName")
                if phase in ("Succeeded", "Failed"):
                    status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                        "Finished", "True", "Pod" + phase, "Pod reached phase %s" % phase, generation))
                    message = "Pod is %s" % phase
                    reason_not_ready = "Pod" + phase
                else:
                    reason_not_ready = "DependenciesNotReady"
                status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                    "Ready", "True" if ready else "False", "DependenciesReady" if ready else reason_not_ready,
                    message, generation))
            status["selector"] = "%s=%s" % (NAME_HASH, name_hash(sandbox["metadata"]["name"]))
            status = {k: v for k, v in status.items() if v is not None}
            self.write_status("sandboxes", sandbox, status)
            if pod is not None:
                self.synced[sandbox["metadata"]["uid"]] = (sandbox["metadata"]["resourceVersion"],
                                                           pod["metadata"]["resourceVersion"])

    def write_status(self, resource, obj, status):
        if status != obj.get("status"):
            obj["status"] = status
            self.cluster.put(resource, obj)

    # ------------------------------------------------------------ the warm pool

    def pool_members(self, pool):
        uid, wanted = pool["metadata"]["uid"], name_hash(pool["metadata"]["name"])
        return [s for s in self.cluster.items("sandboxes", pool["metadata"]["namespace"])
                if s["metadata"].get("labels", {}).get(POOL_LABEL) == wanted and not s["metadata"].get(
                    "deletionTimestamp") and (controller_owner(s) or {}).get("uid") == uid]

    def sandbox_from_template(self, template, name, labels, owner, generate=False):
        spec = template["spec"]
        pod_template = json.loads(json.dumps(spec.get("podTemplate") or {}))
        pod_template.setdefault("metadata", {}).setdefault("labels", {}).update(
            {k: v for k, v in labels.items() if k in (POOL_LABEL, TEMPLATE_REF_HASH)})
        pod_template["spec"] = secure_pod_spec(pod_template.get("spec") or {})
        meta = {"labels": labels, "annotations": {TEMPLATE_REF: template["metadata"]["name"]},
                "ownerReferences": [owner_ref(owner)]}
        meta["generateName" if generate else "name"] = name
        body = {"apiVersion": GROUP_CORE, "kind": "Sandbox", "metadata": meta, "spec": {"podTemplate": pod_template}}
        for key in ("service", "volumeClaimTemplates"):
            if key in spec:
                body["spec"][key] = spec[key]
        return self.cluster.api_create("sandboxes", owner["metadata"]["namespace"], body)

    def pool_controller(self):
        c = self.cluster
        for pool in c.items("sandboxwarmpools"):
            if pool["metadata"].get("deletionTimestamp"):
                continue
            namespace = pool["metadata"]["namespace"]
            replicas = pool["spec"].get("replicas", 1)
            members = self.pool_members(pool)
            template_name = pool["spec"].get("sandboxTemplateRef", {}).get("name", "")
            template = c.get("sandboxtemplates", namespace, template_name)
            if template is None:
                c.record_event(pool, "Warning", "WarmPoolNotProgressing", 'SandboxTemplate "%s" not found'
                               % template_name, "sandboxwarmpool-controller")
            elif len(members) < replicas:
                # Refill at once (ReplenishDelay 0), at most 300 a pass.
                labels = {POOL_LABEL: name_hash(pool["metadata"]["name"]),
                          TEMPLATE_REF_HASH: name_hash(template_name),
                          TEMPLATE_HASH: name_hash(json.dumps(template["spec"], sort_keys=True))}
                for _ in range(min(MAX_REFILL_BATCH, replicas - len(members))):
                    self.sandbox_from_template(template, pool["metadata"]["name"] + "-", dict(labels), pool,
                                               generate=True)
                members = self.pool_members(pool)
            elif len(members) > replicas:
                for extra in sorted(members, key=lambda s: s["metadata"]["creationTimestamp"])[replicas:]:
                    c.remove("sandboxes", extra)
                members = self.pool_members(pool)
            ready = sum(1 for s in members if self.is_ready(s))
            status = {"replicas": len(members), "readyReplicas": ready,
                      "selector": "%s=%s" % (POOL_LABEL, name_hash(pool["metadata"]["name"])),
                      "observedGeneration": pool["metadata"].get("generation", 1)}
            self.write_status("sandboxwarmpools", pool, {k: v for k, v in status.items() if v})

    @staticmethod
    def is_ready(obj):
        return any(x.get("type") == "Ready" and x.get("status") == "True"
                   for x in (obj.get("status") or {}).get("conditions") or [])

    # ------------------------------------------------------------ claims

    def claim_controller(self):
        c = self.cluster
        self.members = {}  # pool uid -> its unclaimed members, computed once a pass (1,000 claims at once)
        for claim in c.items("sandboxclaims"):
            meta = claim["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            namespace, generation = meta["namespace"], meta.get("generation", 1)
            bound_name = (claim.get("status") or {}).get("sandbox", {}).get("name")
            followed = c.get("sandboxes", namespace, bound_name) if bound_name else None
            key = (meta["resourceVersion"], (followed or {}).get("metadata", {}).get("resourceVersion"))
            lifecycle = claim["spec"].get("lifecycle") or {}
            expired = lifecycle.get("shutdownTime") and time.time() >= parse_time(lifecycle["shutdownTime"])
            if self.synced.get(meta["uid"]) == key and not expired:
                continue
            annotations = meta.setdefault("annotations", {})
            if FIRST_OBSERVED not in annotations:
                annotations[FIRST_OBSERVED] = rfc3339_nano()
                c.put("sandboxclaims", claim)
            if expired:
                c.record_event(claim, "Normal", "ClaimExpired", "Claim expired", "sandboxclaim-controller")
                if lifecycle.get("shutdownPolicy", "Retain") in ("Delete", "DeleteForeground"):
                    c.remove("sandboxclaims", claim)  # GC takes the Sandbox and its pod
                    continue
            status = json.loads(json.dumps(claim.get("status") or {}))
            bound = (status.get("sandbox") or {}).get("name") or annotations.get(SANDBOX_NAME)
            if not bound:
                bound = self.bind(claim, status, generation)
                if not bound:
                    self.write_status("sandboxclaims", claim, status)
                    continue
            sandbox = c.get("sandboxes", namespace, bound)
            if sandbox is None:
                status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                    "Ready", "False", "SandboxMissing", 'Sandbox "%s" not found' % bound, generation))
            else:
                ready = next((x for x in (sandbox.get("status") or {}).get("conditions") or []
                              if x["type"] == "Ready"), None)
                if ready is not None:
                    status["conditions"] = merge_condition(status.get("conditions") or [],
                                                           dict(ready, observedGeneration=generation))
                finished = next((x for x in (sandbox.get("status") or {}).get("conditions") or []
                                 if x["type"] == "Finished"), None)
                if finished is not None:
                    status["conditions"] = merge_condition(status["conditions"], dict(finished))
                status["sandbox"] = {"name": bound}
                if (sandbox.get("status") or {}).get("podIPs"):
                    status["sandbox"]["podIPs"] = sandbox["status"]["podIPs"]
            if self.is_ready({"status": status}) and FIRST_READY not in annotations:
                annotations[FIRST_READY] = rfc3339_nano()
                c.put("sandboxclaims", claim)
            self.write_status("sandboxclaims", claim, status)
            if sandbox is not None:
                self.synced[meta["uid"]] = (meta["resourceVersion"], sandbox["metadata"]["resourceVersion"])

    def bind(self, claim, status, generation):
        """getOrCreateSandbox: a warm candidate, else (after the 2 s IP wait) a cold Sandbox.
        Returns the bound Sandbox's name, or None while waiting or refused."""
        c = self.cluster
        meta, spec = claim["metadata"], claim["spec"]
        namespace = meta["namespace"]
        pool_name = (spec.get("warmPoolRef") or {}).get("name", "")
        pool = c.get("sandboxwarmpools", namespace, pool_name)
        if pool is None:
            status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                "Ready", "False", "WarmPoolNotFound", 'SandboxWarmPool "%s" not found' % pool_name, generation))
            return None
        template_name = pool["spec"].get("sandboxTemplateRef", {}).get("name", "")
        template = c.get("sandboxtemplates", namespace, template_name)
        if template is None:
            status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                "Ready", "False", "TemplateNotFound", 'SandboxTemplate "%s" not found' % template_name, generation))
            return None
        forced_cold = bool(spec.get("env") or spec.get("volumeClaimTemplates"))
        if not forced_cold:
            if pool["metadata"]["uid"] not in self.members:
                self.members[pool["metadata"]["uid"]] = self.pool_members(pool)
            members = self.members[pool["metadata"]["uid"]]
            with_ip = [s for s in members if (s.get("status") or {}).get("podIPs")]
            # A Ready candidate first, else a not-Ready one that has an IP (PR #1513 is open);
            # oldest first.
            with_ip.sort(key=lambda s: (not self.is_ready(s), s["metadata"]["creationTimestamp"],
                                        s["metadata"]["name"]))
            if with_ip:
                members.remove(with_ip[0])
                return self.adopt(claim, with_ip[0], status, generation)
            # Wait for a pool member's IP until 2 s after the claim's creationTimestamp (whole
            # seconds, so 1-2 s of real time), retrying every 0.5 s (warmCandidateRetryInterval).
            if members and time.time() < parse_time(meta["creationTimestamp"]) + WARM_CANDIDATE_GRACE_SECONDS:
                return None
        try:
            sandbox = self.sandbox_from_template(template, meta["name"], {
                LAUNCH_TYPE: "cold", CLAIM_UID: meta["uid"], TEMPLATE_REF_HASH: name_hash(template_name)}, claim)
        except Exception as error:
            status["conditions"] = merge_condition(status.get("conditions") or [], condition(
                "Ready", "False", "ReconcilerError", str(error), generation))
            return None
        c.record_event(claim, "Normal", "SandboxProvisioned", 'Created Sandbox "%s"' % sandbox["metadata"]["name"],
                       "sandboxclaim-controller")
        meta.setdefault("annotations", {})[SANDBOX_NAME] = sandbox["metadata"]["name"]
        c.put("sandboxclaims", claim)
        status["sandbox"] = {"name": sandbox["metadata"]["name"]}
        status["conditions"] = merge_condition(status.get("conditions") or [], condition(
            "Ready", "False", "SandboxNotReady", "Sandbox is not ready", generation))
        return sandbox["metadata"]["name"]

    def adopt(self, claim, sandbox, status, generation):
        """completeAdoption: annotate the claim, take the Sandbox out of the pool (labels, owner),
        mark it warm; its pod loses the pool labels too."""
        c = self.cluster
        name = sandbox["metadata"]["name"]
        claim["metadata"].setdefault("annotations", {})[SANDBOX_NAME] = name
        c.put("sandboxclaims", claim)
        labels = sandbox["metadata"].setdefault("labels", {})
        for key in (POOL_LABEL, TEMPLATE_HASH):
            labels.pop(key, None)
        labels[LAUNCH_TYPE] = "warm"
        labels[CLAIM_UID] = claim["metadata"]["uid"]
        sandbox["metadata"]["ownerReferences"] = [owner_ref(claim)]
        sandbox["metadata"].setdefault("annotations", {})[POD_NAME] = name
        pod_labels = ((sandbox["spec"].get("podTemplate") or {}).get("metadata") or {}).get("labels", {})
        pod_labels.pop(POOL_LABEL, None)
        c.put("sandboxes", sandbox)
        pod = c.get("pods", sandbox["metadata"]["namespace"], name)
        if pod is not None:
            pod["metadata"].get("labels", {}).pop(POOL_LABEL, None)
            pod["metadata"].get("annotations", {}).pop(SAFE_TO_EVICT, None)
            c.put("pods", pod)
        c.record_event(claim, "Normal", "SandboxAdopted", 'Adopted warm pool Sandbox "%s"' % name,
                       "sandboxclaim-controller")
        status["sandbox"] = {"name": name}
        return name

    # ------------------------------------------------------------ garbage collection

    def garbage_collector(self):
        """Dependents whose controller owner is gone are deleted (background propagation); a
        pod goes through its grace period."""
        c = self.cluster
        uids = {obj["metadata"]["uid"] for resource in ("sandboxclaims", "sandboxwarmpools", "sandboxes")
                for obj in c.items(resource)}
        for sandbox in c.items("sandboxes"):
            owner = controller_owner(sandbox)
            if owner is not None and owner["uid"] not in uids:
                c.remove("sandboxes", sandbox)
                self.retry_at.pop(sandbox["metadata"]["uid"], None)
        sandbox_uids = {s["metadata"]["uid"] for s in c.items("sandboxes")}
        for pod in c.items("pods"):
            owner = controller_owner(pod)
            if owner is not None and owner.get("kind") == "Sandbox" and owner["uid"] not in sandbox_uids \
                    and not pod["metadata"].get("deletionTimestamp"):
                c.begin_pod_termination(pod)
                c.put("pods", pod)


def parse_time(stamp):
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
