"""The garbage collector (ownerReferences) and the namespace controller (a Terminating namespace goes once it is empty).

A mixin of server.Cluster: `self` is the cluster (its lock is held while controllers run).
"""

import time


class NamespaceLifecycle:
    def garbage_collector(self):
        job_uids = {job["metadata"]["uid"]: job for job in self.items("jobs")}
        for pod in self.items("pods"):
            owners = [ref for ref in pod["metadata"].get("ownerReferences", []) if ref.get("kind") == "Job"]
            if not owners:
                continue
            owner = job_uids.get(owners[0]["uid"])
            orphaned = owner is None
            foreground = owner is not None and "foregroundDeletion" in owner["metadata"].get("finalizers", [])
            if (orphaned or foreground) and not pod["metadata"].get("deletionTimestamp"):
                self.begin_pod_termination(pod)
                self.put("pods", pod)
        for job in job_uids.values():
            if "foregroundDeletion" in job["metadata"].get("finalizers", []) and not self.owned_pods(job):
                self.remove("jobs", job)
                self.job_books.pop(job["metadata"]["uid"], None)

    def namespace_controller(self):
        """kube-controller-manager's namespace controller (pkg/controller/namespace, ASSUMPTIONS.md
        "Namespace deletion"): a Terminating namespace is first worked on namespaceDeletionSeconds
        after its deletion (upstream's namespaceDeletionGracePeriod, 5 s); then each pass deletes its
        contents (pods with their grace period) and removes the namespace once nothing is left. While
        pods are still in their grace period, the next pass comes estimate/2 + 1 whole seconds later."""
        for ns in self.items("namespaces"):
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            book = self.job_books.setdefault("ns:" + ns["metadata"]["uid"], {"deleted_at": time.time()})
            now = time.time()
            if now < book.setdefault("next_at", book["deleted_at"] + self.config["namespaceDeletionSeconds"]):
                continue
            name = ns["metadata"]["name"]
            contents = [(res, obj) for res, stored in self.objects.items()
                        for (namespace, _), obj in stored.items() if namespace == name]
            estimate, has_pods = 0, any(resource == "pods" for resource, _ in contents)
            for resource, obj in contents:
                if resource == "pods":
                    if not obj["metadata"].get("deletionTimestamp"):
                        self.begin_pod_termination(obj)
                        self.put("pods", obj)
                    if obj["status"].get("phase") not in ("Succeeded", "Failed"):
                        estimate = max(estimate, obj["spec"].get("terminationGracePeriodSeconds", 30))
                elif resource == "jobs":
                    self.remove("jobs", obj)
                elif resource != "events" or not has_pods:
                    self.remove(resource, obj)
            if not contents:
                self.remove("namespaces", ns)
                continue
            # estimateGracefulTermination: no estimate once the namespace has been Terminating longer.
            if now - book["deleted_at"] >= estimate:
                estimate = 0
            book["next_at"] = now + (estimate // 2 + 1 if estimate else 0)
