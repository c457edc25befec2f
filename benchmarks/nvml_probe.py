"""Read real NVML once, read-only, and print what the agent's reader sees and would publish.

For a machine with an NVIDIA GPU: ``python benchmarks/nvml_probe.py [--rounds N]``. It calls
only NVML queries (init, counts, names, UUIDs, MIG mode, utilization, memory); it never changes
MIG mode or any other setting. Exits 0 with ``no NVML`` where there is no driver, so it is safe
to run anywhere.
"""

from __future__ import annotations

import argparse
import sys
import time

from controller.agent.nvml import NvmlReader, NvmlUnavailable
from controller.agent.publisher import to_events
from streams.events import EventDecoder, Rejection, encode_event


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="samples, one second apart")
    args = parser.parse_args()
    reader = NvmlReader()
    try:
        reader.open()
    except NvmlUnavailable as exc:
        print(f"no NVML: {exc}")
        return 0
    decoder = EventDecoder()
    bad = 0
    try:
        for round_no in range(args.rounds):
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
            events, no_util = to_events(
                sample, node="probe", ts=time.time(), owners={}, mig_util="memory"
            )
            for item in events:
                raw = encode_event(item.event)
                checked = decoder.decode(raw, now=time.time())
                bad += isinstance(checked, Rejection)
                print(f"  event ({item.util_source}) {raw.decode()}")
            if no_util:
                print(f"  {no_util} MIG instances without NVML utilization (memory fallback)")
    finally:
        reader.close()
    if bad:
        print(f"{bad} events the controller would reject", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
