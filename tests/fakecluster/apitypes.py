"""Kubernetes API value semantics the simulated cluster needs, written from the Kubernetes
sources (not from the tool under test, so that a mistake in the tool's own copy can be caught).

- parse_quantity: resource.Quantity's suffixes, kubernetes/kubernetes
  staging/src/k8s.io/apimachinery/pkg/api/resource/suffix.go at commit 1402b859889c53c881b1d684b138cf66de59c3b2
  (newSuffixer, fastLookup.interpret):
  binary Ki..Ei = 2^10..2^60; decimal n, u, m, "", k, M, G, T, P, E = 10^-9..10^18; a decimal
  exponent e<N> or E<N>. A quantity is a signed decimal number followed by one suffix
  (quantity.go parseQuantityString). Returned as a float in the base unit.
- tolerates: v1 Toleration.ToleratesTaint, staging/src/k8s.io/api/core/v1/toleration.go
  (commit 19c6083b5c8b499f3bdd52e5f58a0b6f645d0fd3): an empty effect matches every effect;
  an empty key matches every key; operator "" or Equal compares values, Exists matches any
  value, Lt and Gt compare the values as int64 (taint value < or > the toleration's); any other
  operator tolerates nothing.
"""

import re

BINARY_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}
DECIMAL_SUFFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                    "P": 1e15, "E": 1e18}
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")


def parse_quantity(value):
    """'100m' -> 0.1, '64Mi' -> 67108864.0, '1e3' -> 1000.0; ValueError for what the API refuses."""
    match = QUANTITY.match(str(value).strip())
    if not match:
        raise ValueError("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in BINARY_SUFFIXES:
        return number * BINARY_SUFFIXES[suffix]
    if suffix in DECIMAL_SUFFIXES:
        return number * DECIMAL_SUFFIXES[suffix]
    exponent = re.match(r"^[eE]([+-]?[0-9]+)$", suffix)
    if exponent:
        return number * 10.0 ** int(exponent.group(1))
    raise ValueError("unable to parse quantity's suffix %r" % suffix)


def toleration_tolerates(toleration, taint):
    """One toleration against one taint, as ToleratesTaint does."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or ""
    if operator in ("", "Equal"):
        return (toleration.get("value") or "") == (taint.get("value") or "")
    if operator == "Exists":
        return True
    if operator in ("Lt", "Gt"):
        try:
            wanted, have = int(toleration.get("value") or ""), int(taint.get("value") or "")
        except ValueError:
            return False
        return have < wanted if operator == "Lt" else have > wanted
    return False


def tolerates(tolerations, taint):
    """Whether any of the pod's tolerations tolerates the taint."""
    return any(toleration_tolerates(toleration, taint) for toleration in tolerations or [])
