"""The report of which isolation mechanisms are in force (served by /healthz and /v1/info)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class IsolationFeature(BaseModel):
    """One isolation mechanism: whether it is in force, and why not when it is not."""

    model_config = ConfigDict(extra="forbid")

    active: bool
    detail: str = ""


class IsolationReport(BaseModel):
    """Which isolation mechanisms protect each run."""

    model_config = ConfigDict(extra="forbid")

    unprivileged_uid: IsolationFeature = Field(
        description="Runs switch to a per-slot unprivileged uid/gid (needs root)."
    )
    process_limit: IsolationFeature = Field(
        description="RLIMIT_NPROC bounds processes per run (needs the per-slot uid)."
    )
    network_namespace: IsolationFeature = Field(
        description="Runs see a network namespace without usable interfaces."
    )
    private_tmp: IsolationFeature = Field(
        description="Shared writable directories are hidden behind private, root-owned tmpfs."
    )
    run_tmp: IsolationFeature = Field(
        default_factory=lambda: IsolationFeature(active=False, detail="not reported"),
        description="Each run has its own /tmp and /dev/shm, with quotas, freed when it ends.",
    )
    filesystem_root: IsolationFeature = Field(
        default_factory=lambda: IsolationFeature(active=False, detail="not reported"),
        description="Runs start in a read-only root holding only what Python and the preloaded "
        "packages need (the detail lists it), with private /proc, /tmp and /dev/shm.",
    )
    pid_namespace: IsolationFeature = Field(
        default_factory=lambda: IsolationFeature(active=False, detail="not reported"),
        description="Each fork-server and its runs have a PID namespace of their own: a run "
        "sees (in /proc) and can signal only its own processes, never the host's.",
    )
    kernel_fence: IsolationFeature = Field(
        default_factory=lambda: IsolationFeature(active=False, detail="not reported"),
        description="Runs hold no capability (bounding set included), have no_new_privs and a "
        "seccomp filter that refuses namespaces, mounts, ptrace, bpf, perf_event_open, keyrings, "
        "io_uring, modules, kexec, userfaultfd and socket families but AF_UNIX/AF_INET/AF_INET6.",
    )
    subreaper: IsolationFeature = Field(
        description="Orphaned descendants re-parent to the fork-server, which kills and reaps them."
    )
    rlimits: IsolationFeature = Field(
        description="CPU time, address space, file size, open files and core dump limits."
    )

    @classmethod
    def merge(cls, reports: list[IsolationReport]) -> IsolationReport:
        """One report for several fork-servers: a feature is active only where active in all."""
        merged: dict[str, IsolationFeature] = {}
        for name in cls.model_fields:
            features = [getattr(r, name) for r in reports]
            details = sorted({f.detail for f in features if f.detail})
            merged[name] = IsolationFeature(
                active=bool(features) and all(f.active for f in features),
                detail="; ".join(details) if features else "no fork-server running",
            )
        return cls.model_validate(merged)
