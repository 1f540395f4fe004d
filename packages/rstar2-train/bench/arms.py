"""What the benchmark compares: runs of one framework in one setting, paired into arms.

An arm is one rstar2 run setting against one TRL run setting. Arms that share a setting share
its runs (``equal@1`` and ``all-groups@1`` measure TRL once), so every setting runs once per
round however many arms name it.

Both sides run their update on torch's default intra-op threads (2 on a 2-core machine); an arm
sets the threads of generation only: the rstar2 engine's forward steps
(``rl.engines.torch_threads``) and TRL's ``model.generate``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Framework = Literal["rstar2", "trl"]


class RunSpec(BaseModel):
    """One framework in one setting: every run of it in a round trains the same way."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    framework: Framework
    generation_threads: int = Field(ge=1, description="torch threads while generating.")
    all_groups: bool = Field(
        default=False,
        description="rstar2: train all-equal groups too (advantage 0), as TRL does, instead of "
        "dropping them (the trainer's behaviour).",
    )
    shared_prefix: bool = Field(
        default=True, description="rstar2: rl.shared_prefix (the prompt runs once per group)."
    )

    @property
    def label(self) -> str:
        parts = [self.framework, f"gen {self.generation_threads}t"]
        if self.all_groups:
            parts.append("all-groups")
        if not self.shared_prefix:
            parts.append("unshared")
        return " ".join(parts)


class Arm(BaseModel):
    """An rstar2 setting against a TRL setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    rstar2: RunSpec
    trl: RunSpec


ARM_KINDS = {
    "equal": "both generators on N threads",
    "all-groups": "as equal, and rstar2 also trains all-equal groups (advantage 0), as TRL does",
    "unshared": "as equal, with rstar2's rl.shared_prefix=false (every rollout recomputes its "
    "prompt in padded rows, as TRL's do)",
    "as-is": "rstar2's engine on tiny-rl's rl.engines.torch_threads, TRL's generation on "
    "torch's default threads (the benchmark before it set them equal; takes no @N)",
}


def parse_arm(text: str, *, threads: int, as_is: tuple[int, int]) -> Arm:
    """``KIND`` or ``KIND@N`` (N: generation threads, default ``threads``) as an ``Arm``.

    ``as_is`` is (rstar2's, TRL's) generation threads for the ``as-is`` arm.
    """
    kind, at, count = text.partition("@")
    if kind not in ARM_KINDS:
        raise ValueError(f"arm {text!r}: unknown kind {kind!r}; expected one of {list(ARM_KINDS)}")
    if at and kind == "as-is":
        raise ValueError(f"arm {text!r}: as-is takes its threads from the defaults, not @N")
    if at:
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"arm {text!r}: N after @ must be a positive integer, got {count!r}")
        threads = int(count)
    if kind == "as-is":
        return Arm(
            name=kind,
            rstar2=RunSpec(framework="rstar2", generation_threads=as_is[0]),
            trl=RunSpec(framework="trl", generation_threads=as_is[1]),
        )
    return Arm(
        name=f"{kind}@{threads}",
        rstar2=RunSpec(
            framework="rstar2",
            generation_threads=threads,
            all_groups=kind == "all-groups",
            shared_prefix=kind != "unshared",
        ),
        trl=RunSpec(framework="trl", generation_threads=threads),
    )


def distinct_runs(arms: list[Arm]) -> list[RunSpec]:
    """Every setting the arms name, once, in the order they first appear."""
    runs: list[RunSpec] = []
    for arm in arms:
        for spec in (arm.rstar2, arm.trl):
            if spec not in runs:
                runs.append(spec)
    return runs
