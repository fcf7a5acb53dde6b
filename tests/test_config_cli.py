"""The broker's configuration: Kafka property names from TOML or server.properties, flags on top."""
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
    for name, (default, _) in PROPERTIES.items():
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        assert f"{name} (default {shown})" in out
    for flag in ("--data-dir", "--listen", "--advertised", "--config", "--set"):
        assert flag in out


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
