"""The HTTP API: native, Code Judge and SandboxFusion endpoints, errors, metrics, back-pressure."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from rstar2_sandbox import ExecutorSettings, ServerSettings
from rstar2_sandbox.models import MAX_CODE_BYTES

from .conftest import start_service  # type: ignore[import-not-found]

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def http(service_url: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    async with aiohttp.ClientSession() as session:
        yield session, service_url


async def post(http: tuple[aiohttp.ClientSession, str], path: str, body: Any) -> tuple[int, Any]:
    session, url = http
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url + path, data=data) as response:
        return response.status, await response.json()


async def get(http: tuple[aiohttp.ClientSession, str], path: str) -> tuple[int, str]:
    session, url = http
    async with session.get(url + path) as response:
        return response.status, await response.text()


# -- native ----------------------------------------------------------------------------------


async def test_native_run(http: tuple[aiohttp.ClientSession, str]) -> None:
    status, body = await post(http, "/v1/run", {"code": "print(input()[::-1])", "stdin": "abc"})
    assert status == 200
    assert body["status"] == "success"
    assert body["stdout"] == "cba\n"


async def test_native_batch_keeps_order(http: tuple[aiohttp.ClientSession, str]) -> None:
    code = "import time; time.sleep({}); print({})"
    requests = [{"code": code.format(0.05 * (i % 2), i)} for i in range(9)]
    status, body = await post(http, "/v1/run/batch", {"requests": requests})
    assert status == 200
    assert [r["stdout"] for r in body["results"]] == [f"{i}\n" for i in range(9)]


async def test_healthz_reports_workers_and_isolation(
    http: tuple[aiohttp.ClientSession, str],
) -> None:
    status, text = await get(http, "/healthz")
    body = json.loads(text)
    assert status == 200
    assert body["status"] == "ok"
    assert body["workers"] == 2
    assert set(body["isolation"]) >= {"unprivileged_uid", "network_namespace", "private_tmp"}
    assert all("active" in feature for feature in body["isolation"].values())


async def test_info(http: tuple[aiohttp.ClientSession, str]) -> None:
    from rstar2_sandbox import __version__

    status, text = await get(http, "/v1/info")
    body = json.loads(text)
    assert status == 200
    assert body["version"] == __version__
    assert body["dispatcher"]["kind"] == "local"
    assert body["dispatcher"]["slots"] == 4
    assert body["max_batch"] == 64
    assert {"/v1/run", "/run/batch", "/run_code", "/ping"} <= set(body["endpoints"])


async def test_metrics_count_calls_by_status(http: tuple[aiohttp.ClientSession, str]) -> None:
    await post(http, "/v1/run", {"code": "raise ValueError"})
    status, text = await get(http, "/metrics")
    assert status == 200
    lines = text.splitlines()
    assert any(
        line.startswith('rstar2_sandbox_calls_total{api="native",status="runtime_error"}')
        for line in lines
    )
    for gauge in ("queue_depth", "in_flight", "workers", "slots"):
        assert any(line.startswith(f"rstar2_sandbox_{gauge} ") for line in lines), gauge
    assert any(line.startswith("rstar2_sandbox_call_latency_seconds_bucket") for line in lines)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/run", b"{not json", 400, None),
        ("/v1/run", {"stdin": "x"}, 422, "code"),
        ("/v1/run", {"code": 5}, 422, "code"),
        ("/v1/run", {"code": "x", "timeout_s": -1}, 422, "timeout_s"),
        ("/v1/run", {"code": "x", "bogus": 1}, 422, "bogus"),
        ("/v1/run", {"code": "x" * (MAX_CODE_BYTES + 1)}, 422, "code"),
        ("/v1/run", [1, 2], 422, "(body)"),
        ("/v1/run/batch", {"requests": [{"code": "x"}, {"code": None}]}, 422, "requests.1.code"),
        ("/v1/run/batch", {"requests": [{"code": "1"}] * 65}, 422, "requests"),
        ("/run", {"type": "python"}, 422, "solution"),
        (
            "/run/batch",
            {"type": "batch", "submissions": [{"type": "java", "solution": ""}]},
            422,
            "submissions.0.type",
        ),
        ("/run_code", {"code": "print(1)", "language": "rust"}, 422, "language"),
        ("/run_code", {"code": "1", "stdin": "x" * (MAX_CODE_BYTES + 1)}, 422, "stdin"),
    ],
)
async def test_bad_input_gets_a_4xx_naming_the_field(
    http: tuple[aiohttp.ClientSession, str], path: str, body: Any, status: int, field: str | None
) -> None:
    got, error = await post(http, path, body)
    assert got == status, error
    assert error["message"]
    if field is not None:
        assert field in [f["field"] for f in error["fields"]]
        assert error["message"].startswith(field)


async def test_body_over_the_size_limit_is_413(http: tuple[aiohttp.ClientSession, str]) -> None:
    status, error = await post(http, "/v1/run", {"code": "x" * (5 << 20)})
    assert status == 413
    assert error["error"] == "body_too_large"


async def test_unknown_route_and_method_answer_json(
    http: tuple[aiohttp.ClientSession, str],
) -> None:
    status, text = await get(http, "/nope")
    assert status == 404
    assert json.loads(text)["error"] == "not_found"
    status, text = await get(http, "/v1/run")
    assert status == 405
    assert json.loads(text)["error"] == "method_not_allowed"


async def test_server_keeps_serving_after_garbage(http: tuple[aiohttp.ClientSession, str]) -> None:
    for garbage in (b"", b"\xff\xfe", b"null", b'{"code": "x"' * 1000):
        status, _ = await post(http, "/v1/run", garbage)
        assert 400 <= status < 500
    status, body = await post(http, "/v1/run", {"code": "print('ok')"})
    assert (status, body["stdout"]) == (200, "ok\n")


# -- Code Judge ---------------------------------------------------------------------------------


async def test_codejudge_ping(http: tuple[aiohttp.ClientSession, str]) -> None:
    status, _ = await get(http, "/ping")
    assert status == 200


async def test_codejudge_single_run(http: tuple[aiohttp.ClientSession, str]) -> None:
    submission = {"type": "python", "solution": "print(int(input()) + 1)", "input": "41"}
    status, body = await post(http, "/run", submission)
    assert status == 200
    assert body["success"] is True
    assert body["run_success"] is True
    assert body["stdout"] == "42\n"
    assert body["reason"] == ""
    assert body["cost"] > 0
    assert body["sub_id"]


@pytest.mark.parametrize("path", ["/run/batch", "/run/long-batch"])
async def test_codejudge_batch(http: tuple[aiohttp.ClientSession, str], path: str) -> None:
    submissions = [
        {"type": "python", "solution": "print('a')", "input": None, "sub_id": "ok"},
        {"type": "python", "solution": "print('a')", "expected_output": "b", "sub_id": "wrong"},
        {"type": "python", "solution": "1/0", "sub_id": "crash"},
        {"type": "python", "solution": "print('x')", "expected_output": "x\n", "sub_id": 7},
    ]
    status, body = await post(http, path, {"type": "batch", "submissions": submissions})
    assert status == 200
    assert body["sub_id"]
    results = {r["sub_id"]: r for r in body["results"]}
    assert [r["sub_id"] for r in body["results"]] == ["ok", "wrong", "crash", 7]
    assert (results["ok"]["success"], results["ok"]["run_success"]) == (True, True)
    assert (results["wrong"]["success"], results["wrong"]["run_success"]) == (False, True)
    assert (results["crash"]["success"], results["crash"]["run_success"]) == (False, False)
    assert "ZeroDivisionError" in results["crash"]["stderr"]
    assert results["crash"]["reason"] == ""
    assert results[7]["success"] is True


async def test_codejudge_output_limit_has_a_reason_and_says_why(
    http: tuple[aiohttp.ClientSession, str],
) -> None:
    """rStar2-Agent's client prints ``reason`` and stderr: both say what stopped the run."""
    flood = "import sys\nsys.stdout.write('x' * (3 << 20))"
    submissions = [
        {"type": "python", "solution": flood},
        {"type": "python", "solution": "print('ok')"},
    ]
    status, body = await post(
        http, "/run/long-batch", {"type": "batch", "submissions": submissions}
    )
    assert status == 200
    cut, fine = body["results"]
    assert (cut["success"], cut["run_success"], cut["reason"]) == (
        False,
        False,
        "output_limit_exceeded",
    )
    limit = 1 << 20
    assert cut["stdout"] == "x" * limit
    assert cut["stderr"].startswith(f"sandbox: stdout exceeded the output limit of {limit} bytes")
    assert (fine["reason"], fine["stdout"]) == ("", "ok\n")


async def test_codejudge_batch_echoes_its_sub_id(http: tuple[aiohttp.ClientSession, str]) -> None:
    body = {
        "type": "batch",
        "sub_id": "batch-7",
        "submissions": [{"type": "python", "solution": "1"}],
    }
    status, reply = await post(http, "/run/batch", body)
    assert (status, reply["sub_id"]) == (200, "batch-7")


async def test_codejudge_output_is_whole_unless_asked() -> None:
    """Off by default; with ``codejudge_output_chars``, cut like Code Judge (first N chars)."""
    code = "import sys\nprint('a' * 3000)\nsys.stderr.write('e' * 1500)"
    submission = {"type": "python", "solution": code}
    for chars, out, err in ((None, 3001, 1500), (1000, 1000, 1000)):
        server = await start_service(
            ExecutorSettings(servers=1, slots=1, preload=[]),
            ServerSettings(codejudge_output_chars=chars),
        )
        url = str(server.make_url("")).rstrip("/")
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(url + "/run", json=submission) as response:
                    single = await response.json()
                batch = {"type": "batch", "submissions": [submission]}
                async with session.post(url + "/run/long-batch", json=batch) as response:
                    (batched,) = (await response.json())["results"]
                # Only the Code Judge API is cut.
                async with session.post(url + "/v1/run", json={"code": code}) as response:
                    native = await response.json()
        finally:
            await server.close()
        for result in (single, batched):
            assert (len(result["stdout"]), len(result["stderr"])) == (out, err)
            assert result["stdout"] == ("a" * 3000 + "\n")[:out]
        assert (len(native["stdout"]), len(native["stderr"])) == (3001, 1500)


# -- SandboxFusion ----------------------------------------------------------------------------


async def test_sandboxfusion_success(http: tuple[aiohttp.ClientSession, str]) -> None:
    request = {"code": "print(input())", "language": "python", "stdin": "hey", "run_timeout": 5}
    status, body = await post(http, "/run_code", request)
    assert status == 200
    assert body["status"] == "Success"
    assert body["run_result"]["status"] == "Finished"
    assert body["run_result"]["return_code"] == 0
    assert body["run_result"]["stdout"] == "hey\n"


async def test_sandboxfusion_output_limit_says_why(
    http: tuple[aiohttp.ClientSession, str],
) -> None:
    code = "import sys\nsys.stdout.write('x' * (3 << 20))"
    status, body = await post(http, "/run_code", {"code": code})
    assert (status, body["status"], body["message"]) == (200, "Failed", "output_limit_exceeded")
    assert body["run_result"]["stderr"].startswith("sandbox: stdout exceeded the output limit")


async def test_sandboxfusion_failure_and_timeout(http: tuple[aiohttp.ClientSession, str]) -> None:
    status, body = await post(http, "/run_code", {"code": "raise SystemExit(4)"})
    assert (status, body["status"]) == (200, "Failed")
    assert (body["run_result"]["status"], body["run_result"]["return_code"]) == ("Finished", 4)
    status, body = await post(http, "/run_code", {"code": "while 1: pass", "run_timeout": 0.5})
    assert (status, body["status"]) == (200, "Failed")
    assert body["run_result"]["status"] == "TimeLimitExceeded"


# -- back-pressure ----------------------------------------------------------------------------


async def test_full_queue_answers_503_with_retry_after() -> None:
    server = await start_service(
        ExecutorSettings(servers=1, slots=1, preload=[]), ServerSettings(max_queue=1)
    )
    url = str(server.make_url("")).rstrip("/")
    sleeper = {"code": "import time; time.sleep(2)"}
    try:
        async with aiohttp.ClientSession() as session:
            busy = [asyncio.create_task(session.post(url + "/v1/run", json=sleeper)) for _ in "ab"]
            await asyncio.sleep(0.5)  # one runs, one waits: the queue is full
            async with session.post(url + "/v1/run", json={"code": "1"}) as response:
                assert response.status == 503
                assert int(response.headers["Retry-After"]) >= 1
                assert (await response.json())["error"] == "queue_full"
            async with session.post(url + "/run_code", json={"code": "1"}) as response:
                assert response.status == 503
            submission = {"type": "python", "solution": "1"}
            async with session.post(url + "/run", json=submission) as response:
                assert (await response.json())["reason"] == "queue_timeout"
            async with session.post(url + "/v1/run/batch", json={"requests": [sleeper]}) as r:
                assert r.status == 503
            for task in busy:
                response = await task
                assert response.status == 200
                response.release()
            async with session.get(url + "/metrics") as response:
                assert 'rstar2_sandbox_rejected_total{api="native"} 1.0' in await response.text()
    finally:
        await server.close()
