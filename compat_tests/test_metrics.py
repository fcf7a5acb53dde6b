"""The Prometheus endpoint reports what the broker did, read from a real server process."""
import re
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer


def _metrics_url(server) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r"metrics on (http://\S+/metrics)", server.stderr_path.read_text(errors="replace"))
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError("the server never logged its metrics address")


@pytest.mark.server_config({"trireme.metrics.listen": "127.0.0.1:0", "num.partitions": 2})
def test_metrics_endpoint_counts_requests_and_offsets(server):
    url = _metrics_url(server)
    producer = Producer({"bootstrap.servers": server.bootstrap, "log_level": 0})
    for i in range(10):
        producer.produce("metered", value=b"x", partition=i % 2)
    assert producer.flush(10) == 0
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    requests = dict(re.findall(r'trireme_requests_total\{api="(\w+)"\} (\d+)', text))
    assert int(requests["Produce"]) >= 1 and int(requests["Metadata"]) >= 1
    ends = {int(p): int(v) for p, v in
            re.findall(r'trireme_partition_high_watermark\{topic="metered",partition="(\d)"\} (\d+)', text)}
    assert ends == {0: 5, 1: 5}
    assert int(re.search(r"trireme_fsyncs_total (\d+)", text).group(1)) >= 1
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=5)
    assert err.value.code == 404
