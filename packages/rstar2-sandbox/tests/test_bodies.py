"""Request bodies are judged by their size before they are buffered: a declared length over the
endpoint's limit is refused before a byte is read, a chunked body as soon as it passes it, and the
limits follow from the code, stdin and batch limits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio

from rstar2_sandbox import ExecutorSettings, ServerSettings
from rstar2_sandbox.api.limits import FIELDS_BYTES, JSON_BYTES_PER_CHAR
from rstar2_sandbox.models import MAX_CODE_BYTES, MAX_STDIN_BYTES

from .conftest import start_service  # type: ignore[import-not-found]

pytestmark = pytest.mark.asyncio(loop_scope="session")

SETTINGS = ServerSettings()
CALL = JSON_BYTES_PER_CHAR * (MAX_CODE_BYTES + MAX_STDIN_BYTES) + FIELDS_BYTES
SUBMISSION = JSON_BYTES_PER_CHAR * (MAX_CODE_BYTES + 2 * MAX_STDIN_BYTES) + FIELDS_BYTES
EXPECTED = {
    "/v1/run": CALL,
    "/v1/run/batch": SETTINGS.max_body_bytes,
    "/run": SUBMISSION,
    "/run/batch": SETTINGS.max_body_bytes,
    "/run/long-batch": SETTINGS.max_body_bytes,
    "/run_code": CALL,
}
HUGE = 250_000_000


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def url() -> AsyncIterator[str]:
    """A service with the default server settings."""
    server = await start_service(ExecutorSettings(servers=1, slots=2, preload=[]), SETTINGS)
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_limits_follow_from_the_code_stdin_and_batch_limits(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/info") as response:
        info = await response.json()
    assert info["body_limits"] == EXPECTED
    # A batch of max_batch calls at their limits would be larger: max_body_bytes caps it.
    assert SETTINGS.max_batch * CALL > SETTINGS.max_body_bytes


async def raw_request(
    url: str, head: str, body: AsyncIterator[bytes] | None = None
) -> tuple[int, dict[str, str], bytes, int]:
    """Send ``head`` (and ``body`` chunks, while the server has not answered) on a plain socket:
    (status, headers, response body, bytes of body sent)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0
    try:
        writer.write(head.encode())
        await writer.drain()
        answered = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        if body is not None:
            async for chunk in body:
                if answered.done():
                    break
                writer.write(chunk)
                try:
                    await writer.drain()
                except ConnectionError:
                    break
                sent += len(chunk)
        status_line, *lines = (await asyncio.wait_for(answered, 10)).decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines if line)
        length = int(headers.get("Content-Length", "0"))
        content = await asyncio.wait_for(reader.readexactly(length), 10)
        return int(status_line.split()[1]), headers, content, sent
    finally:
        writer.close()


def post_head(path: str, extra: str) -> str:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}\r\n"


def assert_refused(path: str, status: int, headers: dict[str, str], content: bytes) -> None:
    assert status == 413
    assert headers.get("Connection", "").lower() == "close"
    error = json.loads(content)
    assert error["error"] == "body_too_large"
    assert error["max_bytes"] == EXPECTED[path]
    assert f"limit of {EXPECTED[path]} bytes" in error["message"]
    assert "\n" not in error["message"]


@pytest.mark.parametrize("path", sorted(EXPECTED))
@pytest.mark.parametrize("expect", [False, True], ids=["plain", "expect-100-continue"])
async def test_a_declared_length_over_the_limit_is_refused_before_the_body(
    url: str, path: str, expect: bool
) -> None:
    extra = f"Content-Length: {HUGE}\r\n" + ("Expect: 100-continue\r\n" if expect else "")
    # Nothing of the body is sent: the answer must come without it.
    status, headers, content, _ = await raw_request(url, post_head(path, extra))
    assert_refused(path, status, headers, content)


@pytest.mark.parametrize("path", ["/v1/run", "/run/batch"])
async def test_a_chunked_body_is_refused_once_past_the_limit(url: str, path: str) -> None:
    chunk = b"x" * (1 << 20)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(HUGE // len(chunk)):
            yield b"%x\r\n%s\r\n" % (len(chunk), chunk)

    head = post_head(path, "Transfer-Encoding: chunked\r\n")
    status, headers, content, sent = await raw_request(url, head, chunks())
    assert_refused(path, status, headers, content)
    # Refused once past the limit, not after the whole body (socket buffers hold a few MiB).
    assert sent < EXPECTED[path] + (32 << 20)


async def test_a_call_at_its_limits_is_accepted(url: str) -> None:
    """Code and stdin of the largest size, every character escaped (six bytes in JSON each)."""
    code = "#" + "\u00e9" * (MAX_CODE_BYTES - 1)
    body = json.dumps({"code": code, "stdin": "\u00e9" * MAX_STDIN_BYTES}).encode()
    assert len(body) > CALL - FIELDS_BYTES
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/run", data=body, headers={"Content-Type": "application/json"}) as r,
    ):
        assert r.status == 200, await r.text()
        assert (await r.json())["status"] == "success"
