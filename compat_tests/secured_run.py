"""A whole compat run against a secured listener: every client the tests create gets one ClientSecurity's settings
(conftest.py's ``--command-config``), so the tests themselves stay as they are.

``install(security)`` gives the client classes the tests use the settings under what the test passes itself (a
test naming security.protocol keeps its own): confluent-kafka's Producer and Consumer (extension types: replaced
by subclasses in the module) and AdminClient, kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient,
aiokafka's AIOKafkaProducer, AIOKafkaConsumer and AIOKafkaAdminClient (Python classes: their ``__init__`` wrapped
in place).  It sets ``clients.DEFAULT_SECURITY`` for the Java, kafkajs and Spark harnesses and the kcat helpers,
and points ``KCAT_CONFIG`` at a kcat configuration file with librdkafka's properties for every other kcat the
tests run.  It must run before the test modules are imported (pytest_configure), as they import the classes by
name.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from compat_tests import clients
from compat_tests.security import ClientSecurity


def _merged(defaults: dict[str, Any], dict_config: bool, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``defaults`` under the arguments given: in the first positional argument (a librdkafka configuration
    dict) when ``dict_config`` and there is one, else as keyword arguments."""
    if dict_config and args and isinstance(args[0], dict):
        return ({**defaults, **args[0]},) + args[1:], kwargs
    return args, {**defaults, **kwargs}


def _subclass(base: type, defaults: dict[str, Any], dict_config: bool) -> type:
    """A subclass of the extension type ``base`` (confluent-kafka's Producer, Consumer) taking ``defaults``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        args, kwargs = _merged(defaults, dict_config, args, kwargs)
        base.__init__(self, *args, **kwargs)

    return type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__, "__doc__": base.__doc__})


def _wrap_init(cls: type, defaults: dict[str, Any], dict_config: bool = False) -> None:
    """Give the Python class ``cls`` ``defaults`` in place (its methods name it, e.g. ``super(AdminClient, self)``:
    a subclass under its name would recurse)."""
    original = cls.__init__
    if getattr(original, "_compat_secured", False):
        original = original.__wrapped__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        args, kwargs = _merged(defaults, dict_config, args, kwargs)
        original(self, *args, **kwargs)

    __init__.__wrapped__ = original
    __init__._compat_secured = True
    cls.__init__ = __init__


def install(security: ClientSecurity) -> None:
    import aiokafka
    import aiokafka.admin
    import confluent_kafka
    import confluent_kafka.admin
    import kafka

    rd = security.librdkafka()
    for name in ("Producer", "Consumer"):
        base = getattr(confluent_kafka, name)
        base = getattr(base, "_compat_base", base)
        cls = _subclass(base, rd, dict_config=True)
        cls._compat_base = base
        setattr(confluent_kafka, name, cls)
    _wrap_init(confluent_kafka.admin.AdminClient, rd, dict_config=True)
    kp = security.kafka_python()
    for cls in (kafka.KafkaProducer, kafka.KafkaConsumer, kafka.KafkaAdminClient):
        _wrap_init(cls, kp)
    ak = security.aiokafka()
    for cls in (aiokafka.AIOKafkaProducer, aiokafka.AIOKafkaConsumer, aiokafka.admin.AIOKafkaAdminClient):
        _wrap_init(cls, ak)

    clients.DEFAULT_SECURITY = security
    conf = Path(tempfile.mkdtemp(prefix="compat-kcat-")) / "kcat.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in rd.items()))
    conf.chmod(0o600)
    os.environ["KCAT_CONFIG"] = str(conf)
