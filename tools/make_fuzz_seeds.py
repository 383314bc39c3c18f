"""Writes the committed seed corpus of the libFuzzer targets (fuzz/seeds/<target>/) with the real producers of each
format: Hugging Face `tokenizers` for tokenizer.json, `mosaicml-streaming`'s MDSWriter for MDS, `safetensors` for
safetensors files, and the recipes in recipes/ for recipe YAML. Run from the checkout with the venv of tools/setup_tests.sh:

    ~/.cache/tessera/venv/bin/python tools/make_fuzz_seeds.py

The output is deterministic except for tokenizer training order details; re-running rewrites the seeds.
"""

import json
import os
import pathlib
import shutil
import tempfile

import numpy as np
import torch
from safetensors.torch import save as st_save
from streaming import MDSWriter
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"
TEXT = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Tessera trains large language models in C++ on LibTorch. 12345 67890",
    "Ünïcödé: café, naïve, 日本語のテキスト, emoji 😀 and tabs\tand\nnewlines.",
    "def f(x):\n    return x * 2  # code, too\n",
] * 8


SENTENCEPIECE_STYLE = {'version': '1.0',
 'truncation': None,
 'padding': None,
 'added_tokens': [{'id': 0,
                   'content': '<unk>',
                   'single_word': False,
                   'lstrip': False,
                   'rstrip': False,
                   'normalized': False,
                   'special': True},
                  {'id': 1,
                   'content': '<s>',
                   'single_word': False,
                   'lstrip': False,
                   'rstrip': False,
                   'normalized': False,
                   'special': True},
                  {'id': 2,
                   'content': '</s>',
                   'single_word': False,
                   'lstrip': False,
                   'rstrip': False,
                   'normalized': False,
                   'special': True}],
 'normalizer': {'type': 'Sequence',
                'normalizers': [{'type': 'NFC'},
                                {'type': 'Prepend', 'prepend': '▁'},
                                {'type': 'Replace', 'pattern': {'String': ' '}, 'content': '▁'}]},
 'pre_tokenizer': {'type': 'Metaspace', 'replacement': '▁', 'prepend_scheme': 'first', 'split': True},
 'post_processor': {'type': 'TemplateProcessing',
                    'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                               {'Sequence': {'id': 'A', 'type_id': 0}}],
                    'pair': [{'Sequence': {'id': 'A', 'type_id': 0}},
                             {'Sequence': {'id': 'B', 'type_id': 1}}],
                    'special_tokens': {'<s>': {'id': '<s>', 'ids': [1], 'tokens': ['<s>']}}},
 'decoder': {'type': 'Sequence',
             'decoders': [{'type': 'Replace', 'pattern': {'String': '▁'}, 'content': ' '},
                          {'type': 'ByteFallback'},
                          {'type': 'Fuse'},
                          {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0},
                          {'type': 'Metaspace',
                           'replacement': '▁',
                           'prepend_scheme': 'always',
                           'split': True}]},
 'model': {'type': 'BPE',
           'dropout': None,
           'unk_token': '<unk>',
           'continuing_subword_prefix': None,
           'end_of_word_suffix': None,
           'fuse_unk': True,
           'byte_fallback': True,
           'ignore_merges': False,
           'vocab': {'<unk>': 0,
                     '<s>': 1,
                     '</s>': 2,
                     '<0x41>': 3,
                     '<0xE2>': 4,
                     '<0x82>': 5,
                     '<0xAC>': 6,
                     '▁': 7,
                     'a': 8,
                     'b': 9,
                     'c': 10,
                     '▁a': 11,
                     'ab': 12,
                     '▁ab': 13,
                     'bc': 14},
           'merges': ['▁ a', 'a b', '▁ ab', 'b c']}}


def fresh(name):
    d = SEEDS / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def tokenizers_seeds():
    out = fresh("fuzz_tokenizer_json")
    # GPT-2 style: byte-level BPE, no normalizer.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (out / "gpt2_style.json").write_text(tok.to_str())
    # Llama-3 style: NFC, a split regex then byte-level, added special tokens and a template with BOS.
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(
            pattern=__import__("tokenizers").Regex(
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|begin_of_text|>",
                                                                                      "<|end_of_text|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    (out / "llama3_style.json").write_text(tok.to_str())
    # Metaspace pre-tokenizer with an unknown token (SentencePiece-converted BPE, as older Llama tokenizers are).
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
    (out / "metaspace.json").write_text(tok.to_str())
    # Llama-2 / Mistral layout (Prepend + Replace normalizer, no pre-tokenizer, byte fallback, the Replace / ByteFallback
    # / Fuse / Strip decoders), with a Metaspace pre-tokenizer and decoder too, on a tiny hand-written vocab; loaded and
    # written back by HF tokenizers.
    (out / "sentencepiece_style.json").write_text(Tokenizer.from_str(json.dumps(SENTENCEPIECE_STYLE)).to_str())


def mds_seeds():
    out = fresh("fuzz_mds_reader")
    rng = np.random.default_rng(0)
    cases = {
        "tokens": ({"tokens": "ndarray:int32"}, lambda i: {"tokens": rng.integers(0, 1000, 16, dtype=np.int32)}),
        "mixed": ({"text": "str", "raw": "bytes", "score": "float32", "meta": "json", "arr": "ndarray"},
                  lambda i: {"text": TEXT[i % 4][:20], "raw": bytes([i, 255, 0]), "score": np.float32(i / 3),
                             "meta": {"i": i, "tags": ["a", "b"]}, "arr": np.arange(i + 1, dtype=np.int64)}),
        "typed": ({"u": "uint16", "si": "str_int", "sf": "str_float", "fixed": "ndarray:float16:2,3"},
                  lambda i: {"u": np.uint16(i), "si": i * 7, "sf": i / 4,
                             "fixed": np.full((2, 3), i, dtype=np.float16)}),
    }
    for name, (columns, sample) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            with MDSWriter(out=d, columns=columns, size_limit=1 << 20) as w:
                for i in range(6):
                    w.write(sample(i))
            index = pathlib.Path(d, "index.json").read_bytes()
            shard = pathlib.Path(d, "shard.00000.mds").read_bytes()
            (out / f"{name}.bin").write_bytes(index + b"\xff" + shard)


def mds_untrusted_seeds():
    """Indexes whose shard names are paths (issue 61) and compressed shards that claim more than raw_data.bytes: the
    reader must refuse them, and fuzz_mds_reader fails on any file created outside the dataset's folder. Added beside
    mds_seeds()' files (not replacing them)."""
    out = SEEDS / "fuzz_mds_reader"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as d:
        with MDSWriter(out=d, columns={"tokens": "ndarray:int32"}, size_limit=1 << 20) as w:
            for _ in range(4):
                w.write({"tokens": rng.integers(0, 1000, 8, dtype=np.int32)})
        index = json.loads(pathlib.Path(d, "index.json").read_text())
        shard = pathlib.Path(d, "shard.00000.mds").read_bytes()
    names = {"dotdot": "../escape.mds", "absolute": "/tmp/tessera_fuzz_escape.mds", "nested": "sub/../../escape.mds",
             "subfolder": "sub/shard.00000.mds", "control": "shard\n.mds", "own_index": "index.json"}
    for label, name in names.items():
        bad = json.loads(json.dumps(index))
        bad["shards"][0]["raw_data"]["basename"] = name
        (out / f"name_{label}.bin").write_bytes(json.dumps(bad).encode() + b"\xff" + shard)
    # shard.00000.mds read as the compressed copy of a raw shard named elsewhere.
    for label, frame in {
        # 17 bytes that declare 8 GiB of content (one RLE block follows).
        "zstd_declares_8gib": b"\x28\xb5\x2f\xfd\xe0" + (8 << 30).to_bytes(8, "little") + b"\x0b\x00\x00x",
        # No declared size: 64 RLE blocks of 128 KiB each, 8 MiB in all.
        "zstd_streams_8mib": b"\x28\xb5\x2f\xfd\x00\x38" + b"\x02\x00\x10x" * 63 + b"\x03\x00\x10x",
    }.items():
        bad = json.loads(json.dumps(index))
        bad["shards"][0]["compression"] = "zstd"
        bad["shards"][0]["raw_data"]["basename"] = "raw.mds"
        bad["shards"][0]["zip_data"] = {"basename": "shard.00000.mds", "bytes": len(frame), "hashes": {}}
        (out / f"bomb_{label}.bin").write_bytes(json.dumps(bad).encode() + b"\xff" + frame)


def safe_path_seeds():
    out = fresh("fuzz_safe_path")
    for i, name in enumerate(["shard.00000.mds", "sub/shard.00000.mds", "../x", "/etc/passwd", "a//b", "./a", "a/.",
                              "out/x", "in/x", "in/../out/x", "..a/b..", "a\x00b", "\x01", "", "a" * 300]):
        (out / f"seed{i:02d}").write_bytes(name.encode())


def safetensors_seeds():
    out = fresh("fuzz_safetensors")
    g = torch.Generator().manual_seed(0)
    (out / "float.safetensors").write_bytes(st_save({
        "transformer.wte.weight": torch.randn(8, 4, generator=g),
        "transformer.blocks.0.norm_1.weight": torch.ones(4),
        "lm_head.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16),
    }, metadata={"format": "pt"}))
    (out / "dtypes.safetensors").write_bytes(st_save({
        "f16": torch.randn(3, generator=g).half(), "f64": torch.randn(2, 2, generator=g).double(),
        "i64": torch.arange(5), "i32": torch.arange(3, dtype=torch.int32), "u8": torch.arange(4, dtype=torch.uint8),
        "bool": torch.tensor([True, False]), "scalar": torch.tensor(1.5), "empty": torch.zeros(0, 3),
    }))
    (out / "metadata_only.safetensors").write_bytes(st_save({}, metadata={"step": "12", "note": "no tensors"}))


# Inputs fuzz_chat_template found, committed as it found them (no producer makes them): kept across regenerations.
CHAT_TEMPLATE_FINDINGS = ("replace_without_arguments.jinja", "split_non_string_separator.jinja")

# Huge and empty operands for the size arithmetic of the renderer (issue 61): repetition counts near 2**62 and 2**64,
# empty strings and lists repeated, ranges with far-apart bounds, filters whose output is a product of two sizes.
CHAT_TEMPLATE_HOSTILE = {
    "repeat_huge_and_empty.jinja":
        "{{ '' * 4611686018427387904 }}{{ 4611686018427387904 * '' }}{{ 'ab' * -1 }}{{ 'ab' * 3 }}\n"
        "{{ [] * 4611686018427387904 }}{{ [1, 2] * 2 }}{{ 2 * messages|map(attribute='role')|list }}\n"
        "{{ [1, 2, 3] * 6148914691236517206 }}\n",
    "range_huge_bounds.jinja":
        "{{ range(9223372036854775800, 9223372036854775807, 5)|list }}\n"
        "{{ range(-9223372036854775807 - 1, 9223372036854775807, 9223372036854775807)|list }}\n"
        "{{ range(-9223372036854775807 - 1, 9223372036854775807)|length }}\n",
    "filters_huge_output.jinja":
        "{{ 'abc'.replace('', '-') }}{{ range(100)|join('s' * 1000) }}{{ ('\\n' * 1000)|indent(1000, blank=true) }}\n"
        "{{ [1, 2]|tojson(indent=-1) }}{{ range(10)|tojson(separators=[',' * 1000, ':']) }}\n"
        "{{ 'abc'[1::9223372036854775807] }}{{ 'abc'[::-9223372036854775807 - 1] }}\n"
        "{{ ('a' * 1000)|replace('a', 'b' * 100000) }}\n",
    "repeated_work.jinja":
        "{% for m in messages %}{% for i in range(300) %}{% set x = (m.content ~ '') * 300 %}"
        "{{ x|length }}{% endfor %}{% endfor %}\n",
}


def chat_template_seeds():
    old = SEEDS / "fuzz_chat_template"
    kept = {name: (old / name).read_bytes() for name in CHAT_TEMPLATE_FINDINGS if (old / name).exists()}
    out = fresh("fuzz_chat_template")
    for p in sorted((ROOT / "tests" / "data" / "chat_templates").glob("*.jinja")):
        shutil.copy(p, out / p.name)
    for name, data in kept.items():
        (out / name).write_bytes(data)
    for name, text in CHAT_TEMPLATE_HOSTILE.items():
        (out / name).write_text(text)


def recipe_seeds():
    out = fresh("fuzz_recipe_yaml")
    for p in sorted((ROOT / "recipes").glob("*.yaml")) + [ROOT / "tests" / "data" / "interpolation.yaml"]:
        shutil.copy(p, out / p.name)
    # Floats outside double's range (a finding of fuzz_recipe_yaml: std::stod threw std::out_of_range).
    (out / "float_range.yaml").write_text(
        "optimizer:\n  name: decoupled_adamw\n  lr: 1.0e+999\n  eps: 1.0e-999\n  weight_decay: -1.0e+999\n"
        "scheduler:\n  name: cosine_with_warmup\n  t_warmup: 10ba\n  alpha_f: 4.9e-324\n")


if __name__ == "__main__":
    os.chdir(ROOT)
    tokenizers_seeds()
    mds_seeds()
    mds_untrusted_seeds()
    safe_path_seeds()
    safetensors_seeds()
    recipe_seeds()
    chat_template_seeds()
    for d in sorted(SEEDS.iterdir()):
        files = list(d.iterdir())
        print(f"{d.relative_to(ROOT)}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")
