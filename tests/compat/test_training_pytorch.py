"""Tessera's training loop against the same loop written in plain PyTorch (the peer) with Hugging Face's MPT:

- The batches Tessera trains on are exactly mosaicml-streaming's StreamingDataset batches (same seed and shuffle).
- From the same initial weights, on those batches, with the peer optimizer (torch.optim.AdamW for adamw and for
  decoupled_adamw with its decay expressed as wd / lr0, which is what Composer's DecoupledAdamW computes;
  torch.optim.SGD with Nesterov momentum for decoupled_sgdw; LLM Foundry's Lion update for decoupled_lionw), Composer's cosine_with_warmup schedule (including
  Composer's order: the rate of step k is the schedule at step k - 1), torch's clip_grad_norm_ and two microbatches
  per step: the first 50 losses agree within 1e-5 relative in fp32.
- Gradient accumulation over 4 microbatches gives the same losses as one batch of 8.
"""
import json
import math

import numpy as np
import pytest
import torch
from streaming import MDSWriter, StreamingDataset
from transformers import MptForCausalLM

STEPS = 50
BATCH = 8
SEQ = 32
LR = 2e-3
WD = 1e-4
WARMUP = 5
ALPHA_F = 0.1

RECIPE = """
max_seq_len: 32
seed: 5
model:
  name: mpt_causal_lm
  d_model: 64
  n_heads: 4
  n_layers: 2
  expansion_ratio: 4
  max_seq_len: 32
  vocab_size: 128
  no_bias: true
  norm_type: layernorm
  attn_config: {{attn_impl: torch, alibi: true}}
tokenizer: {{name: unused}}
train_loader:
  name: text
  dataset: {{local: {data}, split: train, shuffle: true, shuffle_seed: 17, max_seq_len: 32}}
  drop_last: true
optimizer: {optimizer}
scheduler: {{name: cosine_with_warmup, t_warmup: {warmup}ba, alpha_f: {alpha_f}}}
algorithms:
  gradient_clipping: {{clipping_type: norm, clipping_threshold: 1.0}}
max_duration: {steps}ba
eval_interval: 0
global_train_batch_size: {batch}
device_train_microbatch_size: 4
device_eval_batch_size: 8
precision: fp32
log_to_console: false
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("train_data")
    rng = np.random.default_rng(0)
    # Sequences with structure to learn: a random start and a per-sample stride, mod 128.
    with MDSWriter(out=str(root / "train"), columns={"tokens": "ndarray:int32"}, compression="zstd") as w:
        for _ in range(STEPS * BATCH + 37):
            start, stride = rng.integers(0, 128), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % 128).astype(np.int32)})
    return root


class LLMFoundryLion(torch.optim.Optimizer):
    """DecoupledLionW as LLM Foundry defines it (llmfoundry/optim/lion.py), for the comparison."""

    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, initial_lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["weight_decay"] != 0:
                    p.mul_(1 - group["lr"] / group["initial_lr"] * group["weight_decay"])
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.add_(exp_avg.lerp(p.grad, 1 - beta1).sign_(), alpha=-group["lr"])
                exp_avg.lerp_(p.grad, 1 - beta2)


# name -> (the recipe's optimizer section, the peer optimizer); Composer's decoupled decay wd * lr_t / lr0 is
# torch AdamW's lr_t * (wd / lr0).
OPTIMIZERS = {
    "decoupled_adamw": (
        f"{{name: decoupled_adamw, lr: {LR}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {WD}}}",
        lambda ps: torch.optim.AdamW(ps, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD / LR)),
    "adamw": (
        f"{{name: adamw, lr: {LR}, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.01}}",
        lambda ps: torch.optim.AdamW(ps, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
    "decoupled_sgdw": (
        "{name: decoupled_sgdw, lr: 0.3, momentum: 0.9, nesterov: true}",
        lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9, nesterov=True)),
    "decoupled_lionw": (
        "{name: decoupled_lionw, lr: 3.0e-4, betas: [0.9, 0.99], weight_decay: 1.0e-3}",
        lambda ps: LLMFoundryLion(ps, lr=3e-4, betas=(0.9, 0.99), weight_decay=1e-3)),
}


def run_tessera(driver, tmp_path, dataset, *overrides, optimizer="decoupled_adamw"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(data=dataset, warmup=WARMUP, alpha_f=ALPHA_F, steps=STEPS, batch=BATCH,
                                    optimizer=OPTIMIZERS[optimizer][0]))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    driver("train-trace", recipe, out, *overrides)
    trace = json.loads((out / "trace.json").read_text())
    return out, trace


def composer_cosine_with_warmup(batch):
    if batch < WARMUP:
        return batch / WARMUP
    frac = min(1.0, (batch - WARMUP) / (STEPS - WARMUP))
    return ALPHA_F + (1 - ALPHA_F) * 0.5 * (1 + math.cos(math.pi * frac))


def test_batches_are_streamings_order(driver, tmp_path, dataset):
    _, trace = run_tessera(driver, tmp_path, dataset)
    ds = StreamingDataset(local=str(dataset), split="train", shuffle=True, shuffle_seed=17, batch_size=BATCH)
    it = iter(ds)
    for k in range(STEPS):
        expected = np.stack([next(it)["tokens"][:SEQ] for _ in range(BATCH)]).astype(np.int64)
        got = np.array(trace["batches"][k]).reshape(BATCH, SEQ)
        np.testing.assert_array_equal(got, expected, err_msg=f"batch {k}")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_losses_match_plain_pytorch_loop(driver, tmp_path, dataset, optimizer):
    out, trace = run_tessera(driver, tmp_path, dataset, optimizer=optimizer)
    torch.manual_seed(0)
    model = MptForCausalLM.from_pretrained(out / "init", torch_dtype=torch.float32)
    model.train()
    opt = OPTIMIZERS[optimizer][1](model.parameters())
    lr0 = opt.param_groups[0]["lr"]
    losses, lrs = [], []
    for k in range(STEPS):
        lr = lr0 * composer_cosine_with_warmup(max(k - 1, 0))
        lrs.append(lr)
        for group in opt.param_groups:
            group["lr"] = lr
        ids = torch.tensor(trace["batches"][k]).reshape(BATCH, SEQ)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in ids.split(4):
            loss = model(input_ids=mb, labels=mb).loss * (mb.shape[0] / BATCH)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(total)
    np.testing.assert_allclose(trace["lrs"], lrs, rtol=1e-12, atol=0)
    # Lion steps by sign(interpolated momentum): an element whose momentum is within rounding of zero can take the
    # opposite sign on the two sides and move by 2·lr, so its losses agree a little less tightly than Adam's or SGD's.
    rtol = 5e-5 if optimizer == "decoupled_lionw" else 1e-5
    np.testing.assert_allclose(trace["losses"], losses, rtol=rtol, atol=0)
    assert losses[-1] < losses[0] - 0.5  # it really trained


def test_accumulation_matches_one_batch(driver, tmp_path, dataset):
    _, four = run_tessera(driver, tmp_path / "a", dataset, "device_train_microbatch_size=2", "max_duration=10ba")
    _, one = run_tessera(driver, tmp_path / "b", dataset, "device_train_microbatch_size=8", "max_duration=10ba")
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=1e-5, atol=0)
