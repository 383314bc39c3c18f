"""Fine-tuning with Tessera's trainer against LLM Foundry's own fine-tuning run in Composer's Trainer: the loss of the
first optimizer steps on the same weights and the same batches, in fp32.

Tessera (the compat driver's train-trace) trains a tiny Llama recipe with `train_loader: {name: finetuning}` on a
JSONL file and writes its initial weights (transformers' LlamaForCausalLM layout), the input_ids of every device
batch, the rate and the train loss of every step. LLM Foundry's side is what its train.py builds from the same
recipe: llmfoundry.models.hf.ComposerHFCausalLM with those pretrained weights, build_finetuning_dataloader on the same
file, tokenizer folder and dataset settings, Composer's DecoupledAdamW and LinearScheduler, and composer.Trainer with
device_train_microbatch_size 2 of the device batch of 4.

- The batches are the same input_ids, batch for batch.
- Every step's loss (Composer's loss/train/total: with accumulate_train_batch_on_tokens, LLM Foundry's default, the
  mean over all loss-generating tokens of the batch, the microbatches weighted by their loss tokens) agrees within
  1e-5. Step 1 compares the loss on the same weights; steps 2 and 3 also compare the gradient (the token-normalised
  accumulation over two microbatches with different numbers of loss tokens) and DecoupledAdamW's step.
- With accumulate_train_batch_on_tokens false (Composer weights the microbatches' mean losses by samples) the losses
  agree too.
- With packing_ratio 2.0 the packed batches are the same, but the losses are not compared with LLM Foundry's:
  ComposerHFCausalLM does not pass sequence_id to HF models, so packed examples attend to each other there, while
  Tessera's Llama resets attention per example. Step 1's loss is compared instead with transformers'
  LlamaForCausalLM under a block-diagonal causal mask (what LLM Foundry's MPT does with attn_uses_sequence_id), and
  must differ from the loss with attention across the examples.

The tokenizer is a byte-level BPE trained here on the fortunes corpus, with eos only and no chat template, so chat rows
are formatted with LLM Foundry's ChatML fallback (<|im_start|> / <|im_end|>).
"""
import copy
import json
import os
import pathlib
import random
import subprocess

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from composer import Callback, Trainer  # noqa: E402
from composer.optim import DecoupledAdamW, LinearScheduler  # noqa: E402
from llmfoundry.data.finetuning import build_finetuning_dataloader  # noqa: E402
from llmfoundry.models.hf import ComposerHFCausalLM  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DRIVER = os.environ.get("TESSERA_COMPAT_DRIVER", str(ROOT / "build" / "bin" / "tessera_compat_driver"))
FORTUNES = pathlib.Path("/usr/share/games/fortunes")

SEED = 7
SEQ = 64
BATCH = 4
MICROBATCH = 2
STEPS = 3
LR = 5e-3
BETAS = (0.9, 0.95)
EPS = 1e-8
WD = 1e-2
ALPHA_F = 0.1

RECIPE = """
max_seq_len: {seq}
seed: {seed}
model:
  name: llama
  init_device: cpu
  vocab_size: 1024
  hidden_size: 64
  intermediate_size: 128
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: {seq}
  rms_norm_eps: 1.0e-05
  rope_theta: 10000.0
  tie_word_embeddings: false
tokenizer:
  name: {tokenizer}
train_loader:
  name: finetuning
  dataset: {dataset}
  drop_last: true
optimizer: {{name: decoupled_adamw, lr: {lr}, betas: [{b1}, {b2}], eps: {eps}, weight_decay: {wd}}}
scheduler: {{name: linear, alpha_i: 1.0, alpha_f: {alpha_f}}}
max_duration: {steps}ba
eval_interval: 0
global_train_batch_size: {batch}
device_train_microbatch_size: {microbatch}
device_eval_batch_size: {batch}
accumulate_train_batch_on_tokens: {on_tokens}
precision: fp32
log_to_console: false
"""


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer and data

def fortunes():
    docs = []
    for name in ("computers", "science", "wisdom", "people"):
        text = (FORTUNES / name).read_text(errors="replace")
        docs += [d.strip() for d in text.split("\n%\n") if d.strip()][:250]
    return docs


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(fortunes(), trainers.BpeTrainer(
        vocab_size=1000, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"]))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    assert len(hf) <= 1024, "the model's vocab_size must cover the tokenizer"
    hf.save_pretrained(root)
    return root


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Rows whose loss-generating parts range from a few tokens to the whole rest of max_seq_len, so the two
    microbatches of a batch hold very different numbers of loss tokens."""
    root = tmp_path_factory.mktemp("finetuning_data")
    rng = random.Random(1234)
    docs = fortunes()
    tiny = [d for d in docs if len(d) <= 40]
    short = [d for d in docs if len(d) <= 80]
    long = [d for d in docs if len(d) > 300]
    answer = lambda i: rng.choice(long) if i % 3 == 0 else rng.choice(tiny)  # noqa: E731
    chat = []
    for i in range(32):
        msgs = [("user", rng.choice(short)), ("assistant", answer(i))]
        if i % 4 == 1:
            msgs = [("system", "Be brief."), ("user", rng.choice(tiny)), ("assistant", rng.choice(tiny))] + msgs
        chat.append({"messages": [{"role": r, "content": c} for r, c in msgs]})
    _write_jsonl(root / "chat.jsonl", chat)
    _write_jsonl(root / "pr.jsonl", [{"prompt": rng.choice(short), "response": answer(i)} for i in range(32)])
    # short rows (mostly under half of max_seq_len), for packing several into one sequence
    _write_jsonl(root / "short.jsonl", [{"prompt": rng.choice(tiny), "response": rng.choice(tiny)} for i in range(48)])
    return root


def dataset_config(corpus, file, **kw):
    ds = {"hf_name": "json", "hf_kwargs": {"data_files": {"train": str(corpus / file)}}, "split": "train",
          "max_seq_len": SEQ, "decoder_only_format": True, "shuffle": True, "shuffle_seed": 3}
    ds.update(kw)
    return ds


# ---------------------------------------------------------------------------------------------------------------
# The two sides

def tessera_run(tmp_path, tokenizer_dir, dataset, on_tokens):
    if not pathlib.Path(DRIVER).exists():
        pytest.fail(f"{DRIVER} does not exist: build the project first")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(seq=SEQ, seed=SEED, tokenizer=tokenizer_dir, dataset=json.dumps(dataset), lr=LR,
                                    b1=BETAS[0], b2=BETAS[1], eps=EPS, wd=WD, alpha_f=ALPHA_F, steps=STEPS,
                                    batch=BATCH, microbatch=MICROBATCH, on_tokens=str(on_tokens).lower()))
    out = tmp_path / "tessera"
    proc = subprocess.run([DRIVER, "train-trace", str(recipe), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    trace = json.loads((out / "trace.json").read_text())
    assert len(trace["batches"]) == len(trace["losses"]) == STEPS, {k: len(v) for k, v in trace.items()}
    return out / "init", trace


class Record(Callback):
    """Each batch's input_ids and labels, the rate it is trained with, each microbatch's mean loss and the batch's
    loss/train/total."""

    def __init__(self):
        self.input_ids, self.labels, self.lrs, self.losses, self.microbatch_losses = [], [], [], [], []

    def batch_start(self, state, logger):
        self.input_ids.append(state.batch["input_ids"].clone())
        self.labels.append(state.batch["labels"].clone())
        self.microbatch_losses.append([])

    def before_train_batch(self, state, logger):
        self.lrs.append(state.optimizers[0].param_groups[0]["lr"])

    def after_loss(self, state, logger):
        self.microbatch_losses[-1].append(state.loss.item())

    def batch_end(self, state, logger):
        self.losses.append(state.total_loss_dict["loss/train/total"])


def foundry_loader(tmp_path, monkeypatch, tokenizer_dir, dataset):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    spec = build_finetuning_dataloader(tokenizer=tokenizer, device_batch_size=BATCH, dataset=copy.deepcopy(dataset),
                                       num_workers=0, drop_last=True, pin_memory=False, prefetch_factor=None,
                                       persistent_workers=False)
    return tokenizer, spec


def foundry_run(tmp_path, monkeypatch, tokenizer_dir, dataset, init, on_tokens):
    tokenizer, spec = foundry_loader(tmp_path, monkeypatch, tokenizer_dir, dataset)
    model = ComposerHFCausalLM(tokenizer=tokenizer, pretrained_model_name_or_path=str(init), pretrained=True,
                               trust_remote_code=False, use_train_metrics=False, init_device="cpu")
    optimizer = DecoupledAdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    record = Record()
    trainer = Trainer(model=model, train_dataloader=spec, optimizers=optimizer,
                      schedulers=LinearScheduler(alpha_i=1.0, alpha_f=ALPHA_F), max_duration=f"{STEPS}ba",
                      device_train_microbatch_size=MICROBATCH, accumulate_train_batch_on_tokens=on_tokens,
                      precision="fp32", device="cpu", seed=SEED, callbacks=[record], progress_bar=False,
                      log_to_console=False, save_folder=None)
    trainer.fit()
    trainer.close()
    return record


def loss_tokens(labels):
    """Loss-generating tokens of each microbatch (labels shifted by one, as the loss sees them)."""
    return [int((mb[:, 1:] != -100).sum()) for mb in labels.split(MICROBATCH)]


def assert_same_batches(trace, peer_batches):
    assert len(peer_batches) >= STEPS
    for k in range(STEPS):
        want = peer_batches[k]
        got = torch.tensor(trace["batches"][k])
        assert got.numel() == want.numel(), f"batch {k}: {got.numel()} tokens, LLM Foundry has {want.shape}"
        got = got.reshape(want.shape)
        if not torch.equal(got, want):
            r, p = (got != want).nonzero()[0].tolist()
            raise AssertionError(f"batch {k} row {r} position {p}: tessera {got[r, p:p + 8].tolist()} vs "
                                 f"LLM Foundry {want[r, p:p + 8].tolist()}")


# ---------------------------------------------------------------------------------------------------------------
# Cases

CASES = {  # data file, dataset settings, accumulate_train_batch_on_tokens
    "chat-chatml-on-tokens": ("chat.jsonl", {}, True),
    "prompt-response-on-tokens": ("pr.jsonl", {}, True),
    "chat-chatml-on-samples": ("chat.jsonl", {}, False),
}


@pytest.mark.parametrize("name", CASES)
def test_first_losses_equal_llmfoundry(name, tmp_path, monkeypatch, tokenizer_dir, corpus):
    file, settings, on_tokens = CASES[name]
    dataset = dataset_config(corpus, file, **settings)
    init, trace = tessera_run(tmp_path, tokenizer_dir, dataset, on_tokens)
    peer = foundry_run(tmp_path, monkeypatch, tokenizer_dir, dataset, init, on_tokens)

    assert_same_batches(trace, peer.input_ids)
    counts = [loss_tokens(labels) for labels in peer.labels]
    # The case must tell token weighting from sample weighting: some batch's microbatches differ a lot.
    assert any(abs(a - b) >= 10 for a, b in counts), f"loss tokens per microbatch {counts}"
    by_tokens = [sum(n * l for n, l in zip(c, mb)) / sum(c) for c, mb in zip(counts, peer.microbatch_losses)]
    by_samples = [sum(mb) / len(mb) for mb in peer.microbatch_losses]
    assert max(abs(a - b) for a, b in zip(by_tokens, by_samples)) > 1e-4, "weighting by tokens should show"
    # Composer's total is the mean over the batch's loss tokens, or the mean of the microbatches' means
    assert peer.losses == pytest.approx(by_tokens if on_tokens else by_samples, abs=1e-6), "Composer's total"

    assert trace["lrs"] == pytest.approx(peer.lrs, rel=1e-12, abs=0), "learning rates"
    diffs = [abs(a - b) for a, b in zip(trace["losses"], peer.losses)]
    print(f"{name}: tessera {trace['losses']} LLM Foundry {peer.losses} |diff| {diffs} loss tokens {counts}")
    for k, d in enumerate(diffs):
        assert d <= 1e-5, (f"step {k + 1}: tessera loss {trace['losses'][k]!r}, LLM Foundry {peer.losses[k]!r} "
                           f"(diff {d:.3g}; all diffs {diffs}); loss tokens per microbatch {counts[k]}")
    assert peer.losses[-1] < peer.losses[0], "the steps really trained"


def packed_loss(model, batch, per_example):
    """The batch's mean loss over its loss tokens; with per_example, each packed example attends only to itself
    (a block-diagonal causal mask from sequence_id, as LLM Foundry's MPT does with attn_uses_sequence_id)."""
    ids, labels, seq = batch["input_ids"], batch["labels"], batch["sequence_id"]
    causal = torch.tril(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool))
    mask = causal & (seq[:, :, None] == seq[:, None, :]) if per_example else causal.expand(ids.shape[0], -1, -1)
    mask = torch.where(mask, 0.0, torch.finfo(torch.float32).min)[:, None]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    targets = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), targets.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss.item() / int((targets != -100).sum())


def test_packed_batches_equal_llmfoundry(tmp_path, monkeypatch, tokenizer_dir, corpus):
    """packing_ratio 2.0: the trainer's packed batches are LLM Foundry's. LLM Foundry's HF path lets packed examples
    attend to each other, Tessera's Llama does not: its first loss (same weights) is compared with transformers'
    LlamaForCausalLM under a block-diagonal mask instead, and must differ from LLM Foundry's."""
    dataset = dataset_config(corpus, "short.jsonl", packing_ratio=2.0)
    init, trace = tessera_run(tmp_path, tokenizer_dir, dataset, True)
    _, spec = foundry_loader(tmp_path, monkeypatch, tokenizer_dir, dataset)
    spec.dataloader.sampler.set_epoch(0)  # what Composer's Trainer does at the start of the epoch
    batches = []
    for batch in spec.dataloader:
        batches.append(batch)
        if len(batches) == STEPS:
            break
    assert all(int(b["sequence_id"].max()) >= 1 for b in batches), "every batch should hold packed examples"
    assert_same_batches(trace, [b["input_ids"] for b in batches])

    model = LlamaForCausalLM.from_pretrained(init, torch_dtype=torch.float32, attn_implementation="eager").eval()
    per_example, across = packed_loss(model, batches[0], True), packed_loss(model, batches[0], False)
    assert abs(per_example - across) > 1e-4, "the case should tell per-example attention from attention across"
    assert abs(trace["losses"][0] - per_example) <= 1e-5, (
        f"step 1: tessera {trace['losses'][0]!r}, per-example attention {per_example!r}, attention across packed "
        f"examples (LLM Foundry's HF path) {across!r}")
