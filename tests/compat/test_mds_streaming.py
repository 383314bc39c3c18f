"""Tessera's MDS writer and reader against mosaicml-streaming (the real peer), both directions:

- The same samples written by streaming.MDSWriter and by Tessera give byte-identical index.json and shard files
  (uncompressed), including shard rollover and the 0-sample shard; with zstd the raw shard (and its hashes) are
  identical and each side reads the other's compressed files.
- Tessera reads datasets that Streaming wrote (zstd, gz, merged indexes with subdirectories) and Streaming's
  StreamingDataset reads Tessera's output, value for value.
- The golden bytes of the spec (§1, §2.3) are reproduced.
"""
import hashlib
import json
import pathlib
import shutil

import numpy as np
import pytest
from streaming import MDSWriter, StreamingDataset
from streaming.base.util import merge_index

GOLDEN_INDEX = ('{"shards": [{"column_encodings": ["int", "str", "ndarray:int32"], "column_names": ["id", "text", '
                '"tokens"], "column_sizes": [8, null, null], "compression": null, "format": "mds", "hashes": ["sha1", '
                '"xxh64"], "raw_data": {"basename": "shard.00000.mds", "bytes": 306, "hashes": {"sha1": '
                '"91db599846774ae9980bd6917a59ac7ed0665fbb", "xxh64": "54d21b834439957a"}}, "samples": 2, "size_limit": '
                '67108864, "version": 2, "zip_data": null}], "version": 2}')

ENCODINGS = {
    "b": "bytes", "s": "str", "i": "int", "i8": "int8", "u16": "uint16", "i32": "int32", "u64": "uint64",
    "f16": "float16", "f32": "float32", "f64": "float64", "si": "str_int", "sf": "str_float", "j": "json",
    "nd": "ndarray", "nd32": "ndarray:int32", "ndf": "ndarray:float32:2,3", "nd16": "ndarray:uint16",
}


def random_samples(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        text = "".join(rng.choice(list("abc xyzé€😀\n\"\\"), size=int(rng.integers(0, 30))))
        out.append({
            "b": rng.bytes(int(rng.integers(0, 40))), "s": text, "i": int(rng.integers(-2**62, 2**62)),
            "i8": int(rng.integers(-128, 128)), "u16": int(rng.integers(0, 2**16)),
            "i32": int(rng.integers(-2**31, 2**31)), "u64": int(rng.integers(0, 2**62)),
            "f16": float(np.float16(rng.normal())), "f32": float(np.float32(rng.normal())), "f64": float(rng.normal()),
            "si": int(rng.integers(-10**12, 10**12)), "sf": float(rng.normal() * 10.0 ** int(rng.integers(-8, 20))),
            "j": {"k": k, "text": text, "list": [1, 2.5, None, True], "nested": {"é": "ü"}},
            "nd": rng.normal(size=(int(rng.integers(1, 4)), int(rng.integers(1, 300)))).astype(np.float64),
            "nd32": rng.integers(-1000, 50000, size=int(rng.integers(1, 3000)), dtype=np.int32),
            "ndf": rng.normal(size=(2, 3)).astype(np.float32),
            "nd16": rng.integers(0, 2**16, size=int(rng.integers(1, 70000)) if k == 0 else 5, dtype=np.uint16),
        })
    return out


def to_spec_value(enc, v):
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if enc == "json":
        return {"json": v}
    if isinstance(v, np.ndarray):
        return {"ndarray": str(v.dtype), "shape": list(v.shape), "data": v.astype(np.float64).ravel().tolist()}
    return v


def tessera_write(driver, tmp_path, out, columns, samples, compression=None, hashes=("sha1", "xxh64"),
                  size_limit=1 << 26):
    spec = {"columns": columns, "compression": compression, "hashes": list(hashes), "size_limit": size_limit,
            "samples": [{k: to_spec_value(columns[k], v) for k, v in s.items()} for s in samples]}
    spec_path = tmp_path / (out.name + ".spec.json")
    spec_path.write_text(json.dumps(spec))
    driver("mds-write", spec_path, out)


def tessera_read(driver, tmp_path, directory):
    out = tmp_path / "read.json"
    driver("mds-read", directory, out)
    return json.loads(out.read_text())


def python_write(out, columns, samples, compression=None, hashes=("sha1", "xxh64"), size_limit=1 << 26):
    with MDSWriter(out=str(out), columns=columns, compression=compression, hashes=list(hashes),
                   size_limit=size_limit) as w:
        for s in samples:
            w.write(s)


def assert_same_value(enc, ours, theirs, where):
    if enc in ("bytes",):
        assert bytes.fromhex(ours["bytes"]) == theirs, where
    elif enc == "str":
        assert bytes.fromhex(ours["bytes"]).decode() == theirs, where
    elif enc == "json":
        assert ours["json"] == theirs, where
    elif enc.startswith("ndarray"):
        assert ours["ndarray"] == str(theirs.dtype) and ours["shape"] == list(theirs.shape), where
        assert np.array_equal(np.array(ours["data"]), theirs.astype(np.float64).ravel()), where
    elif enc.startswith("float") or enc == "str_float":
        assert ours == pytest.approx(float(theirs), rel=0, abs=0), where
    else:
        assert ours == int(theirs), where


def dir_files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(pathlib.Path(d).rglob("*")) if p.is_file()}


def test_spec_golden_bytes(driver, tmp_path):
    columns = {"text": "str", "id": "int", "tokens": "ndarray:int32"}
    samples = [{"id": 7, "text": "hi", "tokens": np.array([1, 2, 3], np.int32)},
               {"id": -1, "text": "abc", "tokens": np.array([300], np.int32)}]
    tessera_write(driver, tmp_path, tmp_path / "ours", columns, samples)
    files = dir_files(tmp_path / "ours")
    assert files["index.json"].decode() == GOLDEN_INDEX
    shard = files["shard.00000.mds"]
    assert len(shard) == 306 and shard[:16].hex() == "02000000f90000001901000032010000"
    assert shard[281:].hex() == "0300000006000000ffffffffffffffff61626304012c010000"


@pytest.mark.parametrize("size_limit", [1 << 26, 20000, 100])
def test_writer_bytes_identical_to_streaming(driver, tmp_path, size_limit):
    samples = random_samples(25, seed=size_limit)
    python_write(tmp_path / "py", ENCODINGS, samples, size_limit=size_limit)
    tessera_write(driver, tmp_path, tmp_path / "ours", ENCODINGS, samples, size_limit=size_limit)
    ours, theirs = dir_files(tmp_path / "ours"), dir_files(tmp_path / "py")
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name] == theirs[name], name
    if size_limit == 100:  # every sample exceeds the limit: the first shard has 0 samples
        index = json.loads(theirs["index.json"])
        assert index["shards"][0]["samples"] == 0 and len(index["shards"]) == 26


@pytest.mark.parametrize("compression", ["zstd", "zstd:9", "gz"])
def test_compressed_both_directions(driver, tmp_path, compression):
    samples = random_samples(40, seed=3)
    python_write(tmp_path / "py", ENCODINGS, samples, compression=compression, hashes=("sha1", "xxh3_64"),
                 size_limit=30000)
    tessera_write(driver, tmp_path, tmp_path / "ours", ENCODINGS, samples, compression=compression,
                  hashes=("sha1", "xxh3_64"), size_limit=30000)
    py_index = json.loads((tmp_path / "py" / "index.json").read_text())
    our_index = json.loads((tmp_path / "ours" / "index.json").read_text())
    assert [s["raw_data"] for s in our_index["shards"]] == [s["raw_data"] for s in py_index["shards"]]
    # Tessera reads Streaming's compressed shards ...
    for k, sample in enumerate(tessera_read(driver, tmp_path, tmp_path / "py")):
        for name, enc in ENCODINGS.items():
            assert_same_value(enc, sample[name], samples[k][name], f"sample {k} column {name}")
    # ... and Streaming reads Tessera's.
    ds = StreamingDataset(local=str(tmp_path / "ours"), shuffle=False, batch_size=1)
    assert len(ds) == len(samples)
    for k in range(len(samples)):
        got = ds[k]
        for name in ENCODINGS:
            ref = samples[k][name]
            if isinstance(ref, np.ndarray):
                assert np.array_equal(got[name], ref)
            elif ENCODINGS[name] == "str":
                assert got[name] == ref
            elif ENCODINGS[name].startswith("float"):
                assert float(got[name]) == ref
            else:
                assert got[name] == ref, (k, name)


def test_every_hash_streaming_writes_both_directions(driver, tmp_path):
    """Every hash name Streaming's MDSWriter accepts (streaming.base.hashing.get_hashes(): hashlib's and xxhash's):
    Tessera's writer lists the same digests as Streaming's for the same samples, raw and compressed; Tessera's reader
    verifies all of them; a shard with one flipped byte is refused naming the first algorithm and both digests; an
    index.json that lists only a name Tessera cannot compute is refused naming it, and one listed beside a name it
    can compute is skipped."""
    from streaming.base.hashing import get_hashes

    hashes = sorted(get_hashes())
    assert {"md5", "sha1", "sha3_256", "blake2b", "xxh32", "xxh64", "xxh3_64", "xxh128"} <= set(hashes), hashes
    samples = random_samples(30, seed=9)
    python_write(tmp_path / "py", ENCODINGS, samples, compression="zstd", hashes=hashes, size_limit=30000)
    tessera_write(driver, tmp_path, tmp_path / "ours", ENCODINGS, samples, compression="zstd", hashes=hashes,
                  size_limit=30000)
    py_index = json.loads((tmp_path / "py" / "index.json").read_text())
    our_index = json.loads((tmp_path / "ours" / "index.json").read_text())
    assert our_index == py_index
    assert all(set(s["raw_data"]["hashes"]) == set(hashes) for s in py_index["shards"])
    shutil.copytree(tmp_path / "py", tmp_path / "bad")
    got = tessera_read(driver, tmp_path, tmp_path / "py")  # the zip's digests, then the raw shard's, all checked
    assert len(got) == len(samples)
    # A shard that holds samples, read from its zip (its raw copy, which Streaming's writer leaves, removed).
    first = next(s for s in py_index["shards"] if s["samples"] > 0)
    (tmp_path / "bad" / first["raw_data"]["basename"]).unlink(missing_ok=True)
    zip_info = first["zip_data"]
    shard = tmp_path / "bad" / zip_info["basename"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(AssertionError, match=rf"{hashes[0]} mismatch \(index.json says {zip_info['hashes'][hashes[0]]}"):
        tessera_read(driver, tmp_path, tmp_path / "bad")
    # Names Tessera cannot compute: refused when they are all there is, skipped beside one it can compute.
    python_write(tmp_path / "plain", ENCODINGS, samples[:5], hashes=["sha1"])
    index_path = tmp_path / "plain" / "index.json"
    index = json.loads(index_path.read_text())
    raw = index["shards"][0]["raw_data"]
    raw["hashes"] = {"sm3": "00"}
    index_path.write_text(json.dumps(index))
    with pytest.raises(AssertionError, match="lists only hashes Tessera cannot compute \\(sm3;"):
        tessera_read(driver, tmp_path, tmp_path / "plain")
    raw["hashes"] = {"sm3": "00", "sha1": hashlib.sha1(
        (tmp_path / "plain" / raw["basename"]).read_bytes()).hexdigest()}
    index_path.write_text(json.dumps(index))
    assert len(tessera_read(driver, tmp_path, tmp_path / "plain")) == 5


def test_reads_merged_index_with_subdirectories(driver, tmp_path):
    samples = random_samples(12, seed=5)
    cols = {"s": "str", "nd32": "ndarray:int32"}
    parts = [tmp_path / "merged" / "part0", tmp_path / "merged" / "part1"]
    python_write(parts[0], cols, [{k: s[k] for k in cols} for s in samples[:5]], compression="zstd")
    python_write(parts[1], cols, [{k: s[k] for k in cols} for s in samples[5:]])
    merge_index([str(p / "index.json") for p in parts], str(tmp_path / "merged"))
    got = tessera_read(driver, tmp_path, tmp_path / "merged")
    assert len(got) == 12
    for k, sample in enumerate(got):
        assert_same_value("str", sample["s"], samples[k]["s"], k)
        assert_same_value("ndarray:int32", sample["nd32"], samples[k]["nd32"], k)
