"""TLS material for the Dask cluster: a private CA plus one certificate per role.

Dask's TLS is mutual: every endpoint (scheduler, worker, client) presents a
certificate signed by the cluster CA and verifies its peer's against the same
CA (``ssl.CERT_REQUIRED``).  Dask disables host-name checking
(``check_hostname = False`` in ``distributed.security``), so the SANs below
matter for other tools (``openssl s_client``, HAProxy ``check-ssl``) and for
strict verifiers, not for Dask itself.

Key type: EC P-256: key generation takes well under a millisecond (RSA 2048:
tens to hundreds of ms, which adds up in tests building several CAs), handshakes
and certificates are smaller, and every OpenSSL supports it for TLS 1.2/1.3.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from distributed.security import Security

__all__ = [
    "DEFAULT_HOSTS",
    "DEFAULT_ROLES",
    "certificate_info",
    "expected_files",
    "make_certificates",
    "parse_hosts",
    "tls_security",
]

DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1")
DEFAULT_ROLES: tuple[str, ...] = ("scheduler", "worker", "client")

# Backdated so that hosts whose clocks lag by a few minutes accept new certs.
_BACKDATE = _dt.timedelta(minutes=5)
_ROLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
StrPath = str | os.PathLike
_KEY_MODE = 0o600
_CERT_MODE = 0o644


def parse_hosts(values: Iterable[str] | str) -> tuple[str, ...]:
    """Normalise host names/IPs (``--host`` may be repeated or comma-separated)."""
    if isinstance(values, str):
        values = [values]
    hosts: list[str] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if part and part not in hosts:
                hosts.append(part)
    if not hosts:
        raise ValueError("hosts: at least one host name or IP address is required")
    return tuple(hosts)  # each is validated by _san_entry in make_certificates


def _san_entry(host: str) -> x509.GeneralName:
    with contextlib.suppress(ValueError):
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    if not host.isascii() or any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"hosts: {host!r} is neither an IP address nor an ASCII DNS name")
    return x509.DNSName(host.lower())


def expected_files(out_dir: StrPath, roles: Iterable[str] = DEFAULT_ROLES) -> dict[str, Path]:
    """Files written by :func:`make_certificates`: ca, ca-key, <role>, <role>-key."""
    out = Path(out_dir)
    files = {"ca": out / "ca.pem", "ca-key": out / "ca-key.pem"}
    for role in roles:
        files[role] = out / f"{role}.pem"
        files[f"{role}-key"] = out / f"{role}-key.pem"
    return files


def _validate(days: object, roles: tuple[str, ...]) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be an integer >= 1, got {days!r}")
    if not roles:
        raise ValueError("roles: at least one role is required")
    for role in roles:
        ok = isinstance(role, str) and _ROLE_RE.match(role) and role != "ca"
        if not ok or role.endswith("-key"):
            raise ValueError(f"roles: invalid role name {role!r} (not 'ca', not ending in '-key')")
    if len(set(roles)) != len(roles):
        raise ValueError(f"roles: duplicate role names in {roles!r}")


def _write(path: Path, data: bytes, mode: int, overwrite: bool) -> None:
    """Write to a file born with ``mode`` (O_EXCL, no chmod); overwrite = rename a
    fresh temp file over ``path``, so an old file's looser mode is never reused."""
    target = path.with_name(f".{path.name}.{os.getpid()}.tmp") if overwrite else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if overwrite:
            os.replace(target, path)
    except BaseException:
        if overwrite:
            target.unlink(missing_ok=True)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    fmt = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    off = "content_commitment key_encipherment data_encipherment key_agreement"
    flags = dict.fromkeys((off + " encipher_only decipher_only").split(), False)
    return x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca, **flags)


def _sign(subject, issuer, key, ca_key, start, end, extensions) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(ca_key, hashes.SHA256())


def _name(common_name: str) -> x509.Name:
    org = x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pipeline")
    return x509.Name([org, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_certificates(
    out_dir: StrPath,
    *,
    days: int = 365,
    hosts: Iterable[str] = DEFAULT_HOSTS,
    roles: Iterable[str] = DEFAULT_ROLES,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Create a CA and one certificate/key pair per role in ``out_dir``.

    Returns the mapping of :func:`expected_files`.  Keys are written with mode
    0600, certificates with 0644.  Raises ``ValueError`` for bad settings and
    ``FileExistsError`` (naming the first existing file) unless ``overwrite``;
    nothing is written when a file already exists.
    """
    hosts = parse_hosts(tuple(hosts))
    roles = tuple(roles)
    _validate(days, roles)
    out = Path(out_dir)
    files = expected_files(out, roles)
    if not overwrite:
        for path in files.values():
            if path.exists():
                raise FileExistsError(f"{path} already exists (--overwrite replaces the TLS files)")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)

    now = _dt.datetime.now(_dt.UTC)
    start, end = now - _BACKDATE, now + _dt.timedelta(days=days)
    sans = x509.SubjectAlternativeName([_san_entry(h) for h in hosts])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("pipeline Dask cluster CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_ext = [
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (_key_usage(ca=True), True),
        (ca_ski, False),
    ]
    ca_cert = _sign(ca_name, ca_name, ca_key, ca_key, start, end, ca_ext)
    _write(files["ca-key"], _key_pem(ca_key), _KEY_MODE, overwrite)
    _write(files["ca"], ca_cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE, overwrite)

    aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    # Dask uses the same certificate for accepting and for opening connections
    # (scheduler->worker, worker->worker, ...): every role gets both EKUs.
    eku = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    for role in roles:
        key = ec.generate_private_key(ec.SECP256R1())
        leaf_ext = [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(ca=False), True),
            (eku, False),
            (sans, False),
            (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
            (aki, False),
        ]
        cert = _sign(_name(f"pipeline-{role}"), ca_name, key, ca_key, start, end, leaf_ext)
        _write(files[f"{role}-key"], _key_pem(key), _KEY_MODE, overwrite)
        _write(files[role], cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE, overwrite)
    return files


def certificate_info(path: StrPath) -> dict[str, object]:
    """Subject, issuer, validity and SANs of a PEM certificate (for CLI output)."""
    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.DNSName)]
        names += [str(v) for v in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    subject, issuer = cert.subject.rfc4514_string(), cert.issuer.rfc4514_string()
    return {
        "path": str(path),
        "subject": subject,
        "issuer": issuer,
        "hosts": names,
        "not_before": cert.not_valid_before_utc,
        "not_after": cert.not_valid_after_utc,
    }


def tls_security(
    ca_file: StrPath, cert: StrPath, key: StrPath, *, require_encryption: bool = True
) -> Security:
    """Dask ``Security`` for a client presenting ``cert``/``key`` and trusting ``ca_file``.

    Raises ``FileNotFoundError`` naming the setting (``tls_ca_file``,
    ``tls_cert``, ``tls_key``) whose file is missing.
    """
    from distributed.security import Security

    for setting, value in (("tls_ca_file", ca_file), ("tls_cert", cert), ("tls_key", key)):
        if not value or not Path(value).is_file():
            raise FileNotFoundError(f"{setting} points at a missing file: {value}")
    _check_loads(ca_file, cert, key)
    return Security(
        tls_ca_file=str(ca_file),
        tls_client_cert=str(cert),
        tls_client_key=str(key),
        require_encryption=require_encryption,
    )


def _check_loads(ca_file: StrPath, cert: StrPath, key: StrPath) -> None:
    """The files load as a CA and a certificate with its key: swapped files, or another
    role's key, were "cannot reach the Dask scheduler: [SSL] PEM lib" at connection."""
    import ssl

    context = ssl.create_default_context()
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except (ssl.SSLError, ValueError) as exc:
        raise FileNotFoundError(f"tls_ca_file {ca_file} is not a CA certificate: {exc}") from None
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        raise FileNotFoundError(
            f"tls_cert {cert} and tls_key {key} are not a certificate and its key: {exc}"
        ) from None
