"""The only I/O: the trio listener, connections, request dispatch, config and CLI."""
