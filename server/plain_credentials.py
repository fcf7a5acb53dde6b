"""The PLAIN credentials file (``trireme.sasl.plain.credentials.file``): salted PBKDF2 hashes of passwords, never the
passwords, one user a line, and the function that writes its entries.

A line is ``NAME:pbkdf2-sha512:ITERATIONS:SALT:HASH`` (salt and hash in base64; the name is everything before the last
four colons, so it may hold colons itself); ``#`` starts a comment line.  PBKDF2-HMAC-SHA512 from the standard
library's hashlib (OpenSSL): present on every Python, FIPS-approved, the primitive SCRAM itself uses, and with a small
constant memory per check (scrypt at safe settings takes 16 MiB or more per check, which concurrent failed logins
would multiply).  Checking costs ~0.1-0.3 s of CPU by design, so logins check in a worker thread (at most
CHECK_THREADS at once), never on the event loop.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import tempfile

SCHEME = "pbkdf2-sha512"
DEFAULT_ITERATIONS = 210_000            # OWASP's 2023 figure for PBKDF2-HMAC-SHA512
MIN_ITERATIONS = 10_000
MAX_ITERATIONS = 10_000_000             # a line asking for more is refused (a check must end)
MAX_FILE_BYTES = 16 << 20
MAX_NAME_BYTES = 1024
SALT_BYTES = 16


class CredentialsError(ValueError):
    """A credentials file line or an entry to write that is not valid."""


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """The stored form of ``password``: ``pbkdf2-sha512:ITERATIONS:SALT:HASH``."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise CredentialsError(f"iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}, not {iterations}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return f"{SCHEME}:{iterations}:{base64.b64encode(salt).decode()}:{base64.b64encode(digest).decode()}"


def verify(stored: str, password: str) -> bool:
    """Whether ``password`` matches ``stored`` (hash_password's form); CPU-heavy: call from a worker thread."""
    scheme, iterations, salt, digest = _parse_hash(stored)
    got = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return hmac.compare_digest(got, digest)


def _parse_hash(stored: str) -> tuple[str, int, bytes, bytes]:
    parts = stored.split(":")
    if len(parts) != 4 or parts[0] != SCHEME:
        raise CredentialsError(f"expected {SCHEME}:ITERATIONS:SALT:HASH")
    try:
        iterations = int(parts[1])
        salt = base64.b64decode(parts[2], validate=True)
        digest = base64.b64decode(parts[3], validate=True)
    except ValueError:
        raise CredentialsError("bad iterations, salt or hash") from None
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS or not salt or len(digest) != 64:
        raise CredentialsError("iterations out of range, empty salt or a hash that is not 64 bytes")
    return parts[0], iterations, salt, digest


def parse(text: str) -> dict[str, str]:
    """User name → stored hash of a credentials file's text (CredentialsError naming the line)."""
    users = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, stored = _split_line(line)
        try:
            _parse_hash(stored)
        except CredentialsError as e:
            raise CredentialsError(f"line {number}: {e}") from None
        if not name:
            raise CredentialsError(f"line {number}: empty user name")
        users[name] = stored
    return users


def _split_line(line: str) -> tuple[str, str, str]:
    parts = line.rsplit(":", 4)
    if len(parts) != 5:
        return "", "", ""
    return parts[0], "", ":".join(parts[1:])


def read(path: str) -> dict[str, str]:
    with open(path, "rb") as f:
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise CredentialsError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        return parse(raw.decode("utf-8"))
    except (UnicodeDecodeError, CredentialsError) as e:
        raise CredentialsError(f"{path}: {e}") from None


def set_user(path: str, name: str, password: str | None, iterations: int = DEFAULT_ITERATIONS) -> None:
    """Add or replace (``password`` given) or remove (``password`` None) user ``name`` in the credentials file at
    ``path``: written to a temporary file in the same directory (mode 0600) and renamed over it, so a broker reading
    it meanwhile sees the old or the new file whole.  What the admin CLI (``trireme users``) calls."""
    if not name or "\n" in name or "\r" in name or "\0" in name or len(name.encode()) > MAX_NAME_BYTES:
        raise CredentialsError("a user name must be 1 to 1024 bytes without NUL or line breaks")
    if password is not None and not password:
        raise CredentialsError("empty password")
    users = read(path) if os.path.exists(path) else {}
    if password is None:
        users.pop(name, None)
    else:
        users[name] = hash_password(password, iterations)
    text = "# Trireme PLAIN credentials: NAME:pbkdf2-sha512:ITERATIONS:SALT:HASH (see docs/security.md)\n" + \
        "".join(f"{n}:{stored}\n" for n, stored in users.items())
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".credentials-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def decoy_hash(users: dict[str, str]) -> str:
    """A stored hash no password matches, costing what checking a user of ``users`` costs: the file's most common
    iterations (DEFAULT_ITERATIONS for an empty file), a random salt and digest (so making it costs no PBKDF2)."""
    counts: dict[int, int] = {}
    for stored in users.values():
        iterations = _parse_hash(stored)[1]
        counts[iterations] = counts.get(iterations, 0) + 1
    iterations = max(counts, key=lambda i: (counts[i], i)) if counts else DEFAULT_ITERATIONS
    return (f"{SCHEME}:{iterations}:{base64.b64encode(secrets.token_bytes(SALT_BYTES)).decode()}:"
            f"{base64.b64encode(secrets.token_bytes(64)).decode()}")


class CredentialsFile:
    """The file's users, read again when its modification time or size changes."""

    def __init__(self, path: str):
        self.path = path
        self._stamp = None
        self._users: dict[str, str] = {}
        self._decoy = ""

    def lookup(self, name: str) -> str | None:
        """The stored hash of ``name`` (None: no such user).  OSError/CredentialsError when the file is unreadable."""
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._users = read(self.path)
            self._decoy = decoy_hash(self._users)
            self._stamp = stamp
        return self._users.get(name)

    def decoy(self) -> str:
        """What an unknown user's password is checked against (after a lookup): as costly as a known user's check,
        so the answer's time does not tell which names exist."""
        return self._decoy or decoy_hash(self._users)
