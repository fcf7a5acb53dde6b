"""The built wheel installs one top-level name, `trireme`, into a fresh virtualenv, imports whole, and serves a client."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
                   check=True, cwd=out)
    (path,) = out.glob("trireme_broker-*.whl")      # the distribution's name, not the import name
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv (no access to this one's packages) with the wheel and its runtime dependencies, and pytest
    (as an application's test environment has it: trireme.pytest_plugin needs it)."""
    env = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(env)
    # By its name, as a user installs it: pip takes the built wheel from --find-links (the name is free on the index;
    # `trireme` there is an unrelated project) and its dependencies from the index.
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--find-links", str(wheel.parent), "trireme-broker", "pytest"], check=True, cwd=env)
    return env


def test_installed_by_its_distribution_name(installed):
    script = ("import importlib.metadata as m, trireme; "
              "print(m.version('trireme-broker'), trireme.__version__, m.distribution('trireme-broker').read_text("
              "'entry_points.txt').count('trireme'))")
    out = subprocess.run([str(installed / "bin" / "python"), "-c", script], capture_output=True, text=True, check=True)
    version, imported, entry_points = out.stdout.split()
    assert version == imported != "0+unknown" and int(entry_points) >= 2      # the command and the pytest plugin
    listed = subprocess.run([str(installed / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout.lower().split()
    assert f"trireme-broker=={version}" in listed and not any(p.startswith("trireme==") for p in listed)


def test_wheel_has_one_top_level_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {"trireme"}, sorted(tops)
    assert "trireme/wire/definitions/OffsetCommitKey.json" in names


def test_every_module_imports_from_the_installed_wheel(installed, tmp_path):
    script = textwrap.dedent("""
        import importlib, pkgutil, sys, trireme
        assert "/site-packages/trireme/" in trireme.__file__.replace("\\\\", "/") + "/", trireme.__file__
        names = ["trireme"] + [m.name for m in pkgutil.walk_packages(trireme.__path__, "trireme.")
                               if not m.name.endswith("__main__")]   # that one runs the CLI
        for name in names:
            importlib.import_module(name)
        import trireme.server.dispatch as d, trireme.server.handlers as h
        print(len(names), len(d.implemented_versions()), len(list(pkgutil.iter_modules(h.__path__))))
    """)
    # Run from an empty directory so that nothing but the installed wheel can satisfy the imports.
    out = subprocess.run([str(installed / "bin" / "python"), "-c", script], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    modules, apis, handler_modules = map(int, out.stdout.split())
    assert modules > 40 and apis == handler_modules > 20


def test_installed_command_serves_a_client(installed, tmp_path):
    """`trireme serve` from the wheel, and kafka-python (a runtime dependency) producing to and reading from it."""
    proc = subprocess.Popen([str(installed / "bin" / "trireme"), "serve", "--data-dir", str(tmp_path / "data"),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        bootstrap = line.split()[-1]
        client = textwrap.dedent(f"""
            from kafka import KafkaConsumer, KafkaProducer
            p = KafkaProducer(bootstrap_servers="{bootstrap}", acks="all")
            for i in range(10):
                p.send("wheel-topic", value=b"v%d" % i)
            p.flush(); p.close()
            c = KafkaConsumer("wheel-topic", bootstrap_servers="{bootstrap}", auto_offset_reset="earliest",
                              consumer_timeout_ms=10000)
            print(",".join(m.value.decode() for m in c))
            c.close()
        """)
        out = subprocess.run([str(installed / "bin" / "python"), "-c", client], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().split(",")[:10] == [f"v{i}" for i in range(10)]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_pytest_finds_the_plugin_of_the_installed_wheel(installed, tmp_path):
    """Installing the package is enough: pytest loads trireme.pytest_plugin through its entry point."""
    (tmp_path / "test_app.py").write_text(textwrap.dedent("""
        import pytest
        from kafka import KafkaConsumer, KafkaProducer

        @pytest.mark.trireme(topics={"orders": 2})
        def test_roundtrip(trireme_bootstrap):
            p = KafkaProducer(bootstrap_servers=trireme_bootstrap, acks="all")
            assert p.send("orders", b"v", partition=1).get(timeout=30).offset == 0
            p.close()
    """))
    out = subprocess.run([str(installed / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout


def test_fixture_and_testing_module_start_a_broker_with_warnings_as_errors(installed, tmp_path):
    """An application's suite that runs with ``-W error`` (or ``filterwarnings = error``) can use the fixture:
    loading the message definitions must not import kafka-python, whose modules call deprecated APIs."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    (tmp_path / "test_app.py").write_text(textwrap.dedent("""
        import socket
        import sys

        import pytest
        from trireme.testing import TriremeBroker

        @pytest.mark.trireme(topics={"orders": 2})
        def test_fixture(trireme_bootstrap):
            host, port = trireme_bootstrap.rsplit(":", 1)
            socket.create_connection((host, int(port)), timeout=10).close()
            assert "kafka" not in sys.modules

        def test_without_pytest_fixture():
            with TriremeBroker(topics={"audit": 1}) as broker:
                host, port = broker.bootstrap.rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=10).close()
    """))
    out = subprocess.run([str(installed / "bin" / "python"), "-W", "error", "-m", "pytest", "-q",
                          "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
