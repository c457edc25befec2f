"""The LLM serving model: a continuous-batching server (vLLM) per replica, driven by tokens.

Why: an LLM server is not one queue with a smooth knee. It runs *iterations*: each decodes one
token of every running request and spends what is left of a token budget on waiting prompts
(chunked prefill); more requests in the batch give more throughput for a slightly longer
iteration, until the KV cache, the batch or the token budget is full, and then requests wait.
The model follows vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``: running requests
first, then waiting prompts up to ``max_num_batched_tokens``) in a fluid, per-tick form.

Per replica, with ``lam`` requests/s of mean prompt ``P`` and output ``O`` tokens
(:class:`ServerProfile` holds the constants):

* **Iteration time** ``T = t0 + t1 * b + p * c`` for ``b`` decoding requests and ``c`` prefill
  tokens. In steady state ``c = lam * P * T`` and ``b = lam * O * T`` (Little's law), so
  ``T = t0 / (1 - lam * a)`` with ``a = O * t1 + P * p``: flat at low load, growing as the
  GPU fills.
* **Capacity** ``mu``: the largest ``lam`` that keeps ``b`` within the batch limit
  ``b_max = min(max_num_seqs, kv_tokens / (P + O))`` and ``b + c`` within the token budget:
  ``mu = min(b_max / (O t0 + b_max a), B / ((P + O) t0 + B a))``.
* **Queueing once full** (the fluid backlog of :mod:`.queueing`): ``Q <- max(0, Q + (offered -
  R mu) dt)`` requests over ``R`` Running replicas, at most ``R mu timeout``; every request of
  the tick first waits ``W = Q / (R mu)``. Saturated (a backlog, or ``lam >= mu``), the
  replica runs at ``lam = mu``.
* **Per request** ``(P_i, O_i)`` (drawn from the trace's requests, or the service's mean tokens
  for a load without them): time to first token ``TTFT = W + (P_i p + ceil(P_i / (B - b))
  (t0 + t1 b)) / (1 - u)``, its prompt's chunks sharing the prefill budget with the other
  prompts (processor sharing at the prefill share ``u = lam P p``); time per output token
  ``TPOT = T (1 + jitter E)`` (``E`` a standard exponential: iterations differ with the prompts
  they carry); end to end ``TTFT + (O_i - 1) TPOT``. Each at most ``timeout_ms``; no Running
  replica: every request times out.

The events the controllers see carry one of the three (``metric``; TPOT by default, because
a P99 objective of a few hundred milliseconds, as in the shipped policies, is one a TPOT can
meet on this server, while the code trace's longest prompts alone take longer than that to
prefill). :class:`LlmServer` keeps the three per tick for the figures.

Calibration (docs/scenarios.md cites each): Llama-3.1-8B-Instruct in BF16 on one A100 under
vLLM's OpenAI server defaults (``max_num_batched_tokens`` 2048 and ``max_num_seqs`` 256 on an
A100, ``vllm/engine/arg_utils.py``); decode 75 tokens/s for one request and 6.6x that at 8
(a published vLLM sweep on A100): ``t0 = 13.3 ms``, ``t1 = 0.40 ms``; a KV cache of 380,000
tokens (vLLM's start-up log for Llama-3-8B, 11.12 GiB = 91k tokens on a 40 GB A100, scaled to
the 80 GB card's memory); prefill ``p = 0.086 ms`` per prompt token (2 x 8.03 GFLOP per token
at 60% of the A100's 312 TFLOPS: derived, not measured).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from controller.offline.models.queueing import DEFAULT_PEAK_PER_REPLICA, ServiceModel

__all__ = [
    "DEFAULT_MEAN_TOKENS",
    "DEFAULT_SERVING_STARTUP_S",
    "METRICS",
    "Iteration",
    "LlmServer",
    "LlmServing",
    "Metric",
    "ServerProfile",
    "TokenMix",
    "capacity_rps",
    "mix_of",
]

Metric = Literal["ttft", "tpot", "e2e"]
METRICS: Final[tuple[Metric, ...]] = ("ttft", "tpot", "e2e")
#: (prompt, output) tokens of a request when the load has none: the calibration sweep's shape.
DEFAULT_MEAN_TOKENS: Final = (1024, 128)
#: Pod start-up of an LLM server (image pull, weight load, CUDA graphs): minutes.
DEFAULT_SERVING_STARTUP_S: Final = 180.0


@dataclass(frozen=True, slots=True)
class ServerProfile:
    """One replica's constants (module docstring: calibration)."""

    decode_base_ms: float = 13.3
    """``t0``: an iteration with one request decoding."""
    decode_per_request_ms: float = 0.40
    """``t1``: what each more request in the batch adds to an iteration."""
    prefill_per_token_ms: float = 0.086
    """``p``: an iteration's time per prompt token it prefills."""
    kv_cache_tokens: int = 380_000
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    jitter: float = 0.15
    timeout_ms: float = 30_000.0


@dataclass(frozen=True, slots=True)
class TokenMix:
    """The requests' (prompt, output) tokens: a trace's, or one mean pair."""

    pairs: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("a token mix needs at least one (prompt, output) pair")

    @property
    def mean_prompt(self) -> float:
        return sum(p for p, _ in self.pairs) / len(self.pairs)

    @property
    def mean_output(self) -> float:
        return sum(o for _, o in self.pairs) / len(self.pairs)

    def draw(self, rng: random.Random, n: int) -> list[tuple[int, int]]:
        """``n`` requests' tokens (uniformly from the pairs; no draw from a single pair)."""
        if len(self.pairs) == 1:
            return [self.pairs[0]] * n
        return [self.pairs[rng.randrange(len(self.pairs))] for _ in range(n)]


def capacity_rps(profile: ServerProfile, prompt: float, output: float) -> float:
    """``mu``: requests/s one replica serves before requests queue (module docstring)."""
    s = profile
    t0 = s.decode_base_ms / 1000.0
    a = (output * s.decode_per_request_ms + prompt * s.prefill_per_token_ms) / 1000.0
    b_max = min(float(s.max_num_seqs), s.kv_cache_tokens / max(1.0, prompt + output))
    budget = float(s.max_num_batched_tokens)
    return min(b_max / (output * t0 + b_max * a), budget / ((prompt + output) * t0 + budget * a))


@dataclass(frozen=True, slots=True)
class LlmServing:
    """The serving model's settings for a run: one server profile and token mix for every
    service, the metric the controllers see, the load's scale."""

    tokens: TokenMix = field(default_factory=lambda: TokenMix((DEFAULT_MEAN_TOKENS,)))
    profile: ServerProfile = ServerProfile()
    metric: Metric = "tpot"
    trace_rps: float | None = None
    """The load's own peak rate (a trace's); ``None``: the peak is relative to capacity."""

    def model(self, key: str, *, initial_replicas: int) -> ServiceModel:
        """The service's load and capacity: ``per_replica_rps`` is ``mu`` at the mix's mean
        tokens; the peak is the trace's own rate, else 1.25 x the starting replicas'
        capacity (the runner multiplies it by ``--load-scale``)."""
        mu = capacity_rps(self.profile, self.tokens.mean_prompt, self.tokens.mean_output)
        peak = self.trace_rps
        if peak is None:
            peak = DEFAULT_PEAK_PER_REPLICA * mu * max(1, initial_replicas)
        prompt = round(self.tokens.mean_prompt)
        output = max(1, round(self.tokens.mean_output))
        idle = dict(zip(METRICS, Iteration.at(self, 0.0).latency(prompt, output, 0.0), strict=True))
        return ServiceModel(
            key=key,
            peak_rps=peak,
            per_replica_rps=mu,
            base_ms=idle[self.metric],
            jitter=self.profile.jitter,
            timeout_ms=self.profile.timeout_ms,
        )

    def server(self, model: ServiceModel, rng: random.Random) -> LlmServer:
        return LlmServer(self, model, rng)


@dataclass(frozen=True, slots=True)
class Iteration:
    """One replica's iterations at ``lam`` requests/s (module docstring), and what a request
    of given tokens sees behind a wait of ``wait_s``."""

    profile: ServerProfile
    step_ms: float
    """``T``: the mean iteration, which is each output token's time."""
    batch: float
    share: float
    """``u``: the prefill's share of the GPU."""
    wait_s: float = 0.0

    @classmethod
    def at(cls, serving: LlmServing, lam: float, wait_s: float = 0.0) -> Iteration:
        s, mix = serving.profile, serving.tokens
        a = mix.mean_output * s.decode_per_request_ms + mix.mean_prompt * s.prefill_per_token_ms
        step = s.decode_base_ms / max(1e-9, 1.0 - lam * a / 1000.0)
        batch = lam * mix.mean_output * step / 1000.0
        share = min(0.99, lam * mix.mean_prompt * s.prefill_per_token_ms / 1000.0)
        return cls(s, step, batch, share, wait_s)

    def latency(self, prompt: int, output: int, e: float) -> tuple[float, float, float]:
        """(TTFT, TPOT, end to end) in ms of a request; ``e`` its exponential draw."""
        s, b = self.profile, self.batch
        room = max(1.0, s.max_num_batched_tokens - b)
        chunks = math.ceil(prompt / room) * (s.decode_base_ms + s.decode_per_request_ms * b)
        prefill = (prompt * s.prefill_per_token_ms + chunks) / (1.0 - self.share)
        timeout = s.timeout_ms
        ttft = min(timeout, 1000.0 * self.wait_s + prefill)
        tpot = min(timeout, self.step_ms * (1.0 + s.jitter * e))
        return ttft, tpot, min(timeout, ttft + (output - 1) * tpot)


class LlmServer:
    """One service's replicas over a run (module docstring); the interface of
    :class:`~controller.offline.models.queueing.ServiceQueue`."""

    __slots__ = ("backlog", "e2e", "model", "rho", "rng", "serving", "tpot", "ttft")

    def __init__(self, serving: LlmServing, model: ServiceModel, rng: random.Random) -> None:
        self.serving = serving
        self.model = model
        self.rng = rng
        self.backlog = 0.0
        self.rho = 0.0
        """Offered load over capacity in the last tick (``inf`` without capacity)."""
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.e2e: list[float] = []
        """The last tick's requests' three latencies (ms)."""

    def step(self, *, offered_rps: float, replicas: int, arrivals: int, dt: float) -> list[float]:
        """Advance the backlog by ``dt``; the chosen metric of ``arrivals`` requests."""
        m, timeout = self.model, self.serving.profile.timeout_ms
        requests = self.serving.tokens.draw(self.rng, arrivals)
        draws = [self.rng.expovariate(1.0) for _ in range(arrivals)]
        capacity = replicas * m.per_replica_rps
        if capacity <= 0.0:
            self.rho = math.inf
            self.backlog = 0.0
            self.ttft = self.tpot = self.e2e = [timeout] * arrivals
            return list(self.ttft)
        self.rho = offered_rps / capacity
        limit = capacity * timeout / 1000.0
        self.backlog = min(limit, max(0.0, self.backlog + (offered_rps - capacity) * dt))
        lam = min(offered_rps / replicas, m.per_replica_rps)
        it = Iteration.at(self.serving, lam, self.backlog / capacity)
        rows = [it.latency(p, o, e) for (p, o), e in zip(requests, draws, strict=True)]
        self.ttft = [round(r[0], 1) for r in rows]
        self.tpot = [round(r[1], 1) for r in rows]
        self.e2e = [round(r[2], 1) for r in rows]
        return self.latest(self.serving.metric)

    def latest(self, metric: Metric) -> list[float]:
        """The last tick's requests' ``metric``."""
        return {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}[metric]


def mix_of(pairs: Sequence[tuple[int, int]], mean: tuple[int, int]) -> TokenMix:
    """The trace's pairs, or ``mean`` for a load without token counts."""
    return TokenMix(tuple(pairs) if pairs else (mean,))
