"""Meta tests of the IS Reshape v4 trainer on a causal LM (reference_impl/isreshape/lm).

They check our own loop on a tiny config: every arm's loss has a gradient, masked tokens get none,
the KL term is the k3 estimate, a lagged or lower-precision behaviour policy gives ratios != 1 (and
an on-policy float32 one gives exactly the ratio 1 the KV-cache sampler promises), the SAPO arm
carries the signed SAPO weight, two updates write the metrics and a resume replays them, and the
model/loss step runs on the ``meta`` device with the code the CPU run uses. Needs ``transformers``.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conformance_tests.harness import assert_that

pytest.importorskip("transformers")

from reference_impl import _checks  # noqa: E402
from reference_impl.isreshape.lm import model as lm  # noqa: E402
from reference_impl.isreshape.lm import task as task_mod  # noqa: E402
from reference_impl.isreshape.lm.trainer import ARMS, LmConfig, arm_loss, cli, init_path  # noqa: E402
from reference_impl.isreshape.sapo import sapo_policy_loss  # noqa: E402

pytestmark = pytest.mark.meta

TINY = ["--max-operand", "4", "--hidden", "16", "--layers", "1", "--heads", "2", "--pretrain-steps", "60",
        "--batch-prompts", "2", "--group-size", "8", "--max-new-tokens", "3", "--eval-every", "1",
        "--checkpoint-every", "1"]
TINY_CFG = dict(max_operand=4, hidden=16, layers=1, heads=2, pretrain_steps=60, batch_prompts=2, group_size=8,
                max_new_tokens=3)
METRICS = ("reward", "kl_ref", "kl_mu_pi", "kl_mu_pi_first", "grad_norm", "clip_fraction", "entropy", "ratio_mean",
           "ratio_std", "ratio_min", "ratio_max", "gamma_mean", "gamma_std", "weight_mean", "weight_max",
           "sapo_weight_mean", "abs_adv_mean", "loss", "heldout_acc")


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    """The tiny pre-trained init, built once for the module (``--model`` points every run at it)."""
    return init_path(LmConfig(**TINY_CFG), tmp_path_factory.mktemp("lm"))


def _records(path):
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _batch(seed=0, n=6, t=4):
    """Synthetic token tensors: log pi (leaf), log mu, log ref, advantages, mask (ragged), rewards."""
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(n, t, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    lp_mu = lp.detach() + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)
    lp_ref = lp.detach() + 0.2 * torch.randn(n, t, generator=g, dtype=torch.float64)
    lengths = torch.tensor([4, 3, 2, 4, 1, 2])[:n]
    mask = torch.arange(t)[None, :] < lengths[:, None]
    reward = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)[:n]
    adv = ((reward - reward.mean()) / reward.std(unbiased=False))[:, None].expand(n, t) * mask
    return lp, lp_mu, lp_ref, adv, mask, reward


@pytest.mark.clause("ISR-LOSS-2", "ISR-SFT-1", "ISR-SAPO-2", "PPO-LOSS-1")
@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_has_a_gradient_and_masked_tokens_get_none(arm):
    lp, lp_mu, lp_ref, adv, mask, reward = _batch()
    loss, _ = arm_loss(LmConfig(arm=arm, kl_coef=0.5), lp, lp_mu, lp_ref, adv, mask, reward)
    loss.backward()
    grad = lp.grad
    assert_that(grad[mask].abs().sum() > 1e-6, "ISR-LOSS-2", grad[mask], f"a non-zero gradient on response tokens ({arm})")
    assert_that(grad[~mask].abs().max() == 0, "ISR-LOSS-2", grad[~mask], f"exactly zero gradient on masked tokens ({arm})")


@pytest.mark.clause("ISR-LOSS-2")
def test_masked_tokens_do_not_change_the_loss_of_a_real_model(init):
    """Changing the pad tokens after eos (and their log-probs' inputs) leaves every arm's loss unchanged."""
    model, tok = lm.load(init, device=torch.device("cpu"), dtype=torch.float32)
    probs = task_mod.encode(tok, [(1, 2), (3, 4)], 3)
    resp = torch.tensor([[task_mod.CHARS.index("3") + 4, tok.eos_token_id, tok.pad_token_id],
                         [task_mod.CHARS.index("7") + 4, tok.eos_token_id, tok.pad_token_id]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    other = resp.clone()
    other[:, 2] = task_mod.CHARS.index("9") + 4  # a different token where the mask is off
    reward = torch.tensor([1.0, 0.0])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    for arm in ARMS:
        losses = []
        for r in (resp, other):
            lp = lm.token_log_probs(lm.response_logits(model, probs.prompt_ids, probs.prompt_mask, r), r) * mask
            losses.append(arm_loss(LmConfig(arm=arm), lp, lp.detach() - 0.1, lp.detach() + 0.05, adv, mask, reward)[0])
        assert_that(torch.equal(losses[0], losses[1]), "ISR-LOSS-2", [float(x.detach()) for x in losses],
                    f"the same loss whatever sits in masked positions ({arm})")


@pytest.mark.clause("PPO-KL-2")
def test_kl_term_is_the_masked_k3_to_the_reference():
    lp, lp_mu, lp_ref, adv, mask, reward = _batch(seed=1)
    _, kl = arm_loss(LmConfig(arm="v4"), lp, lp_mu, lp_ref, adv, mask, reward)
    d = (lp_ref - lp.detach()).numpy()[mask.numpy()]
    expected = float(np.mean(np.exp(d) - 1.0 - d))  # numpy oracle over response tokens only
    assert_that(abs(float(kl) - expected) < 1e-12, "PPO-KL-2", float(kl), f"{expected} (masked mean of e^d - 1 - d)")
    _, kl0 = arm_loss(LmConfig(arm="v4"), lp, lp_mu, lp.detach(), adv, mask, reward)
    assert_that(float(kl0) == 0.0, "PPO-KL-2", float(kl0), "0 when the policy is the reference")


@pytest.mark.clause("ISR-SAPO-2", "ISR-SAPO-3")
def test_sapo_loss_gradient_is_the_signed_sapo_weight():
    lp, lp_mu, _, adv, mask, _ = _batch(seed=2)
    tau_pos, tau_neg = 1.0, 3.0
    sapo_policy_loss(lp, lp_mu, adv, mask.double(), tau_pos=tau_pos, tau_neg=tau_neg).backward()
    r = np.exp(lp.detach().numpy() - lp_mu.numpy())
    a, m = adv.numpy(), mask.numpy().astype(float)
    tau = np.where(a > 0, tau_pos, tau_neg)
    w = r / np.cosh(tau * (r - 1) / 2) ** 2  # r sech^2(tau_A (r - 1)/2), numpy
    expected = -w * a * m / (m.sum() + 1e-8)
    err = float(np.abs(lp.grad.numpy() - expected).max())
    assert_that(err < 1e-12, "ISR-SAPO-3", err, "dL/dlog pi = -r sech^2(tau_A (r-1)/2) A m / n")


def _run(tmp_path, init, *extra, name="run"):
    out = tmp_path / name
    assert cli(["--out", str(out), "--model", init, *TINY, *extra]) == 0
    return out


@pytest.mark.clause("ISR-METRIC-1", "ISR-METRIC-2", "ISR-METRIC-3", "ISR-LOSS-2")
def test_all_arms_two_updates_then_resume(tmp_path, init):
    out = _run(tmp_path, init, "--arms", "all", "--updates", "2")
    for arm in ARMS:
        recs = _records(out / arm / "seed0" / "metrics.jsonl")
        assert_that([r["update"] for r in recs] == [0, 1], "ISR-METRIC-1", [r["update"] for r in recs], f"updates 0, 1 ({arm})")
        for r in recs:
            bad = [k for k in METRICS if k not in r or not math.isfinite(r[k])]
            assert_that(not bad, "ISR-METRIC-1", bad, f"every metric present and finite ({arm})")
        ckpt = torch.load(out / arm / "seed0" / "checkpoint.pt", weights_only=False)
        devices = {v.device.type for v in ckpt["policy"].values()}
        assert_that(devices == {"cpu"}, "ISR-METRIC-1", devices, "checkpoint tensors on the CPU (load on any device)")
    resumed = _run(tmp_path, init, "--arm", "v4", "--updates", "3", "--resume", name="run")
    straight = _run(tmp_path, init, "--arm", "v4", "--updates", "3", name="straight")
    a, b = (_records(d / "v4" / "seed0" / "metrics.jsonl") for d in (resumed, straight))
    same = [(x["update"], x["reward"], x["loss"]) == (y["update"], y["reward"], y["loss"]) for x, y in zip(a, b)]
    assert_that(len(a) == 3 and all(same), "ISR-METRIC-1", same, "a resumed run replays the uninterrupted run exactly")


@pytest.mark.clause("ISR-RATIO-1")
@pytest.mark.parametrize("lag, sample_dtype, off_policy", [(0, "float32", False), (1, "float32", True),
                                                            (0, "bf16", True)])
def test_lag_and_low_precision_make_the_batch_off_policy(tmp_path, init, lag, sample_dtype, off_policy):
    """One epoch per batch, so the logged ratios are those before any step on the batch."""
    out = _run(tmp_path, init, "--arm", "v4", "--updates", "2", "--epochs", "1", "--behaviour-lag", str(lag),
               "--sample-dtype", sample_dtype)
    last = _records(out / "v4" / "seed0" / "metrics.jsonl")[-1]  # update 1: a lag of 1 has a stale mu here
    spread = max(abs(last["ratio_max"] - 1), abs(last["ratio_min"] - 1))
    if off_policy:
        assert_that(spread > 1e-3, "ISR-RATIO-1", spread, f"ratios != 1 (lag {lag}, sampling in {sample_dtype})")
    else:
        assert_that(spread < 1e-4, "ISR-RATIO-1", spread, "ratio 1 on-policy in float32 (KV-cache sampler = full forward)")


@pytest.mark.clause("ISR-LOSS-2")
def test_model_and_loss_step_run_on_the_meta_device():
    """The trainer's model and loss code holds no CPU assumption: build, sample, score and backprop on meta."""
    tok = lm.char_tokenizer()
    with torch.device("meta"):
        model = __import__("transformers").AutoModelForCausalLM.from_config(
            lm.tiny_config(len(tok), hidden=16, layers=1, heads=2, max_positions=32),
            attn_implementation="eager")  # transformers' sdpa path reads the padding mask back (an .all())
    probs = task_mod.encode(tok, [(1, 2), (3, 4)], 3).to("meta")
    with _checks.validation(False):
        resp, lp_mu, mask = lm.generate(model, probs.prompt_ids, probs.prompt_mask, max_new_tokens=3,
                                        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=None)
        reward = task_mod.exact_match(resp, probs.target_ids)
        lp = lm.token_log_probs(lm.response_logits(model, probs.prompt_ids, probs.prompt_mask, resp), resp) * mask
        for arm in ARMS:
            loss, _ = arm_loss(LmConfig(arm=arm), lp, lp_mu, lp.detach(), lp.detach(), mask, reward)
            loss.backward(retain_graph=True)
    grads = {p.grad.device.type for p in model.parameters() if p.grad is not None}
    assert_that(grads == {"meta"} and resp.shape == (2, 3), "ISR-LOSS-2", (grads, tuple(resp.shape)),
                "gradients on meta and a [2, 3] response")
