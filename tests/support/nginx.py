"""Debian's nginx in front of a server, configured from the shipped ``deploy/nginx.conf``,
and a test certificate authority for its TLS."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.processes import REPO, free_port, require_binary

SHIPPED = REPO / "deploy" / "nginx.conf"


@dataclass(frozen=True)
class Certificates:
    ca: Path  # trust this (NODE_EXTRA_CA_CERTS, httpx's verify)
    cert: Path
    key: Path


def make_certificates(folder: Path, host: str = "127.0.0.1") -> Certificates:
    """A CA and a certificate it signs for ``host`` (an IP address) and localhost."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agent-broadcaster test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(host))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    found = Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    found.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return found


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"deploy/nginx.conf no longer has {old!r} exactly once"
    return text.replace(old, new)


def render_site(upstream_port: int, http_port: int, tls_port: int, certs: Certificates) -> str:
    """``deploy/nginx.conf`` with this test's ports and certificate, nothing else changed."""
    text = SHIPPED.read_text()
    for old, new in (
        ("server 127.0.0.1:8080;", f"server 127.0.0.1:{upstream_port};"),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen 443 ssl;", f"listen 127.0.0.1:{tls_port} ssl;"),
        ("/etc/ssl/certs/broadcaster.example.com.pem", str(certs.cert)),
        ("/etc/ssl/private/broadcaster.example.com.key", str(certs.key)),
    ):
        text = _replace_once(text, old, new)
    return text


class Nginx:
    """nginx in the foreground with a prefix of its own, serving the rendered site."""

    def __init__(self, folder: Path, upstream_port: int, certs: Certificates) -> None:
        self.binary = require_binary("nginx")
        self.folder = folder
        self.tls_port = free_port()
        self.http_port = free_port()
        (folder / "temp").mkdir(parents=True, exist_ok=True)
        site = folder / "site.conf"
        site.write_text(render_site(upstream_port, self.http_port, self.tls_port, certs))
        temp = folder / "temp"
        # Workers run as the master's user when it is root (the files here are root's).
        user = "user root;\n" if os.geteuid() == 0 else ""
        self.conf = folder / "nginx.conf"
        self.conf.write_text(
            f"{user}worker_processes 1;\npid {folder}/nginx.pid;\n"
            f"error_log {folder}/error.log info;\n"
            "events { worker_connections 512; }\n"
            "http {\n"
            f"  access_log {folder}/access.log;\n"
            f"  client_body_temp_path {temp}/body;\n  proxy_temp_path {temp}/proxy;\n"
            f"  fastcgi_temp_path {temp}/fastcgi;\n  uwsgi_temp_path {temp}/uwsgi;\n"
            f"  scgi_temp_path {temp}/scgi;\n"
            f"  include {site};\n"
            "}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def _command(self) -> list[str]:
        return [self.binary, "-p", str(self.folder), "-e", "stderr", "-c", str(self.conf)]

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.tls_port}"

    def start(self, timeout: float = 20) -> Nginx:
        check = subprocess.run(
            [*self._command, "-t"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, f"nginx -t refused the rendered config:\n{check.stderr}"
        self.proc = subprocess.Popen(
            [*self._command, "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start:\n{self.log}")
            time.sleep(0.02)
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.tls_port), timeout=1):
                return True
        except OSError:
            return False

    @property
    def log(self) -> str:
        path = self.folder / "error.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # fast shutdown: streams are cut
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
