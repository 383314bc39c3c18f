"""`tessera eval --recipe` against LLM Foundry's own evaluation entry point (llmfoundry.command_utils.eval_from_yaml,
what scripts/eval/eval.py runs) on LLM Foundry's hf_eval.yaml as published (tests/data/eval/hf_eval.yaml).

A small random MPT is built with transformers (MptConfig, save_pretrained) and a byte-level BPE tokenizer trained by
HF `tokenizers` on the Debian fortunes is saved into the same folder, so that `hf_causal_lm` with
pretrained_model_name_or_path and `tokenizer.name` both point at it, as a user's local model would. Both sides read
the YAML with the same key=value overrides (the model folder, max_seq_len, a local tasks file and gauntlet); LLM
Foundry's copy also drops fsdp_config and sets init_device: cpu, which its single CPU process needs (Tessera's one
process ignores fsdp_config as Composer does on one rank; on 2 ranks it shards the model). The table LLM
Foundry prints (Category, Benchmark, Subtask, Accuracy, Number few shot, Model) must equal Tessera's row for row,
and Tessera's must stay the same with one row per forward pass and on 2 ranks. The YAML's `loggers` reach a real
MLflow tracking server (the test venv's `mlflow server` on loopback) with the metrics LLM Foundry's run sends there.
"""
import atexit
import json
import os
import pathlib
import re
import subprocess

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
from transformers import MptConfig, MptForCausalLM, PreTrainedTokenizerFast  # noqa: E402

import mlflow_server  # noqa: E402

torch.set_num_threads(1)
ROOT = pathlib.Path(__file__).resolve().parents[2]
EVAL = os.environ.get("TESSERA_EVAL_BIN", str(ROOT / "build" / "bin" / "eval"))
DATA = ROOT / "tests" / "data" / "icl"  # first 40 lines of LLM Foundry's task files
RECIPE = ROOT / "tests" / "data" / "eval" / "hf_eval.yaml"
FORTUNES = pathlib.Path("/usr/share/games/fortunes")
EOS = "<|endoftext|>"
TASKS = [
    dict(label="lambada_openai", file="lambada_openai.jsonl", icl_task_type="language_modeling", num_fewshot=[0]),
    dict(label="jeopardy", file="jeopardy_small.jsonl", icl_task_type="language_modeling", num_fewshot=[0],
         continuation_delimiter="\nAnswer: ", has_categories=True),
    dict(label="piqa", file="piqa.jsonl", icl_task_type="multiple_choice", num_fewshot=[0, 2],
         continuation_delimiter="\nAnswer: "),
    dict(label="winograd", file="winograd_wsc.jsonl", icl_task_type="schema", num_fewshot=[0]),
]
GAUNTLET = dict(weighting="EQUAL", subtract_random_baseline=True, rescale_accuracy=True,
                categories=[dict(name="commonsense_reasoning", benchmarks=[
                                 dict(name="piqa", num_fewshot=0, random_baseline=0.5)]),
                            dict(name="language_understanding", benchmarks=[
                                 dict(name="lambada_openai", num_fewshot=0, random_baseline=0.0),
                                 dict(name="winograd", num_fewshot=0, random_baseline=0.5)])])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval_recipe")
    docs = [d for d in (FORTUNES / "fortunes").read_text(errors="replace").split("\n%\n") if d.strip()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=1024, min_frequency=2, special_tokens=[EOS], show_progress=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, pad_token=EOS)
    torch.manual_seed(0)
    model = MptForCausalLM(MptConfig(d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
                                     vocab_size=1024))
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tok.save_pretrained(tmp / "model")
    tasks = []
    for t in TASKS:
        (tmp / t["file"]).write_text("\n".join((DATA / t["file"]).read_text().splitlines()[:24]) + "\n")
        tasks.append(dict({k: v for k, v in t.items() if k != "file"}, dataset_uri=str(tmp / t["file"])))
    (tmp / "tasks.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}))
    (tmp / "gauntlet.yaml").write_text(yaml.safe_dump({"eval_gauntlet": GAUNTLET}))
    overrides = [f"variables.model_name_or_path={tmp / 'model'}", "variables.max_seq_len=256",
                 f"icl_tasks={tmp / 'tasks.yaml'}", f"eval_gauntlet={tmp / 'gauntlet.yaml'}"]
    return tmp, overrides


def table_lines(text, title="Printing complete results for all models"):
    """The lines of the last table printed after `title`, as printed."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start + 1:end]


def table_cells(text, title):
    """The last table printed after `title`: one list of stripped cells per line (header, rule, rows)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table_lines(text, title)]


def table(text):
    """The last results table printed after "Printing complete results for all models": one tuple of cells per row
    (Accuracy as a float; an empty cell, or pandas' None / nan, as "")."""
    rows = table_cells(text, "Printing complete results for all models")
    head, body = rows[0], rows[2:]
    assert head == ["Category", "Benchmark", "Subtask", "Accuracy", "Number few shot", "Model"], head
    out = []
    for r in body:
        r = ["" if c in ("None", "nan") else c for c in r]
        out.append((r[0], r[1], r[2], float(r[3].removeprefix("tensor(").removesuffix(")")), r[4], r[5]))
    return out


def gauntlet_table(text):
    """The last gauntlet table printed after "Printing gauntlet results for all models": its header and one row per
    model (the model's name, then each score as a float)."""
    rows = table_cells(text, "Printing gauntlet results for all models")
    return rows[0], [[r[0], *map(float, r[1:])] for r in rows[2:]]


def llm_foundry_table(tmp_path, overrides, capsys, monkeypatch, printed=None):
    """LLM Foundry's own entry point on the same YAML and overrides (its single CPU process cannot run FSDP)."""
    from llmfoundry.command_utils import eval_from_yaml
    theirs_yaml = yaml.safe_load(RECIPE.read_text())
    del theirs_yaml["fsdp_config"]
    theirs_yaml["models"][0]["model"]["init_device"] = "cpu"
    theirs_yaml["python_log_level"] = None  # its logging handler would outlive pytest's captured stderr
    (tmp_path / "hf_eval.yaml").write_text(yaml.safe_dump(theirs_yaml))
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)  # where LLM Foundry copies (and partitions) the task files
    eval_from_yaml(str(tmp_path / "hf_eval.yaml"), overrides)
    out = capsys.readouterr().out
    if printed is not None:
        printed.append(out)
    return table(out)


def tessera_table(overrides, totals=None):
    """Tessera's table; with `totals` (a dict), also each evaluator's number of examples scored, by its label."""
    proc = subprocess.run([EVAL, "--recipe", RECIPE, *overrides], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():  # metrics/piqa/2-shot/InContextLearningMultipleChoiceAccuracy: 0.5 (1/2)
        if line.startswith("metrics/") and line.endswith(")") and totals is not None:
            totals[line.split(":")[0].rsplit("/", 1)[0].removeprefix("metrics/")] = int(line.split("/")[-1][:-1])
    return table(proc.stdout)


def test_the_published_eval_yaml_prints_llm_foundrys_table(setup, tmp_path, capsys, monkeypatch):
    tmp, overrides = setup
    proc = subprocess.run([EVAL, "--recipe", RECIPE, *overrides], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ours = table(proc.stdout)

    their_out = []
    theirs = llm_foundry_table(tmp_path, overrides, capsys, monkeypatch, their_out)

    print("\n".join(map(str, ours)))
    # The gauntlet's table: model_name, the averages, then the categories.
    # pandas' to_markdown as LLM Foundry prints it: the results table's text is the same, character for character.
    assert table_lines(proc.stdout) == table_lines(their_out[0])
    (head, rows), (their_head, their_rows) = gauntlet_table(proc.stdout), gauntlet_table(their_out[0])
    gauntlet_title = "Printing gauntlet results for all models"
    assert table_lines(proc.stdout, gauntlet_title)[:2] == table_lines(their_out[0], gauntlet_title)[:2]
    assert head == their_head == ["model_name", "default_average", "commonsense_reasoning", "language_understanding"]
    assert [r[0] for r in rows] == [r[0] for r in their_rows] == [str(tmp / "model")]
    assert rows[0][1:] == pytest.approx(their_rows[0][1:], abs=1e-5)
    assert [r[:3] + r[4:] for r in ours] == [r[:3] + r[4:] for r in theirs]
    assert [r[3] for r in ours] == pytest.approx([r[3] for r in theirs], abs=1e-6)
    # What the table must hold: a category's Average row and its subtasks, the gauntlet's categories, both shots.
    assert ("", "", "word_origins") in [r[:3] for r in ours]
    assert any(r[1] == "jeopardy" and r[2] == "Average" for r in ours)
    assert any(r[0] == "commonsense_reasoning" and r[1] == "piqa" for r in ours)
    assert {r[4] for r in ours} == {"0-shot", "2-shot"}
    assert all(r[5] == str(tmp / "model") for r in ours)

    # One row per forward pass, and 2 ranks (the eval launcher), where the YAML's fsdp_config (FULL_SHARD) shards
    # the model as training does, each rank reading only its half of the weights: the same table.
    for extra in (["device_eval_batch_size=1"], ["--nproc-per-node", "2", "--master-port", "0"]):
        proc = subprocess.run([EVAL, "--recipe", RECIPE, *overrides, *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        if "--nproc-per-node" in extra:
            held = re.search(r"FULL_SHARD over 2 ranks: this rank holds (\d+) of the model's (\d+) parameter bytes",
                             proc.stderr)
            assert held, proc.stderr
            assert int(held[1]) <= int(held[2]) // 2 + 4 * 1024, held[0]  # half, and each unit's padding at most
        other = table(proc.stdout)
        assert [r[:3] + r[4:] for r in other] == [r[:3] + r[4:] for r in ours], extra
        assert [r[3] for r in other] == pytest.approx([r[3] for r in ours], abs=1e-9), extra


@pytest.mark.parametrize("subset", [["icl_subset_num_batches=2", "device_eval_batch_size=3"],
                                    ["icl_subset_num_batches=2", "eval_subset_num_batches=1"]],
                         ids=["icl_subset", "eval_subset_overrides"])
def test_subsets_of_batches_print_llm_foundrys_table(setup, tmp_path, capsys, monkeypatch, subset):
    """icl_subset_num_batches limits the evaluators of tasks without categories (lambada, piqa, winograd) to their
    first batches (multiple choice and schema: batch_size / choices questions a batch); eval.py's
    eval_subset_num_batches overrides it for every evaluator, the per-category ones (jeopardy) too."""
    tmp, overrides = setup
    totals = {}
    ours = tessera_table([*overrides, *subset], totals)
    theirs = llm_foundry_table(tmp_path, [*overrides, *subset], capsys, monkeypatch)
    print("\n".join(map(str, ours)))
    assert [r[:3] + r[4:] for r in ours] == [r[:3] + r[4:] for r in theirs]
    assert [r[3] for r in ours] == pytest.approx([r[3] for r in theirs], abs=1e-6)
    # The files have at least 24 examples; a batch holds 3 or 4 LM examples, 1 or 2 questions of 2 choices; without
    # eval_subset_num_batches, jeopardy's categories are scored whole.
    per_lm, per_mc = (3, 1) if subset[-1] == "device_eval_batch_size=3" else (4, 2)
    batches = 2 if subset[-1] == "device_eval_batch_size=3" else 1
    assert totals["lambada_openai/0-shot"] == batches * per_lm, totals
    assert totals["piqa/0-shot"] == totals["piqa/2-shot"] == totals["winograd/0-shot"] == batches * per_mc, totals
    jeopardy = [n for label, n in totals.items() if label.startswith("jeopardy/")]
    whole = len((tmp / "jeopardy_small.jsonl").read_text().splitlines())
    assert sum(jeopardy) == whole if batches == 2 else max(jeopardy) <= per_lm, totals
    if subset[-1] == "device_eval_batch_size=3":
        # A rank's batches: 2 ranks of 1 batch each score the examples 1 process scores in 2.
        one = tessera_table([*overrides, "icl_subset_num_batches=4", "device_eval_batch_size=3"])
        two = tessera_table([*overrides, *subset, "--nproc-per-node", "2", "--master-port", "0"])
        assert [r[:3] + r[4:] for r in two] == [r[:3] + r[4:] for r in one]
        assert [r[3] for r in two] == pytest.approx([r[3] for r in one], abs=1e-9)


def test_a_tessera_checkpoint_evaluates_sharded_as_its_hf_folder(setup, tmp_path):
    """`load_path`: a Tessera checkpoint, saved by `train` on one rank after a step at learning rate 0 from the HF
    folder's weights, is evaluated with the folder's architecture (its hf_config) and gives the folder's table, on
    one process and on 2 ranks, where the YAML's FULL_SHARD fsdp_config loads each rank's half of the checkpoint."""
    import numpy as np
    from streaming import MDSWriter

    tmp, overrides = setup
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(tmp_path / "data" / "train"), columns={"tokens": "ndarray:int32"}) as w:
        for _ in range(4):
            w.write({"tokens": rng.integers(0, 1024, 65).astype(np.int32)})
    recipe = {
        "max_seq_len": 64, "seed": 1, "run_name": "ckpt",
        "model": {"name": "hf_causal_lm", "pretrained_model_name_or_path": str(tmp / "model"), "pretrained": True},
        "tokenizer": {"name": str(tmp / "model")},
        "train_loader": {"name": "text", "drop_last": True,
                         "dataset": {"local": str(tmp_path / "data"), "split": "train", "max_seq_len": 64}},
        "optimizer": {"name": "decoupled_adamw", "lr": 0.0, "weight_decay": 0.0},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "max_duration": "1ba", "eval_interval": 0, "global_train_batch_size": 2, "device_train_microbatch_size": 2,
        "precision": "fp32", "device": "cpu", "log_to_console": False,
        "save_folder": str(tmp_path / "save"), "save_interval": "1ba",
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(recipe))
    train = pathlib.Path(EVAL).parent / "train"
    proc = subprocess.run([train, "--recipe", tmp_path / "train.yaml"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = tessera_table(overrides)
    evaluated = yaml.safe_load(RECIPE.read_text())
    evaluated["models"][0]["load_path"] = str(tmp_path / "save")  # its newest valid checkpoint
    (tmp_path / "from_checkpoint.yaml").write_text(yaml.safe_dump(evaluated))
    for extra in ([], ["--nproc-per-node", "2", "--master-port", "0"]):
        proc = subprocess.run([EVAL, "--recipe", tmp_path / "from_checkpoint.yaml", *overrides, *extra],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ("FULL_SHARD over 2 ranks: this rank holds" in proc.stderr) == bool(extra), proc.stderr[-3000:]
        other = table(proc.stdout)
        assert [r[:3] + r[4:] for r in other] == [r[:3] + r[4:] for r in ours], extra
        assert [r[3] for r in other] == pytest.approx([r[3] for r in ours], abs=1e-9), extra


@pytest.fixture(scope="module", autouse=True)
def mlflow_server_starting(tmp_path_factory):
    """`mlflow server` (PyPI mlflow, the test venv's; the Composer venv's cannot start one) on a free loopback port,
    started with the module so that its start-up overlaps the tests before the one that uses it."""
    root = tmp_path_factory.mktemp("mlflow")
    mlflow = os.environ.get("TESSERA_MLFLOW", str(pathlib.Path.home() / ".cache/tessera/venv/bin/mlflow"))
    proc, uri = mlflow_server.launch(root, mlflow)
    # Stopped at exit, after Composer's own exit hook, which post-closes its MLFlowLogger again (engine.py registers
    # Engine._close with atexit and close() leaves it registered): against a stopped server that retries for minutes.
    atexit.register(mlflow_server.stop, proc)
    return proc, uri, root, mlflow


@pytest.fixture
def mlflow_uri(mlflow_server_starting):
    proc, uri, root, mlflow = mlflow_server_starting
    mlflow_server.wait(proc, uri, root, mlflow)
    return uri


def mlflow_runs(uri, experiment):
    """Each run of the experiment: (run, {metric: [(step, value), ...]})."""
    from mlflow import MlflowClient
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, experiment
    return [(run, {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                   for k in run.data.metrics})
            for run in client.search_runs([exp.experiment_id])]


def test_loggers_send_what_llm_foundry_sends_to_mlflow(setup, tmp_path, capsys, monkeypatch, mlflow_uri):
    """`loggers:` as in LLM Foundry's eval YAMLs. eval.py (Composer's MLFlowLogger in a Trainer per model) and
    `tessera eval` each log one run named run_name to a real tracking server; the runs hold the same metrics, once, at
    step 0: each evaluator's metrics/<label>/<metric> and the gauntlet's icl/metrics/eval_gauntlet/<name>; both are
    FINISHED. Tessera's jsonl logger writes the same values, the recipe goes in as params without the tracking URI's
    password, and 2 ranks log one run with the same numbers."""
    tmp, overrides = setup
    llm_foundry_table(tmp_path, [*overrides, "run_name=foundry-eval", f"loggers.mlflow.tracking_uri={mlflow_uri}",
                                 "loggers.mlflow.experiment_name=foundry"], capsys, monkeypatch)
    [(theirs_run, theirs)] = mlflow_runs(mlflow_uri, "foundry")
    assert theirs_run.info.status == "FINISHED" and theirs_run.data.tags["run_name"] == "foundry-eval"
    assert any(k.startswith("icl/metrics/eval_gauntlet/") for k in theirs), theirs
    assert any(k.startswith("metrics/jeopardy/0-shot/") for k in theirs), theirs

    with_password = mlflow_uri.replace("http://", "http://alice:hunter2@")
    for experiment, extra in (("tessera", []), ("tessera-2-ranks", ["--nproc-per-node", "2", "--master-port", "0"])):
        jsonl = tmp_path / f"{experiment}.jsonl"
        proc = subprocess.run([EVAL, "--recipe", RECIPE, *overrides, "run_name=tessera-eval",
                               f"loggers.mlflow.tracking_uri={with_password}",
                               f"loggers.mlflow.experiment_name={experiment}", f"loggers.jsonl.filename={jsonl}",
                               *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "hunter2" not in proc.stdout + proc.stderr
        [(run, ours)] = mlflow_runs(mlflow_uri, experiment)
        assert run.info.run_name == "tessera-eval" and run.info.status == "FINISHED", run.info
        assert run.data.tags["run_name"] == "tessera-eval"
        assert sorted(ours) == sorted(theirs), experiment
        for key, history in ours.items():
            assert [step for step, _ in history] == [0], (key, history)
            assert history[0][1] == pytest.approx(theirs[key][0][1], abs=1e-6), key
        params = run.data.params
        assert params["device_eval_batch_size"] == "4" and params["max_seq_len"] == "256"
        assert params["loggers.mlflow.tracking_uri"] == mlflow_uri.replace("http://", "http://***@")
        assert not any("hunter2" in v for v in params.values())
        rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
        logged = {k: v for r in rows if "batch" in r for k, v in r.items() if k != "batch"}
        assert sorted(logged) == sorted(ours) and all(r["batch"] == 0 for r in rows if "batch" in r)
        assert all(logged[k] == pytest.approx(ours[k][0][1], abs=1e-6) for k in logged)


def test_eval_recipe_errors_name_the_file_line_and_key(setup, tmp_path):
    tmp, overrides = setup
    text = RECIPE.read_text().replace("device_eval_batch_size: 4", "device_eval_batch_sise: 4")
    (tmp_path / "typo.yaml").write_text(text)
    proc = subprocess.run([EVAL, "--recipe", tmp_path / "typo.yaml", *overrides], capture_output=True, text=True)
    assert proc.returncode == 2
    line = text.splitlines().index("device_eval_batch_sise: 4") + 1
    assert f"typo.yaml:{line}" in proc.stderr and "device_eval_batch_sise" in proc.stderr, proc.stderr
    # Keys of LLM Foundry's schema that Tessera does not implement are named together.
    (tmp_path / "loggers.yaml").write_text(RECIPE.read_text() + "loggers:\n  comet_ml: {}\ncallbacks: {}\n")
    proc = subprocess.run([EVAL, "--recipe", tmp_path / "loggers.yaml", *overrides], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not supported yet" in proc.stderr and "comet_ml" in proc.stderr and "callbacks" in proc.stderr
    # A logger's misspelt option is refused with its line, before any model is loaded.
    (tmp_path / "typo_logger.yaml").write_text(RECIPE.read_text() + "loggers:\n  mlflow:\n    tracking_ur: x\n")
    proc = subprocess.run([EVAL, "--recipe", tmp_path / "typo_logger.yaml", *overrides], capture_output=True,
                          text=True)
    line = len(RECIPE.read_text().splitlines()) + 3
    assert proc.returncode == 2 and f"typo_logger.yaml:{line}" in proc.stderr and "tracking_ur" in proc.stderr, \
        proc.stderr
    for bad in ("icl_subset_num_batches=0", "eval_subset_num_batches=0"):
        proc = subprocess.run([EVAL, "--recipe", RECIPE, *overrides, bad], capture_output=True, text=True)
        assert proc.returncode == 2 and bad.split("=")[0] in proc.stderr, proc.stderr
    # The flags the recipe decides are refused beside it.
    proc = subprocess.run([EVAL, "--recipe", RECIPE, "--batch-size", "2", *overrides], capture_output=True, text=True)
    assert proc.returncode == 2 and "--batch-size with --recipe" in proc.stderr, proc.stderr
