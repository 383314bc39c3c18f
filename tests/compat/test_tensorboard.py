"""Tessera's `tensorboard` logger read back by TensorBoard's own reader (EventAccumulator, tensorboard==2.20.0).

A short training run (`train` binary) logs through both the `jsonl` and the `tensorboard` loggers; every scalar in the
event file must equal the JSON-lines log (same tags, same steps in the same order, values as float32), and the
resolved recipe is there as a text summary.
"""
import json
import os
import pathlib
import subprocess
import textwrap

import numpy as np
import pytest
from streaming import MDSWriter
from tensorboard.backend.event_processing import event_accumulator

from conftest import _binary

SEQ = 32

RECIPE = """
max_seq_len: 32
seed: 3
run_name: tb-run
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
eval_loader:
  name: text
  dataset: {{local: {data}, split: val, shuffle: false, max_seq_len: 32}}
  drop_last: false
optimizer: {{name: decoupled_adamw, lr: 1.0e-2, weight_decay: 0.0}}
scheduler: {{name: cosine_with_warmup, t_warmup: 2ba}}
algorithms:
  gradient_clipping: {{clipping_type: norm, clipping_threshold: 1.0}}
callbacks:
  speed_monitor: {{window_size: 2}}
  lr_monitor: {{}}
  optimizer_monitor: {{batch_log_interval: 3}}
loggers:
  jsonl: {{filename: "{{run_name}}/metrics.jsonl"}}
  tensorboard: {{flush_interval: 4}}
max_duration: 7ba
eval_interval: 3ba
eval_first: true
global_train_batch_size: 8
device_train_microbatch_size: 4
device_eval_batch_size: 8
precision: fp32
log_to_console: false
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard")
    rng = np.random.default_rng(0)
    for split, n in (("train", 80), ("val", 16)):
        with MDSWriter(out=str(root / "data" / split), columns={"tokens": "ndarray:int32"}) as w:
            for _ in range(n):
                start, stride = rng.integers(0, 64), rng.integers(1, 6)
                w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % 64).astype(np.int32)})
    (root / "recipe.yaml").write_text(RECIPE.format(data=root / "data"))
    # Absolute, as the run's cwd is root; not resolve(): bin/train is a link to tessera, which runs by its name.
    train = pathlib.Path(_binary("TESSERA_TRAIN_BIN", "train")).absolute()
    proc = subprocess.run([train, "--recipe", "recipe.yaml"], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return root / "tb-run"


def read_jsonl(path):
    hparams, series = None, {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "hyperparameters" in record:
            hparams = record["hyperparameters"]
            continue
        step = record.pop("batch")
        for tag, value in record.items():
            series.setdefault(tag, []).append((step, value))
    return hparams, series


def load_events(log_dir):
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def test_event_file_is_named_as_tensorboard_names_it(run_dir):
    files = list((run_dir / "tensorboard").iterdir())
    assert len(files) == 1
    parts = files[0].name.split(".")
    assert parts[:3] == ["events", "out", "tfevents"] and len(parts[3]) == 10 and parts[3].isdigit()


def test_every_scalar_equals_the_jsonl_log(run_dir):
    _, expected = read_jsonl(run_dir / "metrics.jsonl")
    acc = load_events(run_dir / "tensorboard")
    assert acc.file_version == 2.0
    tags = acc.Tags()["scalars"]
    assert sorted(tags) == sorted(expected)
    # What the run logged: train loss, eval metrics (eval_first and every 3 batches), speed, lr and optimizer norms.
    for tag in ("loss/train/total", "metrics/eval/LanguageCrossEntropy", "throughput/tokens_per_sec",
                "lr-DecoupledAdamW/group0", "l2_norm/grad/global", "l2_norm/moment/model.transformer.wte.weight"):
        assert tag in tags, tag
    for tag in tags:
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(step, float(np.float32(value))) for step, value in expected[tag]]
        assert got == want, tag
    assert [e.step for e in acc.Scalars("metrics/eval/LanguageCrossEntropy")] == [0, 3, 6, 7]
    walls = [e.wall_time for e in acc.Scalars("loss/train/total")]
    assert walls == sorted(walls) and abs(walls[0] - (run_dir / "metrics.jsonl").stat().st_mtime) < 600


def test_hyperparameters_are_a_text_summary(run_dir):
    hparams, _ = read_jsonl(run_dir / "metrics.jsonl")
    acc = load_events(run_dir / "tensorboard")
    assert "hyperparameters" in acc.Tags()["tensors"]
    (event,) = acc.Tensors("hyperparameters")
    assert acc.SummaryMetadata("hyperparameters").plugin_data.plugin_name == "text"
    markdown = event.tensor_proto.string_val[0].decode()
    assert json.loads(textwrap.dedent(markdown)) == hparams
    assert hparams["loggers"]["tensorboard"] == {"flush_interval": 4}
