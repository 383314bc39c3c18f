"""benchmarks/run: a quick run of two of its benchmarks (the tokenizer against HF tokenizers, the sharding engine
on 1, 2 and 4 ranks) writes results.json, report.md and PNG plots that agree with each other, and an unknown name
fails naming the known ones. The figures themselves are checked for what they must show, not for speed."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin"))
PNG = b"\x89PNG\r\n\x1a\n"


def run_suite(*args):
    return subprocess.run([str(ROOT / "benchmarks" / "run"), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, TESSERA_BIN_DIR=str(BIN)), timeout=900)


def test_a_quick_run_writes_results_report_and_plots(tmp_path):
    for program in ("bench_tokenizer_throughput", "bench_dist_sharding"):
        if not (BIN / program).exists():
            pytest.skip(f"{BIN / program} is not built (TESSERA_BUILD_BENCHMARKS=OFF)")
    proc = run_suite("--quick", "--only", "tokenizer_vs_hf,dist_sharding", "--out", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["quick"] is True
    assert results["command"] == f"benchmarks/run --quick --only tokenizer_vs_hf,dist_sharding --out {tmp_path}"
    machine = results["machine"]
    assert machine["cores"] >= 1 and machine["torch"] and machine["tokenizers"]
    assert len(machine["tessera_commit"]) == 40
    by_name = {b["benchmark"]: b for b in results["benchmarks"]}
    assert set(by_name) == {"tokenizer_vs_hf", "dist_sharding"}

    tok = by_name["tokenizer_vs_hf"]
    assert tok["status"] == "ok" and "--rounds" in tok["command"]
    [row] = tok["rows"]
    assert row["unit"] == "MB/s" and row["tessera"] > 0 and row["peers"]["HF tokenizers (encode_batch)"] > 0

    dist = by_name["dist_sharding"]
    assert dist["status"] == "ok"
    cells = {(r["strategy"], r["ranks"]): r for r in dist["rows"]}
    assert set(cells) == {(s, n) for s in ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD") for n in (1, 2, 4)}
    assert all(r["tessera"] > 0 and r["step_seconds"] > 0 for r in dist["rows"])
    # What the engine is for: between steps each of N ranks holds 1/N of the parameters, gradients and optimizer
    # state under the sharded strategies (ZeRO-2 and ZeRO-3 differ only while units run), all of it under NO_SHARD.
    for n in (2, 4):
        held = {s: cells[(s, n)]["bytes_per_rank"] for s in ("NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD")}
        assert held["FULL_SHARD"] == held["SHARD_GRAD_OP"]
        assert held["NO_SHARD"] == cells[("NO_SHARD", 1)]["bytes_per_rank"]
        assert abs(held["FULL_SHARD"] / held["NO_SHARD"] - 1 / n) < 0.01, (n, held)

    report = (tmp_path / "report.md").read_text()
    assert "quick: smaller inputs" in report
    assert "| case | unit | Tessera | HF tokenizers (encode_batch) | Tessera / HF tokenizers (encode_batch) |" in report
    ratio = row["tessera"] / row["peers"]["HF tokenizers (encode_batch)"]
    assert f"| {ratio:.2f} |" in report
    for name in ("tokenizer_vs_hf.png", "dist_sharding.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, name
        assert f"]({name})" in report


def test_an_unknown_benchmark_is_an_error_naming_the_known_ones(tmp_path):
    proc = run_suite("--only", "tokenizer_vs_hf,no_such_bench", "--out", tmp_path)
    assert proc.returncode != 0
    assert "unknown benchmark(s) no_such_bench" in proc.stderr and "train_vs_pytorch" in proc.stderr
    assert not (tmp_path / "results.json").exists()


def test_rows_off_the_schema_are_refused_and_impossible_figures_are_marked(monkeypatch):
    # bench_json's schema, checked when a program emits (so that a program cannot break the report), and the report's
    # marks: a figure past the measured peak, or one resting on fewer than 3 timed steps, is not shown as a result.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_json
    import suite
    bad = [{"case": "x", "tessera": 1.0, "peers": {}},
           {"case": "y", "unit": "MB/s", "tessera": "fast", "peers": {"p": 1}},
           {"case": "z", "unit": "s", "peers": {"p": "slow"}},
           {"case": "w", "unit": "s", "tessera": 1.0, "peers": {}, "too_noisy": True}]
    problems = bench_json.check_rows("demo", bad)
    assert problems == ["demo row 0 ('x'): `unit` must be a non-empty string",
                        "demo row 1 ('y'): `tessera` must be a number or null",
                        "demo row 2 ('z'): `tessera` must be a number or null",
                        "demo row 2 ('z'): `peers` must map peer names to numbers or null",
                        "demo row 3 ('w'): `too_noisy` must be a non-empty string or null"]
    with pytest.raises(ValueError, match=r"demo row 0 \('x'\)"):
        bench_json.emit("demo", bad)
    rows = [{"case": "fp32", "unit": "tokens/s", "tessera": 40.0, "peers": {"HF": 182.3}, "mfu": 0.4,
             "peer_mfu": {"HF": 1.7}, "timed_steps": 6},
            {"case": "bf16", "unit": "tokens/s", "tessera": 300.0, "peers": {"HF": 150.0}, "mfu": 0.5, "timed_steps": 2},
            {"case": "plan", "unit": "h makespan", "higher_is_better": False, "tessera": 2.0, "peers": {"HF": 3.0}},
            {"case": "ok", "unit": "tokens/s", "tessera": 200.0, "peers": {"HF": 100.0}, "mfu": 0.5, "timed_steps": 6},
            {"case": "monitor", "unit": "steps/s", "tessera": 80.0, "peers": {"HF": 81.0}, "timed_steps": 700,
             "too_noisy": "the 95% interval is wider than 1%"}]
    assert bench_json.check_rows("demo", rows) == []
    text = suite.table({"rows": rows})
    assert "- fp32: unreliable: implies more than the measured peak (HF 170%)" in text, text
    assert "| fp32 (unreliable) | tokens/s | ~~40.0~~ | ~~182.3~~ | ~~0.22~~ | ~~40.0%~~ |" in text, text
    assert "- bf16: unreliable: 2 timed steps (fewer than 3)" in text, text
    assert "| plan | h makespan, lower is better | 2.00 | 3.00 | 1.50 | - |" in text, text
    assert "| ok | tokens/s | 200.0 | 100.0 | 2.00 | 50.0% |" in text, text
    # A program's own statistics can mark its row (the health monitor's overhead against its 95% interval).
    assert "- monitor: unreliable: the 95% interval is wider than 1%" in text, text
    # The report opens with the CPU and whether it computes bf16 natively.
    head = suite.report({"machine": {"cpu": "AMD EPYC", "cores": 2, "cpu_bf16": "native", "memory_gib": 24},
                         "date": "2026-12-06", "command": "benchmarks/run --quick", "quick": True,
                         "benchmarks": []}, "")
    assert head.startswith("**CPU: AMD EPYC, 2 cores, bf16 native.**"), head


def test_the_health_monitor_gate_runs_the_monitor_in_alternate_blocks(tmp_path):
    # health_monitor_overhead.py's plug-in: the real monitor runs in every other block of one 2-rank run (its exchange
    # is a collective, so both ranks must agree on the blocks) and the row carries its overhead and 95% interval.
    if not (BIN / "libbench_health_monitor_gate.so").exists():
        pytest.skip(f"{BIN / 'libbench_health_monitor_gate.so'} is not built (TESSERA_BUILD_BENCHMARKS=OFF)")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, ROOT / "benchmarks/health_monitor_overhead.py",
                           "--steps", "300", "--block", "20"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TESSERA_BIN_DIR=str(BIN), TESSERA_BENCH_JSON=str(out)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = json.loads(out.read_text())["rows"]
    # Blocks 3-14 are kept (60 warm-up steps); the monitored ones with an unmonitored block on each side: 5, 7, ... 13.
    assert row["timed_steps"] == 20 * 5
    assert row["tessera"] > 0 and row["peers"]["without health_monitor"] > 0
    # The monitor ran in the monitored blocks (its handlers took time) and the A/B is a real comparison.
    assert 0 < row["measured_overhead_percent"] < 10, row
    assert abs(row["overhead_percent"]) < 50 and row["overhead_ci95_percent"] > 0, row
