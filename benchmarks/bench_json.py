"""Machine-readable results for benchmarks/run (benchmarks/suite.py).

A benchmark program calls emit() with its figures; when TESSERA_BENCH_JSON names a file (benchmarks/run sets it),
the rows are written there as JSON, and otherwise nothing happens, so the programs run alone exactly as before.

A row is one measured case, and every row has this schema (check_rows; emit refuses rows that do not, so that a
program cannot break the report):
    {"case": "tiny fp32", "unit": "tokens/s",   # non-empty strings
     "tessera": 4722.5,                         # a number, or None when Tessera has no figure for the case
     "peers": {"PyTorch eager": 3745.0, ...},   # measured in the same run, same unit; None when not measured; {} none
     # optional:
     "higher_is_better": True,                  # False for times and makespans (default True)
     "mfu": 0.41, "peer_mfu": {"PyTorch eager": 0.33},   # fractions of the measured peak (`gemm_peak_flops`)
     "timed_steps": 6,                          # timed steps (or items) behind each figure of the row
     "too_noisy": "why",                        # the program's own statistics say the figure does not resolve
                                                # what it must (a string), or None
     ...}                                       # anything else the benchmark reports (ratios, sizes)
The report marks a row unreliable when a figure implies more than 100% of the measured peak, or when it rests on
fewer than MIN_TIMED_STEPS timed steps, or when the program says it is too noisy (benchmarks/suite.py).
"""
import json
import os
import sys

# util::configure_host_allocator()'s glibc malloc settings, as environment variables for a Python peer's process: no
# mmap for large blocks, never trim (a threshold beyond any heap), 64 MiB top pad. The peers are measured with them
# too, so that a ratio compares the frameworks and not their allocators.
TUNED_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 62), "MALLOC_TOP_PAD_": str(64 << 20)}


# Fewer timed steps than this behind a figure make a ratio noise, not a result: the report marks the row.
MIN_TIMED_STEPS = 3


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_rows(benchmark, rows):
    """The ways `rows` break the schema above, one message each ([] when they follow it)."""
    if not isinstance(rows, list):
        return [f"{benchmark}: rows must be a list, not {type(rows).__name__}"]
    problems = []
    for i, r in enumerate(rows):
        where = f"{benchmark} row {i}" + (f" ({r['case']!r})" if isinstance(r, dict) and "case" in r else "")
        if not isinstance(r, dict):
            problems.append(f"{where}: not an object")
            continue
        for key in ("case", "unit"):
            if not isinstance(r.get(key), str) or not r[key]:
                problems.append(f"{where}: `{key}` must be a non-empty string")
        if "tessera" not in r or not (r["tessera"] is None or _number(r["tessera"])):
            problems.append(f"{where}: `tessera` must be a number or null")
        peers = r.get("peers")
        if not isinstance(peers, dict) or not all(isinstance(k, str) and (v is None or _number(v))
                                                  for k, v in peers.items()):
            problems.append(f"{where}: `peers` must map peer names to numbers or null")
        if "higher_is_better" in r and not isinstance(r["higher_is_better"], bool):
            problems.append(f"{where}: `higher_is_better` must be true or false")
        for key in ("mfu", "timed_steps"):
            if r.get(key) is not None and not _number(r[key]):
                problems.append(f"{where}: `{key}` must be a number or null")
        if r.get("too_noisy") is not None and not (isinstance(r["too_noisy"], str) and r["too_noisy"]):
            problems.append(f"{where}: `too_noisy` must be a non-empty string or null")
        if "peer_mfu" in r and not (isinstance(r["peer_mfu"], dict) and
                                    all(v is None or _number(v) for v in r["peer_mfu"].values())):
            problems.append(f"{where}: `peer_mfu` must map peer names to numbers or null")
    return problems


def emit(benchmark, rows, **meta):
    problems = check_rows(benchmark, rows)
    if problems:
        raise ValueError("benchmark rows do not follow benchmarks/bench_json.py's schema:\n  " + "\n  ".join(problems))
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


_BF16_EMULATED = None


def cpu_bf16_emulated():
    """True where this CPU's bf16 GEMMs are emulated, about 50x slower than fp32: no bf16 instructions in its flags
    (AVX512-BF16 / AMX on x86, BF16 on ARM), or a 512^2 bf16 GEMM below a quarter of fp32's rate (LibTorch restricted
    below them, e.g. ONEDNN_MAX_CPU_ISA=AVX2). The rule of Tessera's `precision: auto` (util::probe_cpu_bf16), so that
    the benchmarks mark exactly the hosts where Tessera itself would not train in bf16. Measured once per process."""
    global _BF16_EMULATED
    if _BF16_EMULATED is None:
        import re
        import time
        import torch
        try:
            m = re.search(r"^(?:flags|Features)\s*:(.*)$", open("/proc/cpuinfo").read(), re.M)
            flags = m.group(1).split() if m else []
        except OSError:
            flags = []
        flag = any(f in ("avx512_bf16", "amx_bf16", "bf16") for f in flags)
        n = 512
        a32, b32 = torch.ones(n, n) / n, torch.ones(n, n)
        a16, b16 = a32.bfloat16(), b32.bfloat16()

        def seconds(a, b):
            t0 = time.perf_counter()
            (a @ b).sum().item()
            return time.perf_counter() - t0

        seconds(a32, b32), seconds(a16, b16)  # warm-up
        best32 = best16 = float("inf")
        for _ in range(5):  # alternating, so that other work on the cores slows both alike
            best32 = min(best32, seconds(a32, b32))
            best16 = min(best16, seconds(a16, b16))
        _BF16_EMULATED = not (flag and best16 <= 4 * best32)
    return _BF16_EMULATED


# On a CPU that emulates bf16, the benchmarks run their amp_bf16 cases on this many timed steps, once, and mark them
# (a full-length emulated case took over 6 minutes of `benchmarks/run --quick` on a 2-core AVX2-only EPYC).
EMULATED_BF16_STEPS = 1
EMULATED_BF16_NOTE = "bf16 emulated on this CPU: 1 step, 1 round"


def pct(value, width):
    """A right-aligned percentage cell, or "-" for None (e.g. MFU of an emulated-bf16 case, whose GEMM peak probe
    measures the emulation, not the hardware)."""
    return f"{value:>{width}.1%}" if value is not None else f"{'-':>{width}}"
