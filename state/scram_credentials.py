"""SCRAM credentials (RFC 5802/7677): what the server keeps per user and mechanism, their records in ``__cluster_metadata``, and Kafka's rules for changing them.

A credential is (salt, StoredKey, ServerKey, iterations), never the password: Kafka's admin clients
send the salt and the salted password (AlterUserScramCredentials), and the broker derives StoredKey =
H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key") as Kafka's
ScramFormatter does.  :class:`ScramCredential` is the tuple scramp's server side takes from its
``auth_fn``.  :class:`ScramCredentials` is the SCRAM section of the cluster metadata coordinator
(state/cluster_metadata.py); :func:`parse_add_scram` reads Kafka's storage-tool ``--add-scram``
argument (``trireme.storage.add.scram``).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import NamedTuple

from trireme.wire.codec import message

from .cluster_metadata import (USER_SCRAM_CREDENTIAL, MetadataRecordError, decode_key, decode_value, encode_key,
                               encode_value)

SCRAM_SHA_256, SCRAM_SHA_512 = 1, 2
# Kafka's ScramMechanism type codes → (mechanism name, hash)
MECHANISMS = {SCRAM_SHA_256: ("SCRAM-SHA-256", "sha256"), SCRAM_SHA_512: ("SCRAM-SHA-512", "sha512")}
MECHANISM_CODES = {name: code for code, (name, _) in MECHANISMS.items()}
MIN_ITERATIONS = 4096            # Kafka's ScramMechanism.minIterations (both mechanisms)
MAX_ITERATIONS = 16384           # Kafka's ScramControlManager.MAX_ITERATIONS
DEFAULT_ITERATIONS = 4096        # kafka-storage --add-scram without iterations
# Our bounds (Kafka has none): credentials kept, and bytes of a salt or salted password.
MAX_CREDENTIALS = 100_000
MAX_SALT_BYTES = 1024


class ScramCredential(NamedTuple):
    """One user's credential for one mechanism, in the order scramp's ``auth_fn`` returns it."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def mechanism_code(mechanism: str | int) -> int | None:
    """Kafka's code of a mechanism given by name or code; None for one it does not know."""
    if isinstance(mechanism, int):
        return mechanism if mechanism in MECHANISMS else None
    return MECHANISM_CODES.get(mechanism.upper())


def salted_password(mechanism: int, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's Hi(Normalize(password), salt, i): PBKDF2 with the mechanism's HMAC (Kafka does not SASLprep)."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism][1], password.encode("utf-8"), salt, iterations)


def credential(mechanism: int, salt: bytes, salted: bytes, iterations: int) -> ScramCredential:
    """The stored credential for a salted password (Kafka's ScramFormatter storedKey/serverKey)."""
    digest = MECHANISMS[mechanism][1]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return ScramCredential(bytes(salt), hashlib.new(digest, client_key).digest(),
                           hmac.new(salted, b"Server Key", digest).digest(), iterations)


# --- records ---------------------------------------------------------------------------------

def scram_key(user: str, mechanism: int) -> bytes:
    return encode_key(USER_SCRAM_CREDENTIAL, "UserScramCredentialKey",
                      message("UserScramCredentialKey").cls(name=user, mechanism=mechanism))


def scram_record(user: str, mechanism: int, c: ScramCredential) -> tuple[bytes, bytes]:
    value = message("UserScramCredentialValue").cls(salt=c.salt, stored_key=c.stored_key, server_key=c.server_key,
                                                   iterations=c.iterations)
    return scram_key(user, mechanism), encode_value("UserScramCredentialValue", value)


def scram_tombstone(user: str, mechanism: int) -> tuple[bytes, None]:
    return scram_key(user, mechanism), None


# --- the section -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class UserResult:
    """One user's answer to AlterUserScramCredentials / DescribeUserScramCredentials."""

    user: str
    error: str | None = None            # Kafka's error name (wire.error_codes), None for success
    message: str | None = None
    credentials: tuple[tuple[int, int], ...] = ()       # describe: (mechanism, iterations)


class ScramCredentials:
    """The SCRAM section: (user, mechanism) → :class:`ScramCredential`, replayed from ``__cluster_metadata``."""

    record_types = (USER_SCRAM_CREDENTIAL,)

    def __init__(self, max_credentials: int = MAX_CREDENTIALS):
        self.max_credentials = max_credentials
        self._credentials: dict[tuple[str, int], ScramCredential] = {}

    def __len__(self) -> int:
        return len(self._credentials)

    def get(self, user: str, mechanism: str | int) -> ScramCredential | None:
        code = mechanism_code(mechanism)
        return None if code is None else self._credentials.get((user, code))

    def users(self) -> list[str]:
        return list(dict.fromkeys(user for user, _ in self._credentials))

    def replay(self, key: bytes, value: bytes | None) -> None:
        k = decode_key(key, "UserScramCredentialKey")
        if k.mechanism not in MECHANISMS:
            raise MetadataRecordError(f"SCRAM record for unknown mechanism {k.mechanism}")
        if value is None:
            self._credentials.pop((k.name, k.mechanism), None)
            return
        v = decode_value(value, "UserScramCredentialValue")
        self._credentials[(k.name, k.mechanism)] = ScramCredential(bytes(v.salt), bytes(v.stored_key),
                                                                   bytes(v.server_key), v.iterations)

    def live_records(self) -> list[tuple[bytes, bytes]]:
        return [scram_record(user, mech, c) for (user, mech), c in self._credentials.items()]

    # --- AlterUserScramCredentials ------------------------------------------------------------

    def alter(self, deletions: list[tuple[str, int]],
              upsertions: list[tuple[str, int, int, bytes, bytes]]) -> tuple[list, list[UserResult]]:
        """Kafka's ScramControlManager.alterCredentials: ``deletions`` (user, mechanism) and ``upsertions``
        (user, mechanism, iterations, salt, salted password) → (records, one result per user).  A user named
        twice in the request (whatever the mechanisms) gets DUPLICATE_RESOURCE and nothing of theirs changes;
        results come in the order users first appear."""
        order: list[str] = []
        errors: dict[str, tuple[str, str]] = {}
        chosen: dict[str, tuple] = {}
        for kind, items in (("delete", deletions), ("upsert", upsertions)):
            for item in items:
                user = item[0]
                if user not in order:
                    order.append(user)
                if user in errors:
                    continue
                if user in chosen:
                    del chosen[user]
                    errors[user] = ("DUPLICATE_RESOURCE", "A user credential cannot be altered twice in the same "
                                                          "request")
                    continue
                problem = self._deletion_error(*item) if kind == "delete" else self._upsertion_error(*item)
                if problem is not None:
                    errors[user] = problem
                else:
                    chosen[user] = (kind, item)
        records, results = [], []
        new = {(u, item[1]) for u, (kind, item) in chosen.items() if kind == "upsert"} - set(self._credentials)
        gone = {(u, item[1]) for u, (kind, item) in chosen.items() if kind == "delete"}
        too_many = len(self._credentials) - len(gone) + len(new) > self.max_credentials
        for user in order:
            if user in errors:
                results.append(UserResult(user, *errors[user]))
                continue
            kind, item = chosen[user]
            if kind == "delete":
                records.append(scram_tombstone(user, item[1]))
            elif too_many and (user, item[1]) in new:
                results.append(UserResult(user, "UNACCEPTABLE_CREDENTIAL",
                                          f"this broker keeps at most {self.max_credentials} SCRAM credentials"))
                continue
            else:
                _, mech, iterations, salt, salted = item
                records.append(scram_record(user, mech, credential(mech, salt, salted, iterations)))
            results.append(UserResult(user))
        return records, results

    @staticmethod
    def _name_error(user: str, mechanism: int) -> tuple[str, str] | None:
        if not user:
            return "UNACCEPTABLE_CREDENTIAL", "Username must not be empty"
        if mechanism not in MECHANISMS:
            return "UNSUPPORTED_SASL_MECHANISM", "Unknown SCRAM mechanism"
        return None

    def _deletion_error(self, user: str, mechanism: int) -> tuple[str, str] | None:
        problem = self._name_error(user, mechanism)
        if problem is None and (user, mechanism) not in self._credentials:
            return "RESOURCE_NOT_FOUND", "Attempt to delete a user credential that does not exist"
        return problem

    def _upsertion_error(self, user: str, mechanism: int, iterations: int, salt: bytes,
                         salted: bytes) -> tuple[str, str] | None:
        problem = self._name_error(user, mechanism)
        if problem is not None:
            return problem
        if iterations < MIN_ITERATIONS:
            return "UNACCEPTABLE_CREDENTIAL", "Too few iterations"
        if iterations > MAX_ITERATIONS:
            return "UNACCEPTABLE_CREDENTIAL", "Too many iterations"
        if len(salt) > MAX_SALT_BYTES or len(salted) > MAX_SALT_BYTES:
            return "UNACCEPTABLE_CREDENTIAL", f"salt and salted password are at most {MAX_SALT_BYTES} bytes here"
        return None

    # --- DescribeUserScramCredentials ---------------------------------------------------------

    def describe(self, users: list[str] | None) -> list[UserResult]:
        """Kafka's ScramImage.describe: every user with credentials when ``users`` is empty or None, else each
        named user once (RESOURCE_NOT_FOUND without credentials, DUPLICATE_RESOURCE when named twice).  Only
        mechanisms and iterations are told, never salts or keys."""
        if not users:
            names = self.users()
            twice: set[str] = set()
        else:
            names = list(dict.fromkeys(users))
            twice = {u for u in names if users.count(u) > 1} if len(names) < len(users) else set()
        out = []
        for user in names:
            if user in twice:
                out.append(UserResult(user, "DUPLICATE_RESOURCE", "Cannot describe SCRAM credentials for the same "
                                                                  f"user twice in a single request: {user}"))
                continue
            found = tuple((mech, c.iterations) for (u, mech), c in sorted(self._credentials.items(),
                                                                          key=lambda kv: kv[0][1]) if u == user)
            if found:
                out.append(UserResult(user, credentials=found))
            else:
                out.append(UserResult(user, "RESOURCE_NOT_FOUND",
                                      f"Attempt to describe a user credential that does not exist: {user}"))
        return out


# --- kafka-storage format --add-scram ----------------------------------------------------------

class AddScramError(ValueError):
    """A ``trireme.storage.add.scram`` entry that cannot be read (the message never holds a password)."""


@dataclass(frozen=True, slots=True)
class AddScram:
    """One ``--add-scram`` entry: salt None means a random one; password or salted password, never both."""

    mechanism: int
    user: str
    iterations: int
    salt: bytes | None = None
    password: str | None = None
    salted_password: bytes | None = None

    def __repr__(self) -> str:          # never show the secret
        return f"AddScram({MECHANISMS[self.mechanism][0]}, name={self.user!r}, iterations={self.iterations})"

    def record(self, random_salt: bytes) -> tuple[bytes, bytes]:
        """The credential record (``random_salt`` used when the entry gives none)."""
        salt = self.salt if self.salt is not None else random_salt
        salted = self.salted_password if self.salted_password is not None else \
            salted_password(self.mechanism, self.password, salt, self.iterations)
        return scram_record(self.user, self.mechanism, credential(self.mechanism, salt, salted, self.iterations))


_ENTRY_END = re.compile(r"(?<=\])\s*;")


def parse_add_scram(text: str) -> list[AddScram]:
    """Kafka's kafka-storage ``--add-scram`` arguments, several separated by ``;``:
    ``MECHANISM=[name=N,password=P]`` or ``MECHANISM=[name=N,salt=B64,saltedpassword=B64]``, each with an
    optional ``iterations=`` (4096..16384, default 4096) and, with a password, an optional ``salt=``; a value may
    be in double quotes; components are separated by commas (so a password holds neither ``,`` nor ``];``)."""
    out = []
    for raw in _ENTRY_END.split(text.strip()):
        entry = raw.strip()
        if not entry:
            continue
        mechanism_name, sep, config = entry.partition("=")
        if not sep:
            raise AddScramError("an entry has no '=' after its mechanism")
        mechanism = MECHANISM_CODES.get(mechanism_name.strip())
        if mechanism is None:
            raise AddScramError(f"the add-scram mechanism {mechanism_name.strip()!r} is not supported "
                                f"(SCRAM-SHA-256 or SCRAM-SHA-512)")
        config = config.strip()
        if not config.startswith("[") or not config.endswith("]"):
            raise AddScramError(f"{mechanism_name.strip()}: expected the configuration in [ ]")
        components: dict[str, str] = {}
        for part in config[1:-1].split(","):
            key, eq, value = part.partition("=")
            if not eq:
                raise AddScramError(f"{mechanism_name.strip()}: a component has no '='")     # not shown: a secret?
            if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
                value = value[1:-1]
            components[key.strip()] = value
        user = components.pop("name", None)
        if user is None:
            raise AddScramError("you must supply 'name' to add-scram")
        salt = _b64(components.pop("salt", None), "salt", user)
        iterations_text = components.pop("iterations", None)
        try:
            iterations = DEFAULT_ITERATIONS if iterations_text is None else int(iterations_text)
        except ValueError:
            raise AddScramError(f"user {user}: cannot parse the iterations count {iterations_text!r}") from None
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AddScramError(f"user {user}: 'iterations' must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}")
        password = components.pop("password", None)
        salted = components.pop("saltedpassword", None)
        if components:
            raise AddScramError(f"user {user}: unknown SCRAM configurations: {', '.join(sorted(components))}")
        if password is None:
            if salted is None:
                raise AddScramError(f"user {user}: you must supply one of 'password' or 'saltedpassword'")
            if salt is None:
                raise AddScramError(f"user {user}: you must supply 'salt' with 'saltedpassword'")
            out.append(AddScram(mechanism, user, iterations, salt, None, _b64(salted, "saltedpassword", user)))
        else:
            out.append(AddScram(mechanism, user, iterations, salt, password, None))
    return out


def _b64(text: str | None, what: str, user: str) -> bytes | None:
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AddScramError(f"user {user}: cannot decode the {what} (base64)") from None
