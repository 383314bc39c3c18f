"""Tessera's byte-level BPE tokenizer against Hugging Face `tokenizers` (the real peer).

Tokenizers are trained here by HF on the Debian fortunes corpus (no model hub is reachable): GPT-2 style
(ByteLevelBPETokenizer), GPT-2 style with add_prefix_space, GPT-NeoX style (NFC normalizer, <|endoftext|> and
<|padding|> added tokens, extra added tokens with lstrip/rstrip/single_word/normalized), and Llama-3 style (Split
regex + ByteLevel(use_regex=false), ignore_merges, TemplateProcessing BOS). For each:

- ids equal HF's `encode` for every fortunes document and for Unicode edge cases, with and without special tokens;
- pre-tokenizer pieces equal HF's for every code point of planes 0-3 and 14 in several contexts (regex classes);
- decode equals HF's decode (with and without skip_special_tokens), including ids that decode to invalid UTF-8;
- invalid UTF-8 input gives HF's ids for the text Python's errors="replace" decoding makes of it.

And Tessera's C++ trainer gives exactly HF BpeTrainer's vocab and merges on the fortunes corpus, and the tokenizer it
writes loads in HF and encodes identically there.
"""
import json
import os
import pathlib

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import ByteLevelBPETokenizer, trainers

os.environ.setdefault("RAYON_NUM_THREADS", "1")
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")

EDGE_CASES = [
    "", " ", "  ", "\t", "\n", "\r\n", "a\r\nb\r\n\r\n", "\t\t  \n\n x", "   leading", "trailing   ", "a  b   c    d",
    "nbsp\u00a0here\u00a0\u00a0x", "ideographic\u3000space\u3000\u3000", "\u2028line\u2029para\u0085nel\u000b\u000c",
    "Hello, world! 1234567890 3.14159 -42 1e10 ١٢٣ ૧૨૩ Ⅻ ½",
    "I'm you're he'll she'd we've it's 'S 'T 'RE 'Ve 'LL 'D don't DON'T O'Neil ''s '", "rock 'n' roll's",
    "emoji 😀😃🎉 👍🏽👍🏿 family 👨‍👩‍👧‍👦 flag 🇫🇷🇯🇵 heart ❤️ keycap 1️⃣",
    "combining e\u0301 a\u0300 n\u0303 o\u0308\u0304 Z\u0351\u0352\u0353",
    "composed é à ñ ö vs decomposed e\u0301 a\u0300 n\u0303 o\u0308", "Å Å Å ﬁ ﬃ ㌀ ｈａｌｆ ｗｉｄｔｈ",
    "中文文本，日本語のテキスト、한국어 텍스트。", "العربية نص مع أرقام ١٢٣", "עברית טקסט עם ניקוד שָׁלוֹם",
    "हिन्दी देवनागरी क्षत्रिय", "ไทย ภาษา", "Ελληνικά Кириллица Ⴀ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈 𓀀",
    "<|endoftext|>", "a<|endoftext|>b", "text <|endoftext|> more<|endoftext|><|endoftext|> end",
    "<|padding|><|endoftext|> <|pad", "<|endoftext", "x <mask>  y", "  <mask>  ", "foo food afoo foo_ foo. (foo)",
    "<|begin_of_text|>hi", "tabs\tand\tspaces \t mixed\t \n", "\x00\x01\x7f control \x1b[0m",
    "zero\u200bwidth\u200cjoin\u200dnj\u2060\ufeff", "mongolian\u180evowel", "a" * 300, "ab" * 200 + "!" * 50,
    "URL https://example.com/path?q=1&r=2#frag e-mail: a.b@c.de", "    def f(x):\n        return x ** 2\n",
]
INVALID_UTF8 = [b"\xff", b"abc\xffdef", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xed\xa0\x80", b"\xf0\x9f\x98",
                b"\xf0\x9f\x98\x80\xf0\x9f", b"\xc0\xaf", b"\xf5\x80\x80\x80", b"\x80\x80\x80", b"ok \xfe\xff ok",
                "caf\u00e9".encode("latin-1") + b" au lait", b"\xef\xbf\xbd literal replacement"]


def read_fortunes():
    docs = []
    for path in sorted(FORTUNES.iterdir()):
        if path.suffix or path.is_symlink() or not path.is_file():
            continue
        doc = []
        for line in path.read_bytes().decode("utf-8").splitlines(keepends=True):
            if line.rstrip("\r\n") == "%":
                if doc:
                    docs.append("".join(doc))
                doc = []
            else:
                doc.append(line)
        if doc:
            docs.append("".join(doc))
    return docs


@pytest.fixture(scope="module")
def corpus():
    if not FORTUNES.is_dir():
        pytest.fail(f"{FORTUNES} missing: install the Debian package `fortunes` (tools/setup.sh)")
    docs = read_fortunes()
    assert len(docs) > 10000
    return docs


def train_gpt2(docs, vocab_size=4096):
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(docs, vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    return tok._tokenizer


def train_neox(docs):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, special_tokens=["<|endoftext|>", "<|padding|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("foo", single_word=True, normalized=True), AddedToken("Å", normalized=True)])
    return tok


def train_llama3(docs):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3500, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def with_prefix_space(tok):
    j = json.loads(tok.to_str())
    j["pre_tokenizer"]["add_prefix_space"] = True
    return Tokenizer.from_str(json.dumps(j))


@pytest.fixture(scope="module")
def hf_tokenizers(corpus, tmp_path_factory):
    sample = corpus[::3]
    gpt2 = train_gpt2(sample)
    toks = {"gpt2": gpt2, "gpt2_prefix": with_prefix_space(gpt2), "neox": train_neox(sample),
            "llama3": train_llama3(sample)}
    out = {}
    for name, tok in toks.items():
        path = tmp_path_factory.mktemp("tok") / f"{name}.json"
        tok.save(str(path))
        out[name] = (Tokenizer.from_file(str(path)), path)
    return out


def run_tessera(driver, tmp_path, tok_path, texts, add_special_tokens=True, pieces=False, decode=()):
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    raw = [t if isinstance(t, bytes) else t.encode("utf-8") for t in texts]
    inp.write_text(json.dumps({"texts": [r.hex() for r in raw], "add_special_tokens": add_special_tokens,
                               "pieces": pieces, "decode": [list(d) for d in decode]}))
    driver("tokenize", tok_path, inp, out)
    return json.loads(out.read_text())


def first_mismatch(texts, got, want):
    for t, g, w in zip(texts, got, want):
        if g != w:
            return f"text {t!r}:\n tessera {g}\n hf      {w}"
    return None


NAMES = ["gpt2", "gpt2_prefix", "neox", "llama3"]


@pytest.mark.parametrize("name", NAMES)
def test_ids_equal_hf_on_corpus_and_edge_cases(driver, tmp_path, corpus, hf_tokenizers, name):
    hf, path = hf_tokenizers[name]
    texts = corpus + EDGE_CASES
    for add in (True, False):
        got = run_tessera(driver, tmp_path, path, texts, add_special_tokens=add)
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add)]
        assert got["ids"] == want, first_mismatch(texts, got["ids"], want)
    assert got["vocab_size"] == hf.get_vocab_size(with_added_tokens=True)
    if name == "llama3":
        bos = hf.token_to_id("<|begin_of_text|>")
        assert run_tessera(driver, tmp_path, path, ["hi"])["ids"][0][0] == bos  # the template's BOS is there


@pytest.mark.parametrize("name", ["gpt2", "neox", "llama3"])
def test_invalid_utf8_is_replaced_like_python(driver, tmp_path, hf_tokenizers, name):
    hf, path = hf_tokenizers[name]
    got = run_tessera(driver, tmp_path, path, INVALID_UTF8)
    want = [hf.encode(b.decode("utf-8", errors="replace")).ids for b in INVALID_UTF8]
    assert got["ids"] == want, first_mismatch(INVALID_UTF8, got["ids"], want)


def codepoint_texts():
    """Every code point of planes 0-3 and 14 (no surrogates) in contexts that separate the regex classes."""
    cps = [c for c in list(range(0x0, 0x40000)) + list(range(0xE0000, 0xE1000)) if not 0xD800 <= c <= 0xDFFF]
    texts = []
    for k in range(0, len(cps), 4000):
        parts = []
        for c in cps[k:k + 4000]:
            ch = chr(c)
            parts.append(f"x{ch}1{ch}!{ch} {ch}\n'{ch}  ")
        texts.append("".join(parts))
    return texts


@pytest.mark.parametrize("name", ["gpt2", "llama3"])
def test_pre_tokenizer_pieces_equal_hf_for_every_code_point(driver, tmp_path, hf_tokenizers, name):
    hf, path = hf_tokenizers[name]
    texts = codepoint_texts()
    got = run_tessera(driver, tmp_path, path, texts, pieces=True)
    to_byte_level = {b: c for b, c in enumerate(bytes_to_unicode())}  # latin-1 char b -> byte-level char
    for t, pieces in zip(texts, got["pieces"]):
        mine = "\x00".join(bytes.fromhex(p).decode("latin-1").translate(to_byte_level) for p in pieces).split("\x00")
        want = [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(t)]
        if mine != want:
            i = next(i for i, (a, b) in enumerate(zip(mine, want)) if a != b)
            pytest.fail(f"piece {i}: tessera {mine[i - 2:i + 3]} hf {want[i - 2:i + 3]}")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


@pytest.mark.parametrize("name", ["gpt2", "neox", "llama3"])
def test_decode_equals_hf(driver, tmp_path, corpus, hf_tokenizers, name):
    import random
    hf, path = hf_tokenizers[name]
    rng = random.Random(0)
    n = hf.get_vocab_size(with_added_tokens=True)
    seqs = [e.ids for e in hf.encode_batch(corpus[:300] + EDGE_CASES)]
    seqs += [[rng.randrange(n) for _ in range(rng.randrange(1, 40))] for _ in range(300)]  # invalid UTF-8 too
    seqs += [[0, 1, 2, n - 1, n + 5, 10**6], []]  # ids beyond the vocab are skipped
    got = run_tessera(driver, tmp_path, path, [], decode=seqs)
    for flag, key in ((False, "decoded"), (True, "decoded_skip")):
        want = [hf.decode(s, skip_special_tokens=flag) for s in seqs]
        mine = [bytes.fromhex(h).decode("utf-8") for h in got[key]]
        assert mine == want, first_mismatch(seqs, mine, want)
    # Round trip on the corpus.
    assert [bytes.fromhex(h).decode("utf-8") for h in got["decoded_skip"][:300]] == corpus[:300]


def test_cpp_trainer_equals_hf_trainer_and_loads_in_hf(driver, tmp_path, corpus):
    spec = tmp_path / "spec.json"
    out = tmp_path / "trained.json"
    for vocab_size, docs in ((4096, corpus), (1000, corpus[:2000])):
        spec.write_text(json.dumps({"documents": docs, "vocab_size": vocab_size, "min_frequency": 2,
                                    "special_tokens": ["<|endoftext|>"]}))
        driver("train-tokenizer", spec, out)
        mine = json.loads(out.read_text())
        theirs = json.loads(train_gpt2(docs, vocab_size).to_str())
        assert mine["model"]["vocab"] == theirs["model"]["vocab"]
        assert mine["model"]["merges"] == theirs["model"]["merges"]
        assert mine["added_tokens"] == theirs["added_tokens"]
        hf = Tokenizer.from_file(str(out))
        assert hf.get_vocab_size() == vocab_size
        texts = docs[::7] + EDGE_CASES
        got = run_tessera(driver, tmp_path, out, texts)
        want = [e.ids for e in hf.encode_batch(texts)]
        assert got["ids"] == want, first_mismatch(texts, got["ids"], want)


def test_train_tokenizer_cli_on_fortunes_equals_hf(tmp_path, corpus):
    """The CLI reads the fortunes directory itself (the C++ document reader) and matches HF trained on Python's read."""
    import subprocess
    from conftest import _binary
    out = tmp_path / "tokenizer.json"
    subprocess.run([_binary("TESSERA_TRAIN_TOKENIZER_BIN", "train_tokenizer"), "--input", str(FORTUNES), "--format",
                    "fortunes", "--vocab-size", "8192", "--output", str(out)], check=True, capture_output=True)
    mine = json.loads(out.read_text())
    theirs = json.loads(train_gpt2(corpus, 8192).to_str())
    assert mine["model"]["vocab"] == theirs["model"]["vocab"]
    assert mine["model"]["merges"] == theirs["model"]["merges"]
