"""What an OpenAI-compatible ``/completions`` server accepts, and the request bodies it gets.

Servers differ in three ways that decide whether a rollout is exact:

- **prompts**: token ids (vLLM, SGLang; part of the OpenAI API itself) or text only
  (``transformers serve``);
- **extension fields**: vLLM's and SGLang's ``stop_token_ids``, ``skip_special_tokens``,
  ``return_token_ids`` and neutral ``top_k``/``min_p``/``repetition_penalty`` (so a checkpoint's
  ``generation_config.json`` defaults do not reshape the distribution); servers that validate
  their fields strictly refuse them;
- **the sampling switch**: ``transformers serve`` samples only when the checkpoint's generation
  config says ``do_sample``; its documented way to ask for sampling per request is the
  ``generation_config`` field (a JSON string of ``GenerationConfig`` parameters).

``Dialect`` is one combination; ``candidates`` lists them in the order a probe tries them (the
most exact first), and ``ServerCapabilities`` records what the probe found.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rstar2_scheduler.engine import SamplingParams

PromptFormat = Literal["auto", "token_ids", "text"]
TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class Dialect:
    """How requests are shaped for one server."""

    token_ids: bool  # prompts as token ids (else decoded text)
    extensions: bool  # vLLM/SGLang extension fields
    generation_config: bool  # transformers serve's per-request GenerationConfig

    def describe(self) -> str:
        prompt = "token-id prompts" if self.token_ids else "text prompts"
        fields = (
            "vLLM/SGLang extension fields"
            if self.extensions
            else "OpenAI fields + generation_config"
            if self.generation_config
            else "OpenAI fields only"
        )
        return f"{prompt} with {fields}"

    def body(
        self,
        model: str,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        decode: Callable[[Sequence[int]], str] | None,
    ) -> dict[str, Any]:
        """The ``/completions`` request body for one generation."""
        if decode is None and (not self.token_ids or not self.extensions):
            raise ValueError(f"{self.describe()} need the served model's tokenizer")
        if sampling.return_support:
            raise ValueError(
                "an OpenAI-compatible server reports no sampling supports (return_support): "
                "sample with an in-process engine (transformers, or vLLM started with "
                "return_sampling_mask)"
            )
        if sampling.top_k and not (self.extensions or self.generation_config):
            raise ValueError(f"{self.describe()} take no top_k; sample with top_k 0")
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_ids) if self.token_ids else _decode(decode, prompt_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
        }
        if self.extensions:
            body.update(
                stop_token_ids=list(sampling.stop_token_ids),
                skip_special_tokens=False,
                include_stop_str_in_output=True,
                return_tokens_as_token_ids=True,
                return_token_ids=True,
                # -1 disables top-k on vLLM (all versions) and SGLang.
                top_k=sampling.top_k or -1,
                min_p=0.0,
                repetition_penalty=1.0,
            )
        if not self.token_ids or not self.extensions:
            # Without stop_token_ids the stop tokens go as strings.
            stops = [_decode(decode, [token]) for token in sampling.stop_token_ids]
            body["stop"] = stops or None
        if self.generation_config:
            body["generation_config"] = json.dumps(_generation_config(sampling))
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body


def _decode(decode: Callable[[Sequence[int]], str] | None, ids: Sequence[int]) -> str:
    assert decode is not None  # checked by Dialect.body
    return decode(ids)


def _generation_config(sampling: SamplingParams) -> dict[str, Any]:
    """transformers' ``GenerationConfig`` for one request: sampling exactly as asked. Fields left
    out fall back to the checkpoint's generation config, so the neutral ones are spelled out."""
    if sampling.temperature == 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }


def candidates(prompt_format: PromptFormat, *, has_tokenizer: bool) -> list[Dialect]:
    """Dialects to try, most exact first: token ids in and out, then text."""
    ids = [
        Dialect(token_ids=True, extensions=True, generation_config=False),
        Dialect(token_ids=True, extensions=False, generation_config=True),
        Dialect(token_ids=True, extensions=False, generation_config=False),
    ]
    text = [
        Dialect(token_ids=False, extensions=True, generation_config=False),
        Dialect(token_ids=False, extensions=False, generation_config=True),
        Dialect(token_ids=False, extensions=False, generation_config=False),
    ]
    if not has_tokenizer:  # stop strings and text need the tokenizer
        return ids[:1]
    if prompt_format == "token_ids":
        return ids
    if prompt_format == "text":
        return text
    return ids + text


StopLogprob = Literal["server", "masked"]


class ServerCapabilities(BaseModel):
    """What an OpenAI-compatible server was found to accept and return (one probe at start)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="The API root probed.")
    prompt: Literal["token_ids", "text"] = Field(
        description="token_ids: prompts go as ids, exactly; text: the prompt ids decoded."
    )
    extension_fields: bool = Field(
        description="vLLM/SGLang extension fields accepted (stop_token_ids, "
        "skip_special_tokens=false, return_token_ids, neutral top_k/min_p/repetition_penalty)."
    )
    sampling_switch: Literal["temperature", "generation_config"] = Field(
        description="How sampling is asked for: the temperature field (vLLM, SGLang; a server "
        "that takes nothing else may still decode greedily), or transformers serve's "
        "generation_config with do_sample."
    )
    completion_ids: Literal["server", "reencoded"] = Field(
        description="server: the completion's token ids come back; reencoded: its text is "
        "re-encoded with the local tokenizer (exact only when the text re-encodes to the "
        "sampled tokens)."
    )
    token_counts: Literal["server", "reencoded"] = Field(
        description="Where response budgets count generated tokens: the server (its token ids or "
        "usage.completion_tokens), or the re-encoded text (the server reports neither)."
    )
    logprobs: bool = Field(description="Sampling log-probs come back (RL needs them).")
    special_tokens_kept: bool = Field(
        description="Special tokens reach the client: token ids come back, or the server "
        "accepted skip_special_tokens=false. Otherwise a text server drops them from its text."
    )
    stop_token_logprob: StopLogprob = Field(
        description="server: the stop token comes back with its log-prob; masked: the server "
        "drops it, the client restores the token with loss mask 0 (not trained on)."
    )
    notes: list[str] = Field(description="Each dialect tried and the server's answer.")

    def summary(self) -> str:
        """One line for the log."""
        prompt = "token-id prompts" if self.prompt == "token_ids" else "text prompts"
        fields = "extension fields" if self.extension_fields else "OpenAI fields only"
        ids = (
            "token ids returned"
            if self.completion_ids == "server"
            else "completion text re-encoded locally"
        )
        counts = (
            "token counts from the server"
            if self.token_counts == "server"
            else "token counts from the re-encoded text"
        )
        return (
            f"{prompt}, {fields}; {ids}, {counts}; sampling via {self.sampling_switch}; "
            f"{'log-probs' if self.logprobs else 'no log-probs'}; special tokens "
            f"{'kept' if self.special_tokens_kept else 'dropped from the text'}; stop token "
            f"log-prob: {self.stop_token_logprob}"
        )
