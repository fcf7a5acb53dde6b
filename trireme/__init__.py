"""Trireme, a Kafka-compatible broker on trio: the one import name under which wire/, state/ and server/ install.

The repository keeps the folders its design fixes (``wire/``, ``state/``, ``server/``); packaging maps
them to ``trireme.wire``, ``trireme.state`` and ``trireme.server`` (see ``[tool.setuptools.package-dir]``
in pyproject.toml), so an installed Trireme adds exactly one top-level name to an environment.
"""
from importlib.metadata import PackageNotFoundError, version as _version

# The name it installs under (pyproject.toml); the import name is `trireme`.
DISTRIBUTION = "trireme-broker"

try:
    __version__ = _version(DISTRIBUTION)
except PackageNotFoundError:     # running from a source tree that was never installed
    __version__ = "0+unknown"
