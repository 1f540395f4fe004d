"""Loading stage configs: shipped names or YAML files, ``extends:`` chains and ``--set`` overrides.

A config file may name another in ``extends:`` (a shipped config name, or a path relative to the
file) and override any of its keys: mappings merge key by key, everything else (lists included)
is replaced, and ``null`` clears an inherited value (e.g. ``recipe: null`` next to a new
``build:``). ``--set a.b.c=VALUE`` overrides apply last; VALUE is read as YAML (``3``, ``true``,
``[a, b]``, ``null``). Every problem is reported with its key path and what was expected.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rstar2_data.errors import describe_yaml_error
from rstar2_train.config.schema import StageConfig

SHIPPED = files("rstar2_train").joinpath("configs")
_MAX_EXTENDS = 16


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names each bad key and what was expected."""


def shipped_configs() -> dict[str, str]:
    """Shipped config names -> their first description line."""
    out: dict[str, str] = {}
    for entry in sorted(SHIPPED.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text(encoding="utf-8")) or {}
            out[entry.name.removesuffix(".yaml")] = str(data.get("description", "")).strip()
    return out


def _locate(name_or_path: str, base: Path | None) -> tuple[str, Path | None]:
    """The YAML text of a config, and its folder (None for a shipped config)."""
    path = Path(name_or_path)
    if base is not None and not path.is_absolute():
        path = base / path
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        return path.read_text(encoding="utf-8"), path.resolve().parent
    entry = SHIPPED.joinpath(f"{name_or_path}.yaml")
    if not entry.is_file():
        known = ", ".join(shipped_configs())
        raise ConfigError(
            f"{name_or_path!r} is neither a config file nor a shipped config ({known})"
        )
    return entry.read_text(encoding="utf-8"), None


def _read(name_or_path: str, base: Path | None, chain: list[str]) -> dict[str, Any]:
    if len(chain) > _MAX_EXTENDS or name_or_path in chain:
        raise ConfigError(f"extends chain loops or is too deep: {' -> '.join(chain)}")
    text, folder = _locate(name_or_path, base)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{name_or_path}: not valid YAML: {describe_yaml_error(error)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name_or_path}: expected a mapping of keys, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"{name_or_path}: extends must be a config name or path")
    return merge(_read(parent, folder, [*chain, name_or_path]), data)


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings merge recursively, other values replace."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(assignment: str) -> dict[str, Any]:
    """``a.b=VALUE`` as the nested mapping ``{"a": {"b": VALUE}}`` (VALUE read as YAML)."""
    key, sep, raw = assignment.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(f"`overrides` {assignment!r}: expected KEY.PATH=VALUE, e.g. rl.steps=10")
    try:
        value: Any = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(
            f"`overrides` {assignment!r}: the value is not valid YAML: {describe_yaml_error(error)}"
        ) from None
    for part in reversed(parts):
        value = {part: value}
    return value  # type: ignore[no-any-return]  # built as a dict by the loop


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The pydantic model that owns the key at ``loc`` (for listing its valid keys)."""
    model: type[BaseModel] = StageConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        annotation = field.annotation
        candidates = getattr(annotation, "__args__", (annotation,))
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def describe(error: ValidationError) -> str:
    """Every problem as ``key.path: what is wrong (got VALUE)``, on one line."""
    lines = []
    for problem in error.errors():
        loc = [part for part in problem["loc"] if not str(part).startswith("function-")]
        path = ".".join(str(part) for part in loc) or "(top level)"
        if problem["type"] == "extra_forbidden":
            owner = _model_at(loc[:-1])
            known = list(owner.model_fields) if owner is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"{path}: unknown key{hint} (valid keys: {', '.join(known)})")
            continue
        message = problem["msg"].removeprefix("Value error, ")
        got = problem.get("input")
        shown = "" if isinstance(got, dict) or problem["type"] == "missing" else f" (got {got!r})"
        lines.append(f"{path}: {message}{shown}")
    return "; ".join(lines)


def _leaf_keys(value: Any, prefix: str) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [key for k, v in value.items() for key in _leaf_keys(v, f"{prefix}.{k}")]
    return [prefix]


def _check_kind_sections(name: str, data: Mapping[str, Any]) -> None:
    """Settings of the other kind's section (``rl.*`` on an SFT stage), named key by key
    (validating them would report the section's required fields instead)."""
    kind = data.get("kind")
    if not isinstance(kind, str):
        return
    other = {"sft": "rl", "rl": "sft"}.get(kind)
    if other is None or data.get(other) is None:
        return
    keys = _leaf_keys(data[other], other)
    shown = ", ".join(keys[:5]) + (f" (and {len(keys) - 5} more)" if len(keys) > 5 else "")
    raise ConfigError(
        f"{name}: {shown}: not settings of an {kind.upper()} stage (kind: {kind}); {other}.* "
        f"settings belong to kind {other} configs"
    )


def load_config(name_or_path: str, overrides: Sequence[str] = ()) -> StageConfig:
    """A validated stage config from a shipped name or a YAML file, with ``overrides``
    (``KEY.PATH=VALUE``, as ``--set`` takes them)."""
    data = _read(name_or_path, None, [])
    for assignment in overrides:
        data = merge(data, parse_override(assignment))
    _check_kind_sections(name_or_path, data)
    try:
        return StageConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(f"{name_or_path}: invalid config: {describe(error)}") from None


def dump_config(config: StageConfig) -> str:
    """The resolved config as YAML (every default spelled out), loadable by ``load_config``."""
    data = config.model_dump(mode="json")
    if data.get("rl") is not None:
        del data["rl"]["rollout"]["chat"]  # the top-level chat section is the one source
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
