"""The engine's series again under vLLM's names, so vLLM's dashboards and alerts work unchanged.

Same values (nothing is counted twice): at each scrape every `turnout_engine_*` family is read
once (engine_metrics.py) and the ones in the table below are yielded a second time renamed, with
vLLM's `model_name` label (the served model name) and its label spellings. Names and types are those of
vLLM v1's Prometheus logger (vllm/v1/metrics/loggers.py); our histogram buckets stay ours.
The page that merges the stack adds `engine="<address>"`, which is where vLLM puts an engine index.

| turnout | vLLM | type |
| --- | --- | --- |
| `turnout_engine_running_requests` | `vllm:num_requests_running` | gauge |
| `turnout_engine_waiting_requests` | `vllm:num_requests_waiting` | gauge |
| `turnout_engine_kv_cache_usage_ratio` | `vllm:kv_cache_usage_perc` (0..1, as vLLM's) | gauge |
| `turnout_engine_prompt_tokens_total` | `vllm:prompt_tokens_total` | counter |
| `turnout_engine_generation_tokens_total` | `vllm:generation_tokens_total` | counter |
| `turnout_engine_requests_total{finish_reason}` | `vllm:request_success_total{finished_reason}` | counter |
| `turnout_engine_prefix_cache_queried_tokens_total` | `vllm:prefix_cache_queries_total` | counter |
| `turnout_engine_prefix_cache_hit_tokens_total` | `vllm:prefix_cache_hits_total` | counter |
| `turnout_engine_preemptions_total` | `vllm:num_preemptions_total` | counter |
| `turnout_engine_time_to_first_token_seconds` | `vllm:time_to_first_token_seconds` | histogram |
| `turnout_engine_inter_token_latency_seconds` | `vllm:inter_token_latency_seconds` | histogram |
| | and `vllm:time_per_output_token_seconds` | |
| `turnout_engine_e2e_request_latency_seconds` | `vllm:e2e_request_latency_seconds` | histogram |
| `turnout_engine_queue_time_seconds` | `vllm:request_queue_time_seconds` | histogram |

`vllm:time_per_output_token_seconds` is what vLLM v1 called its per-step inter-token histogram
before naming it `vllm:inter_token_latency_seconds`; older dashboards query the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import Metric

# turnout family name (without _total) -> the vLLM family names it is also exposed as.
VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "turnout_engine_running_requests": ("vllm:num_requests_running",),
    "turnout_engine_waiting_requests": ("vllm:num_requests_waiting",),
    "turnout_engine_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc",),
    "turnout_engine_prompt_tokens": ("vllm:prompt_tokens",),
    "turnout_engine_generation_tokens": ("vllm:generation_tokens",),
    "turnout_engine_requests": ("vllm:request_success",),
    "turnout_engine_prefix_cache_queried_tokens": ("vllm:prefix_cache_queries",),
    "turnout_engine_prefix_cache_hit_tokens": ("vllm:prefix_cache_hits",),
    "turnout_engine_preemptions": ("vllm:num_preemptions",),
    "turnout_engine_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "turnout_engine_inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "turnout_engine_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "turnout_engine_queue_time_seconds": ("vllm:request_queue_time_seconds",),
}
# Our label name -> vLLM's.
VLLM_LABELS = {"finish_reason": "finished_reason"}


def vllm_families(families: Iterable[Metric], model_name: str) -> Iterator[Metric]:
    """The families the table names, renamed, with `model_name`; the others are left out."""
    for family in families:
        for name in VLLM_NAMES.get(family.name, ()):
            yield renamed(family, name, model_name)


def renamed(family: Metric, name: str, model_name: str) -> Metric:
    """A copy of `family` called `name`: sample names keep their suffix (`_total`, `_bucket`, ...)."""
    copy = Metric(name, family.documentation, family.type, family.unit)
    for sample in family.samples:
        labels = {VLLM_LABELS.get(k, k): v for k, v in sample.labels.items()}
        labels["model_name"] = model_name
        copy.samples.append(sample._replace(name=name + sample.name.removeprefix(family.name), labels=labels))
    return copy
