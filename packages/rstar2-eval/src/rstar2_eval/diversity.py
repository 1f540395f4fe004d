"""Whether the k samples of a problem really differ: a check on the engine, not on the model.

At temperature > 0, two samples of a reasoning response almost never coincide. When the samples
of (nearly) every problem are identical, the engine decoded greedily (``transformers serve``
ignores the temperature unless sampling is switched on), and avg@k, pass@k and maj@k were
computed over copies of one sample. ``check_diversity`` finds that and names the likely cause.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval.scoring import ScoredSample
from rstar2_eval.settings import EvalSettings
from rstar2_scheduler.engine import Engine
from rstar2_scheduler.engines.openai_dialect import ServerCapabilities

IDENTICAL_SHARE = 0.9
"""Share of problems with identical samples from which the samples count as collapsed."""


class SampleDiversity(BaseModel):
    """How many problems got k identical samples, and whether that is a finding."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expected: bool = Field(description="Samples should differ: k > 1 and temperature > 0.")
    problems: int = Field(description="Problems with at least two samples.")
    identical: int = Field(description="Of those, problems whose samples are all the same text.")
    collapsed: bool = Field(
        description=f"Samples should differ, yet those of at least {IDENTICAL_SHARE:.0%} of the "
        "problems are identical: the metrics were computed over copies."
    )
    cause: str | None = Field(default=None, description="The likely cause, when collapsed.")
    accepted: bool = Field(
        default=False, description="The run was told to accept it (--allow-identical-samples)."
    )

    def message(self) -> str:
        """The warning for the log, the terminal and run.json readers."""
        return (
            f"{self.identical} of {self.problems} problems with several samples got "
            "identical samples at temperature > 0: avg@k, pass@k and maj@k were computed over "
            f"copies of one sample. Likely cause: {self.cause}"
        )


def check_diversity(
    samples: Sequence[ScoredSample],
    settings: EvalSettings,
    engines: Sequence[Engine],
    *,
    accepted: bool = False,
) -> SampleDiversity:
    """Count the problems whose samples are all the same response text."""
    responses: dict[tuple[str, str], list[str]] = defaultdict(list)
    for sample in samples:
        generation = sample.generation
        responses[(generation.benchmark, generation.problem_id)].append(generation.response)
    several = [texts for texts in responses.values() if len(texts) > 1]
    identical = sum(len(set(texts)) == 1 for texts in several)
    expected = settings.samples > 1 and settings.temperature > 0
    collapsed = expected and bool(several) and identical >= IDENTICAL_SHARE * len(several)
    return SampleDiversity(
        expected=expected,
        problems=len(several),
        identical=identical,
        collapsed=collapsed,
        cause=_likely_cause(engines, settings.temperature) if collapsed else None,
        accepted=accepted,
    )


def _likely_cause(engines: Sequence[Engine], temperature: float) -> str:
    causes: list[str] = []
    for engine in engines:
        server = getattr(engine, "server_capabilities", None)  # OpenAI-compatible servers
        if not isinstance(server, ServerCapabilities):
            continue
        if server.sampling_switch == "generation_config":
            causes.append(
                f"{server.url} was asked to sample through its generation_config (do_sample) "
                "and still answered with copies: check the server's log and version"
            )
        elif not server.extension_fields:
            causes.append(
                f"{server.url} takes no sampling switch besides temperature (it refused the "
                "extension fields and generation_config); servers such as transformers serve "
                "then decode greedily unless the checkpoint's generation_config.json sets "
                '"do_sample": true'
            )
        else:
            causes.append(f"{server.url} may ignore the temperature")
    causes.append(
        f"or the model is (nearly) deterministic at temperature {temperature:g} (a tiny or "
        "overfitted model, very short answers)"
    )
    return "; ".join(causes)
