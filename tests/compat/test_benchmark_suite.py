"""benchmarks/run: a quick run of two of its benchmarks (the tokenizer against HF tokenizers, the sharding engine
on 1, 2 and 4 ranks) writes results.json, report.md and PNG plots that agree with each other, and an unknown name
fails naming the known ones. The figures themselves are checked for what they must show, not for speed."""
import json
import os
import pathlib
import subprocess

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
