"""What each OpenAI-compatible dialect sends for top-k, and what it refuses."""

from __future__ import annotations

import json

import pytest

from rstar2_scheduler.engine import SamplingParams
from rstar2_scheduler.engines.openai_dialect import Dialect

VLLM = Dialect(token_ids=True, extensions=True, generation_config=False)
TRANSFORMERS_SERVE = Dialect(token_ids=True, extensions=False, generation_config=True)
PLAIN = Dialect(token_ids=True, extensions=False, generation_config=False)


def body(dialect: Dialect, **sampling: object) -> dict[str, object]:
    params = SamplingParams.model_validate({"max_new_tokens": 4, **sampling})
    return dialect.body("m", [1, 2], params, lambda ids: "x" * len(ids))


def test_top_k_goes_as_each_dialect_spells_it() -> None:
    assert body(VLLM, top_k=20)["top_k"] == 20
    assert body(VLLM)["top_k"] == -1  # off
    config = json.loads(str(body(TRANSFORMERS_SERVE, top_k=20)["generation_config"]))
    assert config["top_k"] == 20
    with pytest.raises(ValueError, match="take no top_k"):
        body(PLAIN, top_k=20)


@pytest.mark.parametrize("dialect", [VLLM, TRANSFORMERS_SERVE, PLAIN])
def test_no_server_is_asked_for_supports(dialect: Dialect) -> None:
    with pytest.raises(ValueError, match="reports no sampling supports"):
        body(dialect, return_support=True, top_p=0.9)
