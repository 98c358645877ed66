"""SASL_SSL with SCRAM for the embedded broker: a throwaway CA, a server certificate, users.

Production brokers get their certificates and users from whoever runs Kafka; this module
exists so tests and demos can run the exact client code path a bank's cluster needs
(TLS with a private CA, SCRAM passwords) against the embedded broker. The CA and server
key are made with the `openssl` command line (PEM files, which Kafka reads directly with
`ssl.keystore.type=PEM`), and SCRAM users are written into the cluster's metadata when
its storage is formatted (`kafka-storage format --add-scram`), so no unauthenticated
bootstrap step ever exists.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

from streamlearn.config import KafkaSettings
from streamlearn.errors import BrokerStartError, ConfigError

INTER_BROKER_USER = "streamlearn-broker"
# Kafka parses `--add-scram 'MECH=[name=x,password=y]'` itself: these characters would end a value early.
_UNSAFE = re.compile(r"[,\[\]=\"'\s]")


@dataclass(frozen=True)
class BrokerSecurity:
    """Client listener over SASL_SSL with SCRAM; `users` are created when storage is formatted.

    The controller listener stays PLAINTEXT on loopback (only this process talks to it);
    inter-broker traffic uses the SASL_SSL listener with its own user, so the broker opens
    no unauthenticated port to clients.
    """

    users: dict[str, SecretStr]
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    valid_days: int = 30

    def __post_init__(self):
        if not self.users:
            raise ConfigError("BrokerSecurity needs at least one user: users={'name': SecretStr('password')}")
        for name, password in self.users.items():
            if not isinstance(password, SecretStr):
                raise ConfigError(f"user {name!r}: give the password as pydantic.SecretStr, so it never prints")
            if not name or _UNSAFE.search(name) or _UNSAFE.search(password.get_secret_value()):
                raise ConfigError(f"user {name!r}: names and passwords may not contain spaces, quotes or any of ,[]=")


def tls_files(directory: Path) -> dict[str, Path]:
    return {"ca": directory / "ca.pem", "keystore": directory / "server.pem",
            "inter_broker_password": directory / "inter-broker.secret"}


def make_tls(directory: Path, valid_days: int = 30) -> dict[str, Path]:
    """A private CA and a server certificate for 127.0.0.1/localhost signed by it (idempotent).

    Clients trust the CA (`ssl_cafile`); the broker's PEM keystore holds its key and chain.
    Hostname checks stay on in both clients, so the certificate names the loopback address.
    """
    files = tls_files(directory)
    if files["keystore"].exists() and files["ca"].exists():
        return files
    if not shutil.which("openssl"):
        raise ConfigError("openssl is needed to make the test broker's certificate: apt-get install openssl")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_key, server_key, csr, crt, ext = (directory / n for n in ("ca.key", "server.key", "server.csr", "server.crt",
                                                                 "server.ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]  # PKCS#8 keys, which Kafka's PEM reads
    steps = [
        ["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", files["ca"], "-days", str(valid_days),
         "-subj", "/CN=streamlearn test CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["openssl", "req", *ec, "-keyout", server_key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        ["openssl", "x509", "-req", "-in", csr, "-CA", files["ca"], "-CAkey", ca_key, "-CAcreateserial",
         "-out", crt, "-days", str(valid_days), "-extfile", ext],
    ]
    for cmd in steps:
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if done.returncode != 0:
            raise BrokerStartError(f"making the test certificate failed ({cmd[1]}): {done.stderr[-400:]}")
    files["keystore"].write_text(server_key.read_text() + crt.read_text())
    os.chmod(files["keystore"], 0o600)
    ca_key.unlink()  # nothing more is ever signed with it
    return files


def inter_broker_password(directory: Path) -> SecretStr:
    """The broker's own SCRAM password: random, made once, kept beside its key (mode 0600)."""
    path = tls_files(directory)["inter_broker_password"]
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(24))
    return SecretStr(path.read_text().strip())


def listener_properties(security: BrokerSecurity, directory: Path, port: int, controller_port: int) -> list[str]:
    """server.properties lines for a SASL_SSL client and inter-broker listener (they override the base file)."""
    files = make_tls(directory, security.valid_days)
    password = inter_broker_password(directory).get_secret_value()
    mech = security.mechanism
    return [
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name=SASL_SSL",
        f"sasl.enabled.mechanisms={mech}",
        f"sasl.mechanism.inter.broker.protocol={mech}",
        f"listener.name.sasl_ssl.{mech.lower()}.sasl.jaas.config="
        f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{INTER_BROKER_USER}" '
        f'password="{password}";',
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={files['keystore']}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={files['ca']}",
        "ssl.client.auth=none",
        # A client with a wrong password is answered after this delay, which caps how fast a
        # misconfigured client (or a guesser) can retry.
        "connection.failed.authentication.delay.ms=500",
    ]


def scram_format_args(security: BrokerSecurity, directory: Path) -> list[str]:
    """`kafka-storage format` arguments that create every user (and the broker's own) in the metadata log."""
    users = {**security.users, INTER_BROKER_USER: inter_broker_password(directory)}
    args = []
    for name, password in users.items():
        args += ["--add-scram", f"{security.mechanism}=[name={name},password={password.get_secret_value()}]"]
    return args


def client_settings(bootstrap: str, security: BrokerSecurity, directory: Path, user: str,
                    password: SecretStr | None = None) -> KafkaSettings:
    """Client settings for `user` (with its own password unless another is given, e.g. a wrong one)."""
    if user not in security.users and password is None:
        raise ConfigError(f"no user {user!r} on this broker; users: {sorted(security.users)}")
    return KafkaSettings(bootstrap=bootstrap, security_protocol="SASL_SSL", sasl_mechanism=security.mechanism,
                         sasl_username=user, sasl_password=password or security.users[user],
                         ssl_cafile=str(tls_files(directory)["ca"]))
