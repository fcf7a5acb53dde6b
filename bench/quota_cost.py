"""What client quota enforcement adds to each request (server/quotas.py), timed in-process without a broker.

    .venv/bin/python bench/quota_cost.py [--requests 1000000]

Times the connection's hook (``if broker.quotas.enabled: broker.quotas.charge(...)``) for a small Produce answered
by the fast path: with no quota set anywhere, with quotas set for other clients only, and for a client with a
produce and a request quota it stays within (its sensors recorded and measured).  Nothing is asserted.
"""
from __future__ import annotations

import argparse
import timeit
import types

from trireme.server.dispatch import Encoded
from trireme.server.quotas import ClientQuotaManager
from trireme.state.client_quotas import ClientQuotas
from trireme.wire.small_produce import encode_small_produce_response


class _Metrics:
    def client_throttled(self, *args):
        pass

    def forget_throttled(self, *args):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    n = ap.parse_args().requests
    quotas = ClientQuotas()
    manager = ClientQuotaManager({"quota.window.num": 11, "quota.window.size.seconds": 1}, quotas, _Metrics())
    conn = types.SimpleNamespace(principal="User:ANONYMOUS", throttled_until=0.0,
                                 broker=types.SimpleNamespace(quotas=manager))
    answer = Encoded(encode_small_produce_response(9, "t", None, 0, 5, -1, 0))

    def hook():
        if conn.broker.quotas.enabled:
            return conn.broker.quotas.charge(conn, "Produce", 9, "app", 1000, 0.00001, answer)
        return answer

    def alter(pairs, ops):
        for key, value in quotas.alter([(pairs, ops)])[1]:
            quotas.replay(key, value)

    print(f"no quota set anywhere:              {timeit.timeit(hook, number=n) / n * 1e9:7.0f} ns/request")
    alter([("user", "someone-else")], [("producer_byte_rate", 1e6, False)])
    print(f"quotas set, none for this client:   {timeit.timeit(hook, number=n) / n * 1e9:7.0f} ns/request")
    alter([("client-id", None)], [("producer_byte_rate", 1e12, False), ("request_percentage", 1e6, False)])
    m = max(n // 5, 1)
    print(f"produce + request quotas, within:   {timeit.timeit(hook, number=m) / m * 1e9:7.0f} ns/request")


if __name__ == "__main__":
    main()
