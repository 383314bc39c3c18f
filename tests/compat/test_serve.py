"""`tessera serve` (OpenAI's HTTP API) against its real clients: lm-evaluation-harness scores a multiple-choice and a
generation task (local JSON files) through its `local-completions` model against the server, and through its own `hf`
model (transformers) on the same folder; every sample's log-likelihoods, accuracy and generated text must agree.
Bad requests (malformed JSON, an oversize body, an unknown field, a negative max_tokens, another model's name) get a
4xx with OpenAI's error object while the server keeps serving; 64 concurrent clients all get their own greedy
answers, equal to one-at-a-time answers; logit_bias and presence / frequency penalties choose what transformers'
generate chooses with the same processing; SIGTERM stops the server with exit code 0."""
import json
import os
import pathlib
import signal
import subprocess
import threading

import pytest
import requests
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("TESSERA_BIN_DIR", ROOT / "build" / "bin")) / "tessera"
FORTUNES = pathlib.Path("/usr/share/games/fortunes")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve") / "llama"
    docs = [d for d in (FORTUNES / "computers").read_text(errors="replace").split("\n%\n") if d.strip()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=512, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                         max_position_embeddings=256, bos_token_id=0, eos_token_id=0,
                                         pad_token_id=0))  # the tokenizer's <|endoftext|>, as exports write
    # Larger weights than the default init, so that the model prefers some continuations clearly (no near-ties
    # between choices that rounding could flip).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


class Server:
    def __init__(self, model_dir, *extra):
        self.proc = subprocess.Popen([str(BIN), "serve", "--model", str(model_dir), "--served-model-name", "tiny",
                                      "--port", "0", "--precision", "fp32", "--max-batch", "16", *map(str, extra)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("serving tiny at http://127.0.0.1:"), line + self.proc.stderr.read()
        self.base = line.split(" at ")[1].strip()  # http://127.0.0.1:PORT/v1

    def post(self, path, body=None, data=None, **kw):
        return requests.post(self.base + path, json=body, data=data, timeout=120, **kw)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.kill()


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir, "--max-body-mib", 0.01)
    yield s
    s.stop()


MC = [
    {"question": "Computers are", "choices": [" fast", " slow and large", " made of cheese"], "answer": 0},
    {"question": "A program that works", "choices": [" is a bug", " is rare", " never happens"], "answer": 1},
    {"question": "The best language is", "choices": [" C", " Lisp", " the one you know"], "answer": 2},
    {"question": "Debugging is", "choices": [" twice as hard as writing code", " easy"], "answer": 0},
    {"question": "Never trust", "choices": [" a computer you can't throw out a window", " the manual"], "answer": 0},
    {"question": "Real programmers", "choices": [" don't comment", " use butterflies", " write tests"], "answer": 1},
]
GEN = [
    {"question": "Q: What do computers do?\nA:", "answer": "compute"},
    {"question": "Q: Who wrote the first program?\nA:", "answer": "Ada"},
    {"question": "Q: What is a bug?\nA:", "answer": "an error"},
    {"question": "Q: Why is the sky blue?\nA:", "answer": "light"},
]


def write_tasks(root):
    (root / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MC))
    (root / "gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GEN))
    (root / "tessera_mc.yaml").write_text(f"""task: tessera_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (root / "tessera_gen.yaml").write_text(f"""task: tessera_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {root / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
""")


def lm_eval_samples(model, model_args, tasks_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    out = simple_evaluate(model=model, model_args=model_args, tasks=["tessera_mc", "tessera_gen"],
                          task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False),
                          log_samples=True, batch_size=4, device="cpu", random_seed=0, numpy_random_seed=0,
                          torch_random_seed=0, fewshot_random_seed=0)
    return out["results"], out["samples"]


def test_lm_eval_scores_the_server_as_it_scores_transformers(server, model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    write_tasks(tmp_path)
    ours, our_samples = lm_eval_samples(
        "local-completions",
        {"model": "tiny", "base_url": server.base + "/completions", "tokenizer": str(model_dir),
         "tokenizer_backend": "huggingface", "num_concurrent": 4, "max_retries": 1, "max_length": 256},
        tmp_path)
    theirs, their_samples = lm_eval_samples("hf", {"pretrained": str(model_dir), "dtype": "float32"}, tmp_path)
    assert ours["tessera_mc"]["acc,none"] == theirs["tessera_mc"]["acc,none"]
    assert ours["tessera_gen"]["exact_match,none"] == theirs["tessera_gen"]["exact_match,none"]
    # Sample by sample: each choice's log-likelihood and greediness, each generated text.
    for task in ("tessera_mc", "tessera_gen"):
        a = sorted(our_samples[task], key=lambda s: s["doc_id"])
        b = sorted(their_samples[task], key=lambda s: s["doc_id"])
        assert len(a) == len(b) == len(MC if task == "tessera_mc" else GEN)
        for x, y in zip(a, b):
            if task == "tessera_mc":
                assert x["acc"] == y["acc"], (x["doc_id"], x["filtered_resps"], y["filtered_resps"])
                for (ll_x, greedy_x), (ll_y, greedy_y) in zip(x["filtered_resps"], y["filtered_resps"]):
                    assert ll_x == pytest.approx(ll_y, abs=1e-4)
                    assert greedy_x == greedy_y
            else:
                assert x["filtered_resps"] == y["filtered_resps"], x["doc_id"]
    # Somewhere the model chose (not every answer is wrong or right by chance alone) and generated text.
    assert any(s["filtered_resps"][0] for s in our_samples["tessera_gen"])


def error_of(r):
    body = r.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return body["error"]["message"]


def test_bad_requests_get_4xx_and_the_server_goes_on(server):
    cases = [
        (dict(data='{"prompt": "a", '), 400, "not valid JSON"),
        (dict(body={"prompt": "a", "max_tokens": -1}), 400, "'max_tokens' must lie in"),
        (dict(body={"prompt": "a", "frobnicate": True}), 400, "unknown field 'frobnicate'"),
        (dict(body={"prompt": "a", "temperature": "hot"}), 400, "'temperature' must be a number"),
        (dict(body={"prompt": [1, 2, 99999]}), 400, "outside the vocabulary"),
        (dict(body={"prompt": "a", "max_tokens": 1000}), 400, "maximum context length is 256"),
        (dict(body={"model": "gpt-4", "prompt": "a"}), 404, "does not exist"),
        (dict(body={"prompt": "x" * 20000}), 413, "larger than"),
    ]
    for kwargs, status, words in cases:
        headers = {"Content-Type": "application/json"} if "data" in kwargs else {}
        r = server.post("/completions", headers=headers, **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        assert words in error_of(r), r.text
    r = requests.get(server.base + "/nothing-here", timeout=30)
    assert r.status_code == 404 and "no route" in error_of(r)
    models = requests.get(server.base + "/models", timeout=30).json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 256
    ok = server.post("/completions", {"prompt": "Computers", "max_tokens": 4, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def test_64_concurrent_clients_get_their_own_answers(server):
    prompts = [f"Fortune {i}: the computer" + " said" * (i % 7) for i in range(64)]
    alone = {}
    for i in (0, 13, 41):  # one at a time, nothing else in the batch
        alone[i] = server.post("/completions", {"prompt": prompts[i], "max_tokens": 10, "temperature": 0}).json()
    results = [None] * 64

    def client(i):
        results[i] = server.post("/completions", {"prompt": prompts[i], "max_tokens": 10, "temperature": 0})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and r.status_code == 200 for r in results), [r.text for r in results if r][:3]
    for i, expected in alone.items():
        assert results[i].json()["choices"][0]["text"] == expected["choices"][0]["text"], i
    # Chat, through the same batch.
    chat = server.post("/chat/completions", {"messages": [{"role": "user", "content": "Tell me a fortune."}],
                                             "max_tokens": 8, "temperature": 0})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant", chat.text


class OpenAIPenalties:
    """OpenAI's presence and frequency penalties as its API reference defines them, as a transformers logits processor:
    logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty, count over the generated tokens."""

    def __init__(self, prompt_len, presence, frequency):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        generated = input_ids[:, self.prompt_len:]
        counts.scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - counts * self.frequency - (counts > 0).to(scores.dtype) * self.presence


def test_logit_bias_and_penalties_choose_what_transformers_chooses(server, model_dir):
    """logit_bias against transformers' own SequenceBiasLogitsProcessor (generate's sequence_bias, one-token
    sequences), and presence / frequency penalties against OpenAI's formula in a transformers logits processor: greedy
    completions equal token for token, and differ from the unbiased one (so the options act)."""
    from transformers import LogitsProcessorList

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    prompt = [int(t) for t in tok("The computer said", add_special_tokens=False)["input_ids"]]

    def ours(**options):
        r = server.post("/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, **options})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    def theirs(**kwargs):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0, **kwargs)
        return tok.decode(out[0, len(prompt):], skip_special_tokens=True)

    plain = ours()
    assert plain == theirs()
    first = tok(plain, add_special_tokens=False)["input_ids"][0]
    bias = {str(first): -100, "7": 5.0}
    biased = ours(logit_bias=bias)
    assert biased != plain
    assert biased == theirs(sequence_bias={(first,): -100.0, (7,): 5.0})
    for presence, frequency in ((1.5, 0.0), (0.0, 0.8), (0.7, 0.4)):
        penalized = ours(presence_penalty=presence, frequency_penalty=frequency)
        assert penalized != plain, (presence, frequency)
        processors = LogitsProcessorList([OpenAIPenalties(len(prompt), presence, frequency)])
        assert penalized == theirs(logits_processor=processors), (presence, frequency)
    for body, words in (({"logit_bias": {"abc": 1}}, "not a token id"), ({"logit_bias": {"5": 1000}}, "[-100, 100]"),
                        ({"logit_bias": [1]}, "must be an object"), ({"presence_penalty": 3}, "'presence_penalty'")):
        r = server.post("/completions", {"prompt": "a", "max_tokens": 1, **body})
        assert r.status_code == 400 and words in error_of(r), r.text


def test_sigterm_stops_the_server_cleanly(model_dir):
    s = Server(model_dir)
    assert s.post("/completions", {"prompt": "Computers", "max_tokens": 2}).status_code == 200
    assert s.stop() == 0
