"""TLS settings without a server: PEM key material as Kafka 4 takes it, TLS versions, the client certificate's DN as
Java renders it, and Kafka's ssl.principal.mapping.rules (SslPrincipalMapper's own test vectors)."""
import datetime
import ssl

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trireme.server.config import Config, ConfigError
from trireme.server.tls import ListenerTls, NoMatchingRule, PrincipalMapper, build_context, subject_dn


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


def _pkcs8(key_pem: bytes, password: bytes | None = None) -> bytes:
    key = serialization.load_pem_private_key(key_pem, None)
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def _keystore(tmp_path, ca, name="localhost", password: bytes | None = None) -> str:
    """Kafka's PEM keystore file: a PKCS#8 key followed by the certificate chain."""
    cert = ca.issue_cert(name, common_name=name, organization_unit_name="Brokers")
    path = tmp_path / f"{name}.keystore.pem"
    path.write_bytes(_pkcs8(cert.private_key_pem.bytes(), password) + b"".join(c.bytes() for c in cert.cert_chain_pems))
    return str(path)


def _config(**settings) -> Config:
    config = Config(data_dir="<memory>")
    config.update(settings, source="test")
    return config


def test_keystore_file_with_a_pkcs8_key_and_the_chain(tmp_path, ca):
    context = build_context(_config(**{"ssl.keystore.location": _keystore(tmp_path, ca)}), "SSL")
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2 and context.maximum_version == ssl.TLSVersion.TLSv1_3
    assert context.verify_mode == ssl.CERT_NONE
    assert subject_dn(context.leaf_certificate).startswith("CN=localhost,OU=Brokers,O=trustme")


def test_inline_key_and_chain_even_on_one_line(tmp_path, ca):
    cert = ca.issue_cert("localhost")
    key = _pkcs8(cert.private_key_pem.bytes()).decode()
    chain = "".join(c.bytes().decode() for c in cert.cert_chain_pems)
    one_line = " ".join(chain.split("\n"))          # a properties file's value without continuation lines
    build_context(_config(**{"ssl.keystore.key": key, "ssl.keystore.certificate.chain": one_line}), "SSL")
    with pytest.raises(ConfigError, match="go together"):
        build_context(_config(**{"ssl.keystore.key": key}), "SSL")
    with pytest.raises(ConfigError, match="not both"):
        build_context(_config(**{"ssl.keystore.key": key, "ssl.keystore.certificate.chain": chain,
                                 "ssl.keystore.location": _keystore(tmp_path, ca)}), "SSL")


def test_encrypted_key_needs_ssl_key_password(tmp_path, ca):
    path = _keystore(tmp_path, ca, password=b"s3cret")
    with pytest.raises(ConfigError, match="encrypted: ssl.key.password is needed"):
        build_context(_config(**{"ssl.keystore.location": path}), "SSL")
    with pytest.raises(ConfigError, match="wrong ssl.key.password") as refused:
        build_context(_config(**{"ssl.keystore.location": path, "ssl.key.password": "wrong"}), "SSL")
    assert "wrong" not in str(refused.value).replace("wrong ssl.key.password", "")       # no secret in the message
    build_context(_config(**{"ssl.keystore.location": path, "ssl.key.password": "s3cret"}), "SSL")


@pytest.mark.parametrize("settings, says", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/x.jks"}, "ssl.keystore.type=JKS is not supported"),
    ({"ssl.truststore.type": "PKCS12"}, "ssl.truststore.type=PKCS12 is not supported"),
    ({"ssl.keystore.location": "/nonexistent.pem"}, "cannot read it"),
    ({}, "needs a key and certificate"),
    ({"ssl.enabled.protocols": "TLSv1.1,TLSv1.2"}, "TLSv1.1 not allowed"),
    ({"ssl.protocol": "SSLv3"}, "TLS 1.2/1.3 only"),
    ({"ssl.cipher.suites": "NO-SUCH-CIPHER"}, "no cipher suite OpenSSL knows"),
])
def test_refusals_name_the_setting_in_one_line(settings, says):
    with pytest.raises(ConfigError, match=says) as refused:
        build_context(_config(**settings), "SSL")
    assert "\n" not in str(refused.value)


def test_binary_store_is_not_pem(tmp_path):
    path = tmp_path / "broker.jks"
    path.write_bytes(b"\xfe\xed\xfe\xed\x00\x00\x00\x02")
    with pytest.raises(ConfigError, match="is not a PEM file"):
        build_context(_config(**{"ssl.keystore.location": str(path)}), "SSL")


def test_key_of_another_certificate_is_refused(tmp_path, ca):
    one, other = ca.issue_cert("a.example"), ca.issue_cert("b.example")
    path = tmp_path / "mixed.pem"
    path.write_bytes(_pkcs8(other.private_key_pem.bytes()) + one.cert_chain_pems[0].bytes())
    with pytest.raises(ConfigError, match="cannot use the key and certificate"):
        build_context(_config(**{"ssl.keystore.location": str(path)}), "SSL")


def test_versions_client_auth_and_listener_overrides(tmp_path, ca):
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    config = _config(**{"ssl.keystore.location": _keystore(tmp_path, ca), "ssl.enabled.protocols": "TLSv1.3",
                        "ssl.client.auth": "required", "ssl.truststore.location": str(ca_path),
                        "listener.name.internal.ssl.client.auth": "none",
                        "listener.name.internal.ssl.enabled.protocols": "TLSv1.2"})
    ssl_context = build_context(config, "SSL")
    assert ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3 and ssl_context.verify_mode == ssl.CERT_REQUIRED
    internal = build_context(config, "INTERNAL")
    assert internal.maximum_version == ssl.TLSVersion.TLSv1_2 and internal.verify_mode == ssl.CERT_NONE
    assert build_context(_config(**{"ssl.keystore.location": _keystore(tmp_path, ca), "ssl.protocol": "TLSv1.2"}),
                         "SSL").maximum_version == ssl.TLSVersion.TLSv1_2     # as Kafka: 1.2 alone
    assert build_context(_config(**{"ssl.keystore.location": _keystore(tmp_path, ca), "ssl.client.auth": "requested",
                                    "ssl.truststore.certificates": ca.cert_pem.bytes().decode()}),
                         "SSL").verify_mode == ssl.CERT_OPTIONAL


def test_sasl_ssl_takes_client_auth_from_its_listener_only(tmp_path, ca):
    """KIP-684: the broker-wide ssl.client.auth is for SSL listeners; a SASL_SSL one needs its listener prefix."""
    config = _config(**{"ssl.keystore.location": _keystore(tmp_path, ca), "ssl.client.auth": "required",
                        "ssl.truststore.certificates": ca.cert_pem.bytes().decode(),
                        "listener.name.secure.ssl.client.auth": "requested"})
    assert ListenerTls(config, "SSL").context.verify_mode == ssl.CERT_REQUIRED
    assert ListenerTls(config, "SASL_SSL", "SASL_SSL").client_auth == "none"
    assert ListenerTls(config, "SASL_SSL", "SASL_SSL").context.verify_mode == ssl.CERT_NONE
    assert ListenerTls(config, "SECURE", "SASL_SSL").client_auth == "requested"


def test_reload_keeps_the_subject_unless_allowed(tmp_path, ca):
    config = _config(**{"ssl.keystore.location": _keystore(tmp_path, ca, "localhost")})
    tls = ListenerTls(config, "SSL")
    first = tls.context
    renewed = _keystore(tmp_path / "..", ca, "localhost")                     # same names, a new key
    tls.reload({"ssl.keystore.location": renewed})
    assert tls.context is not first and tls.overrides == {"ssl.keystore.location": renewed}
    other = _keystore(tmp_path, ca, "other.example")
    with pytest.raises(ConfigError, match="subject CN=other.example,OU=Brokers,.* differs"):
        tls.reload({"ssl.keystore.location": other})
    with pytest.raises(ConfigError, match="cannot read it"):
        tls.reload({"ssl.keystore.location": str(tmp_path / "missing.pem")})
    assert tls.overrides == {"ssl.keystore.location": renewed}                 # the old context stays
    config.set("ssl.allow.dn.changes", "true")
    with pytest.raises(ConfigError, match="subject alternative names differ"):
        tls.reload({"ssl.keystore.location": other})
    config.set("ssl.allow.san.changes", "true")
    tls.reload({"ssl.keystore.location": other})
    tls.reload({"ssl.keystore.location": None})                                 # back to the static setting
    assert tls.overrides == {}


def _certificate(*rdns: x509.RelativeDistinguishedName) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(list(rdns))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def _rdn(oid, value, **kw):
    return x509.RelativeDistinguishedName([x509.NameAttribute(oid, value, **kw)])


def test_subject_dn_as_java_renders_it():
    der = _certificate(_rdn(NameOID.COUNTRY_NAME, "US"), _rdn(NameOID.ORGANIZATION_NAME, "Acme, Inc."),
                       _rdn(NameOID.ORGANIZATIONAL_UNIT_NAME, " Eng=1 "),
                       x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, "#bob+1"),
                                                       x509.NameAttribute(NameOID.USER_ID, "b1")]),
                       _rdn(NameOID.EMAIL_ADDRESS, "bob@x.com"))
    # most specific first; Java's RFC 2253 keywords, others as OID=#DER; ,=+<>#;"\ escaped anywhere, and
    # leading/trailing spaces
    assert subject_dn(der) == ("1.2.840.113549.1.9.1=#1609626f6240782e636f6d,CN=\\#bob\\+1+UID=b1,"
                               "OU=\\ Eng\\=1\\ ,O=Acme\\, Inc.,C=US")


KAFKA_RULES = ", ".join([
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
    "DEFAULT"])


@pytest.mark.parametrize("dn, name", [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_kafkas_mapping_rules(dn, name):
    assert PrincipalMapper(KAFKA_RULES).name(dn) == name


def test_mapping_rule_details():
    assert PrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT").name(
        "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"
    assert PrincipalMapper("RULE:^CN=(.*?),.*$/$1@$2/").name("CN=a,O=b") == "a@$2"     # no group 2: literal
    assert PrincipalMapper("RULE:^CN=(.*?),.*$/x\\/$1/").name("CN=a,O=b") == "x/a"
    assert len(PrincipalMapper(",,RULE://,,,DEFAULT,,").rules) == 2 and PrincipalMapper("").rules == []
    with pytest.raises(NoMatchingRule):
        PrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/").name("CN=a,O=b")


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U", "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L", "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU", "RULE:^CN=(.*?/$1/"])
def test_invalid_rules_are_refused(rules):
    with pytest.raises(ConfigError, match="ssl.principal.mapping.rules"):
        PrincipalMapper(rules)


def test_truststore_reload(tmp_path, ca):
    other = trustme.CA(organization_name="Other CA")
    config = _config(**{"ssl.keystore.location": _keystore(tmp_path, ca), "ssl.client.auth": "required",
                        "ssl.truststore.certificates": ca.cert_pem.bytes().decode()})
    tls = ListenerTls(config, "SSL")
    issuers = lambda: [dict(x[0] for x in c["subject"]).get("organizationName") for c in tls.context.get_ca_certs()]  # noqa: E731
    assert issuers() == ["trustme v" + trustme.__version__]
    path = tmp_path / "other-ca.pem"
    other.cert_pem.write_to_path(str(path))
    tls.reload({"ssl.truststore.certificates": "", "ssl.truststore.location": str(path)})
    assert issuers() == ["Other CA"] and tls.context.verify_mode == ssl.CERT_REQUIRED
