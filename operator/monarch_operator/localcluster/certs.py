"""Certificates of the local control plane, made with ``cryptography``.

One CA signs the apiserver's serving certificate (SANs 127.0.0.1, localhost), the admin client
certificate (``O=system:masters``), the node agent's kubelet serving certificate (127.0.0.1) and
the client certificate the apiserver shows the kubelet (``CN=kube-apiserver-kubelet-client``, as
kubeadm names it), and more client certificates on demand (``write_client_cert``: e.g. one per
benchmarked operator, so that the audit log names its requests); a separate key pair signs
service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=30)
# The common name of the client certificate the apiserver presents to kubelets (kubeadm's name);
# the node agent's kubelet API accepts this client only.
KUBELET_CLIENT_NAME = "kube-apiserver-kubelet-client"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organization: str | tuple[str, ...] | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    groups = (organization,) if isinstance(organization, str) else organization or ()
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    return x509.Name(attributes)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _sign(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = False,
    server_names: tuple[str, ...] = (),
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    else:
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server_names:
            usage.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(name) for name in server_names]),
                critical=False,
            )
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(directory: Path, server_names: tuple[str, ...] = ()) -> None:
    """Write ``ca.{crt,key}``, ``apiserver.{crt,key}``, ``admin.{crt,key}``, ``kubelet.{crt,key}``,
    ``apiserver-kubelet-client.{crt,key}`` and ``sa.{key,pub}``.

    Args:
        directory: created if missing; existing files are overwritten.
        server_names: more names and addresses of the API server's certificate (real nodes
            reach it at the node network's address and at the ``kubernetes`` Service's).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("monarch-localcluster-ca")
    ca_cert = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, is_ca=True)
    server_key = _key()
    server_cert = _sign(
        _name("kube-apiserver"), server_key.public_key(), ca_name, ca_key,
        server_names=("localhost", "kubernetes", "kubernetes.default",
                      "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
                      "127.0.0.1", *server_names),
    )
    admin_key = _key()
    admin_cert = _sign(
        _name("monarch-localcluster-admin", "system:masters"), admin_key.public_key(),
        ca_name, ca_key,
    )
    kubelet_key = _key()
    kubelet_cert = _sign(
        _name("system:node:localcluster", "system:nodes"), kubelet_key.public_key(),
        ca_name, ca_key, server_names=("localhost", "127.0.0.1"),
    )
    kubelet_client_key = _key()
    kubelet_client_cert = _sign(
        _name(KUBELET_CLIENT_NAME), kubelet_client_key.public_key(), ca_name, ca_key,
    )
    sa_key = _key()
    files = {
        "ca.crt": _pem_cert(ca_cert),
        # Kept so that write_client_cert can sign more client certificates later.
        "ca.key": _pem_key(ca_key),
        "apiserver.crt": _pem_cert(server_cert),
        "apiserver.key": _pem_key(server_key),
        "admin.crt": _pem_cert(admin_cert),
        "admin.key": _pem_key(admin_key),
        "kubelet.crt": _pem_cert(kubelet_cert),
        "kubelet.key": _pem_key(kubelet_key),
        "apiserver-kubelet-client.crt": _pem_cert(kubelet_client_cert),
        "apiserver-kubelet-client.key": _pem_key(kubelet_client_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for file_name, content in files.items():
        path = directory / file_name
        path.write_bytes(content)
        path.chmod(0o600)


def write_client_cert(directory: Path, user: str,
                      organization: str | tuple[str, ...] | None = None, *,
                      common_name: str | None = None,
                      server_names: tuple[str, ...] = ()) -> None:
    """Sign a client certificate for ``user`` (CN) in ``organization`` (O, the Kubernetes group;
    several O attributes when a tuple: one group each) with the CA that ``write_pki`` wrote
    there; writes ``<user>.crt`` and ``<user>.key``.

    Args:
        common_name: the CN when it differs from the file name ``user`` (a kubelet's
            ``system:node:<name>``).
        server_names: DNS names and IP addresses: the certificate serves them too (a
            kubelet's serving certificate).

    Raises:
        FileNotFoundError: ``ca.crt`` or ``ca.key`` is missing in ``directory``.
    """
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    cert = _sign(_name(common_name or user, organization), key.public_key(), ca_cert.subject,
                 ca_key, server_names=server_names)
    for file_name, content in ((f"{user}.crt", _pem_cert(cert)), (f"{user}.key", _pem_key(key))):
        path = directory / file_name
        path.write_bytes(content)
        path.chmod(0o600)
