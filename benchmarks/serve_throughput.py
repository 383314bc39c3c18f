"""Serving throughput (generated tokens per second) of `tessera serve` at 1, 8 and 32 concurrent clients, against
transformers' `generate` on the same model decoding the same number of prompts as one static batch, measured in the
same run.

The model is a random Llama built with HF's LlamaConfig (default: hidden 512, 8 layers, vocabulary 8192 from a
byte-level BPE trained on the fortunes corpus) and saved with save_pretrained; the server loads that folder. Each
client sends --requests-per-client requests one after another (a 32-token prompt, --max-tokens new tokens, greedy,
ignore_eos so every request generates all of them) over its own HTTP connection, so the server's continuous batching
decodes up to `concurrency` rows at once. The peer decodes `concurrency` prompts of the same length as one batch with
model.generate (greedy, min_new_tokens = max_new_tokens), --requests-per-client times. Both run on the CPU in fp32
with the same number of intra-op threads; the clients are Python threads on the same machine.

    python benchmarks/serve_throughput.py [--hidden 512] [--layers 8] [--max-tokens 64] [--requests-per-client 2]
        [--concurrency 1 8 32] [--threads 2]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import bench_json

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import requests  # noqa: E402
import torch  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin")) / "tessera"
sys.path.insert(0, str(ROOT / "tests" / "compat"))
from test_tokenizer_hf import read_fortunes  # noqa: E402

PROMPT_TOKENS = 32


def prompts(n, vocab):
    return [[(17 * i + 31 * t) % (vocab - 1) + 1 for t in range(PROMPT_TOKENS)] for i in range(n)]


def serve_run(base, concurrency, per_client, max_tokens, vocab):
    ps = prompts(concurrency * per_client, vocab)
    generated = [0] * concurrency
    latencies = []
    errors = []

    def client(c):
        with requests.Session() as session:
            for k in range(per_client):
                start = time.perf_counter()
                r = session.post(base + "/completions", json={"prompt": ps[c * per_client + k], "max_tokens": max_tokens,
                                                              "temperature": 0, "ignore_eos": True}, timeout=3600)
                latencies.append(time.perf_counter() - start)
                if r.status_code != 200:
                    errors.append(r.text)
                    return
                generated[c] += r.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(c,)) for c in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        sys.exit(f"serve: {errors[0]}")
    return sum(generated) / seconds, sum(latencies) / len(latencies), sum(generated)


def hf_run(model, concurrency, per_client, max_tokens, vocab):
    ps = prompts(concurrency * per_client, vocab)
    tokens = 0
    start = time.perf_counter()
    with torch.no_grad():
        for k in range(per_client):
            ids = torch.tensor(ps[k * concurrency:(k + 1) * concurrency])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return tokens / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        bpe = ByteLevelBPETokenizer()
        bpe.train_from_iterator(read_fortunes(), vocab_size=args.vocab_size, min_frequency=2,
                                special_tokens=["<|endoftext|>"], show_progress=False)
        tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
        vocab = len(tok)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                                             num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                                             num_key_value_heads=args.hidden // 128, vocab_size=vocab,
                                             max_position_embeddings=512)).eval()
        model.save_pretrained(tmp / "hf")
        tok.save_pretrained(tmp / "hf")
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        server = subprocess.Popen([str(BIN), "serve", "--model", str(tmp / "hf"), "--served-model-name", "bench",
                                   "--port", "0", "--precision", "fp32", "--max-batch", str(max(args.concurrency)),
                                   "--log-level", "warn"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            line = server.stdout.readline()
            if not line.startswith("serving bench at "):
                sys.exit(f"serve did not start: {line}{server.stderr.read()}")
            base = line.split(" at ")[1].strip()
            serve_run(base, 1, 1, 4, vocab)  # warm up
            print(f"Llama hidden {args.hidden}, {args.layers} layers, vocab {vocab}; CPU fp32, {args.threads} threads; "
                  f"{PROMPT_TOKENS}-token prompts, {args.max_tokens} new tokens, {args.requests_per_client} requests "
                  "per client")
            print("| concurrency | Tessera serve tokens/s | mean latency s | transformers generate tokens/s | ratio |")
            print("|---|---|---|---|---|")
            rows = []
            for c in args.concurrency:
                ours, latency, n = serve_run(base, c, args.requests_per_client, args.max_tokens, vocab)
                theirs = hf_run(model, c, args.requests_per_client, args.max_tokens, vocab)
                print(f"| {c} | {ours:.1f} | {latency:.2f} | {theirs:.1f} | {ours / theirs:.2f}x |")
                rows.append({"case": f"{c} concurrent", "unit": "tokens/s", "tessera": ours,
                             "peers": {"transformers generate (static batch)": theirs}, "mean_latency_s": latency,
                             "generated_tokens": n, "timed_steps": c * args.requests_per_client})
        finally:
            server.terminate()
            server.wait(timeout=60)
        bench_json.emit("serve_throughput", rows, title="Serving (CPU): tessera serve vs transformers generate",
                        model={"hidden": args.hidden, "layers": args.layers, "vocab": vocab})


if __name__ == "__main__":
    main()
