"""Peak memory and time of ``selective_log_softmax`` against the naive full log-softmax, and
with ``--head HIDDEN`` of ``fused_linear_logprobs`` (LM head + log-softmax, chunked) against the
unfused head (full logits, then the log-softmax).

Memory: each variant runs once in a fresh subprocess, so one variant's allocations cannot hide
another's peak. Peak extra memory is the high-water mark of the resident set during the call
minus the resident set just before it (inputs already built), read from /proc/self/status after
resetting the mark through /proc/self/clear_refs; where that reset is unavailable,
``ru_maxrss`` is used (inputs are filled in place, so they leave no earlier, higher peak).
Time: one more subprocess alternates the variants round by round after a warm-up round, so that
load from other processes hits both alike; the reported ratio is the median of per-round ratios.
Values of the two variants are compared. A case whose estimated footprint does not fit in the
available memory is skipped and reported as such.

    python packages/rstar2-algo/bench/bench.py                       # 8 x 512 and 8 x 4096
    python packages/rstar2-algo/bench/bench.py --seq-lens 1024 --dtypes float32 --backward
    python packages/rstar2-algo/bench/bench.py --head 1024 --seq-lens 128 --backward
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from rstar2_algo import fused_linear_logprobs, selective_log_softmax

QWEN_VOCAB = 151_936
GIB = 1 << 30
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOGITS_VARIANTS = ("naive", "chunked")  # order matters: the ratio is the second over the first
HEAD_VARIANTS = ("unfused", "fused")
PROCESS_OVERHEAD = 1 * GIB  # interpreter, torch libraries, the chunked variant's chunks


def naive(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The textbook reference: a float32 log-softmax over the whole vocabulary, then gather."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def chunked(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return selective_log_softmax(logits, ids)


def unfused(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The LM head over every position, then the chunked log-softmax of its logits (what a
    trainer without a fused head runs)."""
    return selective_log_softmax(torch.nn.functional.linear(hidden, weight), ids)


def fused(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return fused_linear_logprobs(hidden, weight, ids).logprobs


FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "naive": naive,
    "chunked": chunked,
    "unfused": unfused,
    "fused": fused,
}


def call(
    variant: str, inputs: list[torch.Tensor], ids: torch.Tensor, backward: bool
) -> torch.Tensor:
    """Forward only (as for old log-probs), or forward and backward to every input (training:
    the logits, or the hidden states and the head)."""
    function = FUNCTIONS[variant]
    if not backward:
        with torch.no_grad():
            return function(*inputs, ids)
    leaves = [tensor.detach().requires_grad_() for tensor in inputs]
    out = function(*leaves, ids)
    out.sum().backward()
    return out.detach()


# --------------------------------------------------------------------------- child process


def _status_kib(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{key} not in /proc/self/status")
    return int(match.group(1))


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _make_inputs(
    tokens: int, vocab: int, dtype: torch.dtype, hidden: int | None
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Logits ``[tokens, vocab]``; or with ``hidden``, hidden states ``[tokens, hidden]`` and a
    head ``[vocab, hidden]`` scaled so the logits have the same spread."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (tokens,), generator=generator)
    if hidden is not None:
        states = torch.randn(tokens, hidden, generator=generator).to(dtype)
        weight = (torch.randn(vocab, hidden, generator=generator) * 3 / hidden**0.5).to(dtype)
        return [states, weight], ids
    logits = torch.empty(tokens, vocab, dtype=dtype)
    for start in range(0, tokens, 256):  # in place, row block by row block: no big temporary
        logits[start : start + 256].normal_(0.0, 3.0, generator=generator)
    return [logits], ids


def child_memory(
    variant: str, inputs: list[torch.Tensor], ids: torch.Tensor, backward: bool
) -> dict[str, object]:
    """Peak resident memory of one call beyond what the inputs already occupy."""
    before_kib = _status_kib("VmRSS")
    if _reset_peak():
        result = call(variant, inputs, ids, backward)
        peak_kib = _status_kib("VmHWM")
    else:
        before_kib = max(before_kib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        result = call(variant, inputs, ids, backward)
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"extra_bytes": (peak_kib - before_kib) * 1024, "values": result.tolist()}


def child_time(
    variants: list[str],
    inputs: list[torch.Tensor],
    ids: torch.Tensor,
    backward: bool,
    repeats: int,
) -> dict[str, object]:
    """Alternate the variants round by round, so machine load hits both alike; the first round
    is a warm-up and is not timed."""
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_ in range(repeats + 1):
        for variant in variants:
            start = time.perf_counter()
            call(variant, inputs, ids, backward)
            if round_:
                times[variant].append(time.perf_counter() - start)
    return {"times": times}


# --------------------------------------------------------------------------- parent process


@dataclass
class Case:
    tokens: int
    vocab: int
    dtype: str
    backward: bool
    hidden: int | None = None
    """The fused-head comparison with this hidden size; None: the log-softmax of logits."""

    @property
    def variants(self) -> tuple[str, str]:
        return LOGITS_VARIANTS if self.hidden is None else HEAD_VARIANTS

    def label(self, batch: int) -> str:
        mode = "fwd+bwd" if self.backward else "fwd"
        head = "" if self.hidden is None else f" | head {self.hidden}"
        return f"{batch} x {self.tokens // batch}{head} | {self.dtype} | {mode}"


def _available_bytes() -> int:
    text = Path("/proc/meminfo").read_text()
    match = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else 0


def _estimated_bytes(variant: str, case: Case) -> int:
    elements = case.tokens * case.vocab
    size = torch.empty((), dtype=DTYPES[case.dtype]).element_size()
    if case.hidden is not None:
        head = (case.tokens + case.vocab) * case.hidden * size * (2 if case.backward else 1)
        # Unfused: the logits (and their gradient) in the input dtype, a float32 chunk at most.
        logits = 0 if variant == "fused" else elements * size * (2 if case.backward else 1)
        return head + logits + PROCESS_OVERHEAD
    inputs = elements * size
    if variant == "chunked":
        # Chunks stay small; backward adds the gradient, in the logits' dtype.
        return (2 if case.backward else 1) * inputs + PROCESS_OVERHEAD
    # The float32 log-softmax, plus the float32 copy of non-float32 logits; backward keeps the
    # log-softmax and adds a float32 gradient and its cast to the logits' dtype.
    float_copies = (1 if case.dtype == "float32" else 2) + (2 if case.backward else 0)
    return inputs + float_copies * elements * 4 + PROCESS_OVERHEAD


def _fits(variant: str, case: Case) -> str | None:
    needed, available = _estimated_bytes(variant, case), _available_bytes()
    if needed > 0.9 * available:
        return f"skipped: needs ~{needed / GIB:.1f} GiB, {available / GIB:.1f} GiB available"
    return None


def _run_child(case: Case, task: list[str], repeats: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, __file__, "--child", *task, "--tokens", str(case.tokens)]
        command += ["--vocab", str(case.vocab), "--dtypes", case.dtype]
        command += [] if case.hidden is None else ["--head", str(case.hidden)]
        command += ["--repeats", str(repeats), "--out", str(out)]
        command += ["--backward"] if case.backward else []
        completed = subprocess.run(command, check=False, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"exit {completed.returncode}: {completed.stderr.strip()[-300:]}")
        result: dict[str, object] = json.loads(out.read_text())
        return result


def bench_case(case: Case, batch: int, repeats: int) -> None:
    variants = case.variants
    skipped = {variant: _fits(variant, case) for variant in variants}
    runnable = [variant for variant in variants if skipped[variant] is None]
    memory = {v: _run_child(case, ["memory", v], 0) for v in runnable}
    timing = _run_child(case, ["time", *runnable], repeats)["times"] if runnable else {}
    assert isinstance(timing, dict)
    medians = {v: statistics.median(timing[v]) for v in runnable}
    for variant in variants:
        if skipped[variant]:
            print(f"| {case.label(batch)} | {variant} | - | - | {skipped[variant]} |")
            continue
        extra = memory[variant]["extra_bytes"]
        assert isinstance(extra, int)
        print(f"| {case.label(batch)} | {variant} | {extra / GIB:.2f} | {medians[variant]:.3f} | |")
    if len(runnable) < len(variants):
        return
    naive_extra, ours_extra = (memory[v]["extra_bytes"] for v in variants)
    assert isinstance(naive_extra, int)
    assert isinstance(ours_extra, int)
    ratios = [c / n for n, c in zip(timing[variants[0]], timing[variants[1]], strict=True)]
    values = [torch.tensor(memory[v]["values"]) for v in variants]
    difference = (values[0] - values[1]).abs().max().item()
    # Same ops on the same logits: equal to 1e-5. A head chunked or not rounds its matmul
    # differently: equal to float32's relative precision of the values.
    scale = 1.0 if case.hidden is None else max(1.0, values[0].abs().max().item())
    verdict = "agree" if difference <= 1e-5 * scale else "DISAGREE"
    print(
        f"| {case.label(batch)} | ratio | {naive_extra / max(ours_extra, 1):.1f}x lower "
        f"| x{statistics.median(ratios):.2f} time | max abs diff {difference:.1e} ({verdict}) |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up")
    parser.add_argument("--backward", action="store_true", help="also time forward+backward")
    parser.add_argument(
        "--head",
        type=int,
        default=None,
        metavar="HIDDEN",
        help="compare the fused LM head with the unfused one at this hidden size (Qwen3-0.6B: "
        "1024) instead of the log-softmax of given logits",
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        inputs, ids = _make_inputs(args.tokens, args.vocab, DTYPES[args.dtypes[0]], args.head)
        task, *variants = args.child
        if task == "memory":
            result = child_memory(variants[0], inputs, ids, args.backward)
        else:
            result = child_time(variants, inputs, ids, args.backward, args.repeats)
        args.out.write_text(json.dumps(result))
        return

    what = (
        "selective_log_softmax vs naive log_softmax+gather"
        if args.head is None
        else "fused_linear_logprobs vs unfused head + selective_log_softmax"
    )
    print(
        f"{what}: vocab {args.vocab}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    print("| batch x seq | dtype | pass | variant | peak extra GiB | median s | note |")
    print("|---|---|---|---|---|---|---|")
    for seq_len in args.seq_lens:
        for dtype in args.dtypes:
            for backward in [False, True] if args.backward else [False]:
                case = Case(args.batch * seq_len, args.vocab, dtype, backward, args.head)
                bench_case(case, args.batch, args.repeats)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
