"""The TextWorld trainer of the reference (reference_impl.ccapo.textworld): smoke tests of two updates
on one tiny generated game, a resume, a device-free checkpoint, a held-out evaluation that only reads the
STDB (its GiGPO arm's pieces: meta/test_ccapo_gigpo.py).
"""
from __future__ import annotations

import json

import pytest
import torch

from conformance_tests.harness import assert_equal, assert_that
from reference_impl.ccapo.stdb import sqlite_store
from reference_impl.ccapo.textworld.env import TextWorldEnv
from reference_impl.ccapo.textworld.policy import TextPolicy, Tokenizer
from reference_impl.ccapo.textworld.trainer import Config, cli, evaluate

# ----------------------------------------------------------------------------- the trainer
# tiny_game: meta/conftest.py
TINY = ["--prompts", "1", "--group-size", "3", "--max-steps", "6", "--train-games", "1", "--heldout-games", "0",
        "--epochs", "1", "--checkpoint-every", "1", "--device", "cpu"]


def _records(path):
    return [json.loads(ln) for ln in (path / "metrics.jsonl").read_text().splitlines() if ln.strip()]


@pytest.mark.meta
@pytest.mark.clause("CCAPO-PPO-1", "CCAPO-STDB-6")
@pytest.mark.parametrize("arm", ["ccapo", "grpo", "gigpo"])
def test_trainer_two_updates_then_resume(tiny_game, tmp_path, arm):

    args = TINY + ["--out", str(tmp_path), "--arms", arm, "--games-dir", str(tiny_game.parent)]
    assert cli(args + ["--updates", "2"]) == 0
    assert cli(args + ["--updates", "3", "--resume"]) == 0
    recs = _records(tmp_path / f"{arm}-s0")
    assert_that([r["update"] for r in recs] == [0, 1, 2], "CCAPO-PPO-1", [r["update"] for r in recs],
                "updates 0, 1 then 2 after the resume")
    for key in ("success_rate", "mean_steps", "score_frac", "stdb_hit_rate", "approx_kl", "kl_ref", "clip_fraction",
                "grad_norm"):
        assert_that(all(key in r for r in recs), "CCAPO-PPO-1", recs[-1], f"metric {key!r} in every record")
    # every episode of the tiny game fails, so only GiGPO's step term has a gradient here (the group and
    # KL terms are 0 at the reference policy)
    norms = [r["grad_norm"] for r in recs]
    assert_that(all(n >= 0 for n in norms) and (arm != "gigpo" or all(n > 0 for n in norms)), "CCAPO-PPO-1", norms,
                "a gradient norm before clipping at every update, above 0 where an advantage is not 0")
    assert_that(recs[-1]["stdb_hit_rate"] > 0, "CCAPO-STDB-6", recs[-1]["stdb_hit_rate"],
                "> 0: one game replayed, so the third update meets edges the first two stored")
    snap = sqlite_store(tmp_path / f"{arm}-s0" / "stdb.sqlite").snapshot()
    assert_that(snap["n_total_global"] == 3 * 3, "CCAPO-STDB-6", snap["n_total_global"],
                "one count per episode of the three updates (the resume does not double count)")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-PPO-1")
def test_checkpoint_is_device_free(tiny_game, tmp_path):
    # everything in the checkpoint is a CPU tensor or plain data, so a GPU run's checkpoint loads anywhere

    assert cli(TINY + ["--out", str(tmp_path), "--arms", "ccapo", "--games-dir", str(tiny_game.parent),
                       "--updates", "1"]) == 0
    ckpt = torch.load(tmp_path / "ccapo-s0" / "checkpoint.pt", map_location="meta", weights_only=False)
    saved = torch.load(tmp_path / "ccapo-s0" / "checkpoint.pt", weights_only=False)
    devices = set()

    def walk(x):
        if isinstance(x, torch.Tensor):
            devices.add(x.device.type)
        elif isinstance(x, dict):
            [walk(v) for v in x.values()]
        elif isinstance(x, (list, tuple)):
            [walk(v) for v in x]

    walk(saved)
    assert_that(devices == {"cpu"}, "CCAPO-PPO-1", devices, "only CPU tensors in the checkpoint")
    assert_that(ckpt["update"] == 0, "CCAPO-PPO-1", ckpt["update"], "loads with map_location='meta' too")


@pytest.mark.meta
@pytest.mark.clause("CCAPO-STDB-5")
def test_heldout_evaluation_only_reads_the_stdb(tiny_game, tmp_path):

    cfg = Config(max_steps=4, eval_episodes=2)
    store = sqlite_store(tmp_path / "stdb.sqlite")
    store.update({"anchors": [("kitchen", "<START>")], "fingerprints": ["LOOK()"], "success": True})
    before = store.snapshot()
    stats = evaluate(TextPolicy(cfg.vocab, cfg.embed, cfg.hidden), Tokenizer(cfg.vocab, cfg.max_tokens),
                     [TextWorldEnv(tiny_game, cfg.max_steps)], store, cfg, 0, torch.device("cpu"))
    assert_equal(store.snapshot(), before, "CCAPO-STDB-5", "the held-out games leave the STDB as it was")
    assert_that(0.0 <= stats["stdb_hit_rate"] <= 1.0 and 1 <= stats["mean_steps"] <= 4, "CCAPO-STDB-5", stats,
                "a hit rate in [0, 1] and episodes of 1..max_steps commands")
