"""rstar2's chat template and the tags of the agent protocol.

One template (``chat_template.jinja``) renders SFT transcripts (assistant messages with
structured ``tool_calls``, ``tool`` messages), RL rollouts (raw assistant text) and evaluation
prompts, so training and evaluation see the same text.
"""

from __future__ import annotations

from importlib.resources import files

from transformers import PreTrainedTokenizerBase

TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (TURN_START, TURN_END)

REASON_OPEN = "<reason>"
REASON_CLOSE = "</reason>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

CHAT_TEMPLATE: str = (
    files("rstar2_scheduler.protocol").joinpath("chat_template.jinja").read_text("utf-8")
)


def user_prompt(problem: str) -> str:
    """The user turn for one problem: the statement and how to present the answer.

    SFT data must wrap its user messages with this too, so that training and rollouts match.
    """
    return (
        f"{problem}\n\nPut the final answer inside {ANSWER_OPEN} {ANSWER_CLOSE}, with the final "
        "result in \\boxed{}."
    )


def install_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Set rstar2's template on ``tokenizer``, replacing any it ships (e.g. before saving it).

    The turn markers must be single tokens of the vocabulary: the end-of-turn marker is the stop
    token of every assistant turn.
    """
    vocab = tokenizer.get_vocab()
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(
            f"tokenizer lacks the chat template's special tokens {missing}; add them with "
            "tokenizer.add_special_tokens and resize the model's embeddings"
        )
    tokenizer.chat_template = CHAT_TEMPLATE
