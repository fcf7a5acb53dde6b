"""Runs a Broker's background tasks (flusher, coordinators) around one async test body, then stops them."""
import trio


def run_with_broker(broker, body) -> None:
    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            await body(broker)
            nursery.cancel_scope.cancel()
    trio.run(main)
