"""TLS for SSL and SASL_SSL listeners: the server's SSL context built from Kafka's PEM settings (reloadable), and the client certificate's principal as Kafka names it.

Key material is PEM only, as Kafka 4 takes it (``ssl.keystore.type=PEM``): a keystore file holding a PKCS#8 key and
the certificate chain, or the inline ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain``; ``ssl.key.password``
for an encrypted key; trusted CAs from ``ssl.truststore.location`` or inline ``ssl.truststore.certificates``.  Every
setting is read per listener (``Config.for_listener``: ``listener.name.<l>.ssl.*`` wins).  A client certificate's
subject is rendered as Java's ``X500Principal.getName()`` does (RFC 2253) and mapped by
``ssl.principal.mapping.rules`` (Kafka's SslPrincipalMapper syntax) to ``User:<name>``.
"""
from __future__ import annotations

import os
import re
import ssl
import tempfile

from cryptography import x509
from cryptography.x509.oid import NameOID

from .config import ConfigError

TLS_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# What Kafka lets AlterConfigs change on a running broker per listener (SslConfigs.RECONFIGURABLE_CONFIGS, as
# listener.name.<listener>.<config>): the key material, checked by building the new context first.
RECONFIGURABLE = ("ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
                  "ssl.keystore.key", "ssl.keystore.certificate.chain", "ssl.truststore.type",
                  "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.certificates")
# Kafka's PASSWORD configs among them: never logged, described without their value.
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)


def _blocks(text: str) -> list[tuple[str, str]]:
    """The PEM blocks of ``text`` as (label, base64 body without whitespace): Kafka also takes a PEM value written on
    one line (a properties file), so line breaks are not relied on."""
    return [(label, re.sub(r"\s+", "", body)) for label, body in _PEM_BLOCK.findall(text)]


def _pem(label: str, body: str) -> str:
    return f"-----BEGIN {label}-----\n" + "\n".join(body[i:i + 64] for i in range(0, len(body), 64)) + \
        f"\n-----END {label}-----\n"


def _read(path: str, what: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except OSError as e:
        raise ConfigError(f"{what}={path}: cannot read it: {e.strerror or e}") from None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{what}={path} is not a PEM file (Trireme reads PEM key material only; a JKS or PKCS12 "
                          f"store converts with keytool/openssl)") from None


def _setting(config, listener: str, name: str, overrides: dict | None) -> str:
    value = overrides[name] if overrides is not None and name in overrides else config.for_listener(listener, name)
    return "" if value is None else str(value).strip()


def client_auth(config, listener: str, security_protocol: str = "SSL") -> str:
    """ssl.client.auth of a listener: none, requested or required.  On SASL_SSL only the listener's own
    ``listener.name.<l>.ssl.client.auth`` counts (Kafka, KIP-684: the broker-wide one is for SSL listeners)."""
    if security_protocol == "SASL_SSL" and \
            f"listener.name.{listener.lower()}.ssl.client.auth" not in config.listener_values:
        return "none"
    return (_setting(config, listener, "ssl.client.auth", None) or "none").lower()


def build_context(config, listener: str, overrides: dict | None = None,
                  security_protocol: str = "SSL") -> ssl.SSLContext:
    """The server SSL context of ``listener`` from its settings (``overrides``: name → value taking the place of the
    configured ones, for a reload); any problem is a ConfigError of one line naming the setting.  The leaf
    certificate it serves is ``context.leaf_certificate`` (DER)."""
    def get(name: str) -> str:
        return _setting(config, listener, name, overrides)

    for kind in ("ssl.keystore.type", "ssl.truststore.type"):
        if (get(kind) or "PEM").upper() != "PEM":
            raise ConfigError(f"{kind}={get(kind)} is not supported: Trireme reads PEM key material only (Python's "
                              f"ssl has no Java key stores); convert the store to PEM with keytool/openssl")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION | ssl.OP_CIPHER_SERVER_PREFERENCE
    explicit = config.is_set("ssl.enabled.protocols") or bool(overrides and "ssl.enabled.protocols" in overrides) \
        or f"listener.name.{listener.lower()}.ssl.enabled.protocols" in config.listener_values
    _set_versions(context, get("ssl.protocol"), get("ssl.enabled.protocols"), explicit)
    suites = [s.strip() for s in get("ssl.cipher.suites").split(",") if s.strip()]
    tls12 = [s for s in suites if not s.startswith(("TLS_AES_", "TLS_CHACHA20_"))]     # TLS 1.3 suites: OpenSSL's
    if tls12:
        try:
            context.set_ciphers(":".join(tls12))
        except ssl.SSLError:
            raise ConfigError(f"ssl.cipher.suites: no cipher suite OpenSSL knows in {get('ssl.cipher.suites')!r} "
                              f"(use OpenSSL names, e.g. ECDHE-RSA-AES128-GCM-SHA256)") from None
    context.leaf_certificate = load_keystore(context, get)
    auth = client_auth(config, listener, security_protocol)
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"ssl.client.auth must be none, requested or required, not {auth!r}")
    load_truststore(context, get, auth != "none")
    context.verify_mode = CLIENT_AUTH[auth]
    return context


def client_context(config, listener: str) -> ssl.SSLContext:
    """The client SSL context a broker connects to another broker's ``listener`` (its inter-broker listener) with:
    the listener's trust store (else the system's) checks the other broker's certificate, its name too with
    ``ssl.endpoint.identification.algorithm=https``; the listener's key and certificate, when set, are presented
    (an mTLS listener needs them).  A problem is a ConfigError of one line."""
    def get(name: str) -> str:
        return _setting(config, listener, name, None)

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _set_versions(context, get("ssl.protocol"), get("ssl.enabled.protocols"), bool(get("ssl.enabled.protocols")))
    if get("ssl.truststore.location") or get("ssl.truststore.certificates"):
        load_truststore(context, get, True)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if get("ssl.keystore.location") or get("ssl.keystore.key"):
        load_keystore(context, get)
    context.check_hostname = get("ssl.endpoint.identification.algorithm").lower() == "https"
    return context


def _set_versions(context: ssl.SSLContext, protocol: str, enabled: str, enabled_set: bool) -> None:
    if protocol and protocol not in TLS_VERSIONS and protocol != "TLS":
        raise ConfigError(f"ssl.protocol must be TLSv1.2 or TLSv1.3 (Trireme serves TLS 1.2/1.3 only), not {protocol}")
    names = [v.strip() for v in enabled.split(",") if v.strip()] or ["TLSv1.2", "TLSv1.3"]
    unknown = [v for v in names if v not in TLS_VERSIONS]
    if unknown:
        raise ConfigError(f"ssl.enabled.protocols: {', '.join(unknown)} not allowed: TLS 1.2 and 1.3 only "
                          f"(TLSv1.2, TLSv1.3)")
    versions = sorted(TLS_VERSIONS[v] for v in names)
    if protocol == "TLSv1.2" and not enabled_set:
        versions = [ssl.TLSVersion.TLSv1_2]           # as Kafka: ssl.protocol=TLSv1.2 alone keeps to 1.2
    context.minimum_version, context.maximum_version = versions[0], versions[-1]


def load_keystore(context: ssl.SSLContext, get) -> bytes:
    location, key, chain = get("ssl.keystore.location"), get("ssl.keystore.key"), get("ssl.keystore.certificate.chain")
    if location and (key or chain):
        raise ConfigError("ssl.keystore.location and ssl.keystore.key/ssl.keystore.certificate.chain: set one form, "
                          "not both")
    if location:
        blocks = _blocks(_read(location, "ssl.keystore.location"))
        what = f"ssl.keystore.location={location}"
    elif key or chain:
        if not (key and chain):
            raise ConfigError("ssl.keystore.key and ssl.keystore.certificate.chain go together: both are needed")
        blocks = _blocks(key) + _blocks(chain)
        what = "ssl.keystore.key"
    else:
        raise ConfigError("an SSL listener needs a key and certificate: ssl.keystore.location (PEM: the PKCS#8 key "
                          "followed by the certificate chain), or ssl.keystore.key with ssl.keystore.certificate.chain")
    keys = [(label, body) for label, body in blocks if label.endswith("PRIVATE KEY")]
    certs = [body for label, body in blocks if label == "CERTIFICATE"]
    if len(keys) != 1 or not certs:
        raise ConfigError(f"{what}: expected one PEM private key and a certificate chain, found {len(keys)} key(s) "
                          f"and {len(certs)} certificate(s)")
    password = get("ssl.key.password")
    if keys[0][0] == "ENCRYPTED PRIVATE KEY" and not password:
        raise ConfigError(f"{what}: the private key is encrypted: ssl.key.password is needed")
    # Python's ssl loads a key and chain from a file only: a private temporary one, removed at once.
    with tempfile.TemporaryDirectory(prefix="trireme-tls-") as directory:
        path = os.path.join(directory, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(_pem("CERTIFICATE", body) for body in certs) + _pem(*keys[0]))
        try:
            context.load_cert_chain(path, path, password=password.encode() if password else (lambda: b""))
        except ssl.SSLError as e:
            reason = e.reason or str(e)
            hint = " (wrong ssl.key.password?)" if password or "BAD_DECRYPT" in str(e) else ""
            raise ConfigError(f"{what}: cannot use the key and certificate: {reason}{hint}") from None
    return ssl.PEM_cert_to_DER_cert(_pem("CERTIFICATE", certs[0]))


def load_truststore(context: ssl.SSLContext, get, needed: bool) -> None:
    location, inline = get("ssl.truststore.location"), get("ssl.truststore.certificates")
    if location and inline:
        raise ConfigError("ssl.truststore.location and ssl.truststore.certificates: set one, not both")
    text, what = (_read(location, "ssl.truststore.location"), f"ssl.truststore.location={location}") if location \
        else (inline, "ssl.truststore.certificates")
    if not text:
        if needed:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)    # as Kafka falls back to the JVM's trust store
        return
    certs = [body for label, body in _blocks(text) if label == "CERTIFICATE"]
    if not certs:
        raise ConfigError(f"{what}: no PEM certificate in it")
    try:
        context.load_verify_locations(cadata="".join(_pem("CERTIFICATE", body) for body in certs))
    except ssl.SSLError as e:
        raise ConfigError(f"{what}: cannot use the certificates: {e.reason or e}") from None


class ListenerTls:
    """One SSL/SASL_SSL listener's TLS: its current context (replaced whole by :meth:`reload`, so connections keep
    the context they started with), client authentication and principal mapper."""

    def __init__(self, config, listener: str, security_protocol: str = "SSL"):
        self.config = config
        self.listener = listener
        self.overrides: dict[str, str] = {}         # settings changed since start-up (AlterConfigs)
        self.security_protocol = security_protocol
        self.context = build_context(config, listener, security_protocol=security_protocol)
        self.client_auth = client_auth(config, listener, security_protocol)
        self.mapper = PrincipalMapper(_setting(config, listener, "ssl.principal.mapping.rules", None) or "DEFAULT")

    def check(self, overrides: dict[str, str]) -> ssl.SSLContext:
        """The context the dynamic ``overrides`` (setting → value; None: back to the static setting) would give;
        ConfigError when it cannot be built or its certificate names another subject (Kafka's
        ssl.allow.dn.changes / ssl.allow.san.changes, default false).  Nothing changes."""
        static = {name: value for name, value in overrides.items() if value is not None}
        context = build_context(self.config, self.listener, _with_unset(self.config, self.listener, static,
                                                                        overrides), self.security_protocol)
        old, new = (x509.load_der_x509_certificate(c.leaf_certificate) for c in (self.context, context))
        if old.subject != new.subject and not _flag(self.config, self.listener, "ssl.allow.dn.changes"):
            raise ConfigError(f"the new certificate's subject {subject_dn(context.leaf_certificate)} differs from "
                              f"the current one's {subject_dn(self.context.leaf_certificate)} "
                              f"(ssl.allow.dn.changes=false)")
        if _sans(old) != _sans(new) and not _flag(self.config, self.listener, "ssl.allow.san.changes"):
            raise ConfigError("the new certificate's subject alternative names differ from the current one's "
                              "(ssl.allow.san.changes=false)")
        return context

    def reload(self, overrides: dict[str, str | None]) -> None:
        """New connections use the context of these dynamic ``overrides`` (the whole set; ConfigError, and the old
        context kept, when it cannot be built); connections already open keep theirs."""
        context = self.check(overrides)
        self.overrides = {name: value for name, value in overrides.items() if value is not None}
        self.context = context


def _with_unset(config, listener: str, static: dict, overrides: dict) -> dict:
    """Overrides for build_context: a dynamic setting deleted (None) falls back to the static one."""
    return {**{name: _setting(config, listener, name, None) for name, value in overrides.items() if value is None},
            **static}


def _flag(config, listener: str, name: str) -> bool:
    return str(config.for_listener(listener, name) or "false").strip().lower() == "true"


def _sans(cert: x509.Certificate) -> list:
    try:
        return sorted(map(str, cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value))
    except x509.ExtensionNotFound:
        return []


# --- the client certificate's principal --------------------------------------------------------------------

# Java's RFC 2253 keywords (sun.security.x509.AVAKeyword): any other attribute is written as its OID with the
# value's DER encoding in hex.
_KEYWORDS = {NameOID.COMMON_NAME: "CN", NameOID.COUNTRY_NAME: "C", NameOID.LOCALITY_NAME: "L",
             NameOID.STATE_OR_PROVINCE_NAME: "ST", NameOID.ORGANIZATION_NAME: "O",
             NameOID.ORGANIZATIONAL_UNIT_NAME: "OU", NameOID.STREET_ADDRESS: "STREET",
             NameOID.DOMAIN_COMPONENT: "DC", NameOID.USER_ID: "UID"}
_ESCAPED = set(',=+<>#;"\\')
# ASN.1 string tag → the value's bytes (what Java's isDerString takes as a string).
_STRING_TAGS = {12: "utf-8", 19: "ascii", 20: "latin-1", 22: "ascii", 30: "utf-16-be", 28: "utf-32-be"}


def _der(tag: int, data: bytes) -> bytes:
    n = len(data)
    if n < 0x80:
        return bytes((tag, n)) + data
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + data


def _attribute(attr: x509.NameAttribute) -> str:
    tag = getattr(getattr(attr, "_type", None), "value", 12)
    value = attr.value
    keyword = _KEYWORDS.get(attr.oid)
    if keyword is None or tag not in _STRING_TAGS:
        data = value if isinstance(value, bytes) else value.encode(_STRING_TAGS.get(tag, "utf-8"))
        return f"{keyword or attr.oid.dotted_string}=#{_der(tag if tag else 12, data).hex()}"
    out = []
    for c in value:
        if c in _ESCAPED:
            out.append("\\" + c)
        elif c == "\0":
            out.append("\\00")
        else:
            out.append(c)
    # leading and trailing spaces (and CRs) escaped, as Java does
    lead = 0
    while lead < len(out) and out[lead] in (" ", "\r"):
        out[lead] = "\\" + out[lead]
        lead += 1
    trail = len(out) - 1
    while trail >= lead and out[trail] in (" ", "\r"):
        out[trail] = "\\" + out[trail]
        trail -= 1
    return f"{keyword}={''.join(out)}"


def subject_dn(cert_der: bytes) -> str:
    """The certificate's subject distinguished name as Java's ``X500Principal.getName()`` renders it (RFC 2253:
    most specific RDN first, Java's keywords, its escaping) — what Kafka's principal mapping rules are written for."""
    name = x509.load_der_x509_certificate(cert_der).subject
    return ",".join("+".join(_attribute(a) for a in rdn) for rdn in reversed(name.rdns))


class NoMatchingRule(ValueError):
    """No ssl.principal.mapping.rules rule applies to a distinguished name (Kafka fails the authentication)."""


_RULE = r"(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(?:,\s*|$)")
_RULE_PARSER = re.compile(_RULE)


class PrincipalMapper:
    """Kafka's ssl.principal.mapping.rules: comma-separated ``RULE:pattern/replacement/[LU]`` and ``DEFAULT``, tried
    in order; the first rule whose pattern matches the whole DN gives the name (the DN with every match replaced,
    ``$n`` naming groups, then lower/upper cased); DEFAULT gives the DN itself.  ConfigError for a malformed rule."""

    def __init__(self, rules: str):
        self.rules: list[tuple[re.Pattern, list, str] | None] = []     # None: DEFAULT
        for text in (m.group(1) for m in _RULE_SPLITTER.finditer(rules.strip()) if m.group(1) is not None):
            m = _RULE_PARSER.match(text)
            if m is None or m.end() != len(text):
                raise ConfigError(f"ssl.principal.mapping.rules: invalid rule {text!r}")
            if m.group(1):
                self.rules.append(None)
            elif m.group(2) is not None:
                try:
                    pattern = re.compile(m.group(2))
                except re.error as e:
                    raise ConfigError(f"ssl.principal.mapping.rules: invalid pattern in {text!r}: {e}") from None
                self.rules.append((pattern, _replacement(m.group(3), pattern.groups), m.group(4)))

    def name(self, dn: str) -> str:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, parts, case = rule
            if pattern.fullmatch(dn) is None:
                continue
            result = pattern.sub(lambda m: "".join(p if isinstance(p, str) else (m.group(p) or "") for p in parts), dn)
            return result.lower() if case == "L" else result.upper() if case == "U" else result
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to {dn}")


def _replacement(text: str, groups: int) -> list:
    """A Java replacement string (``$n`` group references, ``\\`` escapes) → literal pieces and group numbers.  A
    reference to a group the pattern lacks is literal text (as Kafka's mapper makes it)."""
    parts: list = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            parts.append(text[i + 1])
            i += 2
        elif c == "$" and i + 1 < len(text) and text[i + 1].isdigit() and int(text[i + 1]) <= groups:
            number, i = int(text[i + 1]), i + 2
            while i < len(text) and text[i].isdigit() and number * 10 + int(text[i]) <= groups:
                number, i = number * 10 + int(text[i]), i + 1
            parts.append(number)
        else:
            parts.append(c)
            i += 1
    return parts


def peer_principal(ssl_object: ssl.SSLObject, mapper: PrincipalMapper) -> tuple[str, str | None]:
    """(the TLS principal, the client certificate's DN or None): ``User:`` + the mapped DN, User:ANONYMOUS without a
    client certificate.  NoMatchingRule when the rules give no name."""
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return "User:ANONYMOUS", None
    dn = subject_dn(der)
    return "User:" + mapper.name(dn), dn
