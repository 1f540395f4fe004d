"""A tiny checkpoint whose greedy rollouts call the tool and answer: overfitted on demo transcripts.

A random model only produces garbage, so "same answers" comparisons would be trivially true. This
one is trained for a few seconds on two demo SFT transcripts, rendered exactly as rollouts render
them (rstar2's chat template, the rollout's token layout, tool output formatted by
``ToolOutputFormatter``), until greedy decoding reproduces every trained token. Its greedy
rollouts on those two problems call the tool, read the sandbox's real output and box the answer.

It is saved the way rstar2-train saves checkpoints: ``save_pretrained`` of a Qwen2 model and of a
tokenizer with rstar2's chat template installed. The training ids come from the tokenizer as
``AutoTokenizer`` loads it back from the checkpoint, because that is the tokenizer every engine
uses at evaluation (it is not the class that was saved: see ``make_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rstar2_data import build_tokenizer, parse_recipe
from rstar2_data.build import build
from rstar2_data.demo import demo_transcripts
from rstar2_data.schemas import ChatExample
from rstar2_scheduler.protocol import (
    SPECIAL_TOKENS,
    ChatProtocol,
    Message,
    ToolOutputFormatter,
    encode_transcript,
    install_chat_template,
    user_prompt,
)

EOS = "<|endoftext|>"
DEMO_SEED = 11
DEMO_PROBLEMS = 2
DEMO_RECIPE = f"""
name: eval-demo
description: The problems the tiny checkpoint was trained on.
kind: math
seed: {DEMO_SEED}
sources:
  - name: demo
    synthetic: demo
    demo:
      n: {DEMO_PROBLEMS}
output:
  format: jsonl
"""


def _messages(example_messages: list[Message]) -> list[Message]:
    """A transcript's messages with the user turn worded as rollouts word it."""
    first = example_messages[0]
    return [{**first, "content": user_prompt(first["content"])}, *example_messages[1:]]


def build_demo_set(out_dir: Path) -> Path:
    """The trained problems as an rstar2-data build directory (``demo=DIR`` in --benchmarks)."""
    build(parse_recipe(DEMO_RECIPE, base_dir=out_dir, origin="eval-demo"), out_dir, progress=False)
    return out_dir


def _examples() -> list[ChatExample]:
    return demo_transcripts(
        DEMO_PROBLEMS,
        seed=DEMO_SEED,
        failure_share=0.0,
        tool_response=ToolOutputFormatter().format_execution,
    )


def _tokenizer(special_markers: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on rendered demo transcripts, with rstar2's template;
    ``special_markers`` are added as special tokens (as some checkpoints hold their tags)."""
    formatter = ToolOutputFormatter()
    specials = [EOS, *SPECIAL_TOKENS]
    bootstrap = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(["bootstrap"], special_tokens=specials, vocab_size=300)
    )
    render = ChatProtocol(bootstrap)
    corpus = demo_transcripts(24, seed=7, tool_response=formatter.format_execution) + _examples()
    texts = [
        render.render(_messages(render.to_messages(e.messages)), add_generation_prompt=False)
        for e in corpus
    ]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(texts, special_tokens=specials, vocab_size=700),
        eos_token=EOS,
        pad_token=EOS,
    )
    tokenizer.add_tokens(
        [AddedToken(marker, special=True, normalized=False) for marker in special_markers],
        special_tokens=True,
    )
    install_chat_template(tokenizer)
    return tokenizer


def _config(tokenizer: PreTrainedTokenizerFast, hidden_size: int = 128) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def random_checkpoint(out_dir: Path, *, special_markers: Sequence[str] = ()) -> Path:
    """A checkpoint with random weights (seeded) and the same kind of tokenizer, saved as
    ``make_checkpoint`` saves: for testing servers, whose answers need not make sense."""
    tokenizer = _tokenizer(special_markers)
    config = _config(tokenizer, hidden_size=32)
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    return out_dir


def make_checkpoint(out_dir: Path, *, max_steps: int = 400) -> Path:
    """Train and save the checkpoint; raises if greedy decoding does not reproduce the data."""
    examples = _examples()
    tokenizer = _tokenizer()
    config = _config(tokenizer)
    # AutoTokenizer picks the tokenizer class from config.json's model type (Qwen2's splits
    # digits one by one): save both first, then encode the data with what loads back.
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    reloaded = AutoTokenizer.from_pretrained(out_dir)
    chat = ChatProtocol(reloaded)
    encoded = [encode_transcript(chat, _messages(chat.to_messages(e.messages))) for e in examples]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    width = max(len(e.ids) for e in encoded)
    ids = torch.full((len(encoded), width), int(reloaded.pad_token_id))
    labels = torch.full_like(ids, -100)
    attention = torch.zeros_like(ids)
    for row, example in enumerate(encoded):
        n = len(example.ids)
        ids[row, :n] = torch.tensor(example.ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor(
            [t if m else -100 for t, m in zip(example.ids, example.loss_mask, strict=True)]
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # One thread: on a small shared machine, two contend with everything else (3x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step in range(max_steps):
            model.train()
            loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 9 and _reproduces(model, ids, attention, labels):
                break
        else:
            raise RuntimeError(
                f"the tiny model did not memorize its transcripts in {max_steps} steps"
            )
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(out_dir)
    return out_dir


@torch.inference_mode()
def _reproduces(
    model: Qwen2ForCausalLM, ids: torch.Tensor, attention: torch.Tensor, labels: torch.Tensor
) -> bool:
    """Whether greedy decoding predicts every trained token of the transcripts."""
    model.eval()
    predicted = model(input_ids=ids, attention_mask=attention).logits[:, :-1].argmax(-1)
    targets = labels[:, 1:]
    return bool(((predicted == targets) | (targets == -100)).all())
