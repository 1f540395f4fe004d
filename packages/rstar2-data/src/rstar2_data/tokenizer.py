"""A small byte-level BPE tokenizer trained on the fly (tests and the CPU demo).

Byte-level pre-tokenization and decoding make every string round-trip exactly, which the
append-only token bookkeeping of rollouts relies on; special tokens stay single ids.

Two options trade generality for short sequences on a narrow corpus such as the demo's, where
sequence length is most of the cost of training on a CPU: ``pre_split="lines"`` lets merges span
whole lines (the fixed system prompt, tool schema and solver programs become a few tokens each)
instead of stopping at word boundaries, and ``split_digits`` makes every digit its own token, so
a number is spelled the same way wherever it appears and copying it is learnable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DEFAULT_VOCAB_SIZE = 1024
PreSplit = Literal["words", "lines"]


def build_tokenizer(
    texts: Iterable[str],
    *,
    special_tokens: Sequence[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    pre_split: PreSplit = "words",
    split_digits: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts``.

    ``special_tokens`` get the first ids, in order, and are never split. The same texts and
    arguments give the same tokenizer. ``vocab_size`` counts the 256 byte tokens and the special
    tokens, so it must exceed both together. ``pre_split``: ``words`` (GPT-2's word regex:
    merges stay inside words) or ``lines`` (only newlines split: merges may span a line);
    ``split_digits``: one token per digit.
    """
    if pre_split not in ("words", "lines"):
        raise ValueError(f"pre_split must be 'words' or 'lines', got {pre_split!r}")
    specials = list(special_tokens)
    if len(set(specials)) != len(specials):
        raise ValueError(f"special_tokens has duplicates: {specials}")
    floor = 256 + len(specials)
    if vocab_size <= floor:
        raise ValueError(f"vocab_size must exceed 256 bytes + {len(specials)} specials = {floor}")
    tokenizer = Tokenizer(models.BPE())
    pieces: list[pre_tokenizers.PreTokenizer] = []
    if pre_split == "lines":
        pieces.append(pre_tokenizers.Split("\n", behavior="isolated"))
    if split_digits:
        pieces.append(pre_tokenizers.Digits(individual_digits=True))
    # No prefix space: encoding must not change the text, so decode(encode(t)) == t.
    pieces.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre_split == "words"))
    tokenizer.pre_tokenizer = pieces[0] if len(pieces) == 1 else pre_tokenizers.Sequence(pieces)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer
