"""The broker's configuration: Kafka property names from TOML or server.properties, flags on top."""
import os
import subprocess
import sys

import pytest

from trireme.server.cli import build_parser, load_config
from trireme.server.config import PROPERTIES, ConfigError, parse_properties


def _config(tmp_path, *argv):
    return load_config(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), *argv]))


def test_defaults_are_kafkas(tmp_path):
    config = _config(tmp_path)
    assert config["num.partitions"] == 1
    assert config["auto.create.topics.enable"] is True
    assert config["log.retention.ms"] == 604800000
    assert config["socket.request.max.bytes"] == 104857600
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 9092)


def test_toml_file_with_quoted_keys(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('"num.partitions" = 6\n"auto.create.topics.enable" = false\n"log.retention.ms" = 1000\n')
    config = _config(tmp_path, "--config", str(path))
    assert config["num.partitions"] == 6
    assert config["auto.create.topics.enable"] is False
    assert config["log.retention.ms"] == 1000


def test_properties_file_and_flags_override(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("# comment\nnum.partitions=4\n! also a comment\nlog.segment.bytes : 4096\n"
                    "auto.create.topics.enable=false\n")
    config = _config(tmp_path, "--config", str(path), "--set", "num.partitions=8", "--listen", "0.0.0.0:0",
                     "--advertised", "broker.example:19092")
    assert config["num.partitions"] == 8
    assert config["log.segment.bytes"] == 4096
    assert config["auto.create.topics.enable"] is False
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 0)
    assert (config.advertised_host, config.advertised_port) == ("broker.example", 19092)


def test_bad_values_are_refused(tmp_path):
    with pytest.raises(ConfigError):
        _config(tmp_path, "--set", "num.partitions=many")
    with pytest.raises(ConfigError):
        _config(tmp_path, "--set", "auto.create.topics.enable=maybe")
    with pytest.raises(ConfigError):
        _config(tmp_path, "--set", "no.such.property=1")
    with pytest.raises(ConfigError):
        _config(tmp_path, "--listen", "nohostport")


def test_parse_properties():
    assert parse_properties("a=1\nb : two\n#c=3\n  d= x=y \n") == {"a": "1", "b": "two", "d": "x=y"}


def test_help_lists_every_property_with_its_default():
    out = subprocess.run([sys.executable, "-m", "trireme", "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    flat = " ".join(out.split())                  # a long default wraps onto the next line
    for name, (default, _) in PROPERTIES.items():
        if isinstance(default, bool):
            shown = str(default).lower()
        elif default is None or default == (1 << 63) - 1:
            shown = "unset"                       # not "None" or 9223372036854775807
        else:
            shown = str(default) if default != "" else "empty"
        assert f"{name} (default {shown})" in flat
    assert "9223372036854775807" not in out and "(default None)" not in out
    for flag in ("--data-dir", "--listen", "--advertised", "--config", "--set", "--topic"):
        assert flag in out


def test_help_lines_fit_a_terminal():
    out = subprocess.run([sys.executable, "-m", "trireme", "serve", "--help"], capture_output=True, text=True,
                         check=True, env={**os.environ, "COLUMNS": "100"}).stdout
    assert max(len(line) for line in out.splitlines()) <= 100


def test_version():
    from trireme import __version__
    out = subprocess.run([sys.executable, "-m", "trireme", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"trireme {__version__}" and __version__ != "0+unknown"


def test_bad_config_exits_with_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path),
                           "--set", "num.partitions=x"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "num.partitions must be an integer" in proc.stderr


def test_marker_refuse_injection_is_a_list_of_partitions(tmp_path):
    from trireme.server.config import partition_list
    name = "trireme.debug.transaction.marker.refuse"
    assert _config(tmp_path)[name] == ""
    assert partition_list(_config(tmp_path, "--set", f"{name}=a-b-3, c-0")[name]) == {("a-b", 3), ("c", 0)}
    with pytest.raises(ConfigError, match="TOPIC-PARTITION"):
        _config(tmp_path, "--set", f"{name}=orders")


# --- one rule for every source (issue 24 item 4) ------------------------------------------------------------

def test_unknown_property_in_a_file_is_refused_with_the_nearest_name(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("num.partitions=3\nlog.retention.hour=1\n")
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, "--config", str(path))
    message = str(e.value)
    assert "\n" not in message
    assert str(path) in message and "'log.retention.hour'" in message and "log.retention.hours" in message


def test_unknown_property_with_set_names_the_source_and_nearest_name(tmp_path):
    with pytest.raises(ConfigError, match=r"^--set: unknown property 'num.partitons'.*did you mean num.partitions"):
        _config(tmp_path, "--set", "num.partitons=3")


def test_unquoted_dotted_toml_key_gets_the_quoting_hint(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text("num.partitions = 3\n")
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, "--config", str(path))
    assert str(e.value) == (f"{path}: unknown property 'num' (a TOML table): quote dotted keys in TOML: "
                            f'"num.partitions" = 3')


@pytest.mark.parametrize("setting, allowed", [
    ("num.partitions=-5", "num.partitions must be from 1 to"),
    ("num.partitions=0", "num.partitions must be from 1 to"),
    ("log.retention.hours=-2", "log.retention.hours must be from -1 to"),
    ("log.retention.ms=-7", "retention.ms"),
    ("log.segment.bytes=3", "segment.bytes"),
    ("log.cleanup.policy=sometimes", "cleanup.policy"),
    ("log.message.timestamp.type=Now", "CreateTime, LogAppendTime"),
    ("compression.type=brotli", "producer"),
    ("transaction.version=3", "transaction.version must be from 0 to 2"),
    ("trireme.log.level=LOUD", "DEBUG, INFO"),
    ("node.id=-1", "node.id must be from 0"),
])
def test_invalid_values_are_refused_from_every_source(tmp_path, setting, allowed):
    name, _, value = setting.partition("=")
    with pytest.raises(ConfigError) as e:
        _config(tmp_path, "--set", setting)
    assert str(e.value).startswith("--set: ") and allowed in str(e.value) and "\n" not in str(e.value)
    path = tmp_path / "server.properties"
    path.write_text(setting + "\n")
    with pytest.raises(ConfigError, match=f"^{path}: {name}"):
        _config(tmp_path, "--config", str(path))


def test_kafka_broker_properties_are_accepted_without_effect(tmp_path, caplog):
    path = tmp_path / "server.properties"
    path.write_text("process.roles=broker,controller\nlog.dirs=/tmp/kraft-combined-logs\nnum.io.threads=8\n"
                    "listener.name.internal.ssl.truststore.password=secret\nnum.partitions=3\n")
    config = _config(tmp_path, "--config", str(path), "--set", "ssl.keymanager.algorithm=SunX509")
    assert config["num.partitions"] == 3
    assert set(config.no_effect) == {"process.roles", "log.dirs", "num.io.threads",
                                     "listener.name.internal.ssl.truststore.password",
                                     "ssl.keymanager.algorithm"}
    assert config.no_effect["log.dirs"] == ("/tmp/kraft-combined-logs", str(path))
    with caplog.at_level("INFO", logger="trireme.config"):
        config.report_no_effect()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "no effect here (Kafka properties Trireme does not use): log.dirs, num.io.threads, process.roles",
        "no effect here (Kafka security properties Trireme does not use; see docs/security.md): "
        "listener.name.internal.ssl.truststore.password, ssl.keymanager.algorithm"]


def test_retention_in_minutes_and_hours_with_kafkas_precedence(tmp_path):
    assert _config(tmp_path)["log.retention.ms"] == 604800000
    assert _config(tmp_path, "--set", "log.retention.hours=1")["log.retention.ms"] == 3600000
    assert _config(tmp_path, "--set", "log.retention.hours=1",
                   "--set", "log.retention.minutes=5")["log.retention.ms"] == 300000
    assert _config(tmp_path, "--set", "log.retention.ms=1234", "--set", "log.retention.minutes=5",
                   "--set", "log.retention.hours=1")["log.retention.ms"] == 1234
    assert _config(tmp_path, "--set", "log.retention.hours=-1")["log.retention.ms"] == -1
    assert _config(tmp_path, "--set", "log.retention.minutes=-1",
                   "--set", "log.retention.hours=2")["log.retention.ms"] == -1
    config = _config(tmp_path, "--set", "log.retention.hours=1")
    assert config.setting("log.retention.ms") == ("log.retention.hours", 1) and config.is_set("log.retention.ms")
    assert _config(tmp_path).setting("log.retention.ms") is None


def test_kafkas_listeners_with_a_controller_listener(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("listeners=PLAINTEXT://:19092,CONTROLLER://:19093\ncontroller.listener.names=CONTROLLER\n"
                    "advertised.listeners=PLAINTEXT://broker.example:19092,CONTROLLER://broker.example:19093\n")
    config = _config(tmp_path, "--config", str(path))
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 19092)
    assert (config.advertised_host, config.advertised_port) == ("broker.example", 19092)
    path.write_text("listeners=CLIENTS://127.0.0.1:19092\nlistener.security.protocol.map=CLIENTS:PLAINTEXT\n")
    config = _config(tmp_path, "--config", str(path))
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", 19092)


def test_serve_refuses_a_typo_in_one_line(tmp_path):
    path = tmp_path / "server.properties"
    path.write_text("process.roles=broker,controller\nnum.partitons=3\n")
    proc = subprocess.run([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"),
                           "--listen", "127.0.0.1:0", "--config", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"trireme: {path}: unknown property 'num.partitons', neither Trireme's nor Kafka's: "
                           f"did you mean num.partitions?\n")


def test_serve_refuses_negative_num_partitions_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trireme", "serve", "--data-dir", str(tmp_path / "data"),
                           "--listen", "127.0.0.1:0", "--set", "num.partitions=-5"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "trireme: --set: num.partitions must be from 1 to 2147483647, not -5\n"


def test_fixture_follows_the_same_rule(caplog):
    from trireme.testing import TriremeBroker
    with pytest.raises(ConfigError, match=r"^TriremeBroker\(config=...\): unknown property 'num.partitons'.*"
                                          r"did you mean num.partitions"):
        TriremeBroker(config={"num.partitons": 3}).start()
    with pytest.raises(ConfigError, match=r"^TriremeBroker\(config=...\): num.partitions must be from 1"):
        TriremeBroker(config={"num.partitions": -5}).start()
    broker = TriremeBroker(config={"process.roles": "broker,controller", "log.retention.hours": 2})
    broker.start()
    try:
        text = broker.log_text()
    finally:
        broker.stop()
    assert text.count("no effect here") == 1 and "process.roles" in text


def test_unquoted_dotted_toml_key_hint_spells_the_value_as_toml(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text("trireme.fsync.enable = false\n")
    with pytest.raises(ConfigError, match='quote dotted keys in TOML: "trireme.fsync.enable" = false$'):
        _config(tmp_path, "--config", str(path))


def test_log_level_in_any_case(tmp_path):
    assert _config(tmp_path, "--set", "trireme.log.level=debug")["trireme.log.level"] == "DEBUG"
