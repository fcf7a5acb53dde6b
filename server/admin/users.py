"""``trireme users``: list, add and delete SCRAM users (DescribeUserScramCredentials, AlterUserScramCredentials), kafka-configs.sh's job for ``--entity-type users`` SCRAM credentials.

  trireme users list [--user NAME ...]
  trireme users add --user NAME [--mechanism SCRAM-SHA-512|SCRAM-SHA-256 ...] [--iterations N] [--password-stdin]
  trireme users delete --user NAME ... [--mechanism M ...]

``add`` creates the user's credential for each mechanism (SCRAM-SHA-512 when none is named), or
replaces it (a new password).  The password is read from a prompt that does not echo it (asked
twice), or with ``--password-stdin`` from the first line of standard input; it is never taken from
the command line (which lands in shell history and ``ps``) and never printed.  As Kafka's admin
client does, the tool salts it here and sends only the salt, the iteration count and the salted
password (RFC 5802's ``Hi(password, salt, i)``: PBKDF2-HMAC with the mechanism's hash), not the
password.  ``delete`` without --mechanism deletes every mechanism the user has.

With ``--plain-credentials-file FILE`` the three commands act on PLAIN users in that file instead
(``trireme.sasl.plain.credentials.file``: salted PBKDF2-HMAC-SHA512 hashes, written atomically with
mode 0600, read again by the broker when it changes); no broker is contacted.
"""
from __future__ import annotations

import argparse
import getpass
import hashlib
import secrets
import sys

from trireme.wire import error_codes as E

from .client import AdminError, Client, check, request_class
from .commands import subcommands
from .output import Report, Table

HELP = "list, add and delete SCRAM users (kafka-configs.sh --entity-type users)"
# Kafka's ScramMechanism: type code on the wire, hash, and the iteration bounds its brokers accept.
MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
MECHANISM_NAMES = {code: name for name, (code, _) in MECHANISMS.items()}
MIN_ITERATIONS, MAX_ITERATIONS, DEFAULT_ITERATIONS = 4096, 16384, 4096
SALT_BYTES = 32
MAX_PASSWORD_BYTES = 1024


def add_arguments(parser: argparse.ArgumentParser, nested) -> None:
    command = subcommands(parser, nested)

    p = command("list", _list, "the SCRAM users and their mechanisms and iterations")
    p.add_argument("--user", action="append", default=[], help="only this user (repeatable)")
    _plain_argument(p)
    p = command("add", _add, "create a user's SCRAM credential, or change its password")
    p.set_defaults(prepare=_prepare_add)
    p.add_argument("--user", required=True)
    _mechanism_argument(p)
    p.add_argument("--iterations", type=int, default=None,
                   help=f"PBKDF2 iterations, {MIN_ITERATIONS}-{MAX_ITERATIONS} for SCRAM (default {DEFAULT_ITERATIONS})")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of standard input instead of a prompt")
    _plain_argument(p)
    p = command("delete", _delete, "delete a user's SCRAM credentials")
    p.add_argument("--user", action="append", required=True, help="user name (repeatable)")
    _mechanism_argument(p)
    _plain_argument(p)


def _plain_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plain-credentials-file", metavar="FILE",
                   help="instead of the broker's SCRAM users: the PLAIN users in this file of salted hashes "
                        "(trireme.sasl.plain.credentials.file), changed here; no broker is contacted")


def _mechanism_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mechanism", action="append", default=[], choices=sorted(MECHANISMS),
                   help="SCRAM-SHA-256 or SCRAM-SHA-512 (repeatable)")


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's SaltedPassword = Hi(password, salt, i): PBKDF2 with HMAC over the mechanism's hash, as Kafka's
    ScramFormatter computes it (the password as UTF-8, no SASLprep)."""
    return hashlib.pbkdf2_hmac(MECHANISMS[mechanism][1], password.encode("utf-8"), salt, iterations)


def read_password(from_stdin: bool, user: str) -> str:
    """The new password: a line of stdin, or typed twice at a prompt that does not echo it."""
    if from_stdin:
        line = sys.stdin.readline(MAX_PASSWORD_BYTES + 2)
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    else:
        try:
            password = getpass.getpass(f"Password for {user}: ")
            if getpass.getpass(f"Password for {user} again: ") != password:
                raise AdminError("the passwords typed differ")
        except (EOFError, KeyboardInterrupt):
            raise AdminError("no password given") from None
    if not password:
        raise AdminError("the password is empty")
    if len(password.encode("utf-8")) > MAX_PASSWORD_BYTES:
        raise AdminError(f"the password is longer than {MAX_PASSWORD_BYTES} bytes")
    return password


def _describe(client: Client, users: list[str] | None):
    cls = request_class("DescribeUserScramCredentials")
    response = client.call("DescribeUserScramCredentials",
                           cls(users=None if users is None else [cls.UserName(name=u) for u in users]), (0, 0))
    check(response.error_code, "describing SCRAM users", response.error_message)
    return response.results


# --- actions ----------------------------------------------------------------------------------

def runs_locally(args) -> bool:
    """Whether the command changes a local PLAIN credentials file instead of talking to a broker."""
    return bool(getattr(args, "plain_credentials_file", None))


def plain(args) -> Report:
    """list/add/delete on a PLAIN credentials file (server/plain_credentials.py writes it atomically, mode 0600)."""
    from trireme.server import plain_credentials
    path = args.plain_credentials_file
    if getattr(args, "mechanism", None):
        raise AdminError("--mechanism is for SCRAM users; a credentials file holds PLAIN users")
    try:
        if args.subcommand == "list":
            users = plain_credentials.read(path)
            rows = [(name, "PLAIN", int(stored.split(":")[1])) for name, stored in sorted(users.items())
                    if not args.user or name in args.user]
            return Report([Table(("USER", "MECHANISM", "ITERATIONS"), rows)])
        if args.subcommand == "add":
            iterations = plain_credentials.DEFAULT_ITERATIONS if args.iterations is None else args.iterations
            if not plain_credentials.MIN_ITERATIONS <= iterations <= plain_credentials.MAX_ITERATIONS:
                raise AdminError(f"--iterations must be between {plain_credentials.MIN_ITERATIONS} and "
                                 f"{plain_credentials.MAX_ITERATIONS} for a PLAIN credentials file")
            plain_credentials.set_user(path, args.user, read_password(args.password_stdin, args.user), iterations)
            table = Table(("USER", "MECHANISM", "ITERATIONS"), [(args.user, "PLAIN", iterations)])
            return Report([table], notes=[f"Set the PLAIN password of user {args.user} in {path}:"],
                          data={"set": table.records()})
        existing = plain_credentials.read(path)
        missing = [u for u in args.user if u not in existing]
        if missing:
            raise AdminError(f"{path} has no user {', '.join(repr(u) for u in missing)}")
        for user in dict.fromkeys(args.user):
            plain_credentials.set_user(path, user, None)
        table = Table(("USER", "MECHANISM"), [(u, "PLAIN") for u in dict.fromkeys(args.user)])
        return Report([table], notes=[f"Deleted from {path}:"], data={"deleted": table.records()})
    except plain_credentials.CredentialsError as e:
        raise AdminError(f"{path}: {e}") from None
    except OSError as e:
        raise AdminError(f"{path}: {e.strerror or e}") from None


def _list(client: Client, args) -> Report:
    rows, warnings = [], []
    for result in _describe(client, args.user or None):
        if result.error_code == E.RESOURCE_NOT_FOUND.code:
            warnings.append(f"user {result.user!r} has no SCRAM credentials")
            continue
        check(result.error_code, f"describing user {result.user!r}", result.error_message)
        rows += [(result.user, MECHANISM_NAMES.get(c.mechanism, f"UNKNOWN({c.mechanism})"), c.iterations)
                 for c in result.credential_infos]
    return Report([Table(("USER", "MECHANISM", "ITERATIONS"), sorted(rows))], warnings=warnings)


def _alter(client: Client, what: str, deletions=(), upsertions=()) -> None:
    cls = request_class("AlterUserScramCredentials")
    response = client.call("AlterUserScramCredentials",
                           cls(deletions=list(deletions), upsertions=list(upsertions)), (0, 0))
    for result in response.results:
        check(result.error_code, f"{what} user {result.user!r}", result.error_message)


def _prepare_add(args) -> None:
    """Before connecting: check the options, read the password and salt it (the password is kept no longer)."""
    if not args.user:
        raise AdminError("the user name is empty")
    if args.plain_credentials_file:
        return                                      # _plain_add asks for the password
    args.iterations = DEFAULT_ITERATIONS if args.iterations is None else args.iterations
    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise AdminError(f"--iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, as Kafka requires")
    password = read_password(args.password_stdin, args.user)
    cls = request_class("AlterUserScramCredentials").ScramCredentialUpsertion
    args.upsertions = []
    for mechanism in sorted(set(args.mechanism)) or ["SCRAM-SHA-512"]:
        salt = secrets.token_bytes(SALT_BYTES)
        args.upsertions.append(cls(name=args.user, mechanism=MECHANISMS[mechanism][0], iterations=args.iterations,
                                   salt=salt, salted_password=salted_password(mechanism, password, salt,
                                                                              args.iterations)))


def _add(client: Client, args) -> Report:
    upsertions = args.upsertions
    mechanisms = [MECHANISM_NAMES[u.mechanism] for u in upsertions]
    for upsertion in upsertions:           # one request each: a user is named once per request (DUPLICATE_RESOURCE)
        _alter(client, "setting the SCRAM credentials of", upsertions=[upsertion])
    rows = [(args.user, m, args.iterations) for m in mechanisms]
    table = Table(("USER", "MECHANISM", "ITERATIONS"), rows)
    return Report([table], notes=[f"Set the SCRAM credentials of user {args.user}:"], data={"set": table.records()})


def _delete(client: Client, args) -> Report:
    users = list(dict.fromkeys(args.user))
    if args.mechanism:
        pairs = [(u, m) for u in users for m in sorted(set(args.mechanism))]
    else:
        pairs = []
        for result in _describe(client, users):
            check(result.error_code, f"describing user {result.user!r}", result.error_message)
            pairs += [(result.user, MECHANISM_NAMES[c.mechanism]) for c in result.credential_infos
                      if c.mechanism in MECHANISM_NAMES]
    cls = request_class("AlterUserScramCredentials").ScramCredentialDeletion
    for mechanism in sorted({m for _, m in pairs}):     # each user once per request (DUPLICATE_RESOURCE otherwise)
        _alter(client, "deleting the SCRAM credentials of",
               deletions=[cls(name=u, mechanism=MECHANISMS[m][0]) for u, m in pairs if m == mechanism])
    table = Table(("USER", "MECHANISM"), pairs)
    return Report([table], notes=[f"Deleted {len(pairs)} SCRAM credential{'s' if len(pairs) != 1 else ''}:"],
                  data={"deleted": table.records()})
