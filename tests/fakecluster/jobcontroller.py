"""The simulated Job controller (pkg/controller/job/job_controller.go): pods for a Job's indexes, their counting, the Job's conditions, suspension.

A mixin of server.Cluster: `self` is the cluster (its lock is held while controllers run).
"""

import json
import time

from api import ApiError, compress_indexes, now_rfc3339


TRACKING = "batch.kubernetes.io/job-tracking"


def only_replace_failed_pods(job):
    """onlyReplaceFailedPods (pkg/controller/job/job_controller.go, ASSUMPTIONS.md "Job controller")."""
    spec = job["spec"]
    return spec.get("podReplacementPolicy") == "Failed" or spec.get("podFailurePolicy") is not None


def is_pod_failed(job, pod):
    """isPodFailed: Failed, or, unless only failed pods are replaced, deleted and not Succeeded
    (a pod evicted or deleted while it runs counts as failed at once, in its grace period)."""
    phase = pod["status"].get("phase")
    if phase == "Failed":
        return True
    if only_replace_failed_pods(job):
        return False
    return bool(pod["metadata"].get("deletionTimestamp")) and phase != "Succeeded"


class JobController:
    def mark(self, record):
        """Precise wall-clock moments (benchmarks read them; the API's own times are whole seconds)."""
        with open(self.dir / "marks.jsonl", "a") as marks:
            marks.write(json.dumps(record) + "\n")

    def owned_pods(self, job):
        uid = job["metadata"]["uid"]
        return [pod for pod in self.items("pods", job["metadata"]["namespace"])
                if any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences", []))]

    def failure_policy_action(self, job, pod):
        """The podFailurePolicy rule that matches a failed pod: Ignore, FailIndex, FailJob or Count."""
        status = (pod["status"].get("containerStatuses") or [{}])[0]
        exit_code = ((status.get("state") or {}).get("terminated") or {}).get("exitCode")
        conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions", [])}
        for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules", []):
            codes = rule.get("onExitCodes")
            if codes and exit_code is not None and exit_code != 0:
                inside = exit_code in codes.get("values", [])
                if inside == (codes.get("operator") == "In"):
                    return rule["action"]
            for pattern in rule.get("onPodConditions") or []:
                if (pattern["type"], pattern.get("status", "True")) in conditions:
                    return rule["action"]
        return "Count"

    def count_finished_pod(self, job, pod, book):
        """What the controller learns from a pod that has just finished."""
        uid, spec = pod["metadata"]["uid"], job["spec"]
        index = pod["metadata"].get("annotations", {}).get("batch.kubernetes.io/job-completion-index")
        index = int(index) if index is not None else None
        if pod["status"]["phase"] == "Succeeded":
            book["succeeded"].add(uid)
            if index is not None:
                book["indexes_succeeded"].add(index)
            return
        action = self.failure_policy_action(job, pod)
        if action == "Ignore":
            book["ignored"].add(uid)  # not counted: a replacement is created at once
            return
        book["failed"].add(uid)
        if action == "FailJob":
            book["fail_job"] = "PodFailurePolicy"
        if index is not None and spec.get("backoffLimitPerIndex") is not None:
            failures = book["index_failures"].get(index, 0) + 1
            book["index_failures"][index] = failures
            if action == "FailIndex" or failures > spec["backoffLimitPerIndex"]:
                book["indexes_failed"].add(index)
            else:
                # the Job controller's pod-failure backoff, per index: 10 s, doubling, at most 10 min
                book["index_retry_at"][index] = time.time() + min(600.0, 10.0 * 2 ** (failures - 1))

    def job_controller(self):
        for job in self.items("jobs"):
            if job["metadata"].get("deletionTimestamp"):
                continue
            book = self.job_books[job["metadata"]["uid"]]
            batch = self.timing["jobSyncBatchSeconds"]
            # A spec change (Kueue's suspend, say) is synced at once; pod and status updates wait
            # for the next batched sync of their Job (ASSUMPTIONS.md "Sync batching").
            spec_seen = json.dumps(job["spec"], sort_keys=True)
            if batch and time.time() - self.job_synced.get(job["metadata"]["uid"], 0.0) < batch and \
                    self.job_specs_synced.get(job["metadata"]["uid"]) == spec_seen:
                continue
            self.job_synced[job["metadata"]["uid"]] = time.time()
            self.job_specs_synced[job["metadata"]["uid"]] = spec_seen
            spec, status = job["spec"], job["status"]
            indexed = spec.get("completionMode") == "Indexed"
            conditions = status.get("conditions", [])
            types = {c["type"] for c in conditions}
            if "Complete" in types or "Failed" in types:
                continue
            changed = False
            pods = self.owned_pods(job)
            if self.suspension(job, book, pods):
                continue
            if "startTime" not in status:
                status["startTime"] = now_rfc3339()
                book["started"] = time.time()
                changed = True
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if TRACKING not in pod["metadata"].get("finalizers", []) or \
                        uid in book["succeeded"] | book["failed"] | book["ignored"]:
                    continue  # counted in an earlier sync, or untracked at suspension
                if pod["status"].get("phase") != "Succeeded" and not is_pod_failed(job, pod):
                    continue
                if not self.client_call("jobController"):  # the finalizer's removal is an API call
                    break
                self.count_finished_pod(job, pod, book)
                pod["metadata"]["finalizers"] = [f for f in pod["metadata"].get("finalizers", []) if f != TRACKING]
                self.put("pods", pod)
                changed = True
            active = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")
                      and not p["metadata"].get("deletionTimestamp")]
            terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")
                           and p["status"].get("phase") in ("Pending", "Running")]
            succeeded, failed = len(book["succeeded"]), len(book["failed"])
            if "FailureTarget" not in types and "SuccessCriteriaMet" not in types:
                deadline = spec.get("activeDeadlineSeconds")
                terminal_indexes = book["indexes_succeeded"] | book["indexes_failed"]
                if book.get("fail_job"):
                    self.add_condition(job, "FailureTarget", "PodFailurePolicy",
                                       "Pod failure policy rule matched a failed pod")
                elif failed > spec["backoffLimit"]:
                    self.add_condition(job, "FailureTarget", "BackoffLimitExceeded",
                                       "Job has reached the specified backoff limit")
                elif deadline is not None and time.time() - book["started"] >= deadline:
                    self.add_condition(job, "FailureTarget", "DeadlineExceeded",
                                       "Job was active longer than specified deadline")
                elif indexed and book["indexes_failed"] and len(terminal_indexes) >= spec["completions"]:
                    self.add_condition(job, "FailureTarget", "FailedIndexes", "Job has failed indexes")
                elif (len(book["indexes_succeeded"]) if indexed else succeeded) >= spec["completions"]:
                    self.add_condition(job, "SuccessCriteriaMet", "CompletionsReached",
                                       "Reached expected number of succeeded pods")
                changed = True
            types = {c["type"] for c in job["status"].get("conditions", [])}
            if "FailureTarget" in types:
                for pod in active:
                    self.begin_pod_termination(pod)
                    self.put("pods", pod)
                    self.record_event(job, "Normal", "SuccessfulDelete", "Deleted pod: " + pod["metadata"]["name"])
                if not active and not terminating:
                    target = [c for c in job["status"]["conditions"] if c["type"] == "FailureTarget"][0]
                    self.add_condition(job, "Failed", target["reason"], target["message"])
                    self.record_event(job, "Warning", target["reason"], target["message"])
                changed = True
            elif "SuccessCriteriaMet" in types:
                if not active and not terminating:
                    self.add_condition(job, "Complete", "CompletionsReached",
                                       "Reached expected number of succeeded pods")
                    self.mark({"job": job["metadata"]["name"], "namespace": job["metadata"]["namespace"],
                               "complete_at": time.time()})
                    job["status"]["completionTime"] = now_rfc3339()
                    self.first_created.setdefault("job-complete", time.time())  # an apiOutage may count from it
                    self.record_event(job, "Normal", "Completed", "Job completed")
                    changed = True
            elif time.time() >= book["create_backoff_until"]:
                # TerminatingOrFailed replaces a terminating pod at once; Failed waits for it.
                occupying = active + (terminating if spec["podReplacementPolicy"] == "Failed" else [])
                # A Succeeded pod whose finalizer this sync could not remove yet (the client's rate
                # limit) is succeeded all the same: calculateSucceededIndexes and getStatus count it
                # (ASSUMPTIONS.md "Job controller"), so its index gets no second pod.
                uncounted = [p for p in pods if p["status"].get("phase") == "Succeeded"
                             and TRACKING in p["metadata"].get("finalizers", [])
                             and p["metadata"]["uid"] not in book["succeeded"]]
                if indexed:
                    busy = {int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
                            for p in occupying + uncounted}
                    ready = [i for i in range(spec["completions"]) if i not in book["indexes_succeeded"]
                             and i not in book["indexes_failed"] and i not in busy
                             and time.time() >= book["index_retry_at"].get(i, 0)]
                    indexes = ready[:max(0, spec["parallelism"] - len(occupying))]
                else:
                    want = min(spec["parallelism"], spec["completions"] - succeeded - len(uncounted)) - len(occupying)
                    indexes = [None] * max(0, want)
                if indexes:
                    self.create_job_pods(job, indexes, book)
                    active = [p for p in self.owned_pods(job) if p["status"].get("phase") in ("Pending", "Running")
                              and not p["metadata"].get("deletionTimestamp")]
                    changed = True
            new_status = self.job_status(job, active, terminating, book)
            if new_status != job["status"] or changed:
                job["status"] = new_status
                self.put("jobs", job)

    def suspension(self, job, book, pods):
        """spec.suspend (KEP-2232): a suspended Job has condition Suspended=True (JobSuspended),
        no active pods (they are deleted) and no startTime, and its deadline does not run; on
        resume the condition turns False (JobResumed) and startTime is reset to now, so the
        deadline starts again (job_controller.go syncJob). True while the Job is suspended."""
        status = job["status"]
        suspended = job["spec"].get("suspend", False)
        current = next((c for c in status.get("conditions", []) if c["type"] == "Suspended"), None)
        if suspended:
            changed = False
            if current is None or current["status"] != "True":
                stamp = now_rfc3339()
                status["conditions"] = [c for c in status.get("conditions", []) if c["type"] != "Suspended"] + [
                    {"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended",
                     "lastProbeTime": stamp, "lastTransitionTime": stamp}]
                self.record_event(job, "Normal", "Suspended", "Job suspended")
                status.pop("startTime", None)
                changed = True
            for pod in pods:
                if pod["status"].get("phase") in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
                    # deleteJobPods: the tracking finalizer goes first, then the pod is deleted;
                    # a pod without the finalizer is never counted, failed or succeeded.
                    pod["metadata"]["finalizers"] = [f for f in pod["metadata"].get("finalizers", [])
                                                     if f != TRACKING]
                    self.begin_pod_termination(pod)
                    self.put("pods", pod)
                    self.record_event(job, "Normal", "SuccessfulDelete", "Deleted pod: " + pod["metadata"]["name"])
                    changed = True
            for pod in pods:  # pods that had ended before the suspension are still counted
                if pod["status"].get("phase") in ("Succeeded", "Failed") and pod["metadata"]["uid"] not in \
                        book["succeeded"] | book["failed"] | book["ignored"] and \
                        TRACKING in pod["metadata"].get("finalizers", []):
                    self.count_finished_pod(job, pod, book)
                    pod["metadata"]["finalizers"] = [f for f in pod["metadata"]["finalizers"] if f != TRACKING]
                    self.put("pods", pod)
                    changed = True
            terminating = [p for p in self.owned_pods(job) if p["metadata"].get("deletionTimestamp")
                           and p["status"].get("phase") in ("Pending", "Running")]
            new_status = dict(self.job_status(job, [], terminating, book))
            new_status.pop("ready", None)
            if changed or new_status != status:
                job["status"] = new_status
                self.put("jobs", job)
            # The backoff limit is judged while suspended too, on the pods counted before.
            return len(book["failed"]) <= job["spec"]["backoffLimit"]
        if current is not None and current["status"] == "True":
            stamp = now_rfc3339()
            current.update(status="False", reason="JobResumed", message="Job resumed", lastProbeTime=stamp,
                           lastTransitionTime=stamp)
            self.record_event(job, "Normal", "Resumed", "Job resumed")
            status["startTime"] = stamp
            book["started"] = time.time()
        return False

    def job_status(self, job, active, terminating, book):
        old = job["status"]
        status = {}
        if active:
            status["active"] = len(active)
        for key in ("completionTime", "conditions"):
            if key in old:
                status[key] = old[key]
        if book["failed"]:
            status["failed"] = len(book["failed"])
        status["ready"] = sum(1 for p in active if any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
        if "startTime" in old:
            status["startTime"] = old["startTime"]
        if book["succeeded"]:
            status["succeeded"] = len(book["succeeded"])
        status["terminating"] = len(terminating)
        status["uncountedTerminatedPods"] = {}
        if job["spec"].get("completionMode") == "Indexed":
            if book["indexes_succeeded"]:
                status["completedIndexes"] = compress_indexes(book["indexes_succeeded"])
            if job["spec"].get("backoffLimitPerIndex") is not None:
                status["failedIndexes"] = compress_indexes(book["indexes_failed"])
        return status

    def add_condition(self, job, type_, reason, message):
        stamp = now_rfc3339()
        job["status"].setdefault("conditions", []).append(
            {"type": type_, "status": "True", "lastProbeTime": stamp, "lastTransitionTime": stamp,
             "reason": reason, "message": message})

    def create_job_pods(self, job, indexes, book):
        """Create pods in slow-start batches (1, 2, 4, ...) as the Job controller does; in Indexed
        mode each carries its completion index (annotation, label, JOB_COMPLETION_INDEX, hostname)."""
        template = job["spec"]["template"]
        batch, created = 1, 0
        while created < len(indexes):
            for index in indexes[created:created + batch]:
                name = job["metadata"]["name"]
                meta = {"generateName": name + "-",
                        "labels": dict(template["metadata"].get("labels", {})),
                        "annotations": dict(template["metadata"].get("annotations", {})),
                        "finalizers": [TRACKING],
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                             "uid": job["metadata"]["uid"], "controller": True,
                                             "blockOwnerDeletion": True}]}
                spec = json.loads(json.dumps(template["spec"]))
                if index is not None:
                    meta["generateName"] = "%s-%d-" % (name, index)
                    meta["annotations"]["batch.kubernetes.io/job-completion-index"] = str(index)
                    meta["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
                    spec["hostname"] = "%s-%d" % (name, index)
                    for container in spec.get("containers", []):
                        if not any(v["name"] == "JOB_COMPLETION_INDEX" for v in container.get("env", [])):
                            container.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                                "fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-completion-index']"}}})
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
                if not self.client_call("jobController"):
                    return  # out of tokens: the rest on a later pass
                try:
                    pod = self.api_create("pods", job["metadata"]["namespace"], pod)
                except ApiError as error:
                    self.record_event(job, "Warning", "FailedCreate", "Error creating: " + str(error))
                    book["create_failures"] += 1
                    book["create_backoff_until"] = time.time() + min(10.0, 0.5 * 2 ** book["create_failures"])
                    return
                self.record_event(job, "Normal", "SuccessfulCreate", "Created pod: " + pod["metadata"]["name"])
                created += 1
            batch *= 2
