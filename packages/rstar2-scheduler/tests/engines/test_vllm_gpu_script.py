"""The prepared GPU script (bench/vllm_gpu.py), run on a CPU as far as it goes without a GPU:
its arguments, the checkpoint and the second weights it builds, and the reference scoring and
verdicts that decide whether vLLM generated from the weights it was sent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "vllm_gpu.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_gpu", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_gpu"] = module
    spec.loader.exec_module(module)
    return module


def test_arguments(script: ModuleType) -> None:
    args = script.parse(["--shape", "tiny", "--bucket-mb", "64", "--syncs", "1", "--eager"])
    assert (args.shape, args.bucket_mb, args.syncs, args.eager, args.model) == (
        "tiny",
        64.0,
        1,
        True,
        None,
    )
    with pytest.raises(SystemExit):
        script.parse(["--shape", "huge"])


def test_without_a_gpu_it_says_so(script: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert script.main(["--shape", "tiny"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_reference_scores_tell_the_weights_apart(script: ModuleType, tmp_path: Path) -> None:
    checkpoint = script.build_checkpoint("tiny", tmp_path, seed=0, head_std=0.5)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    other = script.redraw(checkpoint, seed=1, head_std=0.5)
    assert sorted(other) == sorted(model.state_dict())
    first = model.state_dict()
    assert all(
        not torch.equal(other[k].float(), first[k]) for k in first if k.endswith("proj.weight")
    )
    asks = script.prompts(3, 8, model.config.vocab_size)

    def greedy(reference: torch.nn.Module) -> list[SimpleNamespace]:
        """What an engine returns for greedy completions: tokens and their log-probs."""
        results = []
        for prompt in asks:
            ids = list(prompt)
            logprobs = []
            for _ in range(6):
                with torch.no_grad():
                    scores = torch.log_softmax(reference(torch.tensor([ids])).logits[0, -1], -1)
                token = int(scores.argmax())
                logprobs.append(float(scores[token]))
                ids.append(token)
            results.append(SimpleNamespace(token_ids=ids[len(prompt) :], logprobs=logprobs))
        return results

    own = greedy(model)
    chosen = [lp for r in own for lp in r.logprobs]
    assert sum(chosen) / len(chosen) > -2.0  # clear winners (uniform over 512: -6.2)
    scored = script.score(model, asks, own)
    matched = script.verdict(scored, tolerance=0.15, expect_match=True)
    assert matched["passed"]
    assert matched["greedy_share"] == 1.0
    assert matched["max_logprob_diff"] < 1e-4

    swapped = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    swapped.load_state_dict({k: v.float() for k, v in other.items()})
    theirs = greedy(swapped)
    assert [r.token_ids for r in theirs] != [r.token_ids for r in own]
    against_old = script.verdict(
        script.score(model, asks, theirs), tolerance=0.15, expect_match=False
    )
    assert against_old["passed"]  # the old weights' reference rejects the new completions
    assert not script.verdict(script.score(model, asks, theirs), tolerance=0.15, expect_match=True)[
        "passed"
    ]
