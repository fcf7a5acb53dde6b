"""How the admin command line reaches a secured listener: a Kafka-style ``--command-config`` file read into TLS settings and SASL credentials, and the client side of SaslHandshake/SaslAuthenticate.

The file holds client properties as Kafka's tools (``--command-config``) and librdkafka take them:

- ``security.protocol``: PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL;
- TLS: the CA from ``ssl.ca.location`` (librdkafka), ``ssl.truststore.location`` or inline
  ``ssl.truststore.certificates`` with ``ssl.truststore.type=PEM`` (Java); a client certificate for
  mTLS from ``ssl.certificate.location`` + ``ssl.key.location`` (librdkafka),
  ``ssl.keystore.location`` with ``ssl.keystore.type=PEM`` (one file: the key, then the chain) or
  inline ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain``; ``ssl.key.password`` for an
  encrypted key; ``ssl.endpoint.identification.algorithm`` (``https``, the default, checks the
  broker's name; empty does not) and librdkafka's ``enable.ssl.certificate.verification``;
- SASL: ``sasl.mechanism`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with the credentials of a Java
  ``sasl.jaas.config`` line (PlainLoginModule / ScramLoginModule ``username="…" password="…";``)
  or librdkafka's ``sasl.username`` / ``sasl.password``.

Properties for other things (``client.id``, ``request.timeout.ms``, …) are ignored, as a
properties file shared with other tools has them. Secrets read here never go into a message.
"""
from __future__ import annotations

import dataclasses
import socket
import ssl
from typing import Any

from trireme.server import jaas, sasl_mechanisms, tls
from trireme.server.config import ConfigError, parse_properties

from .client import AdminError, request

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MAX_COMMAND_CONFIG_BYTES = 1 << 20


@dataclasses.dataclass
class ClientSecurity:
    """What one connection does after connecting: TLS (``ssl_context`` set) and SASL (``mechanism`` set)."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True
    mechanism: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)

    def authenticate(self, conn: Any) -> int:
        """SASL on ``conn`` when the protocol has SASL (see :func:`authenticate`); → the session lifetime in ms the
        broker gave (0: none, or no SASL)."""
        return authenticate(conn, self) if self.mechanism is not None else 0

    def wrap(self, sock: socket.socket, host: str) -> socket.socket:
        """The socket with TLS around it when the protocol has TLS (the handshake done)."""
        if self.ssl_context is None:
            return sock
        try:
            return self.ssl_context.wrap_socket(sock, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            raise AdminError(f"TLS handshake with {host}: the broker's certificate was not accepted: "
                             f"{e.verify_message or e}") from None
        except (ssl.SSLError, OSError) as e:
            raise AdminError(f"TLS handshake with {host} failed: {e}") from None


def load_command_config(path: str | None) -> ClientSecurity:
    """The security settings of a ``--command-config`` file (PLAINTEXT for none)."""
    if path is None:
        return ClientSecurity()
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_COMMAND_CONFIG_BYTES + 1)
    except OSError as e:
        raise AdminError(f"--command-config {path}: {e.strerror or e}") from None
    if len(raw) > MAX_COMMAND_CONFIG_BYTES:
        raise AdminError(f"--command-config {path}: larger than {MAX_COMMAND_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AdminError(f"--command-config {path}: not UTF-8 text") from None
    return client_security(parse_properties(text))


def client_security(props: dict[str, str]) -> ClientSecurity:
    """Client properties (Kafka's and librdkafka's names) → the settings one connection uses."""
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise AdminError(f"security.protocol: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    out = ClientSecurity(protocol)
    if protocol.endswith("SSL"):
        out.ssl_context, out.check_hostname = _ssl_context(props)
    if protocol.startswith("SASL"):
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "GSSAPI")).strip().upper()
        if mechanism not in MECHANISMS:
            raise AdminError(f"sasl.mechanism: {mechanism} is not supported by this tool (it speaks "
                             f"{', '.join(MECHANISMS)})")
        out.mechanism = mechanism
        out.username, out.password = _credentials(props, mechanism)
    return out


def _credentials(props: dict[str, str], mechanism: str) -> tuple[str, str]:
    jaas_config = props.get("sasl.jaas.config")
    if jaas_config:
        try:
            module = jaas.parse_one(jaas_config)             # Kafka's JaasConfig rules (server/jaas.py)
        except jaas.JaasError as e:
            raise AdminError(f"sasl.jaas.config: {e}") from None
        expected = "PlainLoginModule" if mechanism == "PLAIN" else "ScramLoginModule"
        if module.name.rsplit(".", 1)[-1] != expected:
            raise AdminError(f"sasl.jaas.config: sasl.mechanism={mechanism} needs {expected}, not {module.name}")
        username, password = module.options.get("username"), module.options.get("password")
    else:
        username, password = props.get("sasl.username"), props.get("sasl.password")
    if not username or password is None:
        raise AdminError(f"sasl.mechanism={mechanism} needs a username and a password: sasl.jaas.config "
                         "(username=\"...\" password=\"...\") or sasl.username and sasl.password")
    return username, password


def _pem_type(props: dict[str, str], name: str) -> None:
    kind = props.get(name, "PEM").strip().upper()
    if kind != "PEM":
        raise AdminError(f"{name}={kind}: only PEM key material is read (convert a JKS or PKCS12 store with "
                         "keytool/openssl)")


def _ssl_context(props: dict[str, str]) -> tuple[ssl.SSLContext, bool]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    verify = props.get("enable.ssl.certificate.verification", "true").strip().lower() != "false"
    check_hostname = verify and props.get("ssl.endpoint.identification.algorithm", "https").strip().lower() == "https"
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE

    def get(name: str) -> str:
        return str(props.get(name, "")).strip()

    _pem_type(props, "ssl.truststore.type")
    _pem_type(props, "ssl.keystore.type")
    try:
        # The CA: librdkafka's file, else Java's PEM truststore read as the broker reads its own (server/tls.py).
        if get("ssl.ca.location"):
            context.load_verify_locations(cafile=get("ssl.ca.location"))
        elif get("ssl.truststore.location") or get("ssl.truststore.certificates"):
            tls.load_truststore(context, get, needed=False)
        elif verify:
            context.load_default_certs()
        # A client certificate (mTLS): librdkafka's certificate and key files, else Java's PEM keystore.
        if get("ssl.certificate.location"):
            context.load_cert_chain(get("ssl.certificate.location"), get("ssl.key.location") or None,
                                    get("ssl.key.password") or None)
        elif get("ssl.keystore.location") or get("ssl.keystore.key") or get("ssl.keystore.certificate.chain"):
            tls.load_keystore(context, get)
    except ConfigError as e:
        raise AdminError(f"TLS settings: {e}") from None
    except FileNotFoundError as e:
        raise AdminError(f"TLS settings: {e.filename}: no such file") from None
    except (ssl.SSLError, OSError) as e:
        raise AdminError(f"TLS settings: cannot load the key material: {e}") from None
    return context, check_hostname


# --- SASL, client side ---------------------------------------------------------------------------

def authenticate(conn: Any, security: ClientSecurity) -> int:
    """SaslHandshake v1 naming the mechanism, then the SaslAuthenticate exchange, on ``conn`` (a
    :class:`~trireme.server.admin.client.Connection` whose ApiVersions is done); → the session lifetime (ms) of
    the last answer (SaslAuthenticate v1+, KIP-368; 0: none)."""
    mechanism = security.mechanism
    response = conn.send("SaslHandshake", conn.version("SaslHandshake", 1, 1),
                         request("SaslHandshake", mechanism=mechanism))
    if response.error_code:
        offered = ", ".join(response.mechanisms or []) or "none"
        raise AdminError(f"{conn.address} does not accept SASL mechanism {mechanism} (it offers {offered})")
    version = conn.version("SaslAuthenticate", 0, 2)

    lifetime = [0]

    def exchange(token: bytes) -> bytes:
        answer = conn.send("SaslAuthenticate", version, request("SaslAuthenticate", auth_bytes=token))
        if answer.error_code:
            detail = f": {answer.error_message}" if answer.error_message else ""
            raise AdminError(f"authentication as {security.username!r} with {mechanism} at {conn.address} "
                             f"failed{detail}")
        lifetime[0] = max(0, getattr(answer, "session_lifetime_ms", 0) or 0)
        return answer.auth_bytes or b""

    tokens = sasl_mechanisms.client_tokens(mechanism, security.username, security.password)
    try:
        token = next(tokens)
        while True:
            token = tokens.send(exchange(token))
    except StopIteration:
        return lifetime[0]
    except sasl_mechanisms.SaslClientError as e:
        raise AdminError(f"SCRAM exchange with {conn.address} failed: {e}") from None
