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
        for ns in self.items("namespaces"):
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            name = ns["metadata"]["name"]
            contents = [(res, obj) for res, stored in list(self.objects.items())
                        for (namespace, _), obj in list(stored.items()) if namespace == name]
            for resource, obj in contents:
                if resource == "pods":
                    self.begin_pod_termination(obj)
                elif resource == "jobs":
                    self.remove("jobs", obj)
                elif resource != "events" or not any(r == "pods" for r, _ in contents):
                    self.remove(resource, obj)
            book = self.job_books.get("ns:" + ns["metadata"]["uid"], {})
            if not contents and time.time() - book.get("deleted_at", 0) >= self.config["namespaceDeletionSeconds"]:
                self.remove("namespaces", ns)
