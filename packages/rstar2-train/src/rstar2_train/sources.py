"""Whether a stage's model and tokenizer can be loaded, decided without importing torch or
transformers: the command line checks this before loading the trainer (about 12 s of imports
on 2 cores), so a wrong path or an unreachable hub fails in about a second."""

from __future__ import annotations

from pathlib import Path

from rstar2_data.hub import hub_problem, in_hub_cache, unreachable_message
from rstar2_train.config.schema import StageConfig

TOKENIZER_SETTING = "tokenizer.path (or model.path)"


class CheckpointNotFoundError(ValueError):
    """A model or tokenizer path that is neither a checkpoint folder nor a loadable hub id."""


def unreachable_source(
    path: str, what: str, problem: str, setting: str | None
) -> CheckpointNotFoundError:
    hint = (
        f"download it where the hub is reachable and set {setting or what} to its folder "
        "(or into the hub cache: with HF_HUB_OFFLINE=1 the cache is used without trying the hub)"
    )
    return CheckpointNotFoundError(unreachable_message(f"{what} {path!r}", problem, hint))


def check_source(
    path: str, what: str, *, marker: str = "config.json", setting: str | None = None
) -> None:
    """Fail at once, in one line, on a checkpoint that cannot be loaded: a path that can only be
    local (hub ids are ``name`` or ``namespace/name``) must be a folder; a hub id needs the hub
    (probed once) or the file ``marker`` of it in the local hub cache."""
    local = Path(path).expanduser()
    only_local = local.is_absolute() or path.startswith(".") or path.count("/") > 1
    if (only_local or local.exists()) and not local.is_dir():
        raise CheckpointNotFoundError(f"{what} {path!r}: no such checkpoint folder")
    if not local.exists():
        problem = hub_problem()
        if problem is not None and not in_hub_cache(path, marker):
            raise unreachable_source(path, what, problem, setting)


def check_stage_sources(config: StageConfig) -> None:
    """The stage's model and tokenizer can be loaded (local folder, reachable hub or hub
    cache)."""
    model = config.model
    if model.path is not None:
        check_source(model.path, "model.path")
    path = config.tokenizer.path or model.path
    if config.tokenizer.train is None and path is not None:
        check_source(path, "tokenizer", marker="tokenizer_config.json", setting=TOKENIZER_SETTING)
