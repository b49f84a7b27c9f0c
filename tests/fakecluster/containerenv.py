"""A container's environment as a kubelet builds it from the pod spec, shared by the simulated
kubelet (kubelet.py) and the real-control-plane tier's episode runtime (tests/controlplane/runtime.py).
Pure functions of the pod: no import of the simulated cluster."""

import re


def field_value(pod, path, node):
    """The downward API: metadata.name, .namespace, .uid, spec.nodeName, labels['k'], annotations['k']."""
    match = re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path)
    if match:
        return (pod["metadata"].get(match.group(1)) or {}).get(match.group(2), "")
    return {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
            "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": node}.get(path, "")


def container_env(container, pod, node):
    """[(name, value)] of the container's `env`, in order: a value's $(NAME) expands to an earlier
    variable of the container and $$ escapes (the kubelet's third_party/forked/golang/expansion);
    a fieldRef is the downward API's; other sources (secrets, ConfigMap keys) are left out."""
    defined = {}
    for var in container.get("env", []):
        if "value" in var:
            value = re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                           lambda m: "$" if m.group(0) == "$$" else defined.get(m.group(1), m.group(0)),
                           var["value"])
        elif "fieldRef" in var.get("valueFrom", {}):
            value = field_value(pod, var["valueFrom"]["fieldRef"]["fieldPath"], node)
        else:
            continue
        defined[var["name"]] = value
    return list(defined.items())
