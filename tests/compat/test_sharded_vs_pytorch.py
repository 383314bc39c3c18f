"""Tessera's sharded training on 2 ranks against PyTorch's own data parallelism on 2 processes (gloo, CPU):

- Tessera's FULL_SHARD against FSDP2 (`torch.distributed.fsdp.fully_shard` on each MPT block and on the root, over a
  gloo device mesh), and Tessera's NO_SHARD against `torch.nn.parallel.DistributedDataParallel`.
- The PyTorch side is Hugging Face's `MptForCausalLM`, loaded from Tessera's initial weights (exported as an HF folder
  by `tessera_compat_driver train-trace`, gathered from the shards), with Composer's cosine_with_warmup schedule (the
  rate of step k is the schedule at step k - 1) and two microbatches per rank and step, as in
  test_training_pytorch.py, which is the single-process version of this test. Two optimizer set-ups:
  decoupled_adamw (torch AdamW with the decay expressed as wd / lr0) with clip_grad_norm_ at 1.0, which checks the
  global gradient norm over the shards; and decoupled_sgdw (torch SGD, Nesterov momentum) without clipping, whose
  steps are proportional to the gradient, so that a reduction that sums instead of averaging over the ranks (which
  Adam's normalisation and clipping would hide) shows.
- Each rank's batches are mosaicml-streaming's: every PyTorch rank reads `StreamingDataset` with its own RANK /
  WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE, and Tessera's ranks (the driver under torchrun's variables) must have
  trained on exactly those batches.
- 10 steps in fp32: the per-step losses (the mean over both ranks) agree within 1e-5 relative (LOSS_RTOL) and the
  final weights within 1e-5 absolute (WEIGHT_ATOL), for both pairs and both optimizers.
"""
import contextlib
import math
import os

import numpy as np
import pytest
import torch

import driver_ranks
import streaming_shm
from driver_ranks import run_driver_ranks

STEPS = 10
WORLD = 2
BATCH = 8  # global; 4 per rank, in microbatches of 2
DEVICE_BATCH = BATCH // WORLD
MICRO = 2
SEQ = 32
LR = 2e-3  # decoupled_adamw
WD = 1e-4
SGD_LR = 0.3  # decoupled_sgdw
WARMUP = 2
ALPHA_F = 0.1
SHUFFLE_SEED = 17

# Losses: both sides compute the same fp32 function in a different order (HF's attention and MLP against Tessera's,
# gloo's reductions against Tessera's), which leaves differences of a few ulps in each step's gradients; the single-
# process comparison (test_training_pytorch.py) holds 1e-5 relative over 50 steps, and 10 sharded steps must too.
# Measured: ~1e-7.
LOSS_RTOL = 1e-5
# Weights: the same rounding differences, carried through 10 updates. Adam normalises each element's update
# (m / sqrt(v)), so they do not shrink with the gradient as they do in the loss; measured ~1e-7 for both optimizers.
# 1e-5 leaves two orders of magnitude for other CPUs' kernels, and is far below what a wrong shard, a missing
# reduction or a gradient scaled by the world size would give (the weights move by ~1e-2 over these 10 steps,
# asserted too).
WEIGHT_ATOL = 1e-5

RECIPE = """
max_seq_len: 32
seed: 5
device: cpu
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
  dataset: {{local: {data}, split: train, shuffle: true, shuffle_seed: {shuffle_seed}, max_seq_len: 32}}
  drop_last: true
optimizer: {optimizer}
scheduler: {{name: cosine_with_warmup, t_warmup: {warmup}ba, alpha_f: {alpha_f}}}
algorithms: {algorithms}
fsdp_config: {{sharding_strategy: {strategy}}}
max_duration: {steps}ba
eval_interval: 0
global_train_batch_size: {batch}
device_train_microbatch_size: {micro}
device_eval_batch_size: 8
precision: fp32
log_to_console: false
"""

# Tessera's strategy -> the PyTorch wrapper it is compared with.
PAIRS = {"FULL_SHARD": "fsdp2", "NO_SHARD": "ddp"}
# name -> (the recipe's optimizer, its algorithms, clip_grad_norm_'s max_norm or None). The peer's optimizers are in
# peer_optimizer (built in the spawned ranks, so the table holds no functions).
OPTIMIZERS = {
    "decoupled_adamw": (f"{{name: decoupled_adamw, lr: {LR}, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: {WD}}}",
                        "{gradient_clipping: {clipping_type: norm, clipping_threshold: 1.0}}", 1.0),
    "decoupled_sgdw": (f"{{name: decoupled_sgdw, lr: {SGD_LR}, momentum: 0.9, nesterov: true}}", "{}", None),
}


def peer_optimizer(name, params):
    if name == "decoupled_adamw":  # Composer's decoupled decay wd * lr_t / lr0 is torch AdamW's lr_t * (wd / lr0)
        return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD / LR)
    return torch.optim.SGD(params, lr=SGD_LR, momentum=0.9, nesterov=True)


def rank_env(rank):
    """torchrun's variables for rank `rank` of a one-node job of WORLD ranks."""
    return driver_ranks.rank_env(rank, WORLD, 0)  # the rendezvous is a file (peer_rank)


def composer_cosine_with_warmup(batch):
    if batch < WARMUP:
        return batch / WARMUP
    frac = min(1.0, (batch - WARMUP) / (STEPS - WARMUP))
    return ALPHA_F + (1 - ALPHA_F) * 0.5 * (1 + math.cos(math.pi * frac))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from streaming import MDSWriter

    root = tmp_path_factory.mktemp("train_data")
    rng = np.random.default_rng(0)
    # Sequences with structure to learn: a random start and a per-sample stride, mod 128.
    with MDSWriter(out=str(root / "train"), columns={"tokens": "ndarray:int32"}, compression="zstd") as w:
        for _ in range(STEPS * BATCH + 37):
            start, stride = rng.integers(0, 128), rng.integers(1, 6)
            w.write({"tokens": ((start + stride * np.arange(SEQ + 1)) % 128).astype(np.int32)})
    return root


def run_tessera_ranks(driver_path, tmp_path, dataset, strategy, optimizer):
    """`tessera_compat_driver train-trace` as the WORLD ranks of one job; returns (out dir of rank 0, traces)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(data=dataset, shuffle_seed=SHUFFLE_SEED, optimizer=OPTIMIZERS[optimizer][0],
                                    algorithms=OPTIMIZERS[optimizer][1], warmup=WARMUP, alpha_f=ALPHA_F,
                                    strategy=strategy, steps=STEPS, batch=BATCH, micro=MICRO))
    outs, traces, _ = run_driver_ranks(driver_path, recipe, tmp_path, WORLD, strategy)
    return outs[0], traces


# ---- The PyTorch side: one process per rank (torch.multiprocessing.spawn), both wrappers in turn. ----------------


def peer_train(kind, optimizer, init_dir, batches, mesh):
    """Trains HF MPT from init_dir on this rank's batches under DDP or FSDP2; returns (global losses, full weights)."""
    import torch.distributed as dist
    from transformers import MptForCausalLM

    torch.manual_seed(0)
    model = MptForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    model.train()
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        # Tessera's units: each block, then the root (embedding, final norm and the tied head).
        for block in model.transformer.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
    opt = peer_optimizer(optimizer, wrapped.parameters())
    lr0 = opt.param_groups[0]["lr"]
    max_norm = OPTIMIZERS[optimizer][2]
    losses = []
    for k in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr0 * composer_cosine_with_warmup(max(k - 1, 0))
        ids = torch.tensor(batches[k]).reshape(DEVICE_BATCH, SEQ)
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        micro = ids.split(MICRO)
        for i, mb in enumerate(micro):
            last = i == len(micro) - 1
            # DDP: all-reduce after the last microbatch only (Tessera's NO_SHARD does the same); FSDP2 reduce-scatters
            # every microbatch's gradients (as Tessera's FULL_SHARD does).
            sync = wrapped.no_sync() if kind == "ddp" and not last else contextlib.nullcontext()
            with sync:
                loss = wrapped(input_ids=mb, labels=mb).loss * (mb.shape[0] / DEVICE_BATCH)
                loss.backward()
            total += loss.detach()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)
        opt.step()
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    state = model.state_dict()
    weights = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
               for name, t in state.items()}
    return losses, weights


def peer_rank(rank, rendezvous, init_dir, data_dir, out_dir):
    os.environ.update(rank_env(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from streaming import StreamingDataset
    from torch.distributed.device_mesh import init_device_mesh

    # A file store, not a TCP port chosen beforehand, which another process can take before rank 0 binds it.
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    # This rank's share of Streaming's order: what a DataLoader without workers gives it, batch by batch.
    ds = StreamingDataset(local=str(data_dir), split="train", shuffle=True, shuffle_seed=SHUFFLE_SEED,
                          batch_size=DEVICE_BATCH)
    it = iter(ds)
    batches = [np.stack([next(it)["tokens"][:SEQ] for _ in range(DEVICE_BATCH)]).astype(np.int64).reshape(-1).tolist()
               for _ in range(STEPS)]
    result = {"batches": batches}
    for optimizer in OPTIMIZERS:
        for kind in PAIRS.values():
            losses, weights = peer_train(kind, optimizer, init_dir, batches, mesh)
            result[kind, optimizer] = {"losses": losses, "weights": weights if rank == 0 else None}
    torch.save(result, os.path.join(out_dir, f"peer{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


# ---- Fixtures and tests ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tessera(driver_path, tmp_path_factory, dataset):
    """(strategy, optimizer) -> (rank 0's out dir with init/ and final/, [trace of each rank])."""
    root = tmp_path_factory.mktemp("tessera")
    return {(s, o): run_tessera_ranks(driver_path, root / f"{s}-{o}", dataset, s, o) for s in PAIRS for o in OPTIMIZERS}


@pytest.fixture(scope="module")
def peer(tessera, tmp_path_factory, dataset):
    """The PyTorch ranks' results: [{"batches", (kind, optimizer): {"losses", "weights"}} per rank]."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("peer")
    init_dir = tessera["FULL_SHARD", "decoupled_adamw"][0] / "init"  # all the same (test_every_run_starts_...)
    streaming_shm.hold()  # the ranks build StreamingDatasets: no other test's Streaming use meanwhile
    mp.spawn(peer_rank, args=(str(out / "rendezvous"), str(init_dir), str(dataset), str(out)), nprocs=WORLD,
             join=True)
    return [torch.load(out / f"peer{rank}.pt", weights_only=False) for rank in range(WORLD)]


def load_hf_weights(folder):
    from transformers import MptForCausalLM

    model = MptForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return {name: t.detach() for name, t in model.state_dict().items()}


def test_every_run_starts_from_the_same_weights(tessera):
    runs = list(tessera)
    first = load_hf_weights(tessera[runs[0]][0] / "init")
    for run in runs[1:]:
        other = load_hf_weights(tessera[run][0] / "init")
        assert first.keys() == other.keys()
        for name in first:
            assert torch.equal(first[name], other[name]), f"{run}: {name}"


@pytest.mark.parametrize("strategy", PAIRS)
def test_each_rank_trains_on_streamings_batches_for_that_rank(tessera, peer, strategy):
    for optimizer in OPTIMIZERS:
        _, traces = tessera[strategy, optimizer]
        for rank, trace in enumerate(traces):
            assert (trace["rank"], trace["world_size"]) == (rank, WORLD)
            assert len(trace["batches"]) == STEPS
            for k in range(STEPS):
                np.testing.assert_array_equal(np.array(trace["batches"][k]), np.array(peer[rank]["batches"][k]),
                                              err_msg=f"{strategy} {optimizer} rank {rank} batch {k}")
    # The ranks split each global batch: no sample twice in a step.
    _, traces = tessera[strategy, "decoupled_adamw"]
    for k in range(STEPS):
        rows = [tuple(r) for rank in range(WORLD) for r in np.array(traces[rank]["batches"][k]).reshape(-1, SEQ)]
        assert len(set(rows)) == BATCH, f"step {k}: the ranks share samples"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("strategy", PAIRS)
def test_losses_and_final_weights_match_pytorch(tessera, peer, strategy, optimizer):
    kind = PAIRS[strategy]
    out, traces = tessera[strategy, optimizer]
    what = f"{strategy} vs {kind} ({optimizer})"
    # Every rank logs the same mean over the ranks.
    assert traces[0]["losses"] == traces[1]["losses"]
    lr0 = LR if optimizer == "decoupled_adamw" else SGD_LR
    lrs = [lr0 * composer_cosine_with_warmup(max(k - 1, 0)) for k in range(STEPS)]
    np.testing.assert_allclose(traces[0]["lrs"], lrs, rtol=1e-12, atol=0)
    theirs = peer[0][kind, optimizer]["losses"]
    assert peer[1][kind, optimizer]["losses"] == theirs
    ours = np.array(traces[0]["losses"])
    loss_diff = np.max(np.abs(ours - np.array(theirs)) / np.abs(np.array(theirs)))
    np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL, atol=0, err_msg=what)
    assert theirs[-1] < theirs[0] - 0.5  # it really trained

    final = load_hf_weights(out / "final")
    ref = peer[0][kind, optimizer]["weights"]
    assert final.keys() == ref.keys()
    diffs = {name: (final[name] - ref[name]).abs().max().item() for name in final}
    worst = max(diffs, key=diffs.get)
    print(f"{what}: max relative loss difference {loss_diff:.3g}, max weight difference {diffs[worst]:.3g} ({worst})")
    assert diffs[worst] <= WEIGHT_ATOL, f"{what}: {worst} differs by {diffs[worst]:.3g}"
    # The weights moved far beyond the tolerance, so the comparison means something.
    init = load_hf_weights(out / "init")
    assert max((ref[name] - init[name]).abs().max().item() for name in ref) > 100 * WEIGHT_ATOL
