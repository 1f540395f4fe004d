"""Configuration of the executor pool and of each fork-server it starts."""

from __future__ import annotations

import importlib.util
import os

from pydantic import BaseModel, ConfigDict, Field

# Preloaded by default when installed: what a math model's tool code imports most.
DEFAULT_PRELOAD_CANDIDATES = ("numpy", "sympy", "scipy")


def default_preload() -> list[str]:
    """The default preload list: whichever of numpy, sympy and scipy are importable."""
    return [name for name in DEFAULT_PRELOAD_CANDIDATES if importlib.util.find_spec(name)]


def default_servers() -> int:
    """One fork-server per usable core."""
    return max(1, len(os.sched_getaffinity(0)))


def default_uid_base() -> int:
    """A per-process uid range so two pools on one host never kill each other's runs."""
    return (1 << 20) + (os.getpid() % (1 << 21)) * 1024


class ExecutorSettings(BaseModel):
    """How many fork-servers and slots to run, what they preload and which limits they apply."""

    model_config = ConfigDict(extra="forbid")

    servers: int = Field(default_factory=default_servers, ge=1, le=256, description="Fork-servers.")
    slots: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Concurrent runs per tier over its fork-servers (default: 4 per server).",
    )
    preload: list[str] = Field(
        default_factory=default_preload, description="Modules each fork-server imports up front."
    )
    lean_tier: bool = Field(
        default=True,
        description="Also run fork-servers without preloads for code importing only the stdlib.",
    )
    isolate: bool = Field(
        default=True,
        description="Try uid drop, network and mount namespaces (each reported when inactive).",
    )
    uid_base: int = Field(
        default_factory=default_uid_base,
        ge=1000,
        lt=(1 << 32) - 4096,
        description="First unprivileged uid/gid; slot i runs as uid_base + i.",
    )
    max_processes: int = Field(
        default=64, ge=1, description="RLIMIT_NPROC per run (with the per-slot uid)."
    )
    max_open_files: int = Field(default=1024, ge=16, description="RLIMIT_NOFILE per run.")
    max_file_bytes: int = Field(
        default=64 << 20, ge=0, description="RLIMIT_FSIZE: largest file a run may write."
    )
    tmp_size_mb: int = Field(
        default=256,
        ge=1,
        description="Quota of each run's own /tmp, its working directory included (tmpfs, MiB).",
    )
    shm_size_mb: int = Field(
        default=64,
        ge=1,
        description="Quota of each run's own /dev/shm (multiprocessing, shared memory; MiB).",
    )

    @property
    def total_slots(self) -> int:
        """Concurrent runs over the whole pool."""
        # Several runs per fork-server overlap one child's run with the next fork.
        return self.slots if self.slots is not None else 4 * self.servers


class ForkServerConfig(BaseModel):
    """What one fork-server is told at start (sent over its control pipe, not its environment)."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0)
    slot_uids: list[int] = Field(min_length=1)
    settings: ExecutorSettings
    sys_path: list[str]
    parent_pid: int
