"""The Kubernetes test cluster's own certificate authority (see k8s.py): the CA, the control plane's serving and
client certificates, the service-account key pair, each node agent's certificates, and the kubeconfigs that name
them. Made with openssl under BASE/pki; all signed by the cluster's CA, for tests only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .common import ClusterError
from .k8s_layout import SERVICE_IP, Layout


def openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"`openssl {' '.join(args)}` failed: {result.stderr.strip()[-1000:]}")


def issue_certificate(
    pki: Path, name: str, subject: str, *, server_names: list[str] | None = None, client: bool = False
) -> None:
    """pki/NAME.key and pki/NAME.crt, signed by the cluster's CA: a serving certificate for `server_names`
    (DNS names or IP:a.b.c.d), a client certificate, or both."""
    usages = (["serverAuth"] if server_names else []) + (["clientAuth"] if client else [])
    extensions = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if server_names:
        extensions.append("subjectAltName=" + ",".join(n if n.startswith("IP:") else f"DNS:{n}" for n in server_names))
    with tempfile.NamedTemporaryFile("w", suffix=".ext", dir=pki, delete=False) as ext:
        ext.write("\n".join(extensions) + "\n")
    try:
        openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.csr"),
            "-subj",
            subject,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            str(pki / f"{name}.csr"),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            ext.name,
            "-out",
            str(pki / f"{name}.crt"),
        )
    finally:
        os.unlink(ext.name)
        (pki / f"{name}.csr").unlink(missing_ok=True)


def make_pki(lay: Layout) -> None:
    """The CA, every certificate the control plane needs and the service-account key pair; made once per base
    folder and kept, so a restarted cluster's clients stay valid."""
    pki = lay.pki
    if (pki / "complete").is_file():
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True, mode=0o700)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "3650",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
        "-subj",
        "/CN=bcp-pipeline-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    issue_certificate(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        server_names=[
            "IP:127.0.0.1",
            f"IP:{lay.net.host_address}",
            f"IP:{SERVICE_IP}",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
    )
    # The apiserver's identity towards kubelets (here: the node agents), for pods/log and exec.
    issue_certificate(
        pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", client=True
    )
    issue_certificate(pki, "admin", "/O=system:masters/CN=bcp-pipeline-test-admin", client=True)
    issue_certificate(pki, "controller-manager", "/CN=system:kube-controller-manager", client=True)
    issue_certificate(pki, "scheduler", "/CN=system:kube-scheduler", client=True)
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(pki / "sa.key"))
    openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    (pki / "complete").write_text("")


def make_node_pki(lay: Layout) -> None:
    """Each node agent's client certificate (its Node identity) and serving certificate (its log server), and the
    identity of their stand-in for cluster DNS, which reads EndpointSlices as kube-proxy's identity may (the
    built-in system:node-proxier role): a node's own identity may list only its own pods."""
    if lay.nodes and not (lay.pki / "cluster-dns.crt").is_file():
        issue_certificate(lay.pki, "cluster-dns", "/CN=system:kube-proxy", client=True)
    for k, node in enumerate(lay.node_names, start=1):
        if not (lay.pki / f"{node}.crt").is_file():
            issue_certificate(
                lay.pki,
                node,
                f"/O=system:nodes/CN=system:node:{node}",
                server_names=[f"IP:{lay.net.address(k)}", node],
                client=True,
            )


def kubeconfig_text(server: str, pki: Path, user: str) -> str:
    """A kubeconfig for one client certificate (pki/USER.crt); JSON is YAML, so no YAML library is needed."""
    return (
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "bcp-pipeline-test",
                "clusters": [
                    {
                        "name": "bcp-pipeline-test",
                        "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {
                            "client-certificate": str(pki / f"{user}.crt"),
                            "client-key": str(pki / f"{user}.key"),
                        },
                    }
                ],
                "contexts": [{"name": "bcp-pipeline-test", "context": {"cluster": "bcp-pipeline-test", "user": user}}],
            },
            indent=2,
        )
        + "\n"
    )


def write_kubeconfigs(lay: Layout, port: int) -> None:
    server = f"https://{lay.api_address}:{port}"
    users = [
        ("admin", lay.kubeconfig),
        ("controller-manager", lay.base / "controller-manager.kubeconfig"),
        ("scheduler", lay.base / "scheduler.kubeconfig"),
    ]
    users += [(node, lay.base / f"{node}.kubeconfig") for node in lay.node_names]
    if lay.nodes:
        users.append(("cluster-dns", lay.base / "cluster-dns.kubeconfig"))
    for user, path in users:
        partial = path.with_suffix(".partial")
        partial.write_text(kubeconfig_text(server, lay.pki, user))
        partial.chmod(0o600)
        partial.replace(path)
