"""Read real NVML, read-only, and check what the agent's reader sees and would publish.

For a machine with an NVIDIA GPU: ``python benchmarks/nvml_probe.py [--rounds N]`` prints N
readings one second apart and the ``gpu.utilization`` events the agent would publish, decoded by
the controller's own decoder. ``--load S`` (needs PyTorch) also checks what CI's fake ``pynvml``
cannot show: the card read idle, then while a bf16 matrix-product loop keeps it busy for S
seconds, then idle again; busy must read busy and idle idle within the agent's one-second
cadence, the loading process's memory must show, and one NVML round is timed (200 rounds).
``--json F`` writes every reading. Only NVML queries are called (init, counts, names, UUIDs, MIG
mode, utilization, memory); MIG mode and every other setting are never changed. Exits 0 with
``no NVML`` where there is no driver, so it is safe to run anywhere; 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from controller.agent.nvml import NvmlReader, NvmlUnavailable, Sample
from controller.agent.publisher import to_events
from streams.events import EventDecoder, GpuUtilization, encode_event

BUSY_AT_LEAST = 50.0
IDLE_AT_MOST = 10.0


def _events_check(sample: Sample, decoder: EventDecoder, *, show: bool) -> bool:
    """The round's events decode as ``gpu.utilization`` carrying each whole GPU's reading."""
    events, no_util = to_events(sample, node="probe", ts=time.time(), owners={}, mig_util="memory")
    decoded = []
    for item in events:
        raw = encode_event(item.event)
        decoded.append(decoder.decode(raw, now=time.time()))
        if show:
            print(f"  event ({item.util_source}) {raw.decode()}")
    if no_util and show:
        print(f"  {no_util} MIG instances without NVML utilization (memory fallback)")
    whole = [d for d in decoded if isinstance(d, GpuUtilization) and d.mig_profile is None]
    return all(isinstance(d, GpuUtilization) for d in decoded) and [d.util_pct for d in whole] == [
        g.util_pct for g in sample.gpus if g.util_pct is not None
    ]


def _rounds(reader: NvmlReader, decoder: EventDecoder, rounds: int) -> bool:
    ok = True
    for round_no in range(rounds):
        if round_no:
            time.sleep(1.0)
        started = time.perf_counter()
        sample = reader.read()
        took_ms = (time.perf_counter() - started) * 1000
        print(f"round {round_no}: read {sample.devices} devices in {took_ms:.1f} ms")
        for gpu in sample.gpus:
            print(f"  gpu {gpu}")
        for mig in sample.migs:
            print(f"  mig {mig}")
        for failure in sample.failures:
            print(f"  FAILED {failure}")
        ok &= _events_check(sample, decoder, show=True)
    return ok


def _busy(stop: threading.Event, ready: threading.Event) -> None:
    import torch  # type: ignore[import-not-found]

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    ready.set()
    while not stop.is_set():
        for _ in range(20):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()


def _phase(reader: NvmlReader, seconds: float) -> list[Sample]:
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(reader.read())
        time.sleep(1.0)
    return out


def _first_util(phase: list[Sample]) -> list[float]:
    return [s.gpus[0].util_pct for s in phase if s.gpus and s.gpus[0].util_pct is not None]


def _load_check(reader: NvmlReader, decoder: EventDecoder, seconds: float) -> dict[str, Any]:
    """Idle, busy, idle again on GPU 0 (the first whole GPU), with the checks' verdicts."""
    timings = []
    for _ in range(200):
        started = time.perf_counter()
        reader.read()
        timings.append((time.perf_counter() - started) * 1000)
    idle = _phase(reader, 4)
    stop, ready = threading.Event(), threading.Event()
    worker = threading.Thread(target=_busy, args=(stop, ready))
    worker.start()
    ready.wait(120)
    time.sleep(2.0)  # NVML's utilization covers its last sample period (up to about a second)
    busy = _phase(reader, seconds)
    stop.set()
    worker.join()
    time.sleep(2.0)
    after = _phase(reader, 4)
    util = {"idle": _first_util(idle), "busy": _first_util(busy), "after": _first_util(after)}
    checks = {
        "whole GPUs read, no failures": bool(idle[0].gpus) and not idle[0].failures,
        f"busy reads >= {BUSY_AT_LEAST:g}% (median)": bool(util["busy"])
        and statistics.median(util["busy"]) >= BUSY_AT_LEAST,
        f"idle after the load reads <= {IDLE_AT_MOST:g}% (last)": bool(util["after"])
        and util["after"][-1] <= IDLE_AT_MOST,
        "the loading process's memory shows": busy[-1].gpus[0].mem_used_mib
        > idle[0].gpus[0].mem_used_mib + 256,
        "busy events decode with the reading": _events_check(busy[-1], decoder, show=False),
    }
    return {
        "read_ms_median": statistics.median(timings),
        "read_ms_max": max(timings),
        "util": util,
        "mem_used_mib": {
            "idle": idle[0].gpus[0].mem_used_mib,
            "busy": busy[-1].gpus[0].mem_used_mib,
        },
        "checks": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="samples, one second apart")
    parser.add_argument("--load", type=float, default=0.0, metavar="S", help="busy-GPU check")
    parser.add_argument("--json", type=Path, help="write the readings and checks here")
    args = parser.parse_args()
    reader = NvmlReader()
    try:
        reader.open()
    except NvmlUnavailable as exc:
        print(f"no NVML: {exc}")
        return 0
    decoder = EventDecoder()
    report: dict[str, Any] = {}
    try:
        report["rounds_ok"] = _rounds(reader, decoder, args.rounds)
        if args.load > 0:
            report.update(_load_check(reader, decoder, args.load))
    finally:
        reader.close()
    ok = report["rounds_ok"] and all(report.get("checks", {}).values())
    report["ok"] = ok
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "util"}, indent=2))
    if not ok:
        print("a check failed (see above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
