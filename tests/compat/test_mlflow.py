"""The `mlflow` logger against a real MLflow tracking server (`mlflow server`, PyPI mlflow, on loopback with a SQLite
store), read back with MLflow's own client:

- a run in the named experiment, with its tags (the user's, `run_name`, `run_group`), the resolved recipe as params
  (dotted keys), every step's loss at its step with the value the jsonl logger wrote, and status FINISHED;
- `resume: true` after autoresume: the requeued job finds its run by the `run_name` tag and continues it (one run,
  every step's loss), as Composer's MLFlowLogger does;
- a server that is not there fails the run before training, naming the URI; a file store URI is refused;
- a password in the tracking URI's user-info (`http://alice:hunter2@host`, which the server, without authentication,
  ignores) shows in no param, metrics.jsonl line, checkpoint or message: `http://***@host` instead (issue 61).
"""
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import yaml

import mlflow_server
from conftest import _binary, write_sequence_mds

SEQ, VOCAB = 32, 128


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, uri = mlflow_server.start(tmp_path_factory.mktemp("mlflow"),
                                    os.path.join(os.path.dirname(sys.executable), "mlflow"))
    yield uri
    mlflow_server.stop(proc)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-run")
    write_sequence_mds(root / "data" / "train", 128, SEQ, VOCAB)
    r = {
        "max_seq_len": SEQ, "seed": 3, "tokenizer": {"name": "unused"},
        "model": {"name": "mpt_causal_lm", "d_model": 32, "n_heads": 2, "n_layers": 2, "expansion_ratio": 2,
                  "max_seq_len": SEQ, "vocab_size": VOCAB, "attn_config": {"attn_impl": "torch"}},
        "train_loader": {"name": "text", "dataset": {"local": str(root / "data"), "split": "train", "shuffle": True,
                                                     "max_seq_len": SEQ}, "drop_last": True},
        "optimizer": {"name": "decoupled_adamw", "lr": 3e-3},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "2ba"},
        "max_duration": "6ba", "eval_interval": 0, "global_train_batch_size": 8,
        "device_train_microbatch_size": 8, "device_eval_batch_size": 8, "precision": "fp32", "device": "cpu",
        "log_to_console": False, "save_folder": f"{root}/{{run_name}}/ckpt", "save_interval": "2ba",
        "loggers": {"jsonl": {"filename": f"{root}/{{run_name}}/metrics.jsonl"}},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(r))
    return path, root


def train(path, *overrides, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([_binary("TESSERA_TRAIN_BIN", "train"), "--recipe", str(path), *overrides], env=env,
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def jsonl_losses(root, run):
    rows = [json.loads(line) for line in (root / run / "metrics.jsonl").read_text().splitlines()]
    return {r["batch"]: r["loss/train/total"] for r in rows if "loss/train/total" in r}


def test_a_run_its_params_tags_and_every_step_reach_the_server(server, recipe):
    from mlflow import MlflowClient

    path, root = recipe
    with_password = server.replace("http://", "http://alice:hunter2@")
    proc = train(path, "run_name=first", f"loggers.mlflow.tracking_uri={with_password}",
                 "loggers.mlflow.experiment_name=tessera", "loggers.mlflow.tags.team=pretraining",
                 "loggers.mlflow.run_group=sweep-1", "loggers.mlflow.synchronous=true")
    assert "hunter2" not in proc.stdout + proc.stderr
    client = MlflowClient(server)
    exp = client.get_experiment_by_name("tessera")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], filter_string='tags.run_name = "first"')
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "first" and run.info.status == "FINISHED"
    assert run.data.tags["team"] == "pretraining" and run.data.tags["run_group"] == "sweep-1"
    params = run.data.params
    assert params["max_seq_len"] == "32" and params["model.d_model"] == "32"
    assert params["optimizer.name"] == "decoupled_adamw" and params["optimizer.lr"] == "0.003"
    assert params["loggers.mlflow.synchronous"] == "True"
    assert params["loggers.mlflow.tracking_uri"] == server.replace("http://", "http://***@")
    assert not any("hunter2" in v for v in params.values())
    for f in (root / "first").rglob("*"):
        assert not f.is_file() or b"hunter2" not in f.read_bytes(), f
    history = client.get_metric_history(run.info.run_id, "loss/train/total")
    want = jsonl_losses(root, "first")
    assert sorted(m.step for m in history) == list(range(6))
    for m in history:
        assert m.value == pytest.approx(want[m.step], rel=1e-6)


def test_resume_continues_the_run_after_autoresume(server, recipe):
    from mlflow import MlflowClient

    path, root = recipe
    common = ["run_name=resumed", f"loggers.mlflow.tracking_uri={server}", "loggers.mlflow.experiment_name=tessera",
              "loggers.mlflow.resume=true", "autoresume=true", "loggers.mlflow.flush_interval=0"]
    train(path, *common, "max_duration=4ba")
    train(path, *common, "max_duration=6ba")  # a later job of the same run: resumes at batch 4
    client = MlflowClient(server)
    exp = client.get_experiment_by_name("tessera")
    runs = client.search_runs([exp.experiment_id], filter_string='tags.run_name = "resumed"')
    assert len(runs) == 1, [r.info.run_id for r in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["max_duration"] == "4ba"  # a param is set once: MLflow keeps the first value
    history = client.get_metric_history(run.info.run_id, "loss/train/total")
    assert sorted(m.step for m in history) == list(range(6))
    want = jsonl_losses(root, "resumed")
    for m in history:
        assert m.value == pytest.approx(want[m.step], rel=1e-6)


def test_a_server_that_is_not_there_fails_the_run_naming_it(recipe):
    path, _ = recipe
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Pre-flight asks the server before anything starts: exit 2, the key, the URI without its password.
    proc = train(path, "run_name=nowhere", f"loggers.mlflow.tracking_uri=http://alice:hunter2@127.0.0.1:{port}",
                 check=False)
    assert proc.returncode == 2
    assert (f"loggers.mlflow.tracking_uri: GET http://***@127.0.0.1:{port}/api/2.0/mlflow/experiments/search"
            in proc.stderr), proc.stderr[-2000:]
    assert "hunter2" not in proc.stdout + proc.stderr
    assert "[preflight]" in proc.stderr
    assert not (path.parent / "runs" / "nowhere").exists()
    proc = train(path, "run_name=file", "loggers.mlflow.tracking_uri=./mlruns", check=False)
    assert proc.returncode == 2 and "tracking_uri './mlruns'" in proc.stderr, proc.stderr[-2000:]
    # Without the pre-flight the logger finds it out itself, as the run starts.
    proc = train(path, "run_name=nowhere", f"loggers.mlflow.tracking_uri=http://alice:hunter2@127.0.0.1:{port}",
                 "--no-preflight", check=False)
    assert proc.returncode != 0
    assert f"http://***@127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name" in proc.stderr, proc.stderr[-2000:]
    assert "hunter2" not in proc.stdout + proc.stderr and "[mlflow]" in proc.stderr


def test_hf_checkpointer_logs_and_registers_the_final_model_as_llm_foundry_does(server, recipe, tmp_path):
    """hf_checkpointer's mlflow_registered_model_name: the final Hugging Face folder goes to the run as a transformers
    flavor model (final_model_checkpoint/: MLmodel, model/, components/tokenizer/) and becomes a new version of the
    registered model; MLflow's own mlflow.transformers.load_model loads it and it computes what the local folder
    computes. A second run registers version 2. Without an mlflow logger the setting fails the run before training."""
    import mlflow
    import torch
    from mlflow import MlflowClient
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path, root = recipe
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([f"registered model sample {i}" for i in range(100)], vocab_size=300,
                            special_tokens=["<|endoftext|>"])
    PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>").save_pretrained(tmp_path / "tok")
    common = [f"loggers.mlflow.tracking_uri={server}", "loggers.mlflow.experiment_name=registry",
              f"tokenizer.name={tmp_path / 'tok'}", "model.vocab_size=512",
              f"callbacks.hf_checkpointer.save_folder={root}/{{run_name}}", "callbacks.hf_checkpointer.save_interval=3ba",
              "callbacks.hf_checkpointer.mlflow_registered_model_name=tessera-tiny",
              "callbacks.hf_checkpointer.mlflow_logging_config.metadata.pretrained_model_name=tessera/tiny"]
    train(path, "run_name=registered", *common)
    mlflow.set_tracking_uri(server)  # for download_artifacts and load_model's models:/ URI
    client = MlflowClient(server)
    versions = client.search_model_versions("name='tessera-tiny'")
    assert [v.version for v in versions] == ["1"]
    v = versions[0]
    assert client.get_run(v.run_id).data.tags["run_name"] == "registered"
    assert v.source.endswith("/final_model_checkpoint") and v.tags["task"] == "llm/v1/completions"
    local = root / "registered" / "huggingface" / "ba6"
    got = pathlib.Path(mlflow.artifacts.download_artifacts(run_id=v.run_id, artifact_path="final_model_checkpoint",
                                                           dst_path=str(tmp_path / "download")))
    assert (got / "model" / "model.safetensors").read_bytes() == (local / "model.safetensors").read_bytes()
    assert (got / "components" / "tokenizer" / "tokenizer.json").read_bytes() == (local / "tokenizer.json").read_bytes()
    mlmodel = yaml.safe_load((got / "MLmodel").read_text())
    assert mlmodel["metadata"] == {"pretrained_model_name": "tessera/tiny", "task": "llm/v1/completions"}
    components = mlflow.transformers.load_model(f"models:/tessera-tiny/1", return_type="components")
    ids = torch.tensor([[5, 17, 3, 90, 64]])
    with torch.no_grad():
        ours = components["model"](ids).logits
        want = AutoModelForCausalLM.from_pretrained(local)(ids).logits
    assert torch.equal(ours, want)
    assert type(components["tokenizer"]).__name__ == "PreTrainedTokenizerFast"

    train(path, "run_name=registered-again", *common)
    assert sorted(v.version for v in client.search_model_versions("name='tessera-tiny'")) == ["1", "2"]

    proc = train(path, "run_name=no-logger", f"tokenizer.name={tmp_path / 'tok'}", "model.vocab_size=512",
                 f"callbacks.hf_checkpointer.save_folder={root}/{{run_name}}",
                 "callbacks.hf_checkpointer.mlflow_registered_model_name=tessera-tiny", check=False)
    assert proc.returncode == 2 and "no mlflow logger" in proc.stderr, proc.stderr[-2000:]
