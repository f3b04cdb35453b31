"""`/metrics` in the Prometheus text format (prometheus_client, on a registry of its own so two
servers in one process, as in tests, never share counters).

tau is derived from two counters: (verify_steps + accepted_drafts) / verify_steps is the mean
tokens per target forward, each step's accepted drafts plus its bonus token. Per slot j,
slot_accepted / slot_reached is the acceptance rate of the j-th draft given the ones before it.
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# seconds; TTFT on a CPU tiny model is milliseconds, on a real model and a long queue seconds
_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self):
        # the *_created series (each counter's creation time) double the page for nothing a
        # dashboard reads; the switch is process-wide, and the server process is ours
        disable_created_metrics()
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "domino_graft_"
        self.requests = Counter(p + "requests", "Requests finished, by outcome", ["outcome"], registry=r)
        self.http_errors = Counter(p + "http_errors", "Requests refused, by HTTP status", ["status"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated", registry=r)
        self.verify_steps = Counter(p + "verify_steps", "Speculative verify steps (one per row per block)", registry=r)
        self.accepted_drafts = Counter(p + "accepted_drafts", "Draft tokens accepted", registry=r)
        self.slot_reached = Counter(p + "slot_reached", "Blocks whose draft slot j was verified", ["slot"],
                                    registry=r)
        self.slot_accepted = Counter(p + "slot_accepted", "Blocks whose draft slot j was accepted", ["slot"],
                                     registry=r)
        self.tau = Gauge(p + "tau", "Mean tokens per verify step since start (accepted drafts + 1)", registry=r)
        self.batch_size = Gauge(p + "batch_size", "Rows decoding now", registry=r)
        self.queue_depth = Gauge(p + "queue_depth", "Requests waiting for a row", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token", buckets=_TTFT,
                              registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Mean time per token after the first",
                              buckets=_TPOT, registry=r)
        self._steps = self._accepted = 0

    def observe_steps(self, accepted: list[int], k: int) -> None:
        """One verify step per entry (accepted drafts of one row in one block); k: the drafts the
        block verified (K, or the verify budget's K'; 0 for a plain target step)."""
        if not accepted:
            return
        self.verify_steps.inc(len(accepted))
        self.accepted_drafts.inc(sum(accepted))
        self._steps += len(accepted)
        self._accepted += sum(accepted)
        self.tau.set((self._steps + self._accepted) / self._steps)
        for j in range(k):
            reached = sum(1 for a in accepted if a >= j)
            if reached:
                self.slot_reached.labels(slot=str(j + 1)).inc(reached)
                self.slot_accepted.labels(slot=str(j + 1)).inc(sum(1 for a in accepted if a > j))

    def observe_job(self, job) -> None:
        self.requests.labels(outcome=job.finish_reason or "unknown").inc()
        self.prompt_tokens.inc(len(job.prompt_ids))
        self.generation_tokens.inc(len(job.tokens))
        if job.first_token is not None:
            self.ttft.observe(job.first_token - job.arrived)
            if len(job.tokens) > 1 and job.last_token is not None:
                self.tpot.observe((job.last_token - job.first_token) / (len(job.tokens) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
