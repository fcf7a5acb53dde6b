"""``trireme acls|users|quotas`` and ``--command-config`` against a scripted broker: the frames the CLI sends, decoded by the codec (and one checked byte by byte), TLS with trustme certificates, SASL PLAIN and SCRAM with scramp's server side."""
from __future__ import annotations

import contextlib
import hashlib
import io
import socket
import ssl
import struct
import threading
import time

import pytest
import scramp
import trustme

from trireme.server import cli
from trireme.server.admin import security, users
from trireme.server.admin.client import API_KEYS, AdminError
from trireme.server.config import parse_properties
from trireme.server.dispatch import advertised_versions
from trireme.state.acls import Operation, PatternType, Permission, ResourceType
from trireme.wire import error_codes as E
from trireme.wire import headers
from trireme.wire.codec import message

PASSWORD = "s3cret-Pässword"


class FakeBroker:
    """A listener that answers ApiVersions with the broker's table, SASL as configured, and everything else with
    ``answers[api](request) -> response``; it records each (api, version, request, raw frame) it decodes."""

    def __init__(self, answers=None, ssl_context: ssl.SSLContext | None = None, sasl: dict | None = None):
        self.answers = answers or {}
        self.ssl_context = ssl_context
        self.sasl = sasl                 # {"mechanism": ..., "users": {name: password}, "session_ms": lifetime}
        self.requests: list[tuple[str, int, object, bytes]] = []
        self.errors: list[BaseException] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)         # wakes the accept() of the serving thread
        self.sock.close()
        self.thread.join(10)

    def of(self, api: str) -> list:
        return [r for a, _, r, _ in self.requests if a == api]

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with contextlib.closing(conn):
                    self._connection(conn)
            except (OSError, ssl.SSLError, EOFError):
                pass
            except Exception as e:                   # noqa: BLE001 - reported by the test
                self.errors.append(e)

    def _connection(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        if self.ssl_context is not None:
            conn = self.ssl_context.wrap_socket(conn, server_side=True)
        names = {key: name for name, key in API_KEYS.items()}
        authenticated = self.sasl is None
        state: dict = {}
        expires = None
        while True:
            head = _read(conn, 4)
            frame = _read(conn, struct.unpack(">i", head)[0])
            api_key, version = headers.peek_api(frame)
            api = names[api_key]
            codec = message(api + "Request")
            header = headers.decode_request_header(frame, codec.is_flexible(version))
            obj = codec.decode(memoryview(frame), version, header.size)[0]
            self.requests.append((api, version, obj, head + frame))
            rcodec = message(api + "Response")
            response = rcodec.cls()
            if api == "ApiVersions":
                kcls = type(response).ApiVersion
                response.api_keys = [kcls(api_key=k, min_version=lo, max_version=hi)
                                     for k, (lo, hi) in advertised_versions().items()]
            elif api == "SaslHandshake":
                state = {}                               # a new exchange (KIP-368: also a re-authentication)
                response.mechanisms = [self.sasl["mechanism"]]
                if obj.mechanism != self.sasl["mechanism"]:
                    response.error_code = E.UNSUPPORTED_SASL_MECHANISM.code
            elif api == "SaslAuthenticate":
                response.auth_bytes, failed, done = self._sasl_step(obj.auth_bytes, state)
                if failed:
                    response.error_code, response.error_message = E.SASL_AUTHENTICATION_FAILED.code, failed
                elif done:
                    authenticated = True
                    session_ms = self.sasl.get("session_ms", 0)
                    expires = time.monotonic() + session_ms / 1000 if session_ms else None
                    if version >= 1:
                        response.session_lifetime_ms = session_ms
            elif not authenticated or (expires is not None and time.monotonic() > expires):
                return                                   # Kafka closes the connection
            else:
                response = self.answers[api](obj)
            body = headers.encode_response_header(
                header.correlation_id, headers.response_header_version(api_key, rcodec.is_flexible(version)))
            body += rcodec.encode_bytes(response, version)
            conn.sendall(struct.pack(">i", len(body)) + body)
            if api == "SaslAuthenticate" and response.error_code:
                return

    def _sasl_step(self, token: bytes, state: dict) -> tuple[bytes, str | None, bool]:
        """→ (the answer's bytes, a failure message or None, authenticated now)."""
        mechanism, passwords = self.sasl["mechanism"], self.sasl["users"]
        failed = f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
        if mechanism == "PLAIN":
            _, user, password = token.decode().split("\0")
            ok = user in passwords and passwords[user] == password
            return b"", None if ok else failed, ok
        try:
            if "server" not in state:
                def auth(user):
                    if user not in passwords:
                        raise scramp.ScramException("unknown user")
                    return scramp.ScramMechanism(mechanism).make_auth_info(passwords[user], 4096)
                server = state["server"] = scramp.ScramMechanism(mechanism).make_server(auth)
                server.set_client_first(token.decode())
                return server.get_server_first().encode(), None, False
            state["server"].set_client_final(token.decode())
            return state["server"].get_server_final().encode(), None, True
        except scramp.ScramException:
            return b"", failed, False


def _read(conn, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


@pytest.fixture
def broker_factory():
    made = []

    def make(*args, **kwargs) -> FakeBroker:
        made.append(FakeBroker(*args, **kwargs))
        return made[-1]
    yield make
    for b in made:
        b.close()
    for b in made:
        assert not b.errors, b.errors


def trireme(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdin", io.StringIO(stdin))
        try:
            code = cli.main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def response(api: str, **fields):
    return message(api + "Response").cls(**fields)


# --------------------------------------------------------------------------- acls

def test_acls_create_sends_each_principal_host_and_operation(broker_factory):
    broker = broker_factory({"CreateAcls": lambda req: response("CreateAcls", results=[
        message("CreateAclsResponse").cls.AclCreationResult(error_code=0, error_message=None)
        for _ in req.creations])})
    code, out, err = trireme("acls", "create", "--bootstrap-server", broker.bootstrap,
                             "--allow-principal", "User:alice", "--allow-principal", "User:bob",
                             "--allow-host", "10.0.0.1", "--operation", "Read", "--operation", "describe",
                             "--topic", "orders", "--resource-pattern-type", "prefixed")
    assert code == 0, err
    (req,) = broker.of("CreateAcls")
    got = {(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
            c.permission_type) for c in req.creations}
    assert got == {(ResourceType.TOPIC, "orders", PatternType.PREFIXED, p, "10.0.0.1", op, Permission.ALLOW)
                   for p in ("User:alice", "User:bob") for op in (Operation.READ, Operation.DESCRIBE)}
    assert out.startswith("Created 4 ACLs:") and "User:bob" in out and "PREFIXED" in out


def test_acls_create_producer_shortcut_and_defaults(broker_factory):
    broker = broker_factory({"CreateAcls": lambda req: response("CreateAcls", results=[
        message("CreateAclsResponse").cls.AclCreationResult() for _ in req.creations])})
    code, _, err = trireme("acls", "add", "--bootstrap-server", broker.bootstrap, "--allow-principal", "User:app",
                           "--producer", "--idempotent", "--topic", "t", "--transactional-id", "tx")
    assert code == 0, err
    (req,) = broker.of("CreateAcls")
    got = {(c.resource_type, c.resource_name, c.operation) for c in req.creations}
    assert got == {(ResourceType.TOPIC, "t", Operation.WRITE), (ResourceType.TOPIC, "t", Operation.DESCRIBE),
                   (ResourceType.TOPIC, "t", Operation.CREATE), (ResourceType.TRANSACTIONAL_ID, "tx", Operation.WRITE),
                   (ResourceType.TRANSACTIONAL_ID, "tx", Operation.DESCRIBE),
                   (ResourceType.CLUSTER, "kafka-cluster", Operation.IDEMPOTENT_WRITE)}
    assert {(c.host, c.permission_type, c.resource_pattern_type) for c in req.creations} == {
        ("*", Permission.ALLOW, PatternType.LITERAL)}


def test_acls_refuses_an_operation_the_resource_type_lacks_without_sending(broker_factory):
    broker = broker_factory()
    code, out, err = trireme("acls", "create", "--bootstrap-server", broker.bootstrap,
                             "--allow-principal", "User:a", "--operation", "Write", "--group", "g")
    assert code == 1 and out == ""
    assert "ResourceType Group only supports operations" in err
    assert broker.of("CreateAcls") == []
    code, _, err = trireme("acls", "create", "--bootstrap-server", broker.bootstrap, "--operation", "Read",
                           "--allow-principal", "alice", "--topic", "t")
    assert code == 1 and "a principal is TYPE:NAME" in err


def test_acls_list_filters_and_prints_a_table(broker_factory):
    rcls = message("DescribeAclsResponse").cls
    res = rcls.DescribeAclsResource
    broker = broker_factory({"DescribeAcls": lambda req: response("DescribeAcls", resources=[
        res(resource_type=2, resource_name="orders", pattern_type=3, acls=[
            res.AclDescription(principal="User:alice", host="*", operation=3, permission_type=3)])])})
    code, out, err = trireme("acls", "list", "--bootstrap-server", broker.bootstrap, "--json")
    assert code == 0, err
    (req,) = broker.of("DescribeAcls")
    assert (req.resource_type_filter, req.resource_name_filter, req.pattern_type_filter, req.principal_filter,
            req.operation, req.permission_type) == (ResourceType.ANY, None, PatternType.ANY, None, Operation.ANY,
                                                    Permission.ANY)
    import json
    assert json.loads(out) == [{"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL",
                                "principal": "User:alice", "host": "*", "operation": "READ",
                                "permission": "ALLOW"}]
    code, out, _ = trireme("acls", "list", "--bootstrap-server", broker.bootstrap, "--topic", "orders",
                           "--resource-pattern-type", "match", "--principal", "User:alice")
    assert code == 0 and out.splitlines()[0].split() == ["RESOURCE-TYPE", "RESOURCE-NAME", "PATTERN-TYPE",
                                                         "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"]
    req = broker.of("DescribeAcls")[-1]
    assert (req.resource_type_filter, req.resource_name_filter, req.pattern_type_filter, req.principal_filter) == (
        ResourceType.TOPIC, "orders", PatternType.MATCH, "User:alice")


def test_describe_acls_frame_byte_by_byte(broker_factory):
    """The DescribeAcls v3 frame, written out from Kafka's message definition by hand (flexible: compact strings
    length+1, a tagged-field byte after the header and the body)."""
    broker = broker_factory({"DescribeAcls": lambda req: response("DescribeAcls")})
    assert trireme("acls", "list", "--bootstrap-server", broker.bootstrap, "--group", "billing")[0] == 0
    (frame,) = [raw for api, _, _, raw in broker.requests if api == "DescribeAcls"]
    client_id = b"trireme-admin"
    expected_body = (struct.pack(">hhi", 29, 3, 2) + struct.pack(">h", len(client_id)) + client_id + b"\0"
                     + bytes([3]) + bytes([len("billing") + 1]) + b"billing" + bytes([3])      # GROUP, LITERAL
                     + b"\0" + b"\0"                                                           # principal, host null
                     + bytes([1, 1]) + b"\0")                                                  # ANY, ANY
    assert frame == struct.pack(">i", len(expected_body)) + expected_body


def test_acls_delete_without_principal_deletes_every_acl_of_the_resource(broker_factory):
    rcls = message("DeleteAclsResponse").cls.DeleteAclsFilterResult
    broker = broker_factory({"DeleteAcls": lambda req: response("DeleteAcls", filter_results=[
        rcls(matching_acls=[rcls.DeleteAclsMatchingAcl(resource_type=2, resource_name="t", pattern_type=3,
                                                       principal="User:x", host="*", operation=4,
                                                       permission_type=2)]) for _ in req.filters])})
    code, out, err = trireme("acls", "delete", "--bootstrap-server", broker.bootstrap, "--topic", "t", "--force")
    assert code == 0, err
    (req,) = broker.of("DeleteAcls")
    (f,) = req.filters
    assert (f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter, f.host_filter,
            f.operation, f.permission_type) == (ResourceType.TOPIC, "t", PatternType.LITERAL, None, None,
                                                Operation.ANY, Permission.ANY)
    assert out.startswith("Deleted 1 ACL:") and "DENY" in out
    code, _, err = trireme("acls", "delete", "--bootstrap-server", broker.bootstrap)
    assert code == 1 and "delete needs a resource" in err


def test_acls_error_code_from_the_broker_exits_1_with_its_message(broker_factory):
    broker = broker_factory({"CreateAcls": lambda req: response("CreateAcls", results=[
        message("CreateAclsResponse").cls.AclCreationResult(error_code=E.SECURITY_DISABLED.code,
                                                              error_message="No Authorizer is configured.")])})
    code, out, err = trireme("acls", "create", "--bootstrap-server", broker.bootstrap, "--allow-principal",
                             "User:a", "--cluster", "--operation", "Alter")
    assert code == 1 and out == ""
    assert "SECURITY_DISABLED: No Authorizer is configured." in err


# --------------------------------------------------------------------------- users

def _upsert_ok(req):
    rcls = message("AlterUserScramCredentialsResponse").cls.AlterUserScramCredentialsResult
    names = dict.fromkeys([d.name for d in req.deletions] + [u.name for u in req.upsertions])
    return response("AlterUserScramCredentials", results=[rcls(user=n) for n in names])


def test_users_add_sends_a_salted_password_scram_accepts(broker_factory):
    """What the CLI sends is what a SCRAM server needs: scramp's server, given the stored key and server key derived
    from the salted password sent, authenticates a client that knows the password (and not one that does not)."""
    broker = broker_factory({"AlterUserScramCredentials": _upsert_ok})
    code, out, err = trireme("users", "add", "--bootstrap-server", broker.bootstrap, "--user", "alice",
                             "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192",
                             "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0, err
    assert PASSWORD not in out + err
    sent = broker.of("AlterUserScramCredentials")          # one request per mechanism: a user once per request
    assert [len(r.upsertions) for r in sent] == [1, 1] and all(r.deletions == [] for r in sent)
    upsertions = [u for r in sent for u in r.upsertions]
    for u in upsertions:
        name, hash_name = {1: ("SCRAM-SHA-256", "sha256"), 2: ("SCRAM-SHA-512", "sha512")}[u.mechanism]
        assert u.name == "alice" and u.iterations == 8192 and len(u.salt) >= 16
        assert u.salted_password == hashlib.pbkdf2_hmac(hash_name, PASSWORD.encode(), u.salt, 8192)
        for password, ok in ((PASSWORD, True), ("wrong", False)):
            assert _scram_login(name, u, password) is ok
    assert len({bytes(u.salt) for u in upsertions}) == 2              # a salt per credential


def _scram_login(mechanism: str, upsertion, password: str) -> bool:
    hf = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}[mechanism]
    import hmac
    client_key = hmac.new(upsertion.salted_password, b"Client Key", hf).digest()
    stored_key = hf(client_key).digest()
    server_key = hmac.new(upsertion.salted_password, b"Server Key", hf).digest()
    server = scramp.ScramMechanism(mechanism).make_server(
        lambda user: (bytes(upsertion.salt), stored_key, server_key, upsertion.iterations))
    client = scramp.ScramClient([mechanism], "alice", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    try:
        server.set_client_final(client.get_client_final())
    except scramp.ScramException:
        return False
    client.set_server_final(server.get_server_final())
    return True


def test_users_add_refuses_bad_input_before_sending(broker_factory):
    broker = broker_factory({"AlterUserScramCredentials": _upsert_ok})
    code, _, err = trireme("users", "add", "--bootstrap-server", broker.bootstrap, "--user", "a", "--password-stdin",
                           stdin="\n")
    assert code == 1 and "the password is empty" in err
    code, _, err = trireme("users", "add", "--bootstrap-server", broker.bootstrap, "--user", "a", "--iterations",
                           "100000000", "--password-stdin", stdin="x\n")
    assert code == 1 and "--iterations must be between 4096 and 16384" in err
    assert broker.of("AlterUserScramCredentials") == []


def test_users_list_and_delete_every_mechanism(broker_factory):
    dcls = message("DescribeUserScramCredentialsResponse").cls.DescribeUserScramCredentialsResult
    described = [dcls(user="alice", credential_infos=[dcls.CredentialInfo(mechanism=1, iterations=4096),
                                                      dcls.CredentialInfo(mechanism=2, iterations=8192)]),
                 dcls(user="ghost", error_code=E.RESOURCE_NOT_FOUND.code, error_message="no such user")]
    broker = broker_factory({"DescribeUserScramCredentials": lambda req: response(
        "DescribeUserScramCredentials", results=[d for d in described if req.users is None
                                                 or d.user in {u.name for u in req.users}]),
        "AlterUserScramCredentials": _upsert_ok})
    code, out, err = trireme("users", "list", "--bootstrap-server", broker.bootstrap, "--user", "alice",
                             "--user", "ghost")
    assert code == 0
    assert out.splitlines() == ["USER   MECHANISM      ITERATIONS", "alice  SCRAM-SHA-256  4096",
                                "alice  SCRAM-SHA-512  8192"]
    assert "user 'ghost' has no SCRAM credentials" in err
    assert [u.name for u in broker.of("DescribeUserScramCredentials")[0].users] == ["alice", "ghost"]
    code, out, err = trireme("users", "delete", "--bootstrap-server", broker.bootstrap, "--user", "alice")
    assert code == 0, err
    sent = broker.of("AlterUserScramCredentials")
    assert [[(d.name, d.mechanism) for d in r.deletions] for r in sent] == [[("alice", 1)], [("alice", 2)]]
    assert all(r.upsertions == [] for r in sent)


# --------------------------------------------------------------------------- quotas

def test_quotas_alter_pairs_entity_types_with_names_in_order(broker_factory):
    ecls = message("AlterClientQuotasResponse").cls.EntryData
    broker = broker_factory({"AlterClientQuotas": lambda req: response("AlterClientQuotas", entries=[
        ecls(entity=[ecls.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in x.entity])
        for x in req.entries])})
    code, out, err = trireme("quotas", "alter", "--bootstrap-server", broker.bootstrap,
                             "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                             "--entity-default", "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2e6",
                             "--delete-config", "request_percentage")
    assert code == 0, err
    (req,) = broker.of("AlterClientQuotas")
    (entry,) = req.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("user", "alice"), ("client-id", None)]
    assert sorted((o.key, o.value, o.remove) for o in entry.ops) == [
        ("consumer_byte_rate", 2e6, False), ("producer_byte_rate", 1048576.0, False),
        ("request_percentage", 0.0, True)]
    assert req.validate_only is False
    assert "user=alice,client-id=<default>" in out
    code, _, err = trireme("quotas", "alter", "--bootstrap-server", broker.bootstrap, "--entity-type", "users",
                           "--add-config", "producer_byte_rate=1")
    assert code == 1 and "needs --entity-name or --entity-default" in err
    code, _, err = trireme("quotas", "alter", "--bootstrap-server", broker.bootstrap, "--user-defaults",
                           "--add-config", "producer_byte_rate=fast")
    assert code == 1 and "is not a number" in err
    assert len(broker.of("AlterClientQuotas")) == 1


def test_quotas_describe_matches_exactly_what_is_named(broker_factory):
    dcls = message("DescribeClientQuotasResponse").cls.EntryData
    broker = broker_factory({"DescribeClientQuotas": lambda req: response("DescribeClientQuotas", entries=[
        dcls(entity=[dcls.EntityData(entity_type="user", entity_name="alice")],
             values=[dcls.ValueData(key="producer_byte_rate", value=1024.0)])])})
    code, out, err = trireme("quotas", "describe", "--bootstrap-server", broker.bootstrap, "--user", "alice",
                             "--entity-type", "clients")
    assert code == 0, err
    (req,) = broker.of("DescribeClientQuotas")
    assert [(c.entity_type, c.match_type, c.match) for c in req.components] == [("user", 0, "alice"),
                                                                                 ("client-id", 2, None)]
    assert req.strict is True
    assert out.splitlines()[1].split() == ["user=alice", "producer_byte_rate", "1024.0"]
    code, out, _ = trireme("quotas", "describe", "--bootstrap-server", broker.bootstrap, "--json")
    assert broker.of("DescribeClientQuotas")[-1].components == [] and broker.of("DescribeClientQuotas")[-1].strict is False
    import json
    assert json.loads(out) == [{"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 1024.0}}]


# --------------------------------------------------------------------------- --command-config

def test_java_properties_and_jaas_lines():
    props = parse_properties(
        "# a comment\n! another\nsecurity.protocol = SASL_SSL\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        "    username=\"admin\" \\\n    password=\"p\\\\\\\"w;d\";\n"
        "ssl.truststore.certificates=-----BEGIN CERTIFICATE-----\\nAAA\\n-----END CERTIFICATE-----\n"
        "key\\=with\\:escapes: v\n")
    assert props["security.protocol"] == "SASL_SSL"
    assert props["ssl.truststore.certificates"] == "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----"
    assert props["key=with:escapes"] == "v"
    security_settings = security.client_security({**props, "security.protocol": "SASL_PLAINTEXT",
                                                  "sasl.mechanism": "SCRAM-SHA-512"})
    assert (security_settings.username, security_settings.password) == ("admin", 'p"w;d')


def test_command_config_errors_name_the_setting_never_the_password(tmp_path):
    cases = [({"security.protocol": "SASL_TLS"}, "security.protocol"),
             ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "GSSAPI is not supported"),
             ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
               "sasl.jaas.config": f'x.PlainLoginModule required username="u" password="{PASSWORD}";'},
              "needs ScramLoginModule"),
             ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
              "needs a username and a password"),
             ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
               "sasl.jaas.config": f'x.PlainLoginModule required username="u" password="{PASSWORD}"'},
              "sasl.jaas.config: JAAS config entry not terminated by semi-colon"),
             ({"security.protocol": "SSL", "ssl.truststore.type": "JKS",
               "ssl.truststore.location": str(tmp_path / "x.jks")}, "only PEM"),
             ({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "missing.pem")}, "no such file")]
    for props, message_part in cases:
        with pytest.raises(AdminError) as info:
            security.client_security(props)
        assert message_part in str(info.value) and PASSWORD not in str(info.value)


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


def _server_context(ca, client_auth: bool = False, names=("localhost", "127.0.0.1")) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert(*names).configure_cert(context)
    if client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    return context


def _describe_ok(req):
    return response("DescribeAcls")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_sasl_ssl_with_a_command_config(broker_factory, ca, tmp_path, mechanism):
    broker = broker_factory({"DescribeAcls": _describe_ok}, ssl_context=_server_context(ca),
                            sasl={"mechanism": mechanism, "users": {"admin": PASSWORD}})
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"

    def config(password: str) -> str:
        path = tmp_path / f"admin-{len(password)}.properties"
        path.write_text("security.protocol=SASL_SSL\n"
                        f"sasl.mechanism={mechanism}\n"
                        f"sasl.jaas.config=org.apache.kafka.common.security.{module} required \\\n"
                        f'  username="admin" password="{password}";\n'
                        "ssl.truststore.type=PEM\n"
                        f"ssl.truststore.location={tmp_path / 'ca.pem'}\n")
        return str(path)

    code, out, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                             "--command-config", config(PASSWORD))
    assert code == 0, err
    assert [api for api, *_ in broker.requests] == ["ApiVersions", "SaslHandshake"] + \
        ["SaslAuthenticate"] * (1 if mechanism == "PLAIN" else 2) + ["DescribeAcls"]
    code, out, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                             "--command-config", config("not-it"))
    assert code == 1 and out == ""
    assert f"authentication as 'admin' with {mechanism}" in err and "failed" in err
    assert "not-it" not in err and PASSWORD not in err
    assert len(broker.of("DescribeAcls")) == 1


def test_sasl_mechanism_the_broker_does_not_offer(broker_factory, tmp_path):
    broker = broker_factory({}, sasl={"mechanism": "PLAIN", "users": {}})
    path = tmp_path / "c.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                    "sasl.username=admin\nsasl.password=x\n")
    code, _, err = trireme("users", "list", "--bootstrap-server", broker.bootstrap, "--command-config", str(path))
    assert code == 1 and "does not accept SASL mechanism SCRAM-SHA-512 (it offers PLAIN)" in err


def test_tls_checks_the_broker_certificate_and_presents_a_client_one(broker_factory, ca, tmp_path):
    broker = broker_factory({"DescribeAcls": _describe_ok},
                            ssl_context=_server_context(ca, client_auth=True, names=("localhost",)))
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("admin-client")
    keystore = tmp_path / "keystore.pem"                    # Kafka's PEM keystore: the key, then the chain
    keystore.write_bytes(client.private_key_pem.bytes() + b"".join(c.bytes() for c in client.cert_chain_pems))
    (tmp_path / "wrong-ca.properties").write_text(
        f"security.protocol=SSL\nssl.ca.location={tmp_path / 'other.pem'}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                           "--command-config", str(tmp_path / "wrong-ca.properties"))
    assert code == 1 and "the broker's certificate was not accepted" in err
    (tmp_path / "mtls.properties").write_text(
        "security.protocol=SSL\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={tmp_path / 'ca.pem'}\n"
        f"ssl.keystore.type=PEM\nssl.keystore.location={keystore}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                           "--command-config", str(tmp_path / "mtls.properties"))
    assert code == 0, err
    # librdkafka's names, with the certificate and key in separate files and the CA inline (Java's name)
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    ca_inline = ca.cert_pem.bytes().decode().strip().replace("\n", "\\n")
    (tmp_path / "rdkafka.properties").write_text(
        f"security.protocol=ssl\nssl.truststore.certificates={ca_inline}\n"
        f"ssl.certificate.location={tmp_path / 'client.pem'}\nssl.key.location={tmp_path / 'client.key'}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                           "--command-config", str(tmp_path / "rdkafka.properties"))
    assert code == 0, err
    assert len(broker.of("DescribeAcls")) == 2
    # The broker's certificate names localhost only: 127.0.0.1 fails the host-name check unless
    # ssl.endpoint.identification.algorithm is empty (Kafka's switch); no verification at all is librdkafka's.
    renamed = "127.0.0.1"
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"{renamed}:{broker.port}",
                           "--command-config", str(tmp_path / "mtls.properties"))
    assert code == 1 and "the broker's certificate was not accepted" in err
    (tmp_path / "no-host-check.properties").write_text(
        (tmp_path / "mtls.properties").read_text() + "ssl.endpoint.identification.algorithm=\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"{renamed}:{broker.port}",
                           "--command-config", str(tmp_path / "no-host-check.properties"))
    assert code == 0, err
    # Java's inline PEM forms, one line each (line breaks as spaces, as Kafka takes them)
    one_line = lambda pem: " ".join(pem.decode().split("\n")).strip()            # noqa: E731
    (tmp_path / "inline.properties").write_text(
        "security.protocol=SSL\nssl.keystore.type=PEM\n"
        f"ssl.keystore.key={one_line(client.private_key_pem.bytes())}\n"
        f"ssl.keystore.certificate.chain={one_line(client.cert_chain_pems[0].bytes())}\n"
        f"ssl.truststore.certificates={one_line(ca.cert_pem.bytes())}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                           "--command-config", str(tmp_path / "inline.properties"))
    assert code == 0, err
    (tmp_path / "no-verify.properties").write_text(
        f"security.protocol=SSL\nssl.ca.location={tmp_path / 'other.pem'}\nenable.ssl.certificate.verification=false\n"
        f"ssl.keystore.location={keystore}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", f"localhost:{broker.port}",
                           "--command-config", str(tmp_path / "no-verify.properties"))
    assert code == 0, err


def test_users_add_password_from_a_prompt_is_asked_twice(broker_factory, monkeypatch):
    broker = broker_factory({"AlterUserScramCredentials": _upsert_ok})
    answers = iter([PASSWORD, PASSWORD + "x"])
    monkeypatch.setattr(users.getpass, "getpass", lambda prompt: next(answers))
    code, _, err = trireme("users", "add", "--bootstrap-server", broker.bootstrap, "--user", "a")
    assert code == 1 and "the passwords typed differ" in err and PASSWORD not in err
    answers = iter([PASSWORD, PASSWORD])
    code, _, err = trireme("users", "add", "--bootstrap-server", broker.bootstrap, "--user", "a")
    assert code == 0, err
    (req,) = broker.of("AlterUserScramCredentials")
    (u,) = req.upsertions
    assert u.mechanism == 2 and u.iterations == 4096


def test_users_on_a_plain_credentials_file(tmp_path):
    """--plain-credentials-file: PLAIN users hashed into the file the broker reads (no broker contacted); the broker's
    own check (plain_credentials.verify) accepts the password and nothing else; the file holds no password."""
    from trireme.server import plain_credentials
    path = tmp_path / "plain.credentials"
    code, out, err = trireme("users", "add", "--user", "alice", "--plain-credentials-file", str(path),
                             "--iterations", "10000", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0, err
    assert PASSWORD not in path.read_text() and PASSWORD not in out + err
    assert path.stat().st_mode & 0o777 == 0o600
    stored = plain_credentials.read(str(path))["alice"]
    assert plain_credentials.verify(stored, PASSWORD) and not plain_credentials.verify(stored, "guess")
    code, out, _ = trireme("users", "list", "--plain-credentials-file", str(path))
    assert code == 0 and out.splitlines()[1].split() == ["alice", "PLAIN", "10000"]
    code, _, err = trireme("users", "delete", "--user", "bob", "--plain-credentials-file", str(path))
    assert code == 1 and "has no user 'bob'" in err
    code, _, err = trireme("users", "delete", "--user", "alice", "--plain-credentials-file", str(path))
    assert code == 0, err
    assert plain_credentials.read(str(path)) == {}


def test_sasl_session_is_renewed_on_the_connection_before_it_ends(broker_factory, tmp_path):
    """KIP-368: the broker gives a session lifetime; a request after 85 % of it is preceded by SaslHandshake and
    SaslAuthenticate again on the same connection (the broker would close it otherwise)."""
    def slow_describe(req):
        time.sleep(0.25)
        return response("DescribeAcls")
    broker = broker_factory({"DescribeAcls": slow_describe},
                            sasl={"mechanism": "SCRAM-SHA-256", "users": {"admin": PASSWORD}, "session_ms": 200})
    path = tmp_path / "c.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                    f"sasl.username=admin\nsasl.password={PASSWORD}\n")
    code, _, err = trireme("acls", "list", "--bootstrap-server", broker.bootstrap, "--command-config", str(path),
                           "--principal", "User:a", "--principal", "User:b")
    assert code == 0, err
    sasl = ["SaslHandshake", "SaslAuthenticate", "SaslAuthenticate"]
    assert [api for api, *_ in broker.requests] == ["ApiVersions", *sasl, "DescribeAcls", *sasl, "DescribeAcls"]


def test_kafka_tool_command_lines_run_as_they_are(broker_factory):
    """kafka-acls.sh's --add/--list/--remove and kafka-configs.sh's --alter/--describe anywhere on the line."""
    results = message("CreateAclsResponse").cls.AclCreationResult
    broker = broker_factory({"CreateAcls": lambda req: response("CreateAcls", results=[results() for _ in
                                                                                     req.creations]),
                             "DescribeAcls": lambda req: response("DescribeAcls"),
                             "AlterClientQuotas": lambda req: response("AlterClientQuotas", entries=[]),
                             "DescribeClientQuotas": lambda req: response("DescribeClientQuotas", entries=[])})
    code, _, err = trireme("acls", "--bootstrap-server", broker.bootstrap, "--add", "--allow-principal", "User:Bob",
                           "--operation", "Read", "--topic", "Test-topic")
    assert code == 0, err
    assert [(c.principal, c.operation, c.resource_name) for c in broker.of("CreateAcls")[0].creations] == [
        ("User:Bob", Operation.READ, "Test-topic")]
    assert trireme("acls", "--bootstrap-server", broker.bootstrap, "--list", "--topic", "Test-topic")[0] == 0
    assert broker.of("DescribeAcls")[0].resource_name_filter == "Test-topic"
    code, _, err = trireme("quotas", "--bootstrap-server", broker.bootstrap, "--alter", "--add-config",
                           "producer_byte_rate=1024", "--entity-type", "users", "--entity-name", "alice")
    assert code == 0, err
    assert trireme("quotas", "--bootstrap-server", broker.bootstrap, "--describe", "--entity-type", "users")[0] == 0
    code, _, err = trireme("acls", "--bootstrap-server", broker.bootstrap, "--add", "--list", "--topic", "t")
    assert code == 2
