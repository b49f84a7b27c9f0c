"""kubernetes-sigs/kueue in the simulated cluster: the batch/job webhook, the Job reconciler,
Workloads, LocalQueue and ClusterQueue status, FIFO admission against nominal quota, and
preemption (as a configured fault), as v0.19.2 behaves (mirror ff69552 and tag v0.19.2; see
ASSUMPTIONS.md, "Kueue").

Installed only when cluster.json has "kueue": {"version": "v0.19.2", "clusterQueues": [...]}:
  clusterQueues   [{"name": "team", "nominalQuota": {"cpu": "2", "memory": "4Gi"},
                    "stopPolicy": "None"}], each with one flavor "default-flavor"; or with
                  "resourceGroups" as the API has them (several flavors, borrowingLimit,
                  lendingLimit), "cohortName", and "resumeAfterJobCreatedSeconds": N (a stopped
                  queue resumed by its administrator N s after the cluster's first Job)
  cohorts         [{"name": "shared", "parentName": ..., "resourceGroups": [...]}]: Cohort objects
  localQueues     [{"namespace": "ns", "name": "team", "clusterQueue": "team"}]
  newNamespaceLocalQueue  {"name": "team", "clusterQueue": "team", "delaySeconds": 0.5}: a
                  namespace policy (as Kyverno's generate rules do) that puts this LocalQueue
                  in every new namespace
  manageJobs      false: the batch/job integration is off (the label is ignored)
  preempt         {"afterSeconds": 1.0, "times": 1}: the first admitted Workload is preempted
                  this long after its admission, as if a higher-priority one had arrived;
                  {"whilePodsPending": N}: instead once its Job has N pods, none of them started
                  (a test about pods that never ran says so rather than racing the sandbox start)
  uninstall       {"afterJobs": N, "seconds": S}: Kueue is removed (CRDs, webhooks, controller)
                  S seconds after the cluster's Nth Job was created
  waitForPodsReady  {"timeoutSeconds": 1800, "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600,
                  "backoffLimitCount": null}: on by default since v0.19.0 with these values
"""

import datetime
import hashlib
import json
import time
import uuid

from apitypes import parse_quantity

GROUP = "kueue.x-k8s.io/v1beta2"
RESOURCES = {
    "resourceflavors": (GROUP, "ResourceFlavor", False, ".kueue.x-k8s.io"),
    "clusterqueues": (GROUP, "ClusterQueue", False, ".kueue.x-k8s.io"),
    "localqueues": (GROUP, "LocalQueue", True, ".kueue.x-k8s.io"),
    "workloads": (GROUP, "Workload", True, ".kueue.x-k8s.io"),
    "cohorts": (GROUP, "Cohort", False, ".kueue.x-k8s.io"),
}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
FLAVOR = "default-flavor"


def installed(config):
    return bool(config.get("kueue")) and not config["kueue"].get("uninstalled")


def stamp(at=None):
    return datetime.datetime.fromtimestamp(int(at or time.time()), datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")


def quantity(resource, amount):
    """How resource.Quantity prints an amount: CPU in cores or millicores, memory in Mi or Gi."""
    if resource == "cpu":
        return ("%d" % round(amount)) if abs(amount - round(amount)) < 1e-9 else "%dm" % round(amount * 1000)
    if amount % 2 ** 30 == 0:
        return "%dGi" % (amount // 2 ** 30)
    return "%dMi" % round(amount / 2 ** 20)


def count_eviction(workload, reason, underlying_cause=""):
    """workloadEvictionStateInc (pkg/workload/evict/evict.go): every eviction adds one to
    `status.schedulingStats.evictions[reason, underlyingCause].count`, in the same status patch
    as the Evicted condition. Deactivation counts as reason "Deactivated" with its cause."""
    evictions = workload["status"].setdefault("schedulingStats", {}).setdefault("evictions", [])
    for entry in evictions:
        if (entry["reason"], entry["underlyingCause"]) == (reason, underlying_cause):
            entry["count"] += 1
            return
    evictions.append({"reason": reason, "underlyingCause": underlying_cause, "count": 1})


def set_condition(obj, type_, status, reason, message, at=None):
    """meta.SetStatusCondition: the transition time changes only with the status."""
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    new = {"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": stamp(at), "observedGeneration": obj["metadata"].get("generation", 1)}
    for index, old in enumerate(conditions):
        if old["type"] == type_:
            if old["status"] == status:
                new["lastTransitionTime"] = old["lastTransitionTime"]
            changed = old != new
            conditions[index] = new
            return changed
    conditions.append(new)
    return True


def condition(obj, type_):
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def parse_time(value):
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def workload_name(job):
    """jobframework.GetWorkloadNameForOwnerWithGVK: job-<name>-<first 5 hex of sha1(kind, group,
    name, uid)> (workload_names.go)."""
    digest = hashlib.sha1(("Job\nbatch\n%s\n%s" % (job["metadata"]["name"], job["metadata"]["uid"])).encode())
    return "job-%s-%s" % (job["metadata"]["name"][:247], digest.hexdigest()[:5])


class Kueue:
    def __init__(self, cluster):
        self.cluster = cluster
        self.config = cluster.config.get("kueue") or {}
        self.preempt = dict(self.config.get("preempt") or {})
        self.admitted_at = {}  # workload uid -> when it was last admitted (preemption fault, PodsReady timeout)
        self.pods_ready = dict({"timeoutSeconds": 1800, "backoffBaseSeconds": 60, "backoffMaxSeconds": 3600,
                                "backoffLimitCount": None}, **(self.config.get("waitForPodsReady") or {}))

    # ------------------------------------------------------------ setup

    def seed(self, new_metadata):
        c = self.cluster
        flavors = {FLAVOR}
        for queue in self.config.get("clusterQueues", []):
            resources = sorted(queue.get("nominalQuota", {}))
            groups = queue.get("resourceGroups") or [{"coveredResources": resources, "flavors": [{
                "name": FLAVOR, "resources": [{"name": name, "nominalQuota": queue["nominalQuota"][name]}
                                              for name in resources]}]}]
            flavors |= {flavor["name"] for group in groups for flavor in group["flavors"]}
            spec = {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO",
                    "stopPolicy": queue.get("stopPolicy", "None"), "resourceGroups": groups}
            if queue.get("cohortName"):
                spec["cohortName"] = queue["cohortName"]
            c.put("clusterqueues", {"apiVersion": GROUP, "kind": "ClusterQueue",
                                    "metadata": dict(new_metadata({"name": queue["name"]}, ""), generation=1),
                                    "spec": spec})
        for name in sorted(flavors):
            c.put("resourceflavors", {"apiVersion": GROUP, "kind": "ResourceFlavor",
                                      "metadata": dict(new_metadata({"name": name}, ""), generation=1), "spec": {}})
        for cohort in self.config.get("cohorts", []):
            c.put("cohorts", {"apiVersion": GROUP, "kind": "Cohort",
                              "metadata": dict(new_metadata({"name": cohort["name"]}, ""), generation=1),
                              "spec": {key: cohort[key] for key in ("parentName", "resourceGroups") if key in cohort}})
        for queue in self.config.get("localQueues", []):
            self.make_local_queue(queue["namespace"], queue["name"], queue["clusterQueue"], new_metadata)

    def make_local_queue(self, namespace, name, cluster_queue, new_metadata):
        meta = dict(new_metadata({"name": name}, namespace), generation=1)
        self.cluster.put("localqueues", {"apiVersion": GROUP, "kind": "LocalQueue", "metadata": meta,
                                         "spec": {"clusterQueue": cluster_queue, "stopPolicy": "None"}})

    def webhook(self, job):
        """mjob.kb.io on CREATE: a Job with the queue label is stored suspended."""
        if self.config.get("manageJobs", True) and QUEUE_LABEL in (job["metadata"].get("labels") or {}):
            job.setdefault("spec", {})["suspend"] = True

    # ------------------------------------------------------------ controllers

    def reconcile(self):
        if self.uninstall():
            return
        self.namespace_policy()
        self.resume_queues()
        self.queue_status()
        self.job_reconciler()
        self.requeue_backoff()
        self.scheduler()
        self.wait_for_pods_ready()
        self.preemption_fault()
        self.garbage_collector()

    def uninstall(self):
        """uninstall {"afterJobs": N, "seconds": S}: an administrator removes Kueue (`kubectl
        delete -f manifests.yaml`) S seconds after the cluster's Nth Job was created: its CRDs go,
        and with them every Workload, LocalQueue, ClusterQueue and ResourceFlavor; its webhooks and
        controller go too, so a Job it suspended stays suspended. True once uninstalled."""
        when = self.config.get("uninstall")
        c = self.cluster
        if not when or len(c.jobs_created) < when["afterJobs"] or \
                time.time() < c.jobs_created[when["afterJobs"] - 1] + when["seconds"]:
            return False
        for resource in RESOURCES:
            for obj in list(c.items(resource)):
                c.remove(resource, obj)
        self.config["uninstalled"] = True
        return True

    def namespace_policy(self):
        policy = self.config.get("newNamespaceLocalQueue")
        if not policy:
            return
        c = self.cluster
        for ns in c.items("namespaces"):
            name = ns["metadata"]["name"]
            born = c.namespace_born.get(name, 0.0)
            if not born or ns["metadata"].get("deletionTimestamp") or c.get("localqueues", name, policy["name"]):
                continue
            if time.time() - born >= policy.get("delaySeconds", 0.5):
                self.make_local_queue(name, policy["name"], policy["clusterQueue"], c.new_metadata)

    def resume_queues(self):
        """An administrator resumes a stopped ClusterQueue (`stopPolicy: None`, a spec change:
        generation + 1) resumeAfterJobCreatedSeconds after the cluster's first Job."""
        c = self.cluster
        for queue in self.config.get("clusterQueues", []):
            after = queue.get("resumeAfterJobCreatedSeconds")
            if after is None or c.first_job_at is None or time.time() < c.first_job_at + after:
                continue
            cq = c.get("clusterqueues", "", queue["name"])
            if cq is not None and cq["spec"].get("stopPolicy", "None") != "None":
                cq["spec"]["stopPolicy"] = "None"
                cq["metadata"]["generation"] += 1
                c.put("clusterqueues", cq)

    def queue_status(self):
        c = self.cluster
        for cq in c.items("clusterqueues"):
            stopped = cq["spec"].get("stopPolicy", "None") != "None"
            changed = set_condition(cq, "Active", "False" if stopped else "True", "Stopped" if stopped else "Ready",
                                    "Can't admit new workloads: is stopped." if stopped else "Can admit new workloads")
            if changed:
                c.put("clusterqueues", cq)
        for lq in c.items("localqueues"):
            cq = c.get("clusterqueues", "", lq["spec"].get("clusterQueue"))
            if lq["spec"].get("stopPolicy", "None") != "None":
                args = ("False", "Stopped", "LocalQueue is stopped")
            elif cq is None:
                args = ("False", "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue")
            elif condition(cq, "Active").get("status") != "True":
                args = ("False", "ClusterQueueIsInactive", "Can't submit new workloads to clusterQueue")
            else:
                args = ("True", "Ready", "Can submit new workloads to localQueue")
            if set_condition(lq, "Active", *args):
                c.put("localqueues", lq)

    def job_reconciler(self):
        c = self.cluster
        if not self.config.get("manageJobs", True):
            return
        for job in c.items("jobs"):
            queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if not queue or job["metadata"].get("deletionTimestamp"):
                continue
            namespace = job["metadata"]["namespace"]
            workload = next((w for w in c.items("workloads", namespace) if (w["metadata"].get("labels") or {}).get(
                JOB_UID_LABEL) == job["metadata"]["uid"]), None)
            if workload is None:
                finished = any(x["type"] in ("Complete", "Failed") and x["status"] == "True"
                               for x in job["status"].get("conditions", []))
                if not job["spec"].get("suspend") and not finished:
                    # ensureOneWorkload: a running Job without its Workload (someone deleted it) is
                    # stopped first; its next reconcile makes a new Workload (ASSUMPTIONS.md)
                    job["spec"]["suspend"] = True
                    c.put("jobs", job)
                    c.record_event(job, "Normal", "Stopped", "Missing Workload; unable to restore pod templates",
                                   "kueue-job-controller")
                    continue
                workload = self.create_workload(job, queue)
                continue
            finished = {x["type"] for x in job["status"].get("conditions", []) if x["status"] == "True"} & {
                "Complete", "Failed"}
            if finished and condition(workload, "Finished").get("status") != "True":
                done = "Complete" in finished
                set_condition(workload, "Finished", "True", "Succeeded" if done else "Failed",
                              "Job finished successfully" if done else "Job failed")
                c.put("workloads", workload)
                continue
            admitted = condition(workload, "Admitted").get("status") == "True"
            evicted = condition(workload, "Evicted").get("status") == "True"
            suspended = job["spec"].get("suspend", False)
            if admitted and not evicted and suspended:
                # startJob: unsuspend (RunWithPodSetsInfo); the Job controller then resumes it.
                job["spec"]["suspend"] = False
                c.put("jobs", job)
                c.record_event(job, "Normal", "Started", "Admitted by clusterQueue %s"
                               % workload["status"]["admission"]["clusterQueue"], "kueue-job-controller")
            elif evicted and not suspended:
                # stopJob: suspend; the Job controller deletes the pods.
                job["spec"]["suspend"] = True
                c.put("jobs", job)
                c.record_event(job, "Normal", "Stopped", condition(workload, "Evicted").get("message", ""),
                               "kueue-job-controller")
            elif evicted and suspended and admitted and not job["status"].get("active") and not any(
                    p["metadata"].get("deletionTimestamp") for p in c.owned_pods(job)):
                # Every pod gone: the quota is released and the Workload requeued.
                message = condition(workload, "Evicted")["message"]
                reason = condition(workload, "Evicted")["reason"]
                workload["status"]["admission"] = None
                set_condition(workload, "QuotaReserved", "False", reason, message)
                set_condition(workload, "Admitted", "False", "NoReservation", "The workload has no reservation")
                if reason == "PodsReadyTimeout":
                    # Requeued only once the back-off is over (requeue_backoff)
                    set_condition(workload, "Requeued", "False", reason, message)
                elif reason.startswith("Deactivated"):
                    set_condition(workload, "Requeued", "False", "Deactivated", message)
                else:
                    set_condition(workload, "Requeued", "True", reason, message)
                c.put("workloads", workload)

    def create_workload(self, job, queue):
        c = self.cluster
        spec = job["spec"]
        template = json.loads(json.dumps(spec["template"]))
        body = {"apiVersion": GROUP, "kind": "Workload",
                "metadata": {"name": workload_name(job), "labels": {JOB_UID_LABEL: job["metadata"]["uid"]},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"active": True, "queueName": queue, "priority": 0, "podSets": [
                    {"name": "main", "count": min(spec.get("parallelism", 1), spec.get("completions", 1)),
                     "template": template}]}, "status": {}}
        workload = c.api_create("workloads", job["metadata"]["namespace"], body)
        c.record_event(job, "Normal", "CreatedWorkload", "Created Workload: %s/%s" % (
            job["metadata"]["namespace"], workload["metadata"]["name"]), "kueue-job-controller")
        return workload

    def demand(self, workload):
        """Per resource: container requests plus the RuntimeClass's Pod overhead (Kueue adds it
        to a Job's pod template itself: the template has none), times the pod count."""
        podset = workload["spec"]["podSets"][0]
        spec = podset["template"]["spec"]
        total = {}
        for container in spec.get("containers", []):
            for name, value in (container.get("resources", {}).get("requests") or {}).items():
                total[name] = total.get(name, 0.0) + parse_quantity(value)
        runtime = self.cluster.get("runtimeclasses", "", spec.get("runtimeClassName") or "")
        for name, value in ((runtime or {}).get("overhead", {}).get("podFixed") or {}).items():
            total[name] = total.get(name, 0.0) + parse_quantity(value)
        return {name: amount * podset["count"] for name, amount in total.items()}

    def usage(self, cq_name):
        """{(flavor, resource): amount} the ClusterQueue's admitted, unfinished Workloads hold."""
        used = {}
        for workload in self.cluster.items("workloads"):
            admission = (workload.get("status") or {}).get("admission")
            if admission and admission.get("clusterQueue") == cq_name and \
                    condition(workload, "Finished").get("status") != "True":
                assignment = admission["podSetAssignments"][0]
                for name, value in assignment["resourceUsage"].items():
                    key = (assignment.get("flavors", {}).get(name, FLAVOR), name)
                    used[key] = used.get(key, 0.0) + parse_quantity(value)
        return used

    def scheduler(self):
        """BestEffortFIFO: pending Workloads oldest first; one that does not fit does not block
        the others (v0.19.x: reason Pending; Inadmissible for a queue problem)."""
        c = self.cluster
        pending = [w for w in c.items("workloads") if condition(w, "QuotaReserved").get("status") != "True"
                   and condition(w, "Finished").get("status") != "True" and w["spec"].get("active", True)
                   and not (condition(w, "Requeued").get("status") == "False"
                            and condition(w, "Requeued").get("reason") == "PodsReadyTimeout")]
        pending.sort(key=lambda w: (w["metadata"]["creationTimestamp"], w["metadata"]["name"]))
        for workload in pending:
            namespace, queue = workload["metadata"]["namespace"], workload["spec"]["queueName"]
            lq = c.get("localqueues", namespace, queue)
            cq = c.get("clusterqueues", "", (lq or {}).get("spec", {}).get("clusterQueue", ""))
            if lq is None:
                self.not_admitted(workload, "Inadmissible", "LocalQueue %s is terminating or missing" % queue)
            elif lq["spec"].get("stopPolicy", "None") != "None":
                self.not_admitted(workload, "Inadmissible", "LocalQueue %s is stopped" % queue)
            elif cq is None:
                self.not_admitted(workload, "Inadmissible", "ClusterQueue %s is terminating or missing"
                                  % lq["spec"]["clusterQueue"])
            elif cq["spec"].get("stopPolicy", "None") != "None":
                # the real Kueue v0.19.2 says "inactive" here (WorkloadReconciler.getQueueBlocker, checked with
                # the real binary: tests/test_real_control_plane.py); "is stopped" is its other path
                self.not_admitted(workload, "Inadmissible", "ClusterQueue %s is inactive" % cq["metadata"]["name"])
            else:
                self.try_admit(workload, cq)

    def cohort_root(self, name):
        """The root of a cohort's tree (Cohort objects' parentName; a name without an object is a root)."""
        seen = set()
        while name not in seen:
            seen.add(name)
            cohort = self.cluster.get("cohorts", "", name)
            parent = (cohort or {}).get("spec", {}).get("parentName")
            if not parent:
                return name
            name = parent
        return name

    def capacity(self, cq):
        """{(flavor, resource): (most the ClusterQueue can ever use, what it can use now)}: its
        nominal quota plus, in a cohort, what the cohort's tree can lend it (every other member's
        nominal quota less what its lendingLimit keeps back, and the Cohort objects' own quota),
        within its borrowingLimit; now, less what the cohort already uses beyond what others
        keep for themselves (a flattened model of Kueue's hierarchical cohorts)."""
        c, name = self.cluster, cq["metadata"]["name"]
        table = {}

        def quotas(obj):
            for group in obj.get("spec", {}).get("resourceGroups") or []:
                for flavor in group.get("flavors") or []:
                    for r in flavor.get("resources") or []:
                        yield (flavor["name"], r["name"]), r

        root = self.cohort_root(cq["spec"]["cohortName"]) if cq["spec"].get("cohortName") else None
        members = [other for other in c.items("clusterqueues") if root is not None and other["spec"].get(
            "cohortName") and self.cohort_root(other["spec"]["cohortName"]) == root]
        for key, r in quotas(cq):
            nominal, used = parse_quantity(r["nominalQuota"]), self.usage(name).get(key, 0.0)
            if root is None:
                table[key] = (nominal, nominal - used)
                continue
            lendable, cohort_used_beyond = 0.0, 0.0
            for other in members:
                if other["metadata"]["name"] == name:
                    continue
                for other_key, other_r in quotas(other):
                    if other_key != key:
                        continue
                    other_nominal = parse_quantity(other_r["nominalQuota"])
                    kept = other_nominal - parse_quantity(other_r["lendingLimit"]) if "lendingLimit" in other_r else 0.0
                    lendable += other_nominal - kept
                    other_used = self.usage(other["metadata"]["name"]).get(key, 0.0)
                    cohort_used_beyond += max(0.0, other_used - kept)
            for cohort in c.items("cohorts"):
                if self.cohort_root(cohort["metadata"]["name"]) == root:
                    lendable += sum(parse_quantity(q["nominalQuota"]) for k, q in quotas(cohort) if k == key)
            borrow = parse_quantity(r["borrowingLimit"]) if "borrowingLimit" in r else float("inf")
            most = nominal + min(borrow, lendable)
            table[key] = (most, min(most - used, nominal - used + lendable - cohort_used_beyond))
        return table

    def try_admit(self, workload, cq):
        """flavorassigner.go: per resource group, the first flavor (in order) that fits every
        resource of the group the pod set asks for; a group's resources are never split across
        flavors."""
        demand, table = self.demand(workload), self.capacity(cq)
        reasons, assigned = [], {}
        covered = {r: group for group in cq["spec"]["resourceGroups"] for r in group["coveredResources"]}
        for name in sorted(demand):
            if name not in covered:
                reasons.append("resource %s unavailable in ClusterQueue" % name)
        for group in cq["spec"]["resourceGroups"]:
            wanted = sorted(r for r in group["coveredResources"] if demand.get(r))
            if not wanted:
                continue
            group_reasons = []
            for flavor in group["flavors"]:
                short = []
                for name in wanted:
                    most, now = table.get((flavor["name"], name), (0.0, 0.0))
                    if demand[name] > most + 1e-9:
                        short.append("insufficient quota for %s in flavor %s, previously considered podsets requests "
                                     "(%s) + current podset request (%s) > maximum capacity (%s)" % (
                                         name, flavor["name"], quantity(name, 0), quantity(name, demand[name]),
                                         quantity(name, most)))
                    elif demand[name] > now + 1e-9:
                        short.append("insufficient unused quota for %s in flavor %s, %s more needed" % (
                            name, flavor["name"], quantity(name, demand[name] - now)))
                if not short:
                    assigned.update({name: flavor["name"] for name in wanted})
                    group_reasons = []
                    break
                group_reasons += short
            reasons += group_reasons
        if reasons:
            self.not_admitted(workload, "Pending", "couldn't assign flavors to pod set main: " + ", ".join(reasons))
            return
        c = self.cluster
        now = time.time()
        previously = condition(workload, "Evicted")
        workload["status"]["admission"] = {"clusterQueue": cq["metadata"]["name"], "podSetAssignments": [{
            "name": "main", "count": workload["spec"]["podSets"][0]["count"],
            "flavors": {name: assigned.get(name, FLAVOR) for name in sorted(demand)},
            "resourceUsage": {name: quantity(name, amount) for name, amount in sorted(demand.items())}}]}
        set_condition(workload, "QuotaReserved", "True", "QuotaReserved",
                      "Quota reserved in ClusterQueue %s" % cq["metadata"]["name"], now)
        set_condition(workload, "Admitted", "True", "Admitted", "The workload is admitted", now)
        set_condition(workload, "PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded", now)
        if previously.get("status") == "True":
            for kind in ("Evicted", "Preempted"):
                old = condition(workload, kind)
                if old:
                    set_condition(workload, kind, "False", "QuotaReserved", "Previously: " + old["message"], now)
            requeued = condition(workload, "Requeued")
            if requeued:
                set_condition(workload, "Requeued", "False", "QuotaReserved", "Previously: " + requeued["message"], now)
        c.put("workloads", workload)
        self.admitted_at[workload["metadata"]["uid"]] = now
        queued_since = workload["metadata"]["creationTimestamp"]
        waited = now - datetime.datetime.fromisoformat(queued_since.replace("Z", "+00:00")).timestamp()
        c.record_event(workload, "Normal", "QuotaReserved", "Quota reserved in ClusterQueue %s, wait time since queued "
                       "was %.0fs" % (cq["metadata"]["name"], waited), "kueue-admission")
        c.record_event(workload, "Normal", "Admitted", "Admitted by ClusterQueue %s, wait time since reservation was 0s"
                       % cq["metadata"]["name"], "kueue-admission")

    def not_admitted(self, workload, reason, message):
        changed = set_condition(workload, "QuotaReserved", "False", reason, message)
        if changed:
            self.cluster.put("workloads", workload)
            self.cluster.record_event(workload, "Warning", reason, message, "kueue-admission")

    def requeue_backoff(self):
        """After a PodsReady timeout a Workload waits until status.requeueState.requeueAt; then
        Requeued=True BackoffFinished "The workload backoff was finished" (workload_controller.go)."""
        for workload in self.cluster.items("workloads"):
            requeued = condition(workload, "Requeued")
            state = (workload.get("status") or {}).get("requeueState") or {}
            if requeued.get("status") == "False" and requeued.get("reason") == "PodsReadyTimeout" and \
                    state.get("requeueAt") and time.time() >= parse_time(state["requeueAt"]):
                state.pop("requeueAt", None)
                set_condition(workload, "Requeued", "True", "BackoffFinished", "The workload backoff was finished")
                self.cluster.put("workloads", workload)

    def wait_for_pods_ready(self):
        """waitForPodsReady (on by default since v0.19.0): PodsReady turns True (Started) once
        ready + succeeded pods reach the podSet count; an admitted Workload that does not get
        there within the timeout is evicted (PodsReadyTimeout, "Exceeded the PodsReady timeout
        ns/name") with a requeue back-off of base x 2^(n-1) s, capped; past backoffLimitCount it
        is deactivated instead (spec.active false, Evicted DeactivatedDueToRequeuingLimitExceeded)."""
        c, settings = self.cluster, self.pods_ready
        jobs = {job["metadata"]["uid"]: job for job in c.items("jobs")}
        for workload in c.items("workloads"):
            if condition(workload, "Admitted").get("status") != "True" or \
                    condition(workload, "Evicted").get("status") == "True" or \
                    condition(workload, "PodsReady").get("status") == "True":
                continue
            job = jobs.get(((workload["metadata"].get("ownerReferences") or [{}])[0]).get("uid"))
            status = (job or {}).get("status", {})
            if status.get("ready", 0) + status.get("succeeded", 0) >= workload["spec"]["podSets"][0]["count"]:
                set_condition(workload, "PodsReady", "True", "Started",
                              "All pods reached readiness and the workload is running")
                c.put("workloads", workload)
                continue
            admitted = self.admitted_at.get(workload["metadata"]["uid"])
            if admitted is None or time.time() - admitted < settings["timeoutSeconds"]:
                continue
            state = workload["status"].setdefault("requeueState", {})
            limit = settings.get("backoffLimitCount")
            if limit is not None and state.get("count", 0) + 1 > limit:
                workload["spec"]["active"] = False
                set_condition(workload, "Evicted", "True", "DeactivatedDueToRequeuingLimitExceeded",
                              "The workload is deactivated due to exceeding the maximum number of re-queuing retries")
                count_eviction(workload, "Deactivated", "RequeuingLimitExceeded")
                c.put("workloads", workload)
                continue
            state["count"] = state.get("count", 0) + 1
            wait = min(settings["backoffMaxSeconds"], settings["backoffBaseSeconds"] * 2 ** (state["count"] - 1))
            state["requeueAt"] = stamp(time.time() + wait)
            message = "Exceeded the PodsReady timeout %s/%s" % (workload["metadata"]["namespace"],
                                                              workload["metadata"]["name"])
            set_condition(workload, "Evicted", "True", "PodsReadyTimeout", message)
            count_eviction(workload, "PodsReadyTimeout")
            set_condition(workload, "PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded")
            c.put("workloads", workload)
            c.record_event(workload, "Normal", "EvictedDueToPodsReadyTimeout", message, "kueue-admission")

    def preemption_fault(self):
        """As if a higher-priority Workload had arrived: Evicted (Preempted) and Preempted
        (InClusterQueue) with the preemptor's message (pkg/scheduler/preemption/preemption.go)."""
        if self.preempt.get("times", 1) <= 0 or not {"afterSeconds", "whilePodsPending"} & set(self.preempt):
            return
        for workload in self.cluster.items("workloads"):
            at = self.admitted_at.get(workload["metadata"]["uid"])
            if at is None or time.time() - at < self.preempt.get("afterSeconds", 0) or \
                    condition(workload, "Admitted").get("status") != "True" or \
                    condition(workload, "Evicted").get("status") == "True" or \
                    condition(workload, "Finished").get("status") == "True":
                continue
            if "whilePodsPending" in self.preempt:
                job_uid = (workload["metadata"].get("ownerReferences") or [{}])[0].get("uid")
                pods = [pod for pod in self.cluster.items("pods")
                        if pod["metadata"].get("labels", {}).get("batch.kubernetes.io/controller-uid") == job_uid
                        and not pod["metadata"].get("deletionTimestamp")]
                if len(pods) < self.preempt["whilePodsPending"] or \
                        any(pod.get("status", {}).get("phase") != "Pending" for pod in pods):
                    continue
            self.preempt["times"] = self.preempt.get("times", 1) - 1
            message = ("Preempted to accommodate a workload (UID: %s, JobUID: %s) due to prioritization in the "
                       "ClusterQueue; preemptor path: /%s; preemptee path: /%s" % (
                           uuid.uuid4(), uuid.uuid4(), workload["status"]["admission"]["clusterQueue"],
                           workload["status"]["admission"]["clusterQueue"]))
            set_condition(workload, "Evicted", "True", "Preempted", message)
            count_eviction(workload, "Preempted")
            set_condition(workload, "Preempted", "True", "InClusterQueue", message)
            self.cluster.put("workloads", workload)
            self.cluster.record_event(workload, "Normal", "Preempted", message, "kueue-admission")
            return

    def garbage_collector(self):
        jobs = {job["metadata"]["uid"] for job in self.cluster.items("jobs")}
        for workload in self.cluster.items("workloads"):
            owner = (workload["metadata"].get("ownerReferences") or [{}])[0]
            if owner.get("kind") == "Job" and owner.get("uid") not in jobs:
                self.cluster.remove("workloads", workload)
