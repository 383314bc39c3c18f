"""Helpers for the tests that train from remote data (s3://, gs://, hf://) against the same run on local data."""
import json
import subprocess

import numpy as np
from streaming import MDSWriter

from conftest import _binary

SEQ, VOCAB = 32, 128


def train_trace(env, tmp_path, name, dataset):
    """The batches and losses of one epoch of a tiny MPT on `dataset` (a train_loader dataset: local, or remote with a
    local cache), through the compat driver's train-trace."""
    rec = {
        "max_seq_len": SEQ, "seed": 3, "tokenizer": {"name": "unused"},
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
        "train_loader": {"name": "text", "dataset": {**dataset, "split": "train", "shuffle": True,
                                                     "max_seq_len": SEQ}, "drop_last": True, "num_workers": 2},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "max_duration": "1ep", "eval_interval": 0, "global_train_batch_size": 8,
        "device_train_microbatch_size": 8, "device_eval_batch_size": 8, "precision": "fp32", "log_to_console": False,
    }
    (tmp_path / f"{name}.yaml").write_text(json.dumps(rec))
    (tmp_path / name).mkdir()
    proc = subprocess.run([_binary("TESSERA_COMPAT_DRIVER", "tessera_compat_driver"), "train-trace",
                           tmp_path / f"{name}.yaml", tmp_path / name], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / name / "trace.json").read_text())


def write_mds(folder, samples=200):
    """`samples` token sequences in zstd MDS shards of ~2 kB, written by Streaming's MDSWriter to `folder` (or to
    a (local, remote) pair, which Streaming uploads)."""
    rng = np.random.default_rng(0)
    with MDSWriter(out=folder if isinstance(folder, tuple) else str(folder), columns={"tokens": "ndarray:int32"}, compression="zstd", size_limit=2000) as w:
        for _ in range(samples):
            start, stride = rng.integers(0, VOCAB), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % VOCAB).astype(np.int32)})
