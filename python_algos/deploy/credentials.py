"""The credentials of a Flower deployment over a network: a CA, the SuperLink's TLS certificate, one
authentication key pair per SuperNode.

    python -m python_algos.deploy.credentials creds --server-address 10.77.0.1 --nodes 3

writes into the new folder ``creds`` (mode 0700, every file 0600):

* ``ca.crt`` (give it to every SuperNode and to ``flwr``: ``--root-certificates``, ``root-certificates``)
  and ``ca.key`` (keep it off the network: it signs server certificates);
* ``server.pem`` / ``server.key``: the SuperLink's certificate, signed by the CA, valid for every
  ``--server-address`` (an IP address or a DNS name; 127.0.0.1 and localhost are always added: a
  SuperLink listening on 0.0.0.0 has its own app processes reach it on 127.0.0.1);
* ``node-<i>.key`` / ``node-<i>.pub``: SuperNode i's key (ECDSA P-384, OpenSSH format, what
  ``flower-supernode --auth-supernode-private-key`` reads); its ``.pub`` is registered with
  ``flwr supernode register node-<i>.pub CONNECTION`` before the SuperNode starts.

Made with the ``cryptography`` package (a dependency of Flower). Bad arguments are refused before
anything is written; the folder must not exist yet (credentials are never overwritten in place).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import re
import sys
from typing import Optional, Sequence

__all__ = ["make_credentials", "main"]

_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*$")
_LOOPBACK = ("127.0.0.1", "localhost")


def _names(addresses: Sequence[str]) -> list:
    """The certificate's subject alternative names: IP addresses as IPAddress, others as DNSName."""
    from cryptography import x509

    out = []
    for a in dict.fromkeys([*addresses, *_LOOPBACK]):  # each once, in order
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(a)))
        except ValueError:
            out.append(x509.DNSName(a))
    return out


def _check(folder: str, addresses: Sequence[str], nodes: int, days: int) -> None:
    if os.path.lexists(folder):
        raise ValueError(f"the credentials folder {folder!r} exists already: give a new folder (credentials are "
                         "never overwritten)")
    if not addresses:
        raise ValueError("--server-address: give at least one address (IP or DNS name) the SuperNodes use")
    for a in addresses:
        try:
            ipaddress.ip_address(a)
        except ValueError:
            if not _DNS_NAME.match(a):
                raise ValueError(f"--server-address {a!r} is neither an IP address nor a DNS name") from None
    for flag, v in (("--nodes", nodes), ("--days", days)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{flag} must be an integer >= 1, got {v!r}")


def _certificate(subject: str, issuer: str, public_key, signing_key, days: int, ca: bool, names=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
         .public_key(public_key).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    else:
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signing_key.public_key()),
                            critical=False)
    return b.sign(signing_key, hashes.SHA256())


def make_credentials(folder: str, server_addresses: Sequence[str], nodes: int, days: int = 365) -> dict:
    """Write the CA, the SuperLink's certificate (valid for ``server_addresses``, loopback added) and
    ``nodes`` SuperNode key pairs into the new folder ``folder``; return {name: path}."""
    _check(folder, list(server_addresses), nodes, days)
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise ImportError('making credentials needs the cryptography package (installed with Flower: '
                          'pip install ".[flower]")') from None
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = _certificate("python_algos Flower CA", "python_algos Flower CA", ca_key.public_key(), ca_key, days, True)
    server = _certificate(str(server_addresses[0]), "python_algos Flower CA", server_key.public_key(), ca_key, days,
                          False, _names(server_addresses))
    files = {"ca.crt": ca.public_bytes(pem), "ca.key": ca_key.private_bytes(pem, pkcs8, plain),
             "server.pem": server.public_bytes(pem), "server.key": server_key.private_bytes(pem, pkcs8, plain)}
    for i in range(nodes):
        key = ec.generate_private_key(ec.SECP384R1())
        files[f"node-{i}.key"] = key.private_bytes(pem, serialization.PrivateFormat.OpenSSH, plain)
        files[f"node-{i}.pub"] = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                               serialization.PublicFormat.OpenSSH) + b"\n"
    os.makedirs(folder, mode=0o700)
    os.chmod(folder, 0o700)  # whatever the umask
    paths = {}
    for name, data in files.items():
        paths[name] = os.path.join(folder, name)
        with os.fdopen(os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m python_algos.deploy.credentials",
                                description="Make a CA, the SuperLink's TLS certificate and one key pair per "
                                            "SuperNode in a new folder (0700, files 0600).")
    p.add_argument("folder", help="the new folder to write (must not exist)")
    p.add_argument("--server-address", action="append", required=True, metavar="ADDR",
                   help="an IP address or DNS name the SuperNodes and flwr use to reach the SuperLink "
                        "(repeat for several; 127.0.0.1 and localhost are added)")
    p.add_argument("--nodes", type=int, required=True, help="how many SuperNode key pairs (node-0 .. node-N-1)")
    p.add_argument("--days", type=int, default=365, help="how long the certificates are valid (default 365)")
    args = p.parse_args(argv)
    try:
        paths = make_credentials(args.folder, args.server_address, args.nodes, args.days)
    except ValueError as e:
        p.error(str(e))
    print("\n".join(sorted(paths.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
