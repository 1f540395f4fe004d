"""A run reads no other run's bytes in its own memory: neither an earlier run's code, stdin or
output (however many runs ago), nor a concurrent run's, by scanning its readable and writable
mappings (``/proc/self/maps`` and ``/proc/self/mem``) or walking ``gc.get_objects()``.

Each token sought is ``rstar2-probe-`` and 32 random hex digits. The scanner is given only the
SHA-256 of each token's digits, never the token, so its own memory holds none of them; it reports
which digests it found after the prefix. It also makes a control token of its own at run time,
which it must find: the scan sees the memory it claims to.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import hashlib
import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from rstar2_sandbox import ExecutorSettings, LocalSandbox, RunRequest, RunStatus

pytestmark = pytest.mark.asyncio(loop_scope="session")

PREFIX = "rstar2-probe-"
# Between the scans after the first run: the runs a fork-server serves in the meantime.
LATER_RUNS = 120

SCAN = r"""
import gc, hashlib, re
WANTED = %r
CONTROL = %r
mine = "rstar2-" + "probe-" + CONTROL  # made at run time: only now in this run's memory
pattern = re.compile(rb"rstar2-probe-([0-9a-f]{32})")
found = set()

def check(data):
    for match in pattern.finditer(data):
        digest = hashlib.sha256(match.group(1)).hexdigest()
        if digest in WANTED:
            found.add(WANTED[digest])

for obj in gc.get_objects():
    for item in (obj, *gc.get_referents(obj)):
        if isinstance(item, str) and "rstar2-probe-" in item:
            check(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, (bytes, bytearray)) and b"rstar2-probe-" in item:
            check(item)
in_objects = sorted(found)
found.clear()

with open("/proc/self/maps") as handle:
    regions = [line.split()[:2] for line in handle]
with open("/proc/self/mem", "rb", buffering=0) as mem:
    for span, perms in regions:
        if not perms.startswith("rw"):
            continue
        at, end = (int(x, 16) for x in span.split("-"))
        while at < end:
            size = min(1 << 22, end - at)
            try:
                mem.seek(at)
                check(mem.read(size))
            except OSError:
                break
            if at + size >= end:
                break
            at += size - 64  # overlapping: a token across two reads is still seen whole
print(repr((in_objects, sorted(found))))
"""


def token() -> str:
    """32 random hex digits: a token's tail."""
    return secrets.token_hex(16)


def scanner(sought: dict[str, str]) -> str:
    """Code that looks for the tokens ``sought`` (name -> tail) in its own memory."""
    wanted = {hashlib.sha256(tail.encode()).hexdigest(): name for name, tail in sought.items()}
    control = token()
    wanted[hashlib.sha256(control.encode()).hexdigest()] = "control"
    return SCAN % (wanted, control)


async def scan(sandbox: LocalSandbox, sought: dict[str, str]) -> tuple[list[str], list[str]]:
    """What a run found of ``sought``: in its objects, in its memory (the control excluded)."""
    result = await sandbox.run(RunRequest(code=scanner(sought), timeout_s=60, memory_mb=512))
    assert result.status is RunStatus.SUCCESS, result.stderr
    in_objects, in_memory = ast.literal_eval(result.stdout)
    # The control proves both scans see this run's own memory.
    assert "control" in in_objects
    assert "control" in in_memory
    return [n for n in in_objects if n != "control"], [n for n in in_memory if n != "control"]


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def shared() -> AsyncIterator[LocalSandbox]:
    """One fork-server with two slots: every run here forks from the same server, one after
    another or side by side."""
    async with LocalSandbox(ExecutorSettings(servers=1, slots=2, preload=[])) as local:
        yield local


async def test_no_earlier_run_is_in_a_later_runs_memory(shared: LocalSandbox) -> None:
    tails = {"code": token(), "stdin": token(), "stdout": token()}
    # The code carries its token in a comment (only in its text), stdin one the run never reads,
    # and the output one the run builds and prints.
    code = f"# {PREFIX}{tails['code']}\nprint({PREFIX!r} + {tails['stdout']!r})\n"
    earlier = await shared.run(RunRequest(code=code, stdin=f"{PREFIX}{tails['stdin']}\n"))
    assert earlier.stdout == f"{PREFIX}{tails['stdout']}\n"

    assert await scan(shared, tails) == ([], [])
    fillers = [RunRequest(code=f"print({i} * {i})") for i in range(LATER_RUNS)]
    assert all(r.ok for r in await shared.run_many(fillers))
    assert await scan(shared, tails) == ([], [])


async def test_no_concurrent_run_is_in_a_runs_memory(shared: LocalSandbox) -> None:
    tails = {"code": token(), "held": token()}
    code = (
        f"# {PREFIX}{tails['code']}\n"
        "import time\n"
        f"held = {PREFIX!r} + {tails['held']!r}\n"
        "print(held, flush=True)\n"
        "time.sleep(6)\n"
    )
    holder = asyncio.create_task(shared.run(RunRequest(code=code, timeout_s=20)))
    await asyncio.sleep(1.5)  # it has started, printed its token and sleeps holding it
    assert not holder.done()
    found = await scan(shared, tails)
    assert not holder.done()  # the scan ran while the holder was still running
    held = await holder
    assert held.stdout == f"{PREFIX}{tails['held']}\n"
    assert found == ([], [])


def wrapped(header: str, code: str) -> str:
    """``code`` as a client wrapper carries it (a base64 literal, run with ``exec``) after
    ``header``: the fork-server keeps the text before it, with its compiled form, for later runs
    that start with the same text."""
    literal = base64.b64encode(code.encode()).decode()
    return f"{header}import base64\nexec(base64.b64decode('{literal}'))\n"


async def test_no_other_wrapper_reaches_a_run_through_the_compiled_prefixes(
    shared: LocalSandbox,
) -> None:
    """The fork-server keeps earlier requests' wrappers (the prefix cache); a run gets the
    compiled prefix of its own wrapper only."""
    tails = {"wrapper": token()}
    earlier = await shared.run(RunRequest(code=wrapped(f"# {PREFIX}{tails['wrapper']}\n", "1")))
    assert earlier.ok, earlier.stderr
    for _ in range(2):  # the second time from the cached prefix
        result = await shared.run(
            RunRequest(code=wrapped("# another wrapper\n", scanner(tails)), timeout_s=60)
        )
        assert result.status is RunStatus.SUCCESS, result.stderr
        in_objects, in_memory = ast.literal_eval(result.stdout)
        assert (in_objects, in_memory) == (["control"], ["control"])
