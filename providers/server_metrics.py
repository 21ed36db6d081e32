"""Reading a local inference server's own queue from its Prometheus `/metrics`.

vLLM exposes `vllm:num_requests_waiting` (SGLang `sglang:num_queue_reqs`, llama.cpp's `llama-server
--metrics` `llamacpp:requests_deferred`): requests the server accepted but has not started.
Routing adds it to the gateway's own in-flight count to find the least loaded of equally
preferred backends. Only these gauges are read; every label set of a gauge
is summed (one series per model served). A sample that is no count of requests (`NaN`, `±Inf`, a
negative number) is skipped: a NaN load sorted before every number, and stuck to its backend.
"""

from __future__ import annotations

import math

QUEUE_GAUGES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")


def queue_depth(text: str) -> float | None:
    """The summed queue gauges in a Prometheus text exposition, or None when it has none."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if not line.startswith(QUEUE_GAUGES):
            continue
        value = _sample_value(line)
        if value is not None and math.isfinite(value) and value >= 0:
            total += value
            found = True
    return total if found else None


def _sample_value(line: str) -> float | None:
    """`name{labels} value [timestamp]` or `name value [timestamp]` → value."""
    if "{" in line:
        name, _, rest = line.partition("{")
        rest = rest[rest.rfind("}") + 1 :]
    else:
        name, _, rest = line.partition(" ")
    if name not in QUEUE_GAUGES:
        return None
    fields = rest.split()
    try:
        return float(fields[0])
    except (IndexError, ValueError):
        return None
