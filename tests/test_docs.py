"""The docs that describe the protocol surface must match what the server declares."""
import pathlib
import re

from trireme.server.dispatch import HANDLERS, advertised_versions, implemented_versions

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def _protocol_table() -> dict[int, tuple]:
    rows = {}
    for line in (DOCS / "protocol.md").read_text().splitlines():
        m = re.match(r"\| (\w+) \| (\d+) \| (\d+)–(\d+) \| (\d+)–(\d+) \| (\d+)–(\d+) \| (\w+\.py) \|", line)
        if m:
            rows[int(m.group(2))] = (m.group(1), (int(m.group(3)), int(m.group(4))),
                                     (int(m.group(5)), int(m.group(6))), (int(m.group(7)), int(m.group(8))),
                                     m.group(9))
    return rows


def test_protocol_doc_lists_every_advertised_api_with_its_versions():
    table = _protocol_table()
    advertised = advertised_versions()
    served = implemented_versions()
    assert sorted(table) == sorted(advertised)
    for key, (name, adv, srv, definition, module) in table.items():
        handler = HANDLERS[key]
        assert name == handler.name
        assert adv == advertised[key]
        assert srv == served[key]
        assert definition == (handler.request.min_version, handler.request.max_version)
        assert module == handler.fn.__module__.rsplit(".", 1)[-1] + ".py"
