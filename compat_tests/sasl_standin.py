"""`trireme serve` with every connection on a SASL_PLAINTEXT listener and SCRAM credentials set in-process: the SASL
tests' stand-in until the tls engineer's listeners (``listeners=SASL_PLAINTEXT://...``) and the acls engineer's
stored SCRAM credentials are on main.  Run as ``python compat_tests/sasl_standin.py serve ...`` with
TRIREME_TEST_SCRAM_USERS='{"user": "password"}' in the environment."""
from __future__ import annotations

import json
import os
import sys
import types

import scramp

from trireme.server import authentication, security
from trireme.server.cli import main

_LISTENER = authentication.ListenerStandIn("SASL_PLAINTEXT", "SASL_PLAINTEXT")
# Every connection authenticates as one on a SASL_PLAINTEXT listener (conn.listener itself is left alone).
authentication.for_connection = lambda conn: authentication.Authenticator(conn, authentication.service(conn.broker),
                                                                          _LISTENER)
_CREDENTIALS = {}
for _user, _password in json.loads(os.environ.get("TRIREME_TEST_SCRAM_USERS", "{}")).items():
    for _mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        _salt, _stored, _server, _i = scramp.ScramMechanism(_mechanism).make_auth_info(_password, iteration_count=4096)
        _CREDENTIALS[(_user, _mechanism)] = types.SimpleNamespace(salt=_salt, stored_key=_stored, server_key=_server,
                                                                  iterations=_i)
security.Security.scram_credential = lambda self, user, mechanism: _CREDENTIALS.get((user, mechanism))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
