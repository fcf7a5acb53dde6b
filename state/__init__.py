"""The broker's state, with no sockets, no trio and no clock reads."""
