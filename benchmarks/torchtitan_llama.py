"""torchtitan's own Llama 3 trainer on one GPU, offline, for benchmarks/gpu_train_vs_pytorch.py: the Llama 3.2 1B shape
on random tokens, run through torchrun (the trainer sets up a process group even for one GPU).

torchtitan 0.2.2 (the release for torch 2.11) and its pure-Python dependencies come as wheels inside the GPU kit
(tools/gpu_bundle.sh), unpacked onto PYTHONPATH. Three modules it imports at start-up but does not use on this path --
HF `datasets` (its C4 loader), `tokenizers` and TensorBoard -- are stood in for by empty modules when missing, so the
kit need not carry pyarrow. A TrainSpec `llama3_synth` is torchtitan's llama3 one with a random-token loader and no
tokenizer, and the `1B` flavor is added to its table (dim 2048, 16 layers, 32 heads, 8 K/V heads, SwiGLU 8192, vocab
128256, rope theta 500000; untied embeddings: torchtitan 0.2.2's Llama 3 cannot tie them). Every step's metrics dict
is also printed as one `TT_METRICS {json}` line.

    PYTHONPATH=SITE torchrun --standalone --nproc_per_node=1 benchmarks/torchtitan_llama.py \
        --model.name llama3_synth --model.flavor 1B --training.local_batch_size 8 --training.seq_len 2048 ...
"""
import dataclasses
import json
import sys
import types


def _stub(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def _unavailable(*a, **k):
    raise RuntimeError("stubbed out in offline benchmark kit")


try:
    import datasets  # noqa: F401
except ImportError:  # torchtitan/hf_datasets/text_datasets.py imports it at module level
    _stub("datasets", Dataset=type("Dataset", (), {}), load_dataset=_unavailable)
    _stub("datasets.distributed", split_dataset_by_node=_unavailable)
try:
    import tokenizers  # noqa: F401
except ImportError:  # torchtitan/components/tokenizer.py imports it at module level
    _stub("tokenizers", AddedToken=type("AddedToken", (), {}), Tokenizer=type("Tokenizer", (), {}))
try:
    from torch.utils.tensorboard import SummaryWriter  # noqa: F401
except ImportError:  # torchtitan/components/metrics.py imports it at module level
    _stub("torch.utils.tensorboard", SummaryWriter=type("SummaryWriter", (), {}))

import torch
from torchtitan.components import metrics as tt_metrics
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec, llama3_args
from torchtitan.protocols.train_spec import register_train_spec
from torchtitan.train import Trainer, main

# Llama-3.2-1B shape (untied embeddings: torchtitan 0.2.2 llama3 has no weight tying).
# ffn hidden = 1024*ceil(int(1.5*int(2*4*2048/3))/1024) = 8192
llama3_args["1B"] = TransformerModelArgs(
    dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
    ffn_dim_multiplier=1.5, multiple_of=1024, rope_theta=500000,
)


class SyntheticLoader(BaseDataLoader):
    def __init__(self, bs, seq, vocab, seed=1234):
        self.bs, self.seq, self.vocab, self.seed = bs, seq, vocab, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            x = torch.randint(0, self.vocab, (self.bs, self.seq + 1), generator=g)
            yield {"input": x[:, :-1].contiguous()}, x[:, 1:].contiguous()

    def state_dict(self):
        return {}

    def load_state_dict(self, state_dict):
        pass


def build_synthetic_dataloader(dp_world_size, dp_rank, tokenizer, job_config, **kw):
    t = job_config.training
    return SyntheticLoader(t.local_batch_size, t.seq_len,
                           llama3_args[job_config.model.flavor].vocab_size, seed=1234 + dp_rank)


register_train_spec("llama3_synth", dataclasses.replace(
    get_train_spec(), build_dataloader_fn=build_synthetic_dataloader,
    build_tokenizer_fn=None, build_validator_fn=None, state_dict_adapter=None))

# Also emit every metric dict (step time, max_active, tps, mfu...) as one JSON line.
_orig_log = tt_metrics.BaseLogger.log  # used when TB/W&B are off


def _json_log(self, m, step):
    print("TT_METRICS " + json.dumps({"step": step, **{k: float(v) for k, v in m.items()}}), flush=True)
    _orig_log(self, m, step)


tt_metrics.BaseLogger.log = _json_log

if __name__ == "__main__":
    main(Trainer)
