"""``rstar2-train demo``: data -> SFT -> GRPO-RoC -> held-out evaluation -> before/after table.

Every step is the machinery a user runs by hand: rstar2-data recipes (built as a stage builds
them), ``run_stage`` on the shipped ``demo-sft`` and ``demo-rl`` configs, and rstar2-eval's
``run_evaluation`` (``rstar2-eval run --model``) on each final checkpoint. Re-running with the
same ``out`` skips what is finished and resumes what was interrupted: stages from their newest
checkpoint, evaluations from the samples already written.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

import rstar2_train.demo.staleness as staleness
from rstar2_eval import (
    Grader,
    GraderConfig,
    ProblemSet,
    RunOptions,
    ScoredSample,
    load_problem_sets,
)
from rstar2_eval import run_evaluation as eval_run
from rstar2_train.checkpoint import STATE_FILE, read_state
from rstar2_train.config.loader import dump_config
from rstar2_train.config.schema import DataSource, StageConfig
from rstar2_train.data import load_rows
from rstar2_train.demo.plan import (
    ABLATION_SEEDS,
    ABLATION_STRATEGIES,
    HELDOUT_RECIPE,
    RL_RECIPE,
    SFT_RECIPE,
    DemoOptions,
    DemoPaths,
    eval_settings,
    rl_config,
    sft_config,
)
from rstar2_train.demo.report import (
    AblationResult,
    AblationRun,
    DemoSummary,
    PhaseTime,
    earlier_invocations,
    mean_of,
    metric_mean,
    print_summary,
    reward_trend,
    write_samples,
    write_summary,
)
from rstar2_train.demo.scores import HeldOutScores, held_out_scores
from rstar2_train.demo.staleness import AsyncAblationResult
from rstar2_train.progress import Reporter
from rstar2_train.progress_log import stage_reporter
from rstar2_train.run_dir import RunDir, RunError
from rstar2_train.runner import run_stage

logger = logging.getLogger(__name__)

HELDOUT_SET = "heldout"


def _finished(config: StageConfig) -> bool:
    final = RunDir(config.output_dir).final
    return (final / STATE_FILE).is_file() and read_state(final).finished


class _Clock:
    """Wall time per phase of this invocation, with the load average beside it."""

    def __init__(self) -> None:
        self.started_at = datetime.now(UTC)
        self.started = time.perf_counter()
        self.phases: list[PhaseTime] = []

    @contextmanager
    def phase(self, name: str, *, skipped: bool = False) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.phases.append(
            PhaseTime(
                phase=name,
                seconds=time.perf_counter() - started,
                skipped=skipped,
                load_avg_1m=os.getloadavg()[0],
            )
        )

    @property
    def total(self) -> float:
        return time.perf_counter() - self.started


# Defaults that differ from one process to the next by design, not a change of the run.
_PER_PROCESS = (("rl", "sandbox", "executor", "uid_base"),)


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    for path in _PER_PROCESS:
        node: Any = config
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return config


def _same_config(run_dir: RunDir, config: StageConfig) -> bool:
    """Whether the run in ``run_dir`` was started with ``config`` (per-process defaults such as
    the embedded sandbox's uid range aside)."""
    stored = yaml.safe_load(run_dir.config.read_text(encoding="utf-8"))
    return _comparable(stored) == _comparable(yaml.safe_load(dump_config(config)))


class DemoRunner:
    """Runs the demo's phases in order, each skipped when an earlier invocation finished it."""

    def __init__(self, options: DemoOptions, console: Console, results: Console) -> None:
        self.options = options
        self.console = console  # logs and progress
        self.results = results  # the summary
        self.paths = DemoPaths(options.out)
        self.clock = _Clock()
        self.sft = sft_config(options, self.paths)
        self.rl = rl_config(options, self.paths)
        self._step = 0
        self._steps = 4 if options.ablation_async else 6 + (1 if options.ablation else 0)

    def _header(self, text: str) -> None:
        self._step += 1
        title = f"[{self._step}/{self._steps}] {text}"
        # A rule shortens a title it cannot hold; a longer one goes under the rule, wrapped.
        # In a log file a rule would be a line of dashes: the title alone.
        if not self.console.is_terminal:
            self.console.print(Text(title, style="bold"))
        elif cell_len(title) <= self.console.width - 4:
            self.console.rule(Text(title, style="bold"))
        else:
            self.console.rule()
            self.console.print(Text(title, style="bold"))

    def _reporter(self) -> Reporter:
        return stage_reporter(
            self.console, live=self.options.progress, every=self.options.log_every
        )

    def build_data(self) -> None:
        self._header("data: rstar2-data recipes demo-sft, demo (training split), demo-heldout")
        with self.clock.phase("data"):
            data = self.paths.data
            sizes = {
                SFT_RECIPE: len(load_rows(DataSource(recipe=SFT_RECIPE), "chat", data)),
                RL_RECIPE: len(load_rows(DataSource(recipe=RL_RECIPE), "math", data)),
                HELDOUT_RECIPE: len(load_rows(DataSource(recipe=HELDOUT_RECIPE), "math", data)),
            }
            for recipe, rows in sizes.items():
                self.console.print(f"{recipe}: {rows} rows in {self.paths.dataset(recipe)}")

    def train(self, config: StageConfig, label: str) -> Path:
        """Run a stage to its end (resuming it), or skip it when its final weights exist."""
        run_dir = RunDir(config.output_dir)
        final = run_dir.final
        started = run_dir.config.is_file()
        if started and not _same_config(run_dir, config):
            raise RunError(
                f"{run_dir.root} holds a {config.name} run with another config (see "
                f"{run_dir.config}): use another --out, or the same options"
            )
        if _finished(config):
            self.console.print(f"{label}: finished earlier, final weights in {final}")
            with self.clock.phase(label, skipped=True):
                return final
        with self.clock.phase(label):
            # _same_config has checked the config; only per-process defaults may differ.
            return run_stage(
                config, resume=started, allow_changes=started, reporter=self._reporter()
            )

    def evaluate(
        self, checkpoint: Path, name: str, problems: ProblemSet, grader: Grader
    ) -> tuple[HeldOutScores, list[ScoredSample]]:
        """``rstar2-eval run --model CHECKPOINT`` on the held-out split, resumed if interrupted."""
        out = self.paths.eval / name
        with self.clock.phase(f"eval {name}"):
            eval_run(
                RunOptions(
                    model=str(checkpoint),
                    benchmarks=[f"{HELDOUT_SET}={self.paths.dataset(HELDOUT_RECIPE)}"],
                    settings=eval_settings(self.options, self.rl),
                    out=out,
                    engine="transformers",
                    device="cpu",
                    dtype="float32",
                    batch_size=128,
                    grading=GraderConfig(workers=1),
                    progress=self.options.progress,
                ),
                console=self.console,
            )
            return held_out_scores(out, problems, grader, checkpoint=str(checkpoint))

    def run(self) -> DemoSummary:
        options, paths = self.options, self.paths
        self.build_data()
        self._header(f"SFT: {self.sft.name} -> {paths.sft}")
        sft_final = self.train(self.sft, "sft")
        self._header(f"RL: {self.rl.name} (GRPO-RoC) -> {paths.rl}")
        rl_final = self.train(self.rl, "rl")
        (problems,) = load_problem_sets([f"{HELDOUT_SET}={paths.dataset(HELDOUT_RECIPE)}"])
        problems = problems.head(eval_settings(options, self.rl).limit)
        with Grader(GraderConfig(workers=1)) as grader:
            self._header("evaluation: rstar2-eval run --model sft/final on the held-out split")
            sft_scores, _ = self.evaluate(sft_final, "sft", problems, grader)
            self._header("evaluation: rstar2-eval run --model rl/final on the held-out split")
            rl_scores, rl_samples = self.evaluate(rl_final, "rl", problems, grader)
            write_samples(paths.samples, rl_samples, problems.problems)
            ablation = self.ablation(problems, grader) if options.ablation else None
        self._header("summary")
        first, last = reward_trend(paths.rl)
        summary = DemoSummary(
            quick=options.quick,
            seed=options.seed,
            sft=sft_scores,
            rl=rl_scores,
            rl_reward_first=first,
            rl_reward_last=last,
            started=self.clock.started_at,
            timings=self.clock.phases,
            total_seconds=self.clock.total,
            earlier_invocations=earlier_invocations(paths.summary_json),
            plots=[str(p) for p in self._plots()],
            samples=[str(paths.samples), *(str(p) for p in self._rl_samples())],
            ablation=ablation,
        )
        write_summary(summary, paths.summary_json, paths.summary_text)
        print_summary(summary, self.results)
        self.results.print(f"summary: {paths.summary_json} and {paths.summary_text}")
        return summary

    def ablation(self, problems: ProblemSet, grader: Grader) -> AblationResult:
        """The RL stage with ``roc.strategy`` sample and none over 3 seeds, same budget each."""
        self._header(
            f"ablation: roc.strategy {' vs '.join(ABLATION_STRATEGIES)} over {ABLATION_SEEDS} seeds"
        )
        runs: list[AblationRun] = []
        seeds = [self.options.seed + offset for offset in range(ABLATION_SEEDS)]
        for strategy in ABLATION_STRATEGIES:
            for seed in seeds:
                # The main RL run is the ablation's RoC run at the demo's own seed.
                main = strategy == "sample" and seed == self.options.seed
                run_dir = self.paths.rl if main else self.paths.ablation_run(strategy, seed)
                label = f"{strategy}-seed{seed}"
                config = rl_config(
                    self.options, self.paths, output=run_dir, seed=seed, strategy=strategy
                )
                final = self.train(config, f"rl {label}")
                name = "rl" if main else f"ablation-{label}"
                scores, _ = self.evaluate(final, name, problems, grader)
                runs.append(
                    AblationRun(
                        strategy=strategy,
                        seed=seed,
                        run_dir=str(run_dir),
                        scores=scores,
                        train_tool_error_ratio_kept_positives=metric_mean(
                            run_dir, "tools/error_ratio_kept_positives"
                        ),
                    )
                )
        means = {
            strategy: mean_of(
                [r.scores.tool_error_ratio_correct for r in runs if r.strategy == strategy]
            )
            for strategy in ABLATION_STRATEGIES
        }
        roc, plain = means["sample"], means["none"]
        return AblationResult(
            runs=runs,
            mean_tool_error_ratio_correct=means,
            roc_lower=None if roc is None or plain is None else roc < plain,
        )

    def run_async_ablation(self) -> AsyncAblationResult:
        """Data and SFT as the demo builds them, then the RL stage synchronous and at each
        max_staleness over 3 seeds (``demo/staleness.py``), each run's checkpoints evaluated on
        the held-out split; the result in ``ablation-async.json`` and ``.txt``."""
        options, paths = self.options, self.paths
        trainer_cores, engine_cores = staleness.cores()
        self.build_data()
        self._header(f"SFT: {self.sft.name} -> {paths.sft}")
        sft_final = self.train(self.sft, "sft")
        seeds = [options.seed + offset for offset in range(staleness.SEEDS)]
        arms = [(arm, seed) for seed in seeds for arm in staleness.ARMS]
        self._header(
            f"RL: synchronous and max_staleness {', '.join(map(str, staleness.ARMS[1:]))}, "
            f"{len(seeds)} seeds; trainer on cores {trainer_cores}, engine on {engine_cores}"
        )
        for arm, seed in arms:  # seeds outermost: a change of load falls on every arm alike
            name = staleness.arm_name(arm)
            config = rl_config(
                options,
                paths,
                output=paths.async_run(name, seed),
                seed=seed,
                overrides=staleness.run_overrides(arm, quick=options.quick),
            )
            label = f"rl {name}-seed{seed}"
            if _finished(config):
                self.train(config, label)  # says so; its load was recorded when it trained
                continue
            with staleness.trainer_pinned(), staleness.measured_load(Path(config.output_dir)):
                self.train(config, label)
        (problems,) = load_problem_sets([f"{HELDOUT_SET}={paths.dataset(HELDOUT_RECIPE)}"])
        problems = problems.head(eval_settings(options, self.rl).limit)
        every = staleness.QUICK_EVAL_EVERY if options.quick else staleness.EVAL_EVERY
        self._header(f"evaluation: the SFT checkpoint and every {every}th step of each run")
        runs = []
        with Grader(GraderConfig(workers=1)) as grader:
            start, _ = self.evaluate(sft_final, "sft", problems, grader)
            for arm, seed in arms:
                name = staleness.arm_name(arm)
                run_dir = paths.async_run(name, seed)
                accuracy = {0: start.accuracy}
                for step, checkpoint in staleness.evaluated_steps(run_dir, every):
                    scores, _ = self.evaluate(
                        checkpoint, f"async-{name}-seed{seed}-step{step}", problems, grader
                    )
                    accuracy[step] = scores.accuracy
                runs.append(staleness.run_record(run_dir, arm, seed, accuracy))
        self._header("summary")
        result = staleness.summarize(runs, trainer=trainer_cores, engine=engine_cores)
        plot = staleness.plot_curves(result, paths.ablation_async / "accuracy_vs_wallclock.png")
        result = result.model_copy(update={"plot": None if plot is None else str(plot)})
        staleness.write_result(result, paths.ablation_async)
        staleness.print_result(result, self.results)
        return result

    def _plots(self) -> list[Path]:
        found = [*sorted((self.paths.sft / "plots").glob("*.png"))]
        found += sorted((self.paths.rl / "plots").glob("*.png"))
        found += sorted(self.paths.eval.glob("*/*.png"))
        return found

    def _rl_samples(self) -> list[Path]:
        steps = sorted((self.paths.rl / "samples").glob("step-*.md"))
        return steps[-1:]


def _runner(options: DemoOptions, console: Console | None, results: Console | None) -> DemoRunner:
    return DemoRunner(options, console or Console(stderr=True), results or Console())


def run_demo(
    options: DemoOptions, *, console: Console | None = None, results: Console | None = None
) -> DemoSummary:
    """Run (or resume) the whole demo, logging and showing progress on ``console`` (stderr)
    and printing the summary on ``results`` (stdout); returns what it printed."""
    return _runner(options, console, results).run()


def run_async_ablation(
    options: DemoOptions, *, console: Console | None = None, results: Console | None = None
) -> AsyncAblationResult:
    """Run (or resume) ``demo --ablation-async`` like :func:`run_demo`; returns what it
    printed."""
    return _runner(options, console, results).run_async_ablation()
