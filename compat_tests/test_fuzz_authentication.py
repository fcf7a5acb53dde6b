"""The authentication fuzzer: mutated SaslHandshake / SaslAuthenticate frames, raw v0 tokens, truncated exchanges and
slow logins against a real broker on a SASL_PLAINTEXT and on a SASL_SSL listener (trustme certificates made for the
run) must not break it.  (Truncated TLS records themselves are compat_tests/test_tls.py's.)

Each attempt opens a connection and sends a valid frame of the authentication path (ApiVersions, SaslHandshake v0/1,
SaslAuthenticate v0-2 with PLAIN, SCRAM-SHA-512 and OAUTHBEARER tokens, raw v0 tokens, a SCRAM client final after a
real server first), often mutated (byte flips, truncations, extensions, wrong size prefixes, random mechanism names
and tokens), then reads until the broker answers, closes, or ATTEMPT_READ_S passes.  Meanwhile SLOW_LOGINS
connections hold half-sent frames and an authenticated bystander connection asks for Metadata every BYSTANDER_EVERY
attempts.  Afterwards:

- no traceback (or "internal error") in the broker's log;
- the bystander was answered each time within ANSWER_TIMEOUT_S;
- the broker's resident memory grew by less than MAX_RSS_GROWTH_MB;
- a fresh client logs in with each mechanism and is served.

TRIREME_FUZZ_AUTH_ATTEMPTS (default 500: a few seconds, in the normal suite) and TRIREME_FUZZ_SEED (default 20) set
the run; ``make fuzz-auth`` runs 20,000 attempts.  A failure names the seed.
"""
from __future__ import annotations

import base64
import collections
import json
import os
import random
import socket
import struct
import time

import pytest
import scramp

from compat_tests.sasl_support import Certificates, TlsRawConn, plain_login, sasl_server  # noqa: F401
from compat_tests.test_bad_input import Closed, RawConn, encode_request, req

ATTEMPTS = int(os.environ.get("TRIREME_FUZZ_AUTH_ATTEMPTS", "500"))
SEED = int(os.environ.get("TRIREME_FUZZ_SEED", "20"))
ATTEMPT_READ_S = 0.1
ANSWER_TIMEOUT_S = 10.0
SLOW_LOGINS = 20
BYSTANDER_EVERY = 50
MAX_RSS_GROWTH_MB = 100

pytestmark = pytest.mark.trireme_only("reads the broker's log and memory")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def oauth_token(rnd: random.Random) -> bytes:
    claims = rnd.choice([{"sub": "alice", "exp": time.time() + 60}, {"sub": "alice"}, {"exp": 1},
                         {"sub": ["x"] * 3, "exp": "soon"}, {"sub": "a" * 1000, "exp": 4e9, "scope": 5}])
    header = rnd.choice([{"alg": "none"}, {"alg": "RS256", "kid": "x"}, {}])
    jws = f"{b64(header)}.{b64(claims)}." + rnd.choice(["", "sig"])
    return f"n,{rnd.choice(['', 'a=alice', 'a=bob'])},\x01auth=Bearer {jws}\x01\x01".encode()


def mutate(rnd: random.Random, data: bytes) -> bytes:
    """One frame (size prefix included), maybe mutated."""
    kind = rnd.randrange(8)
    b = bytearray(data)
    if kind == 0 or len(b) < 8:
        return bytes(b)
    if kind == 1:                                   # byte flips after the size prefix
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(4, len(b))] = rnd.randrange(256)
    elif kind == 2:                                 # truncated body, prefix fixed up
        b = b[:rnd.randrange(4, len(b))]
        b[:4] = struct.pack(">i", len(b) - 4)
    elif kind == 3:                                 # random bytes appended, prefix fixed up
        b += rnd.randbytes(rnd.choice((1, 16, 700, 5000)))
        b[:4] = struct.pack(">i", len(b) - 4)
    elif kind == 4:                                 # a size prefix that lies
        b[:4] = struct.pack(">i", rnd.choice((-1, 0, 1, 3, len(b) + 100, 600_000, 2 ** 31 - 1)))
    elif kind == 5:                                 # the body cut off: a truncated exchange
        b = b[:rnd.randrange(1, len(b))]
    elif kind == 6:                                 # random body of the same size
        b[4:] = rnd.randbytes(len(b) - 4)
    else:                                           # the API key or version changed
        struct.pack_into(">hh", b, 4, rnd.choice((17, 36, 18, 3, 0, -1, 999)), rnd.randrange(-1, 6))
    return bytes(b)


class Fuzzer:
    def __init__(self, connect, rnd: random.Random):
        self.connect, self.rnd = connect, rnd        # connect() → a new RawConn to the SASL listener
        self.stats: collections.Counter = collections.Counter()

    def handshake(self, mechanism: str, version: int) -> bytes:
        return encode_request("SaslHandshake", version, req("SaslHandshake", mechanism=mechanism), 1)

    def authenticate(self, token: bytes, version: int | None = None) -> bytes:
        v = self.rnd.randrange(3) if version is None else version
        return encode_request("SaslAuthenticate", v, req("SaslAuthenticate", auth_bytes=token), 2)

    def token(self, mechanism: str) -> bytes:
        rnd = self.rnd
        if mechanism == "PLAIN":
            return rnd.choice([b"\0alice\0alice-secret", b"\0alice\0wrong", b"bob\0alice\0alice-secret", b"",
                               b"\0" * rnd.randrange(5), rnd.randbytes(rnd.randrange(64)), b"\0\xff\xfe\0x"])
        if mechanism == "OAUTHBEARER":
            return oauth_token(rnd) if rnd.random() < 0.7 else rnd.randbytes(rnd.randrange(100))
        user = rnd.choice(["alice", "nobody", "a=2Cb", "x" * 300])
        first = scramp.ScramClient([mechanism], user, "alice-secret").get_client_first()
        return rnd.choice([first.encode(), (first + ",tokenauth=true").encode(), b"n,,n=alice",
                           b"p=tls-unique,,n=alice,r=abc", rnd.randbytes(40)])

    def attempt(self, index: int) -> None:
        rnd = self.rnd
        mechanism = rnd.choice(["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI", "", "P" * 200,
                                rnd.randbytes(8).decode("latin-1")])
        version = rnd.randrange(2)
        plan = rnd.randrange(5)
        frames = []
        if plan == 0:                               # a mutated handshake (maybe after ApiVersions)
            if rnd.random() < 0.5:
                frames.append(encode_request("ApiVersions", 3, req("ApiVersions", client_software_name="fz",
                                                                   client_software_version="1"), 0))
            frames.append(mutate(rnd, self.handshake(mechanism, version)))
        elif plan == 1:                             # a valid handshake, then a mutated SaslAuthenticate
            mech = rnd.choice(["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"])
            frames += [self.handshake(mech, 1), mutate(rnd, self.authenticate(self.token(mech)))]
        elif plan == 2:                             # v0: raw tokens after the handshake
            mech = rnd.choice(["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"])
            token = self.token(mech)
            frames += [self.handshake(mech, 0), mutate(rnd, struct.pack(">i", len(token)) + token)]
        elif plan == 3:                             # a real SCRAM first round, then a mutated client final
            self.scram_final(rnd)
            return
        else:                                       # anything before authentication; pipelined rounds
            frames += [mutate(rnd, encode_request("Metadata", 12, req("Metadata", topics=[]), 5)),
                       self.handshake("PLAIN", 1), self.authenticate(self.token("PLAIN"), 2)]
            rnd.shuffle(frames)
        self.stats[f"plan {plan}"] += 1
        self.exchange(b"".join(frames))

    def scram_final(self, rnd: random.Random) -> None:
        self.stats["plan 3"] += 1
        client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", rnd.choice(["alice-secret", "nope"]))
        with self.connect() as conn:
            try:
                conn.request("SaslHandshake", 1, req("SaslHandshake", mechanism="SCRAM-SHA-512"))
                r = conn.request("SaslAuthenticate", 2, req("SaslAuthenticate",
                                                            auth_bytes=client.get_client_first().encode()))
                client.set_server_first(r.auth_bytes.decode())
                final = client.get_client_final().encode()
                if rnd.random() < 0.7:
                    final = bytearray(final)
                    final[rnd.randrange(len(final))] = rnd.randrange(256)
                conn.send(self.authenticate(bytes(final), 2))
                self.drain(conn)
            except Closed:
                self.stats["closed"] += 1

    def exchange(self, data: bytes) -> None:
        with self.connect() as conn:
            try:
                conn.send(data)
            except OSError:
                self.stats["send refused"] += 1
                return
            self.drain(conn)

    def drain(self, conn: RawConn) -> None:
        deadline = time.monotonic() + ATTEMPT_READ_S
        try:
            while time.monotonic() < deadline:
                conn.sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not conn.sock.recv(65536):
                    self.stats["closed"] += 1
                    return
        except socket.timeout:
            self.stats["left open"] += 1
        except OSError:
            self.stats["closed"] += 1


def slow_login(connect) -> RawConn:
    """A connection that begins a SaslAuthenticate frame and stops (a slow or stuck client)."""
    conn = connect()
    conn.send(encode_request("SaslHandshake", 1, req("SaslHandshake", mechanism="PLAIN"), 1))
    conn.send(struct.pack(">i", 4000) + b"\x00\x24\x00\x02")
    return conn


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_authentication_fuzz(sasl_server, tmp_path, protocol):
    props = {"connection.failed.authentication.delay.ms": 1,
             "trireme.sasl.failed.authentications.per.minute": 1_000_000,
             "sasl.server.max.receive.size": 65536}
    if protocol == "SASL_SSL":
        certs = Certificates(tmp_path / "certs")
        srv = sasl_server(**props, **certs.listener_config())
        context = certs.context()

        def connect():
            return TlsRawConn(srv.bootstrap_for("SASL_SSL"), context, timeout=ANSWER_TIMEOUT_S)
    else:
        srv = sasl_server(**props)

        def connect():
            return RawConn(srv.sasl_bootstrap, timeout=ANSWER_TIMEOUT_S)
    rnd = random.Random(SEED)
    bystander = connect()
    assert plain_login(bystander).error_code == 0
    slow = [slow_login(connect) for _ in range(SLOW_LOGINS)]
    rss_before = rss_mb(srv.proc.pid)
    fuzzer = Fuzzer(connect, rnd)
    try:
        for i in range(ATTEMPTS):
            fuzzer.attempt(i)
            if i % BYSTANDER_EVERY == 0:
                r = bystander.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False),
                                      timeout=ANSWER_TIMEOUT_S)
                assert r.brokers, f"seed {SEED}: the bystander was not served at attempt {i}"
        rss_after = rss_mb(srv.proc.pid)
    finally:
        for s in slow:
            s.close()
        bystander.close()
    print(f"{protocol} seed {SEED}, {ATTEMPTS} attempts: {dict(fuzzer.stats)}; RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    assert rss_after - rss_before < MAX_RSS_GROWTH_MB, f"seed {SEED}: RSS {rss_before:.0f} -> {rss_after:.0f} MiB"
    with connect() as conn:                         # not wedged: a fresh login is served
        assert plain_login(conn).error_code == 0
        assert conn.request("Metadata", 12, req("Metadata", topics=[], allow_auto_topic_creation=False)).brokers
    log = srv.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, f"seed {SEED}:\n{log[-4000:]}"
