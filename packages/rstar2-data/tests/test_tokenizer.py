"""The on-the-fly tokenizer round-trips any text, keeps special tokens whole, is deterministic."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from rstar2_data import build_tokenizer
from rstar2_data.demo import demo_transcripts

SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return [m.content for ex in demo_transcripts(60, seed=3) for m in ex.messages]


@pytest.fixture(scope="module")
def tokenizer(corpus: list[str]) -> Tokenizer:
    return build_tokenizer(corpus, special_tokens=SPECIALS, vocab_size=600)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids_in_order(tokenizer: Tokenizer) -> None:
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    text = "<|im_start|>user\nCompute 2+2<|im_end|><tool_call>{}</tool_call>"
    ids = tokenizer.encode(text).ids
    assert ids[0] == 0
    assert ids.count(1) == 1
    assert 2 in ids
    assert 3 in ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_training_learns_merges_up_to_the_vocab_size(tokenizer: Tokenizer) -> None:
    assert tokenizer.get_vocab_size() == 600
    plain = "The program printed"
    assert len(tokenizer.encode(plain).ids) < len(plain.encode())


def test_same_input_gives_the_same_tokenizer(corpus: list[str], tokenizer: Tokenizer) -> None:
    again = build_tokenizer(corpus, special_tokens=SPECIALS, vocab_size=600)
    assert again.to_str() == tokenizer.to_str()


def test_rejects_a_vocab_too_small_and_duplicate_specials(corpus: list[str]) -> None:
    with pytest.raises(ValueError, match="vocab_size must exceed"):
        build_tokenizer(corpus, special_tokens=SPECIALS, vocab_size=260)
    with pytest.raises(ValueError, match="duplicates"):
        build_tokenizer(corpus, special_tokens=["<a>", "<a>"])


@pytest.fixture(scope="module")
def compact(corpus: list[str]) -> Tokenizer:
    return build_tokenizer(
        corpus, special_tokens=SPECIALS, vocab_size=600, pre_split="lines", split_digits=True
    )


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_lines_and_digit_splitting_still_round_trip(compact: Tokenizer, text: str) -> None:
    ids = compact.encode(text, add_special_tokens=False).ids
    assert compact.decode(ids, skip_special_tokens=False) == text


def test_lines_mode_merges_across_words_and_digits_stay_single(
    corpus: list[str], tokenizer: Tokenizer, compact: Tokenizer
) -> None:
    line = "A sieve of Eratosthenes up to the upper bound counts them quickly."
    assert len(compact.encode(line).ids) < len(tokenizer.encode(line).ids)
    digits = compact.encode("print(123456)").tokens
    assert [t for t in digits if any(c.isdigit() for c in t)] == list("123456")
    assert sum(len(compact.encode(t).ids) for t in corpus) < sum(
        len(tokenizer.encode(t).ids) for t in corpus
    )


def test_rejects_an_unknown_pre_split(corpus: list[str]) -> None:
    with pytest.raises(ValueError, match="pre_split"):
        build_tokenizer(corpus, special_tokens=SPECIALS, pre_split="sentences")  # type: ignore[arg-type]
