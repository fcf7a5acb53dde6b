"""Client security for the compat suite: test certificates made per session with trustme, and one client's security
settings (what a Kafka client properties file says) in each stock client's own names.

``ClientSecurity`` is the one description; ``librdkafka()`` (confluent-kafka, kcat), ``kafka_python()``,
``aiokafka()``, ``java()`` (the Java harness: Kafka's own property names and JAAS line) and ``kafkajs()`` (the
kafkajs harness' ``ssl``/``sasl`` options) translate it.  ``ClientSecurity.from_properties`` reads a Kafka client
properties file (``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config``, PEM ``ssl.truststore.*`` /
``ssl.keystore.*``), the form tools/compat.py's ``--command-config`` takes.  No key material is ever committed:
``make_tls_files`` writes it into a temporary directory of the run.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from trireme.server import jaas

SCRAM_MECHANISM = "SCRAM-SHA-512"
# The first SCRAM user every secured test broker gets (trireme.storage.add.scram); a password made up for tests.
SCRAM_USER = "admin"
SCRAM_PASSWORD = "admin-secret"
CLIENT_CN = "compat-client"


# ------------------------------------------------------------------ certificates

@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM files of one test run: a CA, the broker's certificate for 127.0.0.1/localhost, a client certificate
    from the same CA (mTLS) and one from a CA the broker does not trust."""

    directory: Path
    ca: Path                    # the CA certificate: clients' truststore, the broker's truststore for mTLS
    server_keystore: Path       # Kafka 4's PEM keystore: the broker's PKCS#8 key, then its certificate chain
    client_cert: Path           # the client's certificate chain
    client_key: Path            # its unencrypted PKCS#8 key
    client_keystore: Path       # key then chain, for the Java client's PEM keystore
    client_dn: str              # the client certificate's subject, as Kafka's default principal names it
    stranger_cert: Path         # a client certificate from another CA (mTLS must refuse it)
    stranger_key: Path
    stranger_keystore: Path


def _pkcs8(key_pem: bytes) -> bytes:
    """An unencrypted PEM key in PKCS#8 form (what Kafka's PEM keystore takes; trustme writes the traditional form)."""
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(key_pem, password=None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_tls_files(directory: str | Path) -> TlsFiles:
    """A fresh CA and certificates in ``directory`` (created if missing)."""
    import trustme
    from cryptography import x509
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    # A subject without characters Kafka's RFC 2253 rendering escapes (trustme's default unit name has a '#').
    client = ca.issue_cert("client.compat.invalid", common_name=CLIENT_CN, organization_name="Trireme compat",
                           organization_unit_name="clients")
    stranger = other_ca.issue_cert("stranger.compat.invalid", common_name="stranger")

    def write(name: str, data: bytes) -> Path:
        path = d / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def chain(leaf) -> bytes:
        return b"".join(blob.bytes() for blob in leaf.cert_chain_pems)

    ca_path = write("ca.pem", ca.cert_pem.bytes())
    server_keystore = write("server-keystore.pem", _pkcs8(server.private_key_pem.bytes()) + chain(server))
    client_key = _pkcs8(client.private_key_pem.bytes())
    stranger_key = _pkcs8(stranger.private_key_pem.bytes())
    leaf = x509.load_pem_x509_certificate(client.cert_chain_pems[0].bytes())
    return TlsFiles(
        directory=d, ca=ca_path, server_keystore=server_keystore,
        client_cert=write("client-cert.pem", chain(client)), client_key=write("client-key.pem", client_key),
        client_keystore=write("client-keystore.pem", client_key + chain(client)),
        client_dn=leaf.subject.rfc4514_string(),
        stranger_cert=write("stranger-cert.pem", chain(stranger)), stranger_key=write("stranger-key.pem", stranger_key),
        stranger_keystore=write("stranger-keystore.pem", stranger_key + chain(stranger)))


# ------------------------------------------------------------------ one client's settings



@dataclasses.dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a listener: ``protocol`` is Kafka's security.protocol; ``mechanism`` the SASL mechanism
    (SCRAM-SHA-256/512, PLAIN, OAUTHBEARER) with ``username``/``password`` or, for OAUTHBEARER, the unsecured
    token's ``oauth_principal`` (its ``sub``); ``ca`` the CA file to trust; ``cert``/``key``/``keystore`` the
    client certificate (PEM chain, PKCS#8 key, key+chain) for mTLS."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None
    oauth_principal: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    keystore: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def replace(self, **changes: Any) -> "ClientSecurity":
        return dataclasses.replace(self, **changes)

    # --- constructors ---------------------------------------------------------------------

    @classmethod
    def scram(cls, tls: TlsFiles, username: str = SCRAM_USER, password: str = SCRAM_PASSWORD,
              mechanism: str = SCRAM_MECHANISM) -> "ClientSecurity":
        return cls("SASL_SSL", mechanism, username, password, ca=str(tls.ca))

    @classmethod
    def oauthbearer(cls, tls: TlsFiles, principal: str) -> "ClientSecurity":
        return cls("SASL_SSL", "OAUTHBEARER", oauth_principal=principal, ca=str(tls.ca))

    @classmethod
    def mtls(cls, tls: TlsFiles, stranger: bool = False) -> "ClientSecurity":
        if stranger:
            return cls("SSL", ca=str(tls.ca), cert=str(tls.stranger_cert), key=str(tls.stranger_key),
                       keystore=str(tls.stranger_keystore))
        return cls("SSL", ca=str(tls.ca), cert=str(tls.client_cert), key=str(tls.client_key),
                   keystore=str(tls.client_keystore))

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "ClientSecurity":
        """A client properties file's security settings, in Kafka's names (PEM trust and key stores; the JAAS line of
        Kafka's ScramLoginModule/PlainLoginModule, or OAuthBearerLoginModule's unsecured
        ``unsecuredLoginStringClaim_sub``) or librdkafka's (``ssl.ca.location``, ``ssl.certificate.location`` +
        ``ssl.key.location``, ``sasl.username``/``sasl.password``, ``sasl.oauthbearer.config=principal=...``), as the admin command line's --command-config
        takes them.  Other properties are ignored."""
        protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
        mechanism = (props.get("sasl.mechanism") or props.get("sasl.mechanisms") or
                     ("GSSAPI" if protocol.startswith("SASL") else "")).strip().upper() or None
        jaas_line = props.get("sasl.jaas.config", "").strip()
        options = jaas.parse_one(jaas_line).options if jaas_line else {}     # Kafka's JAAS rules (server/jaas.py)
        for kind in ("truststore", "keystore"):
            store_type = props.get(f"ssl.{kind}.type", "PEM").strip().upper()
            if props.get(f"ssl.{kind}.location") and store_type != "PEM":
                raise ValueError(f"ssl.{kind}.type={store_type}: only PEM stores are supported here")
        keystore = props.get("ssl.keystore.location")
        cert, key = props.get("ssl.certificate.location"), props.get("ssl.key.location")
        if keystore:
            cert, key = _split_keystore(Path(keystore))
        elif cert and key:
            keystore = _join_keystore(Path(cert), Path(key))
        if protocol.startswith("SASL") and mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"):
            raise ValueError(f"sasl.mechanism={mechanism}: the suite drives PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER")
        sasl = protocol.startswith("SASL")
        return cls(protocol, mechanism if sasl else None,
                   options.get("username", props.get("sasl.username")) if sasl else None,
                   options.get("password", props.get("sasl.password")) if sasl else None,
                   options.get("unsecuredLoginStringClaim_sub", _oauthbearer_principal(props)) if sasl else None,
                   props.get("ssl.truststore.location") or props.get("ssl.ca.location"), cert, key, keystore)

    # --- per client -------------------------------------------------------------------------

    def java(self) -> dict[str, str]:
        """Kafka client properties (the Java client; also what ``from_properties`` reads back)."""
        p: dict[str, str] = {}
        if self.protocol == "PLAINTEXT":
            return p
        p["security.protocol"] = self.protocol
        if self.sasl:
            p["sasl.mechanism"] = self.mechanism or ""
            if self.mechanism == "OAUTHBEARER":
                p["sasl.jaas.config"] = ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                                         f'required unsecuredLoginStringClaim_sub="{self.oauth_principal}";')
            else:
                module = ("plain.PlainLoginModule" if self.mechanism == "PLAIN" else "scram.ScramLoginModule")
                p["sasl.jaas.config"] = (f"org.apache.kafka.common.security.{module} required "
                                         f'username="{_jaas_escape(self.username)}" '
                                         f'password="{_jaas_escape(self.password)}";')
        if self.tls:
            if self.ca:
                p["ssl.truststore.type"] = "PEM"
                p["ssl.truststore.location"] = self.ca
            if self.keystore:
                p["ssl.keystore.type"] = "PEM"
                p["ssl.keystore.location"] = self.keystore
        return p

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka's and kcat's (-X) properties."""
        p: dict[str, str] = {}
        if self.protocol == "PLAINTEXT":
            return p
        p["security.protocol"] = self.protocol.lower()
        if self.sasl:
            p["sasl.mechanism"] = self.mechanism or ""
            if self.mechanism == "OAUTHBEARER":
                p["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
                p["sasl.oauthbearer.config"] = f"principal={self.oauth_principal}"
            else:
                p["sasl.username"] = self.username or ""
                p["sasl.password"] = self.password or ""
        if self.tls:
            if self.ca:
                p["ssl.ca.location"] = self.ca
            if self.cert:
                p["ssl.certificate.location"] = self.cert
                p["ssl.key.location"] = self.key or ""
        return p

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python's keyword arguments (KafkaProducer, KafkaConsumer, KafkaAdminClient)."""
        kw: dict[str, Any] = {}
        if self.protocol == "PLAINTEXT":
            return kw
        kw["security_protocol"] = self.protocol
        if self.sasl:
            kw["sasl_mechanism"] = self.mechanism
            if self.mechanism == "OAUTHBEARER":
                raise ValueError("kafka-python's OAUTHBEARER needs a token provider object; not driven here")
            kw["sasl_plain_username"] = self.username
            kw["sasl_plain_password"] = self.password
        if self.tls:
            kw["ssl_cafile"] = self.ca
            kw["ssl_check_hostname"] = True
            if self.cert:
                kw["ssl_certfile"], kw["ssl_keyfile"] = self.cert, self.key
        return kw

    def aiokafka(self) -> dict[str, Any]:
        """aiokafka's keyword arguments, with an ``ssl.SSLContext`` as aiokafka wants it."""
        kw: dict[str, Any] = {}
        if self.protocol == "PLAINTEXT":
            return kw
        kw["security_protocol"] = self.protocol
        if self.sasl:
            if self.mechanism == "OAUTHBEARER":
                raise ValueError("aiokafka's OAUTHBEARER needs a token provider object; not driven here")
            kw["sasl_mechanism"] = self.mechanism
            kw["sasl_plain_username"] = self.username
            kw["sasl_plain_password"] = self.password
        if self.tls:
            kw["ssl_context"] = self.ssl_context()
        return kw

    def ssl_context(self):
        """A client-side ``ssl.SSLContext`` trusting ``ca`` (with the client certificate when there is one)."""
        import ssl
        ctx = ssl.create_default_context(cafile=self.ca)
        if self.cert:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def kafkajs(self) -> dict[str, Any]:
        """The kafkajs harness' options (compat_tests/js/harness.js reads the files named here): ``ssl``
        {ca, cert, key} paths, ``sasl`` {mechanism, username, password} as kafkajs names them."""
        o: dict[str, Any] = {}
        if self.tls:
            o["ssl"] = {k: v for k, v in (("ca", self.ca), ("cert", self.cert), ("key", self.key)) if v}
        if self.sasl:
            if self.mechanism == "OAUTHBEARER":
                raise ValueError("kafkajs' OAUTHBEARER needs a token provider function; not driven here")
            o["sasl"] = {"mechanism": (self.mechanism or "").lower(), "username": self.username,
                         "password": self.password}
        return o

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ClientSecurity":
        return cls(**json.loads(text))


def _jaas_escape(text: str | None) -> str:
    return (text or "").replace("\\", "\\\\").replace('"', '\\"')


def _split_keystore(path: Path) -> tuple[str, str]:
    """A PEM keystore (key then chain, Kafka 4's form) as separate certificate and key files (in a temporary
    directory), for the clients that take them apart (librdkafka, kafka-python, kafkajs)."""
    text = path.read_text()
    key = re.search(r"-----BEGIN (?:ENCRYPTED )?PRIVATE KEY-----.*?-----END (?:ENCRYPTED )?PRIVATE KEY-----\n?",
                    text, re.S)
    certs = re.findall(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n?", text, re.S)
    if key is None or not certs:
        raise ValueError(f"{path}: expected a PKCS#8 private key and a certificate chain (PEM)")
    out = Path(tempfile.mkdtemp(prefix="compat-keystore-"))
    cert_path, key_path = out / "cert.pem", out / "key.pem"
    cert_path.write_text("".join(certs))
    key_path.write_text(key.group(0))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def _oauthbearer_principal(props: dict[str, str]) -> str | None:
    """librdkafka's unsecured token principal: ``principal=NAME`` in ``sasl.oauthbearer.config``."""
    m = re.search(r"(?:^|\s)principal=(\S+)", props.get("sasl.oauthbearer.config", ""))
    return m.group(1) if m else None


def _join_keystore(cert: Path, key: Path) -> str:
    """A certificate chain file and its key file as one PEM keystore (key, then chain: Kafka 4's form, for the Java
    client), in a temporary directory."""
    path = Path(tempfile.mkdtemp(prefix="compat-keystore-")) / "keystore.pem"
    key_text = key.read_text()
    if "BEGIN PRIVATE KEY" not in key_text and "BEGIN ENCRYPTED PRIVATE KEY" not in key_text:
        key_text = _pkcs8(key_text.encode()).decode()
    path.write_text(key_text + cert.read_text())
    path.chmod(0o600)
    return str(path)


def read_properties(path: str | Path) -> dict[str, str]:
    """A Kafka client properties file (the broker's own reader of Java properties)."""
    from trireme.server.config import parse_properties
    return parse_properties(Path(path).read_text())


# ------------------------------------------------------------------ the broker side of the tests

@dataclasses.dataclass(frozen=True)
class SecuredListeners:
    """A test broker's listeners: PLAINTEXT (set-up, checks), SSL with ssl.client.auth=required (mTLS) and
    SASL_SSL (SCRAM-SHA-512 and unsecured OAUTHBEARER), with the TLS files its clients use."""

    plaintext: str
    ssl: str
    sasl_ssl: str
    tls: TlsFiles
    server: Any = None          # the broker (conftest.ServerProcess): its log for failed tests

    @property
    def scram(self) -> ClientSecurity:
        """The first SCRAM user's settings (``trireme.storage.add.scram``)."""
        return ClientSecurity.scram(self.tls)

    @property
    def mtls(self) -> ClientSecurity:
        return ClientSecurity.mtls(self.tls)

    def oauthbearer(self, principal: str) -> ClientSecurity:
        return ClientSecurity.oauthbearer(self.tls, principal)


def secured_broker_config(tls: TlsFiles, host: str = "127.0.0.1") -> dict[str, Any]:
    """Broker properties (Kafka's names) for the SSL and SASL_SSL listeners (free ports) beside the fixture's
    PLAINTEXT one (``--listen``, put first), and the first SCRAM user."""
    return {
        "listeners": f"SSL://{host}:0,SASL_SSL://{host}:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.server_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": f"{SCRAM_MECHANISM},OAUTHBEARER",
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="broker";',
        "trireme.storage.add.scram": f"{SCRAM_MECHANISM}=[name={SCRAM_USER},password={SCRAM_PASSWORD}]",
        # Every client of a test module logs in from 127.0.0.1, the wrong-password tests too (and their clients
        # retry): no per-address limit on failed logins, so that one test's failures never refuse the next one.
        "trireme.sasl.failed.authentications.per.minute": 0,
    }
