"""Tessera's `wandb` logger read back by the wandb package's own reader (wandb 0.31's wandb-core, through
`wandb leet inspect`, the transaction-log reader `wandb sync` uses).

A short run (`train` binary) logs through the `jsonl` and `wandb` loggers into an offline run folder; wandb must read
every record without a skipped chunk, the run's id, name, project, group, tags, notes and config must be the recipe's,
every history row must carry the JSON-lines log's metrics at the same step (loss, lr, the gradient norm), the summary
the last values, and the run must be finished with exit code 0. Autoresume continues the same W&B run: a second folder
with the same id and the resume flag, its steps after the first's, and `wandb sync --dry-run` lists both.
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from streaming import MDSWriter

from conftest import _binary

SEQ = 32
WANDB = pathlib.Path(sys.executable).parent / "wandb"

RECIPE = """
max_seq_len: 32
seed: 3
run_name: wb-run
model:
  name: mpt_causal_lm
  d_model: 32
  n_heads: 2
  n_layers: 2
  expansion_ratio: 2
  max_seq_len: 32
  vocab_size: 64
  attn_config: {{attn_impl: torch}}
tokenizer: {{name: unused}}
train_loader:
  name: text
  dataset: {{local: {data}, split: train, shuffle: true, max_seq_len: 32}}
  drop_last: true
optimizer: {{name: decoupled_adamw, lr: 1.0e-2, weight_decay: 0.0}}
scheduler: {{name: cosine_with_warmup, t_warmup: 2ba}}
callbacks:
  lr_monitor: {{}}
loggers:
  jsonl: {{filename: "{{run_name}}/metrics.jsonl"}}
  wandb:
    project: tessera-tests
    group: grp
    tags: [cpu, tiny]
    init_kwargs: {{dir: wb, notes: "a tiny run", job_type: train}}
save_folder: "{{run_name}}/ckpt"
save_interval: 3ba
autoresume: true
max_duration: 3ba
eval_interval: 0
global_train_batch_size: 8
device_train_microbatch_size: 4
precision: fp32
log_to_console: false
"""


def inspect(path, *flags):
    proc = subprocess.run([WANDB, "leet", "inspect", "--json", *flags, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "skipped" not in proc.stderr and "corrupt" not in proc.stderr, proc.stderr
    return proc.stdout


def metrics_by_step(jsonl):
    out = {}
    for line in jsonl:
        if "batch" in line:
            out.setdefault(line["batch"], {}).update({k: v for k, v in line.items() if k != "batch"})
    return out


def records(path):
    return [json.loads(line) for line in inspect(path).splitlines() if line.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("wandb")
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(root / "data" / "train"), columns={"tokens": "ndarray:int32"}) as w:
        for _ in range(64):
            start, stride = rng.integers(0, 64), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % 64).astype(np.int32)})
    (root / "recipe.yaml").write_text(RECIPE.format(data=root / "data"))
    train = pathlib.Path(_binary("TESSERA_TRAIN_BIN", "train")).absolute()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jsonl = []  # each run's lines of the JSON-lines log (the second appends to the first's)
    for duration in ("3ba", "6ba"):  # the second resumes the first from its batch-3 checkpoint
        proc = subprocess.run([train, "--recipe", "recipe.yaml", f"max_duration={duration}"], cwd=root,
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in (root / "wb-run" / "metrics.jsonl").read_text().splitlines()]
        jsonl.append(lines[sum(len(j) for j in jsonl):])
    dirs = sorted((root / "wb" / "wandb").glob("offline-run-*"), key=lambda d: d.stat().st_mtime_ns)
    return root, dirs, jsonl


def test_the_run_reads_back_as_the_recipe_and_the_jsonl_log_say(runs):
    root, dirs, jsonl = runs
    assert len(dirs) == 2, dirs
    first = dirs[0]
    run_id = next(first.glob("run-*.wandb")).stem[len("run-"):]
    assert first.name.startswith("offline-run-") and run_id in first.name
    assert (first / f"run-{run_id}.wandb").is_file() and (first / "files").is_dir()
    s = json.loads(inspect(first, "--summary"))
    assert s["run_id"] == run_id and s["name"] == "wb-run" and s["project"] == "tessera-tests", s
    assert s["tags"] == ["cpu", "tiny"] and s["notes"] == "a tiny run", s
    assert s["state"] == "finished" and s["exit_code"] == 0, s
    assert s["config"]["max_seq_len"] == 32 and s["config"]["model"]["d_model"] == 32, s["config"]
    run = next(r["run"] for r in records(first) if r["type"] == "run")
    assert run.get("run_group") == "grp" and run.get("job_type") == "train", run
    # Every history row: the JSON-lines log's metrics at its step, the same names and values (the first run's steps
    # 0-3: a batch's loss goes at the step before its end, as Composer logs it; the gradient norm and lr at its end).
    rows = [r["history"] for r in records(first) if r["type"] == "history"]
    assert [r["step"].get("num", 0) for r in rows] == [0, 1, 2, 3], rows
    by_step = metrics_by_step(jsonl[0])
    for r in rows:
        step = r["step"].get("num", 0)
        assert r["item"]["_step"] == step and r["item"]["_runtime"] >= 0 and r["item"]["_timestamp"] > 1.7e9
        logged = {k: v for k, v in r["item"].items() if not k.startswith("_")}
        assert logged.keys() == by_step[step].keys(), step
        for key, value in by_step[step].items():
            assert logged[key] == pytest.approx(value, rel=1e-12), (step, key)
    assert {"loss/train/total", "l2_norm/grad/global", "lr-DecoupledAdamW/group0"} <= by_step[2].keys()
    assert s["summary"]["loss/train/total"] == pytest.approx(by_step[2]["loss/train/total"], rel=1e-12)
    assert s["summary"]["l2_norm/grad/global"] == pytest.approx(by_step[3]["l2_norm/grad/global"], rel=1e-12)


def test_autoresume_continues_the_same_wandb_run(runs):
    root, dirs, jsonl = runs
    first, second = dirs
    assert [p.name for p in first.glob("*.wandb")] == [p.name for p in second.glob("*.wandb")]  # the same run id
    recs = records(second)
    run = next(r["run"] for r in recs if r["type"] == "run")
    assert run.get("resume") is True, run
    # It goes on from the batch it resumed at: its first row is step 3, with batch 4's loss (a batch's loss goes at
    # the step before its end, as Composer logs it), the step the first run's last row had.
    rows = [r["history"] for r in recs if r["type"] == "history"]
    assert [r["step"].get("num", 0) for r in rows] == [3, 4, 5, 6], rows
    by_step = metrics_by_step(jsonl[1])
    for r in rows:
        logged = {k: v for k, v in r["item"].items() if not k.startswith("_")}
        assert logged == pytest.approx(by_step[r["step"]["num"]], rel=1e-12), r
    assert json.loads(inspect(second, "--summary"))["state"] == "finished"
    assert os.readlink(root / "wb" / "wandb" / "latest-run") == second.name
    # wandb sync would upload both, in order.
    proc = subprocess.run([WANDB, "sync", "--dry-run", str(root / "wb" / "wandb")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr  # the newest by latest-run, which wandb lists in its place
    assert "Would sync 2 run(s)" in out and f"{first.name}/run-" in out and "latest-run/run-" in out, out
