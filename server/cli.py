"""The ``trireme`` command: ``trireme serve`` runs a broker on a local data directory; ``trireme topics|groups|transactions`` administer one (server/admin)."""
from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from trireme.state.topics import TopicError

from . import admin, dispatch, metrics, web
from .broker import Broker
from .config import PROPERTIES, Config, ConfigError, parse_host_port, parse_topic_spec, read_config_file
from .listener import Listener
from .status_page import StatusPage

log = logging.getLogger("trireme")

# The flusher's worker thread needs the GIL back after each fdatasync to report it done; with Python's
# default 5 ms switch interval a busy event loop made it wait up to that long per file, so a flush round of
# a few partitions took tens of milliseconds under load (docs/performance.md, "Small requests", second round).  Only the
# broker process (``trireme serve``) sets it; an embedding process keeps its own.
GIL_SWITCH_INTERVAL = 0.002


def _properties_help() -> str:
    lines = ["broker properties (Kafka's names; set in --config or with --set NAME=VALUE):"]
    for name, (default, text) in PROPERTIES.items():
        shown = str(default).lower() if isinstance(default, bool) else default
        lines.append(f"  {name} (default {shown})\n      {text}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trireme", description="A Kafka-compatible broker.")
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
    # The flags win over Kafka's listener properties, as --set wins over --config (which are checked all the same).
    listeners, advertised = config.listener("listeners"), config.listener("advertised.listeners")
    if args.listen:
        config.listen_host, config.listen_port = parse_host_port(args.listen)
    elif listeners:
        config.listen_host, config.listen_port = listeners
    if args.advertised:
        config.advertised_host, config.advertised_port = parse_host_port(args.advertised)
    elif advertised:
        config.advertised_host, config.advertised_port = advertised
    return config


async def run_broker(config: Config, storage=None, topics=(), *, standalone: bool = True,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``config`` (with ``topics``, as parse_topic_spec gives them, created first).  Standalone (the CLI):
    print the address and stop on SIGINT/SIGTERM.  Embedded (trireme.testing): report (listener, port) through
    ``task_status`` and stop when the listener's shutdown is set."""
    dispatch.load_handlers()
    broker = Broker(config, storage)
    listener = Listener(broker, config.listen_host, config.listen_port)
    try:
        for name, partitions, configs in topics:
            broker.ensure_topic(name, partitions, configs)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            sites = web.sites(config, {"trireme.metrics.listen": metrics.routes(broker),
                                       "trireme.status.listen": StatusPage(broker).routes()})
            for (host, port), routes in sites.items():
                bound = await nursery.start(web.serve, routes, host, port)
                if ("GET", "/metrics") in routes:
                    log.info("metrics on http://%s:%d/metrics", host, bound)
                if ("GET", "/") in routes:
                    log.info("status page on http://%s:%d/", host, bound)
            async with trio.open_nursery() as serving:
                port = await serving.start(listener.serve)
                if config.listen_port == 0 or broker.advertised_port == 0:
                    broker.advertised_port = config.advertised_port or port
                task_status.started((listener, port))
                if standalone:
                    print(f"listening on {config.listen_host}:{port}", flush=True)
                    serving.start_soon(_shutdown_on_signal, listener)
            nursery.cancel_scope.cancel()
    finally:
        broker.close()
        log.info("stopped")


async def _shutdown_on_signal(listener: Listener) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutting down on signal %d", signum)
            listener.shutdown.set()
            return


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in admin.TOOLS:
        return admin.run(args)
    try:
        config = load_config(args)
        topics = [parse_topic_spec(spec) for spec in args.topic]
    except (ConfigError, OSError) as e:
        print(f"trireme: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config["trireme.log.level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL)
    try:
        trio.run(run_broker, config, None, topics)
    except TopicError as e:
        print(f"trireme: --topic: {e.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
