"""An OpenAI-compatible completions server that answers at once with canned tool-calling turns.

It stands in for an inference server so that a benchmark measures the evaluation harness alone:
prompt rendering, tool-call parsing, sandbox round trips, grading and writing. It speaks vLLM's
dialect (token-id prompts and completions). Turn ``t`` of a rollout (counted from the turn
markers in the prompt) calls the Python tool with a small program while ``t < turns - 1``; the
last turn boxes an answer. With ``--script FILE`` (a JSON object from a text to find in the
prompt to the completion to give) it answers each problem with its scripted text in one turn
instead (prompts that hold no such text, as a server probe's, get the canned turns), and
``--delay`` spaces its answers out (one at a time). Run it as its own process:

    python stub_server.py --tokenizer DIR --port 0 --turns 4

It prints ``listening on PORT`` once it accepts requests; ``GET /stats`` counts completions.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from aiohttp import web
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from rstar2_data import PYTHON_TOOL_NAME
from rstar2_scheduler.protocol import TURN_END, TURN_START

MODEL = "stub"


def canned_turns(tokenizer: PreTrainedTokenizerBase, turns: int) -> list[list[int]]:
    """Token ids of each turn: ``turns - 1`` tool calls, then a boxed answer."""
    texts = []
    for turn in range(turns - 1):
        code = f"x = {turn + 6} * 7\nprint(x)\n"
        call = json.dumps({"name": PYTHON_TOOL_NAME, "arguments": {"code": code, "input": ""}})
        texts.append(f"\nStep {turn + 1}: compute it.\n<tool_call>\n{call}\n</tool_call>")
    texts.append("\nThe program printed 42.\n</reason>\n<answer>\n\\boxed{42}\n</answer>")
    end = tokenizer.convert_tokens_to_ids(TURN_END)
    return [[*tokenizer.encode(text, add_special_tokens=False), end] for text in texts]


def _body(ids: list[int]) -> bytes:
    return json.dumps(
        {
            "object": "text_completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "token_ids": ids,
                    "finish_reason": "stop",
                    "logprobs": {"token_logprobs": [0.0] * len(ids)},
                }
            ],
        }
    ).encode()


def create_app(
    tokenizer: PreTrainedTokenizerBase,
    turns: int,
    script: dict[str, str] | None = None,
    delay_s: float = 0.0,
) -> web.Application:
    start = tokenizer.convert_tokens_to_ids(TURN_START)
    end = tokenizer.convert_tokens_to_ids(TURN_END)
    canned = canned_turns(tokenizer, turns)
    scripted = {
        marker: _body([*tokenizer.encode(text, add_special_tokens=False), end])
        for marker, text in (script or {}).items()
    }
    one_at_a_time = asyncio.Lock()
    # The prompt of turn t holds 3 + 2t turn markers: system, user, assistant, then a tool
    # response and a new assistant header per earlier turn.
    bodies = [_body(ids) for ids in canned]

    served = {"completions": 0}

    async def completions(request: web.Request) -> web.Response:
        served["completions"] += 1
        body: dict[str, Any] = json.loads(await request.read())
        prompt = body["prompt"]
        if not isinstance(prompt, list):
            return web.json_response({"error": "token-id prompts only"}, status=400)
        if delay_s:
            async with one_at_a_time:
                await asyncio.sleep(delay_s)
        if scripted:
            text = tokenizer.decode(prompt)
            for marker, answer in scripted.items():
                if marker in text:
                    return web.Response(body=answer, content_type="application/json")
        turn = min((prompt.count(start) - 3) // 2, len(bodies) - 1)
        return web.Response(body=bodies[max(0, turn)], content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(served)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    return app


def main(
    tokenizer: Annotated[str, typer.Option(help="Tokenizer directory of the evaluated model.")],
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 0,
    turns: Annotated[int, typer.Option(min=1, help="Turns per rollout (the last answers).")] = 4,
    script: Annotated[
        Path | None,
        typer.Option(
            help="JSON object: a text to find in the prompt -> the one-turn completion to give."
        ),
    ] = None,
    delay: Annotated[
        float, typer.Option(min=0.0, help="Seconds before each answer, one answer at a time.")
    ] = 0.0,
) -> None:
    """Serve canned tool-calling (or scripted) completions until interrupted."""
    answers = json.loads(script.read_text()) if script is not None else None
    app = create_app(AutoTokenizer.from_pretrained(tokenizer), turns, answers, delay)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"listening on {bound}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    typer.run(main)
