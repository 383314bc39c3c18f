"""Machine-readable results for benchmarks/run (benchmarks/suite.py).

A benchmark program calls emit() with its figures; when TESSERA_BENCH_JSON names a file (benchmarks/run sets it),
the rows are written there as JSON, and otherwise nothing happens, so the programs run alone exactly as before.

A row is one measured case:
    {"case": "tiny fp32", "unit": "tokens/s", "tessera": 4722.5,
     "peers": {"PyTorch eager": 3745.0, ...},   # measured in the same run, same unit; None when not measured
     ...}                                        # anything else the benchmark reports (MFU, ratios, sizes)
Higher is better for every unit used with "tessera" and "peers" (throughputs).
"""
import json
import os
import sys

# util::configure_host_allocator()'s glibc malloc settings, as environment variables for a Python peer's process: no
# mmap for large blocks, never trim (a threshold beyond any heap), 64 MiB top pad. The peers are measured with them
# too, so that a ratio compares the frameworks and not their allocators.
TUNED_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 62), "MALLOC_TOP_PAD_": str(64 << 20)}


def emit(benchmark, rows, **meta):
    path = os.environ.get("TESSERA_BENCH_JSON")
    if not path:
        return
    record = {"benchmark": benchmark, "argv": sys.argv, "rows": rows, **meta}
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def time_train_steps(model, ids, precision, steps, warmup=1):
    """Seconds for `steps` forward + loss + backward steps of a transformers causal LM on `ids` (fp32, or bf16
    autocast for "amp_bf16"), after `warmup` untimed ones: the peers' side of the forward+backward benchmarks."""
    import time
    import torch

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp_bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - t0
