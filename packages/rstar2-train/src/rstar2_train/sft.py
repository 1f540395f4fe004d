"""Supervised fine-tuning on chat transcripts, in the agent protocol's token layout.

Each transcript is encoded by rstar2-scheduler's ``encode_transcript``, which replays it as a
rollout would build it: the prompt (with the reasoning prefill), the assistant turns (trained on,
end-of-turn token included) and the template glue and tool responses between them (masked). The
loss is the mean negative log-likelihood over every trained token of the step.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from rstar2_data import ChatExample
from rstar2_scheduler import ChatProtocol, TranscriptError, encode_transcript, user_prompt
from rstar2_scheduler.protocol import Message
from rstar2_train.actor import Actor, LossFn
from rstar2_train.batching import MicroBatch, TokenSequence, micro_batches
from rstar2_train.config.schema import SFTConfig, StageConfig
from rstar2_train.data import DataOrder, load_rows
from rstar2_train.modeling import bootstrap_chat
from rstar2_train.stage import StageRun

logger = logging.getLogger(__name__)


class BadExampleError(ValueError):
    """A transcript that cannot be trained on; names the example."""


def transcript_messages(example: ChatExample, config: SFTConfig) -> list[Message]:
    """The example as template messages, with the RL user prompt when ``math_prompt`` is set."""
    messages = ChatProtocol.to_messages(example.messages)
    if config.math_prompt:
        for index, message in enumerate(messages):
            if message["role"] == "user":
                messages[index] = {**message, "content": user_prompt(str(message["content"]))}
                break
    return messages


def encode_examples(
    examples: Sequence[ChatExample],
    chat: ChatProtocol,
    config: SFTConfig,
) -> list[TokenSequence]:
    """Encode every transcript; bad ones stop the stage or are skipped and counted."""
    sequences: list[TokenSequence] = []
    skipped: Counter[str] = Counter()
    for example in examples:
        try:
            encoded = encode_transcript(
                chat,
                transcript_messages(example, config),
                tool_output_chars=config.tool_output_chars,
            )
            if len(encoded.ids) > config.max_seq_len:
                raise BadExampleError(
                    f"{len(encoded.ids)} tokens, over sft.max_seq_len={config.max_seq_len}"
                )
        except (TranscriptError, BadExampleError) as error:
            if config.on_bad_example == "error":
                raise BadExampleError(f"example {example.id!r}: {error}") from None
            skipped[type(error).__name__ if isinstance(error, TranscriptError) else "too_long"] += 1
            continue
        sequences.append(TokenSequence(ids=encoded.ids, mask=encoded.loss_mask))
    if skipped:
        logger.warning("skipped %d transcripts: %s", sum(skipped.values()), dict(skipped))
    if not sequences:
        raise BadExampleError("no transcript could be encoded")
    return sequences


def nll_loss(total_tokens: int) -> LossFn:
    """Mean negative log-likelihood over the ``total_tokens`` trained tokens of a step."""

    def loss(
        index: int, batch: MicroBatch, logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        del index
        summed = -(logprobs * batch.mask).sum()
        return summed / total_tokens, {"train/loss": float(summed.detach()) / max(batch.tokens, 1)}

    return loss


class SFTTrainer:
    """Runs an SFT stage (``kind: sft``)."""

    def __init__(self, run: StageRun) -> None:
        self.run = run
        self.config: StageConfig = run.config
        assert self.config.sft is not None
        self.sft: SFTConfig = self.config.sft

    def _texts(self, examples: Sequence[ChatExample]) -> Iterator[str]:
        """Transcripts rendered as training sees them, to train a new tokenizer on."""
        training = self.config.tokenizer.train
        assert training is not None
        chat = bootstrap_chat(training)
        limit = training.samples or len(examples)
        for example in examples[:limit]:
            yield chat.render(transcript_messages(example, self.sft), add_generation_prompt=False)

    def train(self) -> Path:
        """Train to the configured length; returns the final checkpoint."""
        run, config, sft = self.run, self.config, self.sft
        examples = load_rows(config.data.train, "chat", run.dir.data)
        tokenizer = run.tokenizer(lambda: self._texts(examples))
        chat = ChatProtocol(tokenizer, config.chat)
        sequences = encode_examples(examples, chat, sft)
        validation = (
            encode_examples(load_rows(config.data.validation, "chat", run.dir.data), chat, sft)
            if config.data.validation is not None
            else []
        )
        total = sft.max_steps or math.ceil((sft.epochs or 1.0) * len(sequences) / sft.batch_size)
        model = run.model(tokenizer)
        actor = Actor(
            model, config.optimizer, config.schedule, total_steps=total, precision=run.precision
        )
        order = DataOrder(len(sequences), seed=config.seed, shuffle=config.data.shuffle)
        run.restore(actor, tokenizer, order)
        pad = int(tokenizer.pad_token_id or 0)
        logger.info(
            "SFT: %d transcripts (%d trained tokens), %d steps of %d",
            len(sequences),
            sum(sum(s.mask) for s in sequences),
            total,
            sft.batch_size,
        )
        run.reporter.start(f"sft {config.name}", total, run.start_step)
        for step in range(run.start_step + 1, total + 1):
            started = time.perf_counter()
            chosen = [sequences[i] for i in order.take(sft.batch_size)]
            batches = micro_batches(
                chosen, sft.micro_batch_tokens, packing=sft.packing, pad_id=pad, device=actor.device
            )
            tokens = sum(batch.tokens for batch in batches)
            update = actor.update(batches, nll_loss(tokens))
            elapsed = time.perf_counter() - started
            metrics = {
                **update.metrics,
                "actor/grad_norm": update.grad_norm,
                "actor/lr": update.lr,
                "actor/skipped_steps": float(update.skipped),
                "data/epoch": order.consumed / len(sequences),
                "train/tokens": float(tokens),
                "time/step_s": elapsed,
                "time/tokens_per_s": sum(len(s.ids) for s in chosen) / elapsed,
            }
            due = sft.validation_every is not None and step % sft.validation_every == 0
            if validation and (due or step == total):
                metrics["val/loss"] = self._validation_loss(actor, validation, pad)
            run.after_step(step, total, metrics)
        return run.finish(total)

    def _validation_loss(self, actor: Actor, sequences: list[TokenSequence], pad: int) -> float:
        batches = micro_batches(
            sequences,
            self.sft.micro_batch_tokens,
            packing=self.sft.packing,
            pad_id=pad,
            device=actor.device,
        )
        total, tokens = 0.0, 0
        for logprobs, batch in zip(actor.logprobs(batches, temperature=1.0), batches, strict=True):
            total -= float((logprobs * batch.mask).sum())
            tokens += batch.tokens
        return total / max(tokens, 1)


def train_sft(run: StageRun) -> Path:
    return SFTTrainer(run).train()
