"""Webhooks of the add-ons (agent-sandbox's CRD conversion, Kueue's admission webhooks) served on
loopback: a CA of the fixture's own signs a serving certificate for 127.0.0.1, and every
`clientConfig` that names an in-cluster Service (which cannot route here: there is no kube-proxy
and no pod network) is pointed at `https://127.0.0.1:<port><path>` with that CA as its caBundle.
The certificates are made with the machine's `openssl`."""

import base64
import json
from pathlib import Path
import socket
import subprocess


def free_port():
    """A loopback port nothing listens on now (bound and released; the part binds it next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_certificates(folder):
    """ca.crt, and tls.crt/tls.key for IP 127.0.0.1 signed by it, in `folder`; returns the CA's PEM."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args):
        done = subprocess.run(["openssl", *args], cwd=str(folder), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError("openssl %s failed: %s" % (args[0], done.stderr.strip()[-300:]))
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=rl-batch-demo-test-webhook-ca")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                    "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                                    "extendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "tls.crt", "-days", "2", "-extfile", "san.cnf")
    return (folder / "ca.crt").read_text()


def as_json(kubectl, manifest_text):
    """Manifests (YAML, one or many) as a list of objects, converted by kubectl (no YAML library)."""
    done = kubectl("create", "--dry-run=client", "-o", "json", "-f", "-", stdin=manifest_text)
    decoder, text, at, objects = json.JSONDecoder(), done.stdout, 0, []
    while text[at:].strip():  # one JSON document per manifest, one after another
        at += len(text[at:]) - len(text[at:].lstrip())
        data, at = decoder.raw_decode(text, at)
        objects += data["items"] if data.get("kind") == "List" else [data]
    return objects


def on_loopback(obj, port, ca_pem):
    """The object with every Service clientConfig (CRD conversion, webhook configurations) turned
    into a loopback URL of `port` with the CA's bundle."""
    bundle = base64.b64encode(ca_pem.encode()).decode()

    def fix(config):
        service = config.pop("service", None)
        if service is not None:
            config["url"] = "https://127.0.0.1:%d%s" % (port, service.get("path") or "/")
            config["caBundle"] = bundle
    conversion = (obj.get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") == "Webhook":
        fix(conversion["webhook"]["clientConfig"])
    for webhook in obj.get("webhooks") or []:
        fix(webhook["clientConfig"])
    return obj
