"""Reading KV-cache and queue statistics from an inference server's Prometheus ``/metrics``.

vLLM (``vllm:kv_cache_usage_perc``, ``vllm:num_requests_running``/``_waiting``,
``vllm:num_preemptions_total``, ``vllm:cache_config_info{num_gpu_blocks, block_size}``) and SGLang
(``sglang:token_usage``, ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:max_total_num_tokens``) are understood. Several engines behind one server add up.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from rstar2_scheduler.engine import KVStats

# Sample name -> statistic it holds. Older vLLM names the usage gpu_cache_usage_perc.
_SAMPLES = {
    "vllm:kv_cache_usage_perc": "usage",
    "vllm:gpu_cache_usage_perc": "usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions_total": "preemptions",
    "sglang:token_usage": "usage",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:max_total_num_tokens": "capacity",
}


def parse_kv_metrics(text: str, *, capacity_tokens: int | None = None) -> KVStats | None:
    """KV statistics from a Prometheus text page; None when it holds no KV usage.

    ``capacity_tokens`` is used when the page does not give the cache size. With several engines
    (label ``engine``) the usage is averaged and the counts are summed.
    """
    values: dict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    values["capacity"].append(float(int(blocks) * int(size)))
            elif sample.name in _SAMPLES:
                values[_SAMPLES[sample.name]].append(float(sample.value))
    if not values["usage"]:
        return None
    capacity = int(sum(values["capacity"])) if values["capacity"] else capacity_tokens or 0
    usage = sum(values["usage"]) / len(values["usage"])
    return KVStats(
        capacity_tokens=capacity,
        used_tokens=round(min(1.0, max(0.0, usage)) * capacity),
        running=int(sum(values["running"])),
        waiting=int(sum(values["waiting"])),
        preemptions=int(sum(values["preemptions"])),
    )
