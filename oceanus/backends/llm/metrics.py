"""The vLLM metric families, as Triton's vLLM backend exports them (labelled `model` and
`version`), plus vLLM's own label `model_name` (the served name), and the gauges routers read
(llm-d, Kubernetes' Gateway API Inference Extension): `vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc` (0..1) and `vllm:lora_requests_info`,
and vLLM v1's prefix-cache counters (in tokens).
They go through the server's custom metric registry, so /metrics exports them beside the nv_*
ones (and `oceanus serve` on its one port)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from oceanus.backends.llm.scheduler import Scheduler, Sequence
from oceanus.core.observability.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    CustomMetricRegistry,
)

_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
_E2E = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]

_ids = itertools.count(1)


def _one_two_five(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `limit` (vLLM's token-count buckets)."""
    out: list[float] = []
    for exponent in itertools.count():
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return out
            out.append(float(value))
    return out


class LlmMetrics:
    FAMILIES: tuple[tuple[str, str, str, list[float] | str | None], ...] = (
        ("vllm:prompt_tokens_total", "Number of prefill tokens processed.", COUNTER, None),
        ("vllm:generation_tokens_total", "Number of generation tokens processed.", COUNTER, None),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            HISTOGRAM,
            _TTFT,
        ),
        (
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            HISTOGRAM,
            _TPOT,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            HISTOGRAM,
            _E2E,
        ),
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            HISTOGRAM,
            "tokens",
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            HISTOGRAM,
            "tokens",
        ),
        ("vllm:num_requests_running", "Number of requests currently running.", GAUGE, None),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", GAUGE, None),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", GAUGE, None),
        # vLLM v1's prefix-cache counters (its `vllm:prefix_cache_queries` and
        # `vllm:prefix_cache_hits`, exported with prometheus_client's `_total`), in tokens.
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            COUNTER,
            None,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            COUNTER,
            None,
        ),
    )
    # vLLM's LoRA gauge: its labels say which adapters run and wait (comma-joined names) and
    # max_lora (model.json max_loras; 0 without LoRA), its value is the time of the last update
    # (as vLLM sets it). One series, the current labels: vLLM keeps every past label set.
    LORA = ("vllm:lora_requests_info", "Running stats on lora requests.")

    def __init__(
        self,
        registry: CustomMetricRegistry,
        model: str,
        version: str,
        served: str | None = None,
        queued: Callable[[], int] = lambda: 0,
    ) -> None:
        """`queued`: the model's requests in the server's queue (the engine has not seen them;
        vLLM counts every request not yet running as waiting, and so do we)."""
        self._queued = queued
        self._owner = registry.owner()
        self._ids: dict[str, int] = {}
        self._prompt = 0
        self._generated = 0
        self._queries = 0
        self._hits = 0
        self._tokens_buckets: list[float] = []
        # vLLM's labels (`engine` is its engine core's index: one here) beside Triton's.
        self._labels = {
            "model": model,
            "version": version,
            "model_name": served or model,
            "engine": "0",
        }
        self._registry_model = model

    def watch(self, engine: Scheduler) -> None:
        """Create the families (token buckets need the engine's max_model_len) and hook in."""
        token_buckets = _one_two_five(engine.max_len)
        for name, description, kind, buckets in self.FAMILIES:
            family_id, metric_id = next(_ids), next(_ids)
            self._owner.new_family(family_id, name, description, kind)
            bounds = token_buckets if isinstance(buckets, str) else buckets
            self._owner.new_metric(metric_id, family_id, self._labels, bounds)
            self._ids[name] = metric_id
        self._lora_family = next(_ids)
        self._owner.new_family(self._lora_family, *self.LORA, GAUGE)
        self._max_lora = str(engine.max_loras if engine.lora_names() is not None else 0)
        self._lora_labels: tuple[str, str] | None = None
        self._engine = engine
        self._lora(engine)
        engine.on_finish = self._finished
        engine.on_step = self._stepped

    def _stepped(self, engine: Scheduler) -> None:
        """After each engine step (engine thread): counters and gauges."""
        counters = engine.counters
        update = self._owner.update
        ids = self._ids
        if counters.prompt_tokens > self._prompt:
            update(
                ids["vllm:prompt_tokens_total"], "increment", counters.prompt_tokens - self._prompt
            )
            self._prompt = counters.prompt_tokens
        if counters.generation_tokens > self._generated:
            added = counters.generation_tokens - self._generated
            update(ids["vllm:generation_tokens_total"], "increment", added)
            self._generated = counters.generation_tokens
        if counters.prefix_cache_queries > self._queries:
            added = counters.prefix_cache_queries - self._queries
            update(ids["vllm:prefix_cache_queries_total"], "increment", added)
            self._queries = counters.prefix_cache_queries
        if counters.prefix_cache_hits > self._hits:
            added = counters.prefix_cache_hits - self._hits
            update(ids["vllm:prefix_cache_hits_total"], "increment", added)
            self._hits = counters.prefix_cache_hits
        update(ids["vllm:num_requests_running"], "set", counters.running)
        update(ids["vllm:num_requests_waiting"], "set", counters.waiting + self._queued())
        usage = counters.reserved_tokens / counters.budget_tokens if counters.budget_tokens else 0
        update(ids["vllm:kv_cache_usage_perc"], "set", usage)
        self._lora(engine)

    def _lora(self, engine: Scheduler) -> None:
        """vllm:lora_requests_info: a new series when the adapters running or waiting change."""
        running, waiting = engine.lora_activity()
        labels = (",".join(running), ",".join(waiting))
        if labels != self._lora_labels:
            if self._lora_labels is not None:
                self._owner.delete_metric(self._ids[self.LORA[0]])
            metric_id = next(_ids)
            lora = {
                "running_lora_adapters": labels[0],
                "waiting_lora_adapters": labels[1],
                "max_lora": self._max_lora,
            }
            self._owner.new_metric(metric_id, self._lora_family, {**self._labels, **lora}, None)
            self._ids[self.LORA[0]] = metric_id
            self._lora_labels = labels
        self._owner.update(self._ids[self.LORA[0]], "set", time.time())

    def _finished(self, seq: Sequence, reason: str) -> None:
        update = self._owner.update
        ids = self._ids
        if seq.first_token_ns:
            ttft = (seq.first_token_ns - seq.arrival_ns) / 1e9
            update(ids["vllm:time_to_first_token_seconds"], "observe", ttft)
        for gap in seq.token_gaps_ns:
            update(ids["vllm:time_per_output_token_seconds"], "observe", gap / 1e9)
        update(ids["vllm:e2e_request_latency_seconds"], "observe", seq.e2e_ns / 1e9)
        update(ids["vllm:request_prompt_tokens"], "observe", len(seq.prompt))
        update(ids["vllm:request_generation_tokens"], "observe", len(seq.generated))
        self._stepped(self._engine)  # the gauges, before the last response leaves

    def close(self) -> None:
        self._owner.close()
