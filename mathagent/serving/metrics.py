"""Server metrics in the Prometheus text format (no client library needed for a handful)."""

from __future__ import annotations

import threading
from bisect import bisect_left

from mathagent.serving.engine.sequence import RequestOutput
from mathagent.serving.engine.spec_decode.stats import SpecStats

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ServerMetrics:
    """Counters fed by finished requests; ``render`` gives the ``/metrics`` body."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.requests = {"stop": 0, "length": 0, "abort": 0}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft_counts = [0] * (len(_TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.decode_tokens = 0
        self.decode_seconds = 0.0
        self.target_forwards = 0
        self.spec = SpecStats()  # drafted/accepted over finished speculative requests
        self.running = 0

    def observe(self, out: RequestOutput) -> None:
        """Record a request when it finishes (called from the engine thread)."""
        if not out.finished:
            return
        m = out.metrics
        with self._lock:
            reason = out.finish_reason or "abort"
            self.requests[reason] = self.requests.get(reason, 0) + 1
            self.prompt_tokens += m.prompt_tokens
            self.generation_tokens += m.generated_tokens
            self.target_forwards += m.target_forwards
            if m.speculative is not None:
                self.spec.merge(m.speculative)
            if m.ttft_s is not None:
                self.ttft_counts[bisect_left(_TTFT_BUCKETS, m.ttft_s)] += 1
                self.ttft_sum += m.ttft_s
            if m.decode_s and m.generated_tokens > 1:
                self.decode_tokens += m.generated_tokens - 1
                self.decode_seconds += m.decode_s

    def render(self) -> str:
        """Prometheus exposition text."""
        label = f'model_name="{self.model_name}"'
        with self._lock:
            lines = [
                "# HELP mathagent_requests_total Finished requests by finish reason.",
                "# TYPE mathagent_requests_total counter",
                *(
                    f'mathagent_requests_total{{{label},finish_reason="{r}"}} {n}'
                    for r, n in sorted(self.requests.items())
                ),
                "# TYPE mathagent_prompt_tokens_total counter",
                f"mathagent_prompt_tokens_total{{{label}}} {self.prompt_tokens}",
                "# TYPE mathagent_generation_tokens_total counter",
                f"mathagent_generation_tokens_total{{{label}}} {self.generation_tokens}",
                "# HELP mathagent_time_to_first_token_seconds Arrival to first generated token.",
                "# TYPE mathagent_time_to_first_token_seconds histogram",
                *self._histogram("mathagent_time_to_first_token_seconds", label),
                "# HELP mathagent_decode_tokens_per_second Mean per-request decode speed.",
                "# TYPE mathagent_decode_tokens_per_second gauge",
                f"mathagent_decode_tokens_per_second{{{label}}} {self._decode_tps():.3f}",
                "# HELP mathagent_acceptance_length Generated tokens per target forward.",
                "# TYPE mathagent_acceptance_length gauge",
                f"mathagent_acceptance_length{{{label}}} {self._acceptance():.3f}",
                *self.spec.prometheus(label),
            ]
        return "\n".join(lines) + "\n"

    def _histogram(self, name: str, label: str) -> list[str]:
        lines, total = [], 0
        for bound, count in zip((*_TTFT_BUCKETS, float("inf")), self.ttft_counts, strict=True):
            total += count
            le = "+Inf" if bound == float("inf") else f"{bound}"
            lines.append(f'{name}_bucket{{{label},le="{le}"}} {total}')
        lines.append(f"{name}_sum{{{label}}} {self.ttft_sum:.6f}")
        lines.append(f"{name}_count{{{label}}} {total}")
        return lines

    def _decode_tps(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def _acceptance(self) -> float:
        return self.generation_tokens / self.target_forwards if self.target_forwards else 1.0
