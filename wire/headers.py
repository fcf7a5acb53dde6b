"""Request and response headers, compiled from Kafka's RequestHeader/ResponseHeader definitions.

A request header's version follows its API's flexible versions (v2 when the request body is
flexible, else v1); a response header is v1 when the response is flexible, except that
ApiVersions responses always use v0 so a client can parse them before it knows our versions.
"""
from __future__ import annotations

import dataclasses
import struct

from .codec import message
from .primitives import INT16, INT32, CodecError

API_VERSIONS_KEY = 18

_REQUEST_HEADER = message("RequestHeader")
_RESPONSE_HEADER = message("ResponseHeader")
_HEADER_START = struct.Struct(">hhih")     # api key, api version, correlation id, client id length


@dataclasses.dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int                       # bytes the header takes in the frame


def peek_api(frame) -> tuple[int, int]:
    """API key and version: the first four bytes of every request, whatever the header version."""
    if len(frame) < 8:
        raise CodecError(f"request of {len(frame)} bytes is shorter than a request header")
    return INT16.unpack_from(frame, 0)[0], INT16.unpack_from(frame, 2)[0]


def decode_request_header(frame, flexible: bool) -> RequestHeader:
    """The request header at the start of ``frame`` (v2 if the API's version is flexible, else v1).

    Fast path: the shape every client sends — a client id that is present and complete, and (v2) an empty
    tagged-field section — is read with one ``struct`` call; anything else goes through the header's compiled
    codec (:func:`decode_request_header_generic`), which defines the bytes.  ``tests/test_codec.py`` checks both
    agree on random input."""
    if len(frame) >= 10:
        api_key, api_version, correlation_id, n = _HEADER_START.unpack_from(frame, 0)
        end = 10 + n
        if n >= 0 and (len(frame) > end and frame[end] == 0 if flexible else len(frame) >= end):
            try:
                client_id = str(frame[10:end], "utf-8")
            except UnicodeDecodeError:
                pass                        # the codec says how that is refused
            else:
                return RequestHeader(api_key, api_version, correlation_id, client_id, end + flexible)
    return decode_request_header_generic(frame, flexible)


def decode_request_header_generic(frame, flexible: bool) -> RequestHeader:
    """The request header read with its compiled codec (any valid header; CodecError otherwise)."""
    obj, end = _REQUEST_HEADER.decode(frame, 2 if flexible else 1)
    return RequestHeader(obj.request_api_key, obj.request_api_version, obj.correlation_id, obj.client_id, end)


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                          flexible: bool) -> bytes:
    obj = _REQUEST_HEADER.cls(api_key, api_version, correlation_id, client_id)
    return _REQUEST_HEADER.encode_bytes(obj, 2 if flexible else 1)


def response_header_version(api_key: int, flexible: bool) -> int:
    return 1 if flexible and api_key != API_VERSIONS_KEY else 0


def encode_response_header(correlation_id: int, version: int) -> bytes:
    """v0 is the correlation id; v1 adds an empty tagged-field section (the only one we send).
    ``tests/test_codec.py`` checks this against the compiled codec (:func:`encode_response_header_generic`)."""
    return INT32.pack(correlation_id) + b"\x00" if version else INT32.pack(correlation_id)


def encode_response_header_generic(correlation_id: int, version: int) -> bytes:
    return _RESPONSE_HEADER.encode_bytes(_RESPONSE_HEADER.cls(correlation_id), version)


def decode_response_header(frame, version: int) -> tuple[int, int]:
    """→ (correlation id, header size)."""
    obj, end = _RESPONSE_HEADER.decode(frame, version)
    return obj.correlation_id, end
