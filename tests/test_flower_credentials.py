"""python -m python_algos.deploy.credentials: the server certificate is signed by the CA and names
the given addresses, each SuperNode key is an EC P-384 OpenSSH pair (what flower-supernode and
`flwr supernode register` read), the folder is 0700 and its files 0600; bad arguments are refused
naming the flag, with nothing written. (Flower using them over TLS: tests/test_flower_netns.py.)"""

import ipaddress
import os

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from python_algos.deploy.credentials import main, make_credentials  # noqa: E402


def test_certificates_and_keys(tmp_path):
    paths = make_credentials(str(tmp_path / "c"), ["10.77.0.1", "link.example.org"], 2)
    assert sorted(paths) == sorted(["ca.crt", "ca.key", "server.pem", "server.key", "node-0.key", "node-0.pub",
                                    "node-1.key", "node-1.pub"])
    assert os.stat(tmp_path / "c").st_mode & 0o777 == 0o700
    assert {os.stat(p).st_mode & 0o777 for p in paths.values()} == {0o600}
    read = {name: open(p, "rb").read() for name, p in paths.items()}
    ca, server = x509.load_pem_x509_certificate(read["ca.crt"]), x509.load_pem_x509_certificate(read["server.pem"])
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("10.77.0.1"),
                                                            ipaddress.ip_address("127.0.0.1")}
    assert set(san.get_values_for_type(x509.DNSName)) == {"link.example.org", "localhost"}
    key = serialization.load_pem_private_key(read["server.key"], None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()
    pubs = set()
    for i in range(2):
        private = serialization.load_ssh_private_key(read[f"node-{i}.key"], None)
        public = serialization.load_ssh_public_key(read[f"node-{i}.pub"])
        assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
        assert private.public_key().public_numbers() == public.public_numbers()
        pubs.add(read[f"node-{i}.pub"])
    assert len(pubs) == 2  # one key per node


@pytest.mark.parametrize("argv, flag", [
    (["--server-address", "10.77.0.1", "--nodes", "0"], "--nodes"),
    (["--server-address", "not an address!", "--nodes", "2"], "--server-address"),
    (["--server-address", "10.77.0.1", "--nodes", "2", "--days", "0"], "--days"),
])
def test_bad_arguments_write_nothing(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "c"), *argv])
    assert e.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_an_existing_folder_is_not_overwritten(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "ca.key").write_text("keep")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "c"), "--server-address", "10.77.0.1", "--nodes", "1"])
    assert "exists already" in capsys.readouterr().err
    assert os.listdir(tmp_path / "c") == ["ca.key"] and (tmp_path / "c" / "ca.key").read_text() == "keep"
