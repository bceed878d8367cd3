"""``/metrics`` in Prometheus' text format: gauges and counters from one engine snapshot per
scrape, latency histograms observed as requests finish; a registry per app, so several
servers can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pagedchat.engine.outputs import EngineStats, RequestOutput

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                  0.75, 1.0, 2.5)


class _Snapshot:
    """Yields the engine figures of the snapshot handed to it before each scrape."""

    def __init__(self) -> None:
        self.stats: EngineStats | None = None

    def collect(self):
        if (s := self.stats) is None:
            return
        gauges = {
            "requests_running": ("Requests whose sequences are in the running batch.",
                                 s.num_running),
            "requests_waiting": ("Requests waiting to be scheduled.", s.num_waiting),
            "requests_swapped": ("Requests swapped out to the CPU pool.", s.num_swapped),
            "kv_blocks_total": ("KV cache blocks in the pool.", s.total_blocks),
            "kv_blocks_used": ("KV blocks held by running sequences.", s.used_blocks),
            "kv_blocks_cached": ("Free KV blocks that still hold a cached prefix.",
                                 s.cached_blocks),
            "kv_blocks_free": ("KV blocks on the free list.", s.free_blocks),
            "kv_blocks_used_percent": ("Share of KV blocks held, in percent.",
                                       100.0 * s.used_blocks / max(s.total_blocks, 1)),
            "kv_blocks_cached_percent": ("Share of KV blocks cached and evictable, in percent.",
                                         100.0 * s.cached_blocks / max(s.total_blocks, 1)),
            "kv_blocks_free_percent": ("Share of KV blocks free, in percent.",
                                       100.0 * s.free_blocks / max(s.total_blocks, 1)),
            "kv_blocks_shared": ("KV blocks held by more than one sequence.", s.shared_blocks)}
        counters = {
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.",
                                     s.prefix_queries),
            "prefix_cache_hits": ("Prompt tokens found in the prefix cache.", s.prefix_hits),
            "preemptions": ("Sequence groups preempted for lack of KV blocks.", s.preemptions),
            "spec_decode_draft_tokens": ("Tokens proposed by speculative decoding.",
                                         s.draft_tokens),
            "spec_decode_accepted_tokens": ("Proposed tokens that verification accepted.",
                                            s.accepted_tokens)}
        for kind, figures in ((GaugeMetricFamily, gauges), (CounterMetricFamily, counters)):
            for name, (text, value) in figures.items():
                family = kind(f"pagedchat_{name}", text)
                family.add_metric([], value)
                yield family
        for name, text, label, value in (
                ("kv_cache_dtype_info", "The KV cache's element type in force (1 on its label).",
                 "dtype", s.kv_cache_dtype),
                ("speculative_decoding", "The speculative decoding in force (method=off: none).",
                 "method", s.speculative or "off")):
            info = GaugeMetricFamily(f"pagedchat_{name}", text, labels=[label])
            info.add_metric([value], 1)
            yield info


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._snapshot = _Snapshot()
        self.registry.register(self._snapshot)
        self.ttft = Histogram("pagedchat_time_to_first_token_seconds",
                              "From arrival to the first output token.",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("pagedchat_time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              buckets=_TOKEN_BUCKETS, registry=self.registry)
        self.e2e = Histogram("pagedchat_e2e_request_latency_seconds",
                             "From arrival to the last output token.",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.finished = Counter("pagedchat_requests", "Requests ended, by finish reason.",
                                ["finish_reason"], registry=self.registry)
        self.prompt_tokens = Counter("pagedchat_prompt_tokens", "Prompt tokens received.",
                                     registry=self.registry)
        self.generation_tokens = Counter("pagedchat_generation_tokens",
                                         "Output tokens generated.", registry=self.registry)

    def observe(self, output: RequestOutput) -> None:
        """A finished request's latencies and token counts."""
        m = output.metrics
        longest = max((len(o.token_ids) for o in output.outputs), default=0)
        self.prompt_tokens.inc(len(output.prompt_token_ids))
        self.generation_tokens.inc(sum(len(o.token_ids) for o in output.outputs))
        for o in output.outputs:
            self.finished.labels(o.finish_reason or "abort").inc()
        if m is None or m.first_token_time is None:
            return
        self.ttft.observe(m.first_token_time - m.arrival_time)
        self.e2e.observe(m.last_token_time - m.arrival_time)
        if longest > 1:
            self.tpot.observe((m.last_token_time - m.first_token_time) / (longest - 1))

    def aborted(self, choices: int) -> None:
        self.finished.labels("abort").inc(choices)

    def render(self, stats: EngineStats) -> bytes:
        self._snapshot.stats = stats
        return generate_latest(self.registry)
