"""Request bodies judged by their size before they are buffered: declared, then running.

Each endpoint's limit follows from what a valid request can hold: a call's text fields (code,
stdin, Code Judge's expected output) have at most ``MAX_CODE_BYTES`` / ``MAX_STDIN_BYTES``
characters, which JSON writes in at most ``JSON_BYTES_PER_CHAR`` bytes each (``\\uXXXX``), plus
``FIELDS_BYTES`` for everything else; a batch holds at most ``ServerSettings.max_batch`` calls.
``ServerSettings.max_body_bytes`` caps every limit.

A body whose ``Content-Length`` is over its limit is refused before a byte of it is read (with
``Expect: 100-continue``, before the client sends it); one sent chunked is read with a running
count and refused as soon as it passes the limit. Either answer is a 413 whose message names the
limit, on a connection that is then closed.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass

from aiohttp import hdrs, web

from rstar2_sandbox.settings import ServerSettings

# The longest way JSON writes one character (of the Basic Multilingual Plane): \uXXXX.
JSON_BYTES_PER_CHAR = 6
# Everything but the text fields: numbers, flags, ids, brackets, fields a client adds and the
# service ignores.
FIELDS_BYTES = 64 << 10


@dataclass(frozen=True)
class Body:
    """What an endpoint's body may hold: one call or a batch of calls, each with text fields of
    at most ``text_chars`` characters together."""

    text_chars: int
    batch: bool = False

    def limit(self, settings: ServerSettings) -> int:
        """The largest body a valid request can have, capped by ``max_body_bytes``."""
        call = JSON_BYTES_PER_CHAR * self.text_chars + FIELDS_BYTES
        largest = settings.max_batch * call + FIELDS_BYTES if self.batch else call
        return min(largest, settings.max_body_bytes)


BODY_LIMITS = web.AppKey("body_limits", dict[str, int])
"""The app's limit for each endpoint that takes a body, by route path."""
SPOOL_DIR = web.AppKey("body_spool_dir", str)
"""Where chunked bodies go past ``CHUNKED_IN_MEMORY`` ("": the system's temporary directory)."""
CHUNKED_IN_MEMORY = 1 << 20


def body_limit(request: web.Request) -> int:
    """The body limit of the endpoint ``request`` is for."""
    route = request.match_info.route
    path = route.resource.canonical if route.resource is not None else request.path
    return request.app[BODY_LIMITS][path]


def _refusal(request: web.Request, limit: int) -> str:
    """The 413's JSON body: the limit, in one line."""
    message = (
        f"request body exceeds the limit of {limit} bytes for {request.method} {request.path} "
        "(set by the code and stdin limits, --max-batch and --max-body-mb)"
    )
    return json.dumps({"error": "body_too_large", "message": message, "max_bytes": limit})


def too_large(request: web.Request, limit: int, size: int) -> web.HTTPRequestEntityTooLarge:
    """The 413 to raise for a body over ``limit`` (``size``: its declared size, or what was
    read); its connection is closed after it."""
    error = web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=size,
        text=_refusal(request, limit),
        content_type="application/json",
    )
    error.force_close()
    return error


async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
    """Route ``expect_handler``: refuse an over-limit body before the client sends it, else let
    it come (``100 Continue``), as aiohttp's default does."""
    limit = body_limit(request)
    if request.content_length is not None and request.content_length > limit:
        response = web.Response(
            status=413, text=_refusal(request, limit), content_type="application/json"
        )
        response.force_close()
        return response
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version >= (1, 1) and expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        # The interim response does not count as the response's own output.
        request.writer.output_size = 0
        return None
    raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")


async def read_body(request: web.Request) -> bytes | bytearray:
    """The whole body, judged first by ``Content-Length`` and then by a running count against
    the endpoint's limit; raises the 413 as soon as it is over.

    A declared body is read into a buffer of its size. A chunked one (its size unknown until it
    ends) is kept in memory up to ``CHUNKED_IN_MEMORY`` bytes and in an unlinked temporary file
    (``ServerSettings.spool_dir``) beyond, so that bodies refused on the way cost disk writes,
    not memory.
    """
    limit = body_limit(request)
    declared = request.content_length
    if declared is not None:
        if declared > limit:
            raise too_large(request, limit, declared)
        body = bytearray(declared)
        filled = 0
        while filled < declared and (chunk := await request.content.readany()):
            body[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
        return body if filled == declared else body[:filled]
    with tempfile.SpooledTemporaryFile(
        CHUNKED_IN_MEMORY, dir=request.app[SPOOL_DIR] or None
    ) as spool:
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise too_large(request, limit, size)
            spool.write(chunk)
        spool.seek(0)
        return spool.read()
