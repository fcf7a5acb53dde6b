"""The ``trireme`` command: ``trireme serve`` runs a broker on a local data directory; ``trireme topics|groups|transactions`` administer one (server/admin)."""
from __future__ import annotations

import argparse
import functools
import gc
import logging
import shutil
import sys
import textwrap

import trio

from trireme import __version__
from trireme.state.topics import TopicError

from . import admin, authentication, dispatch, dump_log, metrics, migrate, web
from .broker import Broker
from .config import LONG_MAX, PROPERTIES, Config, ConfigError, parse_host_port, parse_topic_spec, read_config_file
from .listener import EndPoint, Listener
from .tls import ListenerTls
from .startup import StartupError, StartupInterrupted, StopSignals, open_listeners, startup_failure
from .status_page import StatusPage

log = logging.getLogger("trireme")

# The flusher's worker thread needs the GIL back after each fdatasync to report it done; with Python's
# default 5 ms switch interval a busy event loop made it wait up to that long per file, so a flush round of
# a few partitions took tens of milliseconds under load (docs/performance.md, "Small requests", second round).  Only the
# broker process (``trireme serve``) sets it; an embedding process keeps its own.
GIL_SWITCH_INTERVAL = 0.002


WEB_LISTEN_PROPERTIES = ("trireme.metrics.listen", "trireme.status.listen")



def _default_text(default) -> str:
    if isinstance(default, bool):
        return str(default).lower()
    if default is None or default == LONG_MAX:       # Kafka's "unset" for a long (log.flush.interval.*)
        return "unset"
    if default == "":
        return "empty"
    return str(default)


def _properties_help(width: int | None = None) -> str:
    """Every broker property with its default and meaning, wrapped to the terminal (at most 100 columns)."""
    width = width or min(shutil.get_terminal_size((100, 24)).columns, 100)
    lines = ["broker properties (Kafka's names; set in --config or with --set NAME=VALUE):"]
    for name, (default, text) in PROPERTIES.items():
        lines.extend(textwrap.wrap(f"{name} (default {_default_text(default)})", width=width, initial_indent="  ",
                                   subsequent_indent=" " * 6, break_on_hyphens=False))
        lines.extend(textwrap.wrap(text, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trireme", description="A Kafka-compatible broker.")
    parser.add_argument("--version", action="version", version=f"trireme {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker", epilog=_properties_help(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--data-dir", default="./data", help="where logs and metadata live (default ./data)")
    serve.add_argument("--listen", default=None,
                       help="HOST:PORT to bind; port 0 picks a free port (default: the listeners property, "
                            "else 127.0.0.1:9092)")
    serve.add_argument("--advertised", default=None,
                       help="HOST:PORT clients are told to connect to (default: the advertised.listeners "
                            "property, else the bound address)")
    serve.add_argument("--config", default=None,
                       help="a flat TOML file (quoted Kafka keys) or a Java server.properties file")
    serve.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="set one broker property; overrides --config")
    admin.add_parsers(sub)
    dump_log.add_parser(sub)
    migrate.add_parser(sub)
    serve.add_argument("--topic", action="append", default=[], metavar="NAME[:PARTITIONS[:KEY=VALUE,...]]",
                       help="create this topic at start-up unless it exists (repeatable)")
    return parser


def load_config(args) -> Config:
    config = Config(data_dir=args.data_dir)
    if args.config:
        config.update(read_config_file(args.config), source=args.config)
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects NAME=VALUE, got {item!r}")
        config.set(name.strip(), value, source="--set")
    # The flags win over Kafka's listener properties for the PLAINTEXT listener, as --set wins over --config.
    config.resolve_listeners(parse_host_port(args.listen) if args.listen else None,
                             parse_host_port(args.advertised) if args.advertised else None)
    for name in WEB_LISTEN_PROPERTIES:         # checked now, not after the logs have loaded
        if config[name]:
            try:
                web.parse_address(config[name])
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None
    return config


async def run_broker(config: Config, storage=None, topics=(), *, standalone: bool = True,
                     signals: StopSignals | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``config`` (with ``topics``, as parse_topic_spec gives them, created first).  Standalone (the CLI):
    print the address and stop on SIGINT/SIGTERM (``signals``, taken by main before anything else; a signal while
    the logs load stops the start-up cleanly).  Embedded (trireme.testing): report (listener, port) through
    ``task_status`` and stop when the listener's shutdown is set.  The address is bound before the logs load, so a
    taken port is said at once; what keeps the broker from starting is a StartupError."""
    dispatch.load_handlers()
    specs = config.listeners or config.resolve_listeners(
        (config.listen_host, config.listen_port),
        (config.advertised_host, config.advertised_port or 0) if config.advertised_host else None)
    tls = {}
    for spec in specs:          # key material checked before anything is bound or loaded
        if spec.security_protocol in ("SSL", "SASL_SSL"):
            try:
                tls[spec.name] = ListenerTls(config, spec.name, spec.security_protocol)
            except ConfigError as e:
                raise StartupError(f"listener {spec.name}: {e}") from None
    try:                        # a SASL listener whose settings cannot work refuses to start (server/authentication.py)
        authentication.check_listeners(config, specs)
    except authentication.SaslConfigError as e:
        raise StartupError(str(e)) from None
    endpoints: list[EndPoint] = []
    try:
        for spec in specs:
            sockets = await open_listeners(spec.host, spec.port, f"listener {spec.name}" if len(specs) > 1 else "")
            endpoints.append(EndPoint(spec, sockets, tls.get(spec.name)))
        await _serve_endpoints(config, storage, topics, endpoints, standalone, signals, task_status)
    finally:
        for endpoint in endpoints:
            for sock in endpoint.sockets:
                sock.socket.close()         # the listener closed them already, unless it never served


async def _serve_endpoints(config: Config, storage, topics, endpoints: list, standalone: bool,
                           signals: StopSignals | None, task_status) -> None:
    """run_broker once the listeners are bound: load the broker, serve until asked to stop."""
    port = endpoints[0].port
    try:
        broker = Broker(config, storage, listen=f"{config.listen_host}:{port}",
                        stop_requested=signals.requested if signals else None,
                        endpoints={endpoint.name: endpoint for endpoint in endpoints})
    except StartupInterrupted as e:
        log.info("shutting down on signal %d: %s", signals.received, e)
        log.info("stopped")
        return
    listener = Listener(broker, endpoints)
    try:
        for name, partitions, configs in topics:
            broker.ensure_topic(name, partitions, configs)
        async with trio.open_nursery() as nursery:
            if signals is not None:
                nursery.start_soon(_shutdown_on_signal, signals, listener)
            await nursery.start(broker.run)
            sites = web.sites(config, {"trireme.metrics.listen": metrics.routes(broker),
                                       "trireme.status.listen": StatusPage(broker).routes()})
            for (host, web_port), routes in sites.items():
                settings = _web_settings(config, host, web_port)
                bound_web = await nursery.start(web.serve, routes, host, web_port, settings)
                if ("GET", "/metrics") in routes:
                    log.info("metrics on http://%s:%d/metrics", host, bound_web)
                if ("GET", "/") in routes:
                    log.info("status page on http://%s:%d/", host, bound_web)
            async with trio.open_nursery() as serving:
                await serving.start(listener.serve)
                broker.advertised_host = endpoints[0].advertised_host
                broker.advertised_port = endpoints[0].advertised_port
                task_status.started((listener, port))
                if standalone:
                    print(f"listening on {config.listen_host}:{port}", flush=True)
                    for endpoint in endpoints[1:]:
                        print(listening_line(endpoint), flush=True)
                    # What start-up made (modules, the loaded logs, the coordinators' state) lives as long as the
                    # process, mostly: the cycle collector's full passes need not walk it again (one took 11-16 ms
                    # of the event loop over 65,000 such objects; docs/performance.md, "The collector's pauses").
                    gc.freeze()
            await broker.controlled_shutdown()
            nursery.cancel_scope.cancel()
    finally:
        broker.close()
        log.info("stopped")


def listening_line(endpoint) -> str:
    """The stdout line of a listener after the first (whose line stays ``listening on HOST:PORT``); trireme.testing
    reads it back (LISTENING_LINE)."""
    return f"listening on {endpoint.host}:{endpoint.port} listener={endpoint.name} " \
           f"security_protocol={endpoint.security_protocol}"


def _web_settings(config: Config, host: str, port: int) -> str:
    """The settings that name HOST:PORT for the HTTP endpoints (for the one line when it cannot be bound)."""
    return " and ".join(name for name in WEB_LISTEN_PROPERTIES
                        if config[name] and web.parse_address(config[name]) == (host, port))


async def _shutdown_on_signal(signals: StopSignals, listener: Listener) -> None:
    signum = await signals.wait()
    log.info("shutting down on signal %d", signum)
    listener.shutdown.set()


def main(argv=None) -> int:
    args = build_parser().parse_args(admin.kafka_style(list(sys.argv[1:] if argv is None else argv)))
    if args.command in admin.TOOLS:
        return admin.run(args)
    if args.command == "dump-log":
        return dump_log.run(args)
    if args.command == "migrate":
        return migrate.run(args, load_config)
    # Before anything else of the broker: a SIGTERM from here on is a clean shutdown, however early it comes.
    signals = StopSignals().install()
    try:
        return _serve(args, signals)
    finally:
        signals.restore()


def _serve(args, signals: StopSignals) -> int:
    try:
        config = load_config(args)
        topics = [parse_topic_spec(spec) for spec in args.topic]
    except (ConfigError, OSError) as e:
        print(f"trireme: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config["trireme.log.level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    metrics.time_gc_pauses()
    try:
        trio.run(functools.partial(run_broker, config, None, topics, signals=signals))
    except (StartupError, TopicError, BaseExceptionGroup) as e:
        failure = startup_failure(e, (StartupError, TopicError))
        if failure is None:
            raise
        if isinstance(failure, TopicError):
            print(f"trireme: --topic: {failure.message}", file=sys.stderr)
            return 2
        print(f"trireme: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
