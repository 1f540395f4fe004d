"""The policy's LM head seen from the trainer: whether log-probs can be fused through it, and
the final hidden states of a forward pass, taken without materialising logits.

Log-probs are computed by ``rstar2_algo.fused_linear_logprobs`` from the final hidden states
and the head's weight, chunk by chunk, so a step's ``[tokens, vocab]`` logits never exist. The
forward pass still goes through the model's own ``forward`` (asked for no logits at all), so
FSDP2's hooks gather and free the parameters as usual: once the root module's forward returns,
its head weight is the gathered, unsharded parameter (the root is wrapped with
``reshard_after_forward=False``), and its gradient is reduced after the backward pass like any
other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

_HEAD_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose logits are more than ``hidden @ head.T + bias`` (Gemma 2/3
soft-capping, Cohere's and Granite's scales); their log-probs come from the model's logits."""

_reported: set[str] = set()


def fusable_head(model: PreTrainedModel) -> torch.nn.Linear | None:
    """The model's output projection when its logits are exactly ``linear(hidden)``; else None
    (logged once per model class)."""
    head = model.get_output_embeddings()  # type: ignore[no-untyped-call]  # untyped upstream
    config = model.config.get_text_config()
    transforms = [
        name for name in _HEAD_TRANSFORMS if getattr(config, name, None) not in (None, 1, 1.0)
    ]
    if isinstance(head, torch.nn.Linear) and not transforms:
        return head
    name = type(model).__name__
    if name not in _reported:
        _reported.add(name)
        reason = f"its logits apply {', '.join(transforms)}" if transforms else "no linear head"
        logger.info("%s: log-probs from the model's logits (%s), not the fused head", name, reason)
    return None


@contextlib.contextmanager
def final_hidden_states(model: PreTrainedModel) -> Iterator[list[torch.Tensor]]:
    """Inside the block, every forward of ``model`` appends its final (normed) hidden states,
    ``[batch, positions, hidden]``, to the yielded list."""
    captured: list[torch.Tensor] = []

    def keep(module: torch.nn.Module, args: object, output: object) -> None:
        del module, args
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, tuple):
            hidden = output[0]
        if not isinstance(hidden, torch.Tensor):
            raise TypeError(f"{type(model).__name__}'s base model returned no hidden states")
        captured.append(hidden)

    base: torch.nn.Module = model.base_model
    if base is model:
        raise TypeError(f"{type(model).__name__} has no base model under its LM head")
    handle = base.register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()
