"""Opt-in peer test: Tessera's learning-rate schedules against Composer's own schedulers in Composer's Trainer.

Composer and LLM Foundry pin another torch than the one LibTorch comes from, so this runs in their venv, not in
`cmake --workflow --preset test`:

    tools/setup_composer.sh
    ~/.cache/tessera/venv-composer/bin/python -m pytest -q tests/composer   (after building)

For each scheduler, Tessera's `train` (through the compat driver's train-trace) records the rate every optimizer step
used; Composer's Trainer, with the same scheduler, records the rate its optimizer holds at BEFORE_TRAIN_BATCH of
every batch. Both are Composer's order (step k uses the schedule at step k - 1) and must agree to 1e-12.
"""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch
from composer import Callback, Trainer
from composer.models import ComposerClassifier
from composer.optim import scheduler as cs
from streaming import MDSWriter
from torch.utils.data import DataLoader, TensorDataset

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))
STEPS = 40
LR = 0.01

# recipe `scheduler:` section -> the same scheduler built from Composer's classes
SCHEDULES = {
    "constant": ("{name: constant, alpha: 0.5, t_max: 20ba}", lambda: cs.ConstantScheduler(alpha=0.5, t_max="20ba")),
    "linear": ("{name: linear, alpha_i: 1.0, alpha_f: 0.1}", lambda: cs.LinearScheduler(alpha_i=1.0, alpha_f=0.1)),
    "cosine": ("{name: cosine, alpha_f: 0.05}", lambda: cs.CosineAnnealingScheduler(alpha_f=0.05)),
    "cosine_warm_restarts": ("{name: cosine_warm_restarts, t_0: 7ba, t_mult: 2.0, alpha_f: 0.05}",
                             lambda: cs.CosineAnnealingWarmRestartsScheduler(t_0="7ba", t_mult=2.0, alpha_f=0.05)),
    "polynomial": ("{name: polynomial, power: 2.0, alpha_f: 0.1}",
                   lambda: cs.PolynomialScheduler(power=2.0, alpha_f=0.1)),
    "step": ("{name: step, step_size: 6ba, gamma: 0.5}", lambda: cs.StepScheduler(step_size="6ba", gamma=0.5)),
    "multistep": ("{name: multistep, milestones: [5ba, 12ba], gamma: 0.3}",
                  lambda: cs.MultiStepScheduler(milestones=["5ba", "12ba"], gamma=0.3)),
    "exponential": ("{name: exponential, gamma: 0.9}", lambda: cs.ExponentialScheduler(gamma=0.9)),
    "constant_with_warmup": ("{name: constant_with_warmup, t_warmup: 6ba}",
                             lambda: cs.ConstantWithWarmupScheduler(t_warmup="6ba")),
    "cosine_with_warmup": ("{name: cosine_with_warmup, t_warmup: 5ba, alpha_f: 0.1}",
                           lambda: cs.CosineAnnealingWithWarmupScheduler(t_warmup="5ba", alpha_f=0.1)),
    "linear_decay_with_warmup": ("{name: linear_decay_with_warmup, t_warmup: 4ba, alpha_f: 0.2}",
                                 lambda: cs.LinearWithWarmupScheduler(t_warmup="4ba", alpha_f=0.2)),
    "multistep_with_warmup": ("{name: multistep_with_warmup, t_warmup: 4ba, milestones: [10ba, 20ba], gamma: 0.5}",
                              lambda: cs.MultiStepWithWarmupScheduler(t_warmup="4ba", milestones=["10ba", "20ba"],
                                                                      gamma=0.5)),
    "cosine_with_warmup_scaled": ("{name: cosine_with_warmup, t_warmup: 5ba, alpha_f: 0.1, scale_warmup: true}",
                                  lambda: cs.CosineAnnealingWithWarmupScheduler(t_warmup="5ba", alpha_f=0.1,
                                                                                scale_warmup=True)),
}

RECIPE = """
max_seq_len: 8
seed: 1
model: {{name: mpt_causal_lm, d_model: 16, n_heads: 2, n_layers: 1, expansion_ratio: 2, max_seq_len: 8,
        vocab_size: 32, attn_config: {{attn_impl: torch}}}}
tokenizer: {{name: unused}}
train_loader: {{name: text, dataset: {{local: {data}, split: train, shuffle: false, max_seq_len: 8}}, drop_last: true}}
optimizer: {{name: decoupled_sgdw, lr: {lr}}}
scheduler: {scheduler}
max_duration: {steps}ba
eval_interval: 0
global_train_batch_size: 2
device_train_microbatch_size: 2
device_eval_batch_size: 2
precision: fp32
log_to_console: false
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(root / "train"), columns={"tokens": "ndarray:int32"}) as w:
        for _ in range(2 * STEPS):
            w.write({"tokens": rng.integers(0, 32, 8, dtype=np.int32)})
    return root


def tessera_rates(tmp_path, dataset, section):
    if not pathlib.Path(DRIVER).exists():
        pytest.fail(f"{DRIVER} does not exist: build the project first")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(data=dataset, lr=LR, scheduler=section, steps=STEPS))
    proc = subprocess.run([DRIVER, "train-trace", str(recipe), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [lr / LR for lr in json.loads((tmp_path / "trace.json").read_text())["lrs"]]


class Rates(Callback):
    def __init__(self):
        self.rates = []

    def before_train_batch(self, state, logger):
        self.rates.append(state.optimizers[0].param_groups[0]["lr"])


def composer_rates(scheduler):
    torch.manual_seed(0)
    model = ComposerClassifier(torch.nn.Linear(4, 2), num_classes=2)
    data = TensorDataset(torch.randn(2 * STEPS, 4), torch.randint(0, 2, (2 * STEPS,)))
    rates = Rates()
    trainer = Trainer(model=model, train_dataloader=DataLoader(data, batch_size=2),
                      optimizers=torch.optim.SGD(model.parameters(), lr=1.0), schedulers=scheduler,
                      max_duration=f"{STEPS}ba", callbacks=[rates], device="cpu", progress_bar=False,
                      log_to_console=False)
    trainer.fit()
    return rates.rates


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_matches_composers(tmp_path, dataset, name):
    section, build = SCHEDULES[name]
    ours = tessera_rates(tmp_path, dataset, section)
    theirs = composer_rates(build())
    assert len(ours) == len(theirs) == STEPS
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)
