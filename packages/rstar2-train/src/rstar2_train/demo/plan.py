"""What ``rstar2-train demo`` runs: its options, folders, and the stage configs it derives.

The demo runs the shipped ``demo-sft`` and ``demo-rl`` configs (the ones ``rstar2-train stage``
runs) with ``--set`` overrides that point them at the demo's folders; ``--quick`` shrinks the
same configs to a few steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rstar2_eval import EvalSettings
from rstar2_train.config.loader import load_config
from rstar2_train.config.schema import StageConfig

SFT_CONFIG = "demo-sft"
RL_CONFIG = "demo-rl"
SFT_RECIPE = "demo-sft"
RL_RECIPE = "demo"
HELDOUT_RECIPE = "demo-heldout"
ABLATION_SEEDS = 3
ABLATION_STRATEGIES: tuple[str, ...] = ("sample", "none")

# --quick: every stage runs, on a few steps and a small held-out slice (the test suite runs it).
_QUICK_SFT = (
    "sft.max_steps=6",
    "data.train.limit=200",
    "sft.batch_size=8",
    "tokenizer.train.samples=100",
    "checkpoint.every_steps=3",
)
_QUICK_RL = (
    "rl.steps=2",
    "data.train.limit=50",
    "rl.prompts_per_step=4",
    "rl.rollouts_per_prompt=4",
    "rl.roc.keep=2",
    "rl.rollout.max_response_tokens=96",
    "checkpoint.every_steps=1",
)
QUICK_HELDOUT = 8


class DemoOptions(BaseModel):
    """Everything ``rstar2-train demo`` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(default=Path("runs/demo"), description="Where everything is kept.")
    quick: bool = Field(default=False, description="A few steps and a small held-out slice.")
    ablation: bool = Field(
        default=False, description="Also RL with roc sample and none over 3 seeds each."
    )
    ablation_async: bool = Field(
        default=False,
        description="Instead of the demo's RL run: RL synchronous and at max_staleness 1 and 2, "
        "3 seeds each, engine and trainer on disjoint cores.",
    )
    seed: int = Field(default=0, description="Seed of the SFT stage and of the main RL run.")
    rl_steps: int | None = Field(
        default=None, ge=1, description="RL steps of every RL run (None: the config's)."
    )
    progress: bool = Field(default=True, description="Live progress in a terminal.")
    log_every: int | None = Field(
        default=None, ge=1, description="Without a live display: a progress line every N steps."
    )
    eval_samples: int = Field(default=1, ge=1, description="Samples per held-out problem.")


class DemoPaths:
    """The demo's folders under ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.data = out / "data"
        self.sft = out / "sft"
        self.rl = out / "rl"
        self.eval = out / "eval"
        self.ablation = out / "ablation"
        self.summary_json = out / "summary.json"
        self.summary_text = out / "summary.txt"
        self.samples = out / "samples.md"

    def dataset(self, recipe: str) -> Path:
        """Where a recipe's build lives (``rstar2_train.data`` builds recipes there)."""
        return self.data / recipe

    def ablation_run(self, strategy: str, seed: int) -> Path:
        return self.ablation / f"roc-{strategy}-seed{seed}"

    @property
    def ablation_async(self) -> Path:
        return self.out / "ablation-async"

    def async_run(self, arm: str, seed: int) -> Path:
        return self.ablation_async / f"{arm}-seed{seed}"


def sft_config(options: DemoOptions, paths: DemoPaths) -> StageConfig:
    overrides = [
        f"output_dir={paths.sft}",
        f"seed={options.seed}",
        "data.train.recipe=null",
        f"data.train.build={paths.dataset(SFT_RECIPE)}",
    ]
    if options.quick:
        overrides += _QUICK_SFT
    return load_config(SFT_CONFIG, overrides)


def rl_config(
    options: DemoOptions,
    paths: DemoPaths,
    *,
    output: Path | None = None,
    seed: int | None = None,
    strategy: str | None = None,
    overrides: Sequence[str] = (),
) -> StageConfig:
    """demo-rl from the SFT stage's final weights; ``strategy``, ``seed`` and ``overrides``
    for the ablations."""
    settings = [
        f"output_dir={output or paths.rl}",
        f"seed={options.seed if seed is None else seed}",
        f"model.path={paths.sft / 'final'}",
        "data.train.recipe=null",
        f"data.train.build={paths.dataset(RL_RECIPE)}",
    ]
    if strategy is not None:
        settings.append(f"rl.roc.strategy={strategy}")
    if options.quick:
        settings += _QUICK_RL
    if options.rl_steps is not None:
        settings.append(f"rl.steps={options.rl_steps}")
    return load_config(RL_CONFIG, [*settings, *overrides])


def eval_settings(options: DemoOptions, rl: StageConfig) -> EvalSettings:
    """Held-out evaluation at the paper's temperature, with the RL stage's turn and token
    budget and tool settings, so the policy is evaluated as it was trained."""
    assert rl.rl is not None
    rollout = rl.rl.rollout
    return EvalSettings(
        samples=options.eval_samples,
        temperature=0.6,
        max_tokens=rollout.max_response_tokens,
        max_turns=rollout.max_turns,
        seed=options.seed,
        limit=QUICK_HELDOUT if options.quick else None,
        tool_timeout_s=rollout.tool_timeout_s,
        tool_output_chars=rollout.tool_output_chars,
    )
