"""A small byte-level BPE tokenizer trained on the fly (tests and the CPU demo).

Byte-level pre-tokenization and decoding make every string round-trip exactly, which the
append-only token bookkeeping of rollouts relies on; special tokens stay single ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DEFAULT_VOCAB_SIZE = 1024


def build_tokenizer(
    texts: Iterable[str],
    *,
    special_tokens: Sequence[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``texts``.

    ``special_tokens`` get the first ids, in order, and are never split. The same texts and
    arguments give the same tokenizer. ``vocab_size`` counts the 256 byte tokens and the special
    tokens, so it must exceed both together.
    """
    specials = list(special_tokens)
    if len(set(specials)) != len(specials):
        raise ValueError(f"special_tokens has duplicates: {specials}")
    floor = 256 + len(specials)
    if vocab_size <= floor:
        raise ValueError(f"vocab_size must exceed 256 bytes + {len(specials)} specials = {floor}")
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: encoding must not change the text, so decode(encode(t)) == t.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
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
