"""Periodic validation of the policy during RL, through rstar2-eval's ``evaluate``.

Validation runs on the trainer's own engines (which hold the weights just synced), sandbox and
grading (grader actors too, when the stage is placed on Ray): the same code path as
``rstar2-eval run``, so a validation figure and a later offline evaluation of the checkpoint at
the same settings agree.
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from rstar2_eval import (
    EvalSettings,
    InputError,
    ModelInfo,
    ProblemSet,
    evaluate,
    load_problem_sets,
)
from rstar2_scheduler import ChatConfig, RolloutConfig
from rstar2_train.config.schema import ValidationConfig
from rstar2_train.rl.resources import RolloutResources

logger = logging.getLogger(__name__)

METRIC_PREFIX = "val/"


class Validator:
    """Evaluates the policy on the configured problem sets at the configured steps."""

    def __init__(
        self,
        config: ValidationConfig,
        rollout: RolloutConfig,
        *,
        seed: int,
        total_steps: int,
        out_dir: Path,
    ) -> None:
        self.config = config
        self.total_steps = total_steps
        self.out_dir = out_dir
        # Loaded up front so that an unknown benchmark or a bad file stops the stage before
        # any training, not after the first `every_steps` steps.
        try:
            self.problem_sets: list[ProblemSet] = load_problem_sets(
                config.benchmarks, Path(config.data_dir) if config.data_dir is not None else None
            )
        except InputError as error:
            origin = "rl.validation.benchmarks" if error.origin == "benchmarks" else error.origin
            raise ValueError(str(InputError(origin, error.message, line=error.line))) from None
        self.settings = EvalSettings(
            samples=config.samples,
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_response_tokens or rollout.max_response_tokens,
            max_turns=config.max_turns or rollout.max_turns,
            seed=seed,
            limit=config.limit,
            tool_timeout_s=rollout.tool_timeout_s,
            tool_memory_mb=rollout.tool_memory_mb,
            tool_output_chars=rollout.tool_output_chars,
        )

    def due(self, step: int) -> bool:
        """Whether validation runs after ``step`` (0: before the first step)."""
        if step == 0:
            return self.config.at_start
        every = self.config.every_steps
        return step == self.total_steps or (every is not None and step % every == 0)

    async def run(
        self,
        step: int,
        *,
        resources: RolloutResources,
        tokenizer: PreTrainedTokenizerBase,
        chat: ChatConfig,
        label: str,
    ) -> dict[str, float]:
        """Evaluate the engines' current weights; ``val/<set>/<metric>`` figures.

        Outputs go to ``validation/step-NNNNNN``; a stage killed during validation resumes it
        there without regenerating finished samples.
        """
        report = await evaluate(
            resources.engines,
            tokenizer,
            resources.sandbox,
            resources.grader,
            self.problem_sets,
            self.settings,
            chat=chat,
            model=ModelInfo(kind="engines", name=label, revision=f"step {step}"),
            out_dir=self.out_dir / f"step-{step:06d}",
            plot=False,
        )
        metrics = report.metrics(METRIC_PREFIX)
        logger.info(
            "validation at step %d: %s",
            step,
            ", ".join(
                f"{s.benchmark} avg@{s.min_samples} {s.avg:.3f}" for s in report.score.benchmarks
            ),
        )
        return metrics
