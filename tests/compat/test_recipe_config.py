"""Recipe loading against the real peer: OmegaConf, which LLM Foundry uses to load recipes.

For each recipe and set of command-line overrides, `train --print-config` (Tessera's resolved tree) must equal
OmegaConf.to_container(merge(load(recipe), from_dotlist(overrides)), resolve=True): same keys, types and values.
"""
import json
import os
import pathlib
import subprocess

import pytest
from omegaconf import OmegaConf

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = os.environ.get("TESSERA_TRAIN_BIN", str(ROOT / "build" / "bin" / "train"))

RECIPES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*.yaml")) + [
    "tests/data/foundry/mpt-125m.yaml",
    "tests/data/foundry/mpt-small-cpu.yaml",
    "tests/data/interpolation.yaml",
]

OVERRIDE_SETS = [
    [],
    ["variables.max_seq_len=512", "optimizer.lr=3.0e-4", "optimizer.betas=[0.8, 0.99]", "run_name=trial-7"],
    ["variables.global_seed=1234", "device_train_microbatch_size=auto", "eval_first=true", "max_duration=2ep"],
]


def omegaconf_resolved(recipe, overrides):
    cfg = OmegaConf.load(ROOT / recipe)
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def tessera_resolved(recipe, overrides, hub=None):
    env = dict(os.environ, HF_HUB_CACHE=str(hub)) if hub else None
    out = subprocess.run([TRAIN, "--recipe", str(ROOT / recipe), "--print-config", *overrides],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


@pytest.mark.parametrize("overrides", OVERRIDE_SETS, ids=["plain", "overrides", "more-overrides"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_resolution_matches_omegaconf(recipe, overrides, hub_cache):
    if recipe == "recipes/sft-tiny-cpu.yaml":  # starts from the main job's export, which a fresh clone lacks
        overrides = overrides + [f"variables.model_path={hub_cache / 'main-job-export'}"]
    expected = omegaconf_resolved(recipe, overrides)
    actual = tessera_resolved(recipe, overrides, hub_cache)  # the fine-tuning recipes name hub models
    assert actual == expected
    # Same types too (json/Python equality treats 1 == 1.0 and True == 1).
    def types(x):
        if isinstance(x, dict):
            return {k: types(v) for k, v in x.items()}
        if isinstance(x, list):
            return [types(v) for v in x]
        return type(x).__name__
    assert types(actual) == types(expected)


def test_interpolation_fixture_exercises_chains_and_strings():
    cfg = tessera_resolved("tests/data/interpolation.yaml", [])
    assert cfg["train_loader"]["dataset"]["local"] == "/data/c4-neox"
    assert cfg["save_folder"] == "./runs/256/ckpt-17"
    assert cfg["optimizer"]["betas"] == [0.9, 0.95]
    assert cfg["algorithms"]["gradient_clipping"] == {"clipping_type": "norm", "clipping_threshold": 1.0}
    assert cfg["run_name"] is None
