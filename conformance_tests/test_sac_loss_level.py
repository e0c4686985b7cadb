"""SAC at the level libraries are built: logits entry points and the loss-level op.

Oracles are numpy closed forms written here (legal-set softmax, sums over the legal set, Huber or
squared error, the analytic gradients); the implementation's other ops are never used as oracles.
Conventions the implementation declares (mask fill, Huber support, target entropy, the temperature's
variable, α in the actor loss) and the hyper-parameters it hard-codes (``pinned``) change the oracle, never
the normative part: sums over the legal set only, no NaN, each loss training its own network.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance_tests import strategies as st_
from conformance_tests.harness import (
    assert_close,
    assert_no_grad_into,
    assert_that,
    convention,
    differentiable,
    grad_of,
    masks_supported,
    not_applicable,
    np_temperature_loss,
    on_device,
    pin,
    require_differentiable,
    require_masks,
    temperature_loss_scale,
    terminated_truncated,
    to_numpy,
    working_dtype,
)
from conformance_tests.contract import outputs
from conformance_tests.modules import TableModule, TwinTable
from conformance_tests.oracles import huber, masked_softmax, np_

EPS = 1e-8  # SAC-MASK-2's clip floor


def _table(t: torch.Tensor) -> TableModule:
    """A suite table network on the session's device (the harness moves tensors, not modules)."""
    return on_device(TableModule(t))


def _twin(q1: torch.Tensor, q2: torch.Tensor) -> TwinTable:
    return on_device(TwinTable(q1, q2))


# ----------------------------------------------------------------------------- numpy oracles
def _pi(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The masked policy under the declared fill: the legal-set softmax, ε-clipped for the seed's fill."""
    p = masked_softmax(z, mask)
    return np.maximum(p, EPS) if convention("mask_fill") == "eps_clip" else p


def _legal_sum(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, x, 0.0).sum(-1)


def _safe_log(p: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.log(np.where(mask, p, 1.0))


def _np_entropy(p, mask):
    return -_legal_sum(p * _safe_log(p, mask), mask)


def _np_soft_value(p, q1, q2, mask, alpha):
    return _legal_sum(p * (np.minimum(q1, q2) - alpha * _safe_log(p, mask)), mask)


def _np_policy_loss(p, q1, q2, mask, alpha):
    return float(np.mean(-_np_soft_value(p, q1, q2, mask, alpha)))


def _np_policy_lossgrad_of(p, q1, q2, mask, alpha):
    """∂L_π/∂z of the legal-set softmax: (1/B)·π_j (g_j − Σ π g), g = α log π − min Q; 0 if illegal."""
    g = alpha * _safe_log(p, mask) - np.minimum(q1, q2)
    mean_g = _legal_sum(p * g, mask)[:, None]
    return np.where(mask, p * (g - mean_g), 0.0) / p.shape[0]


def _critic_penalty(err: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(penalty, d penalty / d err) of the critic loss under the declared ``huber_delta`` convention:
    Huber_δ (seed), or the plain squared error err² of ``mse`` (F.mse_loss, what libraries use)."""
    if convention("huber_delta") == "mse":
        return err**2, 2.0 * err
    return huber(err, delta), np.clip(err, -delta, delta)


def _np_target_entropy(mask: np.ndarray, kappa: float) -> np.ndarray:
    """κ·log|A(s)| per state (seed), or κ·log A over all actions for the ``scalar`` convention."""
    count = mask.sum(-1) if convention("target_entropy") == "per_state_legal" else np.full(mask.shape[0], mask.shape[1])
    return kappa * np.log(count)


# ----------------------------------------------------------------------------- inputs
def _all_legal_unless_masks(mask: torch.Tensor) -> torch.Tensor:
    """Implementations without masks only ever see all-legal rows (``masks: False``)."""
    return mask if masks_supported() else torch.ones_like(mask)


@st.composite
def logits_cases(draw, dtype, scale=5.0):
    """(logits, mask, q1, q2, alpha): logits of scale 5 keep every legal π far above the ε floor."""
    z, mask = draw(st_.logits_and_masks(scale=scale, dtype=dtype))
    q1, q2 = (draw(st_.q_values(tuple(z.shape), scale=5.0, dtype=dtype)) for _ in range(2))
    return z, _all_legal_unless_masks(mask), q1, q2, draw(st.floats(0.01, 2.0))


@st.composite
def loss_batches(draw, dtype):
    """A SAC batch over table networks: obs = row i < B, next_obs = row B + i of each table."""
    b, a = draw(st_.batch_shapes(max_batch=5, min_actions=2, max_actions=6))
    table = lambda: draw(st_.tensors((2 * b, a), lo=-4.0, hi=4.0, dtype=dtype))  # noqa: E731
    masks = _all_legal_unless_masks(draw(st_.legal_masks((2 * b, a))))
    legal, next_legal = masks[:b], masks[b:]
    action = torch.tensor([draw(st.sampled_from(np.flatnonzero(to_numpy(row)).tolist())) for row in legal])
    batch = {"obs": torch.arange(b), "next_obs": torch.arange(b, 2 * b), "action": action,
             "reward": draw(st_.tensors((b,), lo=-2.0, hi=2.0, dtype=dtype)),
             "done": torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b))),
             "legal_mask": legal, "next_legal_mask": next_legal}
    if terminated_truncated():  # truncated rows still bootstrap; a row both done and truncated terminated
        batch["truncated"] = torch.tensor(draw(st.lists(st.booleans(), min_size=b, max_size=b)))
    nets = {"policy": _table(table()), "critic": _twin(table(), table()), "target": _twin(table(), table())}
    delta = 1.0 if convention("huber_delta") != "any" else draw(st.sampled_from([0.3, 1.0, 2.5]))
    hp = {"log_alpha": torch.tensor(math.log(draw(st.floats(0.05, 1.5))), dtype=dtype, requires_grad=True),
          "gamma": draw(st.floats(0.01, 0.999)), "kappa": draw(st.floats(0.7, 1.2)), "delta": delta}
    return nets, batch, pin("sac.losses", hp)


def _checked_outputs(out: dict, want: dict) -> list[str]:
    """The documented keys of sac.losses with an oracle here: every required one, and the optional ones returned."""
    return [k for k, o in outputs("sac.losses").items() if k in want and (o.required or k in out)]


def _call_losses(sac, nets, batch, hp):
    return sac.losses(nets["policy"], nets["critic"], nets["target"], batch, **hp)


def _np_losses(nets, batch, hp) -> dict:
    """Every SAC-LOSSES-1 output from the tables, in numpy."""
    n = lambda m: np_(m.table)  # noqa: E731
    b = len(batch["obs"])
    z, legal, next_legal = n(nets["policy"]), np_(batch["legal_mask"]), np_(batch["next_legal_mask"])
    alpha, gamma = math.exp(hp["log_alpha"].item()), hp["gamma"]
    p_next = _pi(z[b:], next_legal)
    v_next = _np_soft_value(p_next, n(nets["target"].q1)[b:], n(nets["target"].q2)[b:], next_legal, alpha)
    y = np_(batch["reward"]) + gamma * (1.0 - np_(batch["done"]).astype(float)) * v_next
    rows, act = np.arange(b), np_(batch["action"]).astype(int)
    q1, q2 = n(nets["critic"].q1)[:b], n(nets["critic"].q2)[:b]
    pen = sum(_critic_penalty(q[rows, act] - y, hp["delta"])[0] for q in (q1, q2))
    p = _pi(z[:b], legal)
    h = _np_entropy(p, legal)
    h_tgt = _np_target_entropy(legal, hp["kappa"])
    return {"loss_actor": _np_policy_loss(p, q1, q2, legal, alpha), "loss_qvalue": float(np.mean(pen)),
            "loss_alpha": np_temperature_loss(hp["log_alpha"].item(), float(np.mean(h - h_tgt))), "entropy": float(np.mean(h)),
            "y": y, "p": p, "h": h, "h_tgt": h_tgt}


# ----------------------------------------------------------------------------- logits entry points
@pytest.mark.clause("SAC-ENT-3")
@given(st.data())
def test_entropy_from_logits_is_the_legal_set_entropy(sac, data):
    z, mask, _, _, _ = data.draw(logits_cases(working_dtype()))
    got = sac.entropy_from_logits(z, mask)
    assert_close(got, _np_entropy(_pi(np_(z), np_(mask)), np_(mask)), "SAC-ENT-3")


@pytest.mark.clause("SAC-ENT-3")
def test_entropy_from_logits_golden_ignores_illegal_logits(sac):
    require_masks()
    dt = working_dtype()
    # legal π = (1/4, 3/4): H = −(¼ ln ¼ + ¾ ln ¾); the illegal logit is the largest and must not matter
    z = torch.tensor([[0.0, math.log(3.0), 40.0]], dtype=dt)
    mask = torch.tensor([[True, True, False]])
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert_close(sac.entropy_from_logits(z, mask), [expected], "SAC-ENT-3", what="entropy with a large illegal logit")
    z_other = z.clone()
    z_other[0, 2] = -40.0
    assert_close(sac.entropy_from_logits(z_other, mask), [expected], "SAC-ENT-3", what="entropy, illegal logit changed")


@pytest.mark.clause("SAC-ENT-3", "SAC-V-2", "SAC-POL-4")
@pytest.mark.parametrize("actions", [1500, 6000])
def test_logits_entry_points_on_a_large_vocabulary(sac, actions):
    # the strategies draw a handful of actions; a library's fast path may switch algorithm or precision
    # past a vocabulary size: the V2 vocabulary (6,000) at the working dtype's tolerance
    dt, g = working_dtype(), torch.Generator().manual_seed(actions)
    z = (4.0 * torch.randn(2, actions, generator=g, dtype=torch.float64)).to(dt)
    mask = _all_legal_unless_masks(torch.rand(2, actions, generator=g) < 0.3)
    mask[:, 0] = True
    q1, q2 = (torch.randn(2, actions, generator=g, dtype=torch.float64).to(dt) for _ in range(2))
    p, m = _pi(np_(z), np_(mask)), np_(mask)
    assert_close(sac.entropy_from_logits(z, mask), _np_entropy(p, m), "SAC-ENT-3")
    assert_close(sac.soft_value_from_logits(z, q1, q2, mask, alpha=0.3),
                 _np_soft_value(p, np_(q1), np_(q2), m, 0.3), "SAC-V-2")
    assert_close(sac.policy_loss_from_logits(z, q1, q2, mask, alpha=0.3), _np_policy_loss(p, np_(q1), np_(q2), m, 0.3),
                 "SAC-POL-4")


@pytest.mark.clause("SAC-V-2")
@given(st.data())
def test_soft_value_from_logits_is_the_legal_set_expectation(sac, data):
    z, mask, q1, q2, alpha = data.draw(logits_cases(working_dtype()))
    got = sac.soft_value_from_logits(z, q1, q2, mask, alpha=alpha)
    assert_close(got, _np_soft_value(_pi(np_(z), np_(mask)), np_(q1), np_(q2), np_(mask), alpha), "SAC-V-2")


@pytest.mark.clause("SAC-V-2")
def test_soft_value_from_logits_ignores_illegal_q(sac):
    require_masks()
    dt = working_dtype()
    z = torch.tensor([[0.0, 0.0, 0.0]], dtype=dt)  # legal π = (½, ½)
    mask = torch.tensor([[True, True, False]])
    q1 = torch.tensor([[1.0, 3.0, 1e6]], dtype=dt)
    q2 = torch.tensor([[2.0, 2.0, -1e6]], dtype=dt)
    # Σ π (min Q − α log π) = ½(1 + α ln 2) + ½(2 + α ln 2) = 1.5 + α ln 2, α = 0.5
    assert_close(sac.soft_value_from_logits(z, q1, q2, mask, alpha=0.5), [1.5 + 0.5 * math.log(2.0)], "SAC-V-2")


@pytest.mark.clause("SAC-POL-4")
@given(st.data())
def test_policy_loss_from_logits_value_and_gradient(sac, data):
    z, mask, q1, q2, alpha = data.draw(logits_cases(working_dtype()))
    z, q1, q2 = (t.clone().requires_grad_(True) for t in (z, q1, q2))
    loss = sac.policy_loss_from_logits(z, q1, q2, mask, alpha=alpha)
    p = _pi(np_(z), np_(mask))
    assert_close(loss, _np_policy_loss(p, np_(q1), np_(q2), np_(mask), alpha), "SAC-POL-4")
    if not differentiable("sac.policy_loss_from_logits"):
        return
    grads = torch.autograd.grad(loss, [z, q1, q2], allow_unused=True)
    expected = _np_policy_lossgrad_of(p, np_(q1), np_(q2), np_(mask), alpha)
    assert_close(grads[0], expected, "SAC-POL-4", approx="gradient", what="dL/dlogits (0 on illegal logits)")
    for g, name in ((grads[1], "q1"), (grads[2], "q2")):
        assert_that(g is None or bool((g == 0).all()), "SAC-POL-4", g, f"no gradient into {name} (Q is a constant)")


# ----------------------------------------------------------------------------- the loss-level op
@pytest.mark.clause("SAC-LOSSES-1")
@given(st.data())
def test_losses_match_the_composed_clauses(sac, data):
    nets, batch, hp = data.draw(loss_batches(working_dtype()))
    out = _call_losses(sac, nets, batch, hp)
    want = _np_losses(nets, batch, hp)
    for key in _checked_outputs(out, want):
        assert_close(out[key], want[key], "SAC-LOSSES-1", what=key)
    if "target_value" in out:  # optional key
        assert_close(out["target_value"], want["y"], "SAC-LOSSES-1", what="target_value")


@pytest.mark.clause("SAC-LOSSES-1")
@given(st.data(), st.floats(0.3, 0.95))
def test_losses_actor_and_alpha_ignore_the_backups_top_p(sac, data, top_p):
    """top_p reaches the TD target only: loss_actor stays SAC-POL-1 over the whole legal set (option A), and
    loss_alpha and the entropy the legal-set ones."""
    nets, batch, hp = data.draw(loss_batches(working_dtype()))
    hp = pin("sac.losses", {**hp, "top_p": top_p})
    out = _call_losses(sac, nets, batch, hp)
    want = _np_losses(nets, batch, hp)
    for key in [k for k in _checked_outputs(out, want) if k != "loss_qvalue"]:
        assert_close(out[key], want[key], "SAC-LOSSES-1", what=f"{key} with top_p = {hp['top_p']}")


@pytest.mark.clause("SAC-LOSSES-1")
def test_losses_stay_finite_with_illegal_actions(sac):
    # a -inf fill with an unmasked Σ π log π is 0·(−inf) = NaN in the actor, alpha and entropy terms
    require_masks()
    dt = working_dtype()
    logits = torch.tensor([[0.5, -0.5, 2.0, 0.0], [1.0, 0.0, 0.0, -1.0]], dtype=dt)
    q = torch.tensor([[1.0, 0.0, 5.0, -1.0], [0.5, 0.5, 0.0, 2.0]], dtype=dt)
    legal = torch.tensor([[True, True, False, True], [True, False, True, True]])
    nets = {"policy": _table(logits), "critic": _twin(q, q + 0.25), "target": _twin(q - 0.5, q)}
    batch = {"obs": torch.tensor([0]), "next_obs": torch.tensor([1]), "action": torch.tensor([1]),
             "reward": torch.tensor([1.0], dtype=dt), "done": torch.tensor([False]),
             "legal_mask": legal[:1], "next_legal_mask": legal[1:]}
    hp = pin("sac.losses", {"log_alpha": torch.tensor(math.log(0.3), dtype=dt, requires_grad=True), "gamma": 0.9,
                            "kappa": 0.9, "delta": 1.0})
    out = _call_losses(sac, nets, batch, hp)
    want = _np_losses(nets, batch, hp)
    for key in _checked_outputs(out, want):
        assert_that(bool(torch.isfinite(torch.as_tensor(out[key])).all()), "SAC-LOSSES-1", out[key],
                    f"a finite {key} with an illegal action in the row")
        assert_close(out[key], want[key], "SAC-LOSSES-1", what=key)


@pytest.mark.clause("SAC-LOSSES-1")
def test_losses_top_p_backup_golden(sac):
    # next state: π = (0.6, 0.3, 0.1), p = 0.8 keeps {0, 1} (mass before action 2 is 0.9 >= 0.8): π_p = (2/3, 1/3)
    dt = working_dtype()
    logits = torch.tensor([[0.0, 0.0, 0.0], [math.log(0.6), math.log(0.3), math.log(0.1)]], dtype=dt)
    q_t = torch.tensor([[0.0, 0.0, 0.0], [3.0, 1.0, 100.0]], dtype=dt)
    nets = {"policy": _table(logits), "critic": _twin(torch.zeros(2, 3, dtype=dt), torch.zeros(2, 3, dtype=dt)),
            "target": _twin(q_t, q_t + 1.0)}
    legal = torch.ones(2, 3, dtype=torch.bool)
    batch = {"obs": torch.tensor([0]), "next_obs": torch.tensor([1]), "action": torch.tensor([0]),
             "reward": torch.tensor([0.5], dtype=dt), "done": torch.tensor([False]),
             "legal_mask": legal[:1], "next_legal_mask": legal[1:]}
    alpha, gamma = 0.2, 0.5
    v = 2 / 3 * (3.0 - alpha * math.log(2 / 3)) + 1 / 3 * (1.0 - alpha * math.log(1 / 3))
    y = 0.5 + gamma * v
    out = sac.losses(nets["policy"], nets["critic"], nets["target"], batch,
                     log_alpha=torch.tensor(math.log(alpha), dtype=dt), gamma=gamma, top_p=0.8)
    expected = 2 * float(_critic_penalty(np.array([0.0 - y]), 1.0)[0][0])  # both critics predict 0
    assert_close(out["loss_qvalue"], expected, "SAC-LOSSES-1", what="critic loss against the Top-p target")


@pytest.mark.clause("SAC-LOSSES-1")
def test_losses_terminal_rows_do_not_bootstrap(sac):
    dt = working_dtype()
    q_t = torch.full((2, 2), 50.0, dtype=dt)  # a bootstrap would add γ·~50
    nets = {"policy": _table(torch.zeros(2, 2, dtype=dt)), "critic": _twin(torch.zeros(2, 2, dtype=dt),
            torch.zeros(2, 2, dtype=dt)), "target": _twin(q_t, q_t)}
    legal = torch.ones(1, 2, dtype=torch.bool)
    batch = {"obs": torch.tensor([0]), "next_obs": torch.tensor([1]), "action": torch.tensor([1]),
             "reward": torch.tensor([0.25], dtype=dt), "done": torch.tensor([True]),
             "legal_mask": legal, "next_legal_mask": legal}
    if terminated_truncated():
        batch["truncated"] = torch.tensor([False])
    out = sac.losses(nets["policy"], nets["critic"], nets["target"], batch,
                     log_alpha=torch.tensor(0.0, dtype=dt), gamma=0.9)
    expected = 2 * float(_critic_penalty(np.array([-0.25]), 1.0)[0][0])
    assert_close(out["loss_qvalue"], expected, "SAC-LOSSES-1", what="critic loss with y = r on a terminal row")


@pytest.mark.clause("SAC-LOSSES-1")
def test_losses_truncated_rows_still_bootstrap(sac):
    if not terminated_truncated():
        not_applicable("a truncated row needs the terminated_truncated capability")
    dt = working_dtype()
    q_t = torch.full((2, 2), 2.0, dtype=dt)
    nets = {"policy": _table(torch.zeros(2, 2, dtype=dt)), "critic": _twin(torch.zeros(2, 2, dtype=dt),
            torch.zeros(2, 2, dtype=dt)), "target": _twin(q_t, q_t)}
    legal = torch.ones(1, 2, dtype=torch.bool)
    batch = {"obs": torch.tensor([0]), "next_obs": torch.tensor([1]), "action": torch.tensor([0]),
             "reward": torch.tensor([0.0], dtype=dt), "done": torch.tensor([False]),
             "truncated": torch.tensor([True]), "legal_mask": legal, "next_legal_mask": legal}
    alpha = 0.5
    y = 0.9 * (2.0 + alpha * math.log(2.0))  # V = Σ ½(2 − α ln ½)
    out = sac.losses(nets["policy"], nets["critic"], nets["target"], batch,
                     log_alpha=torch.tensor(math.log(alpha), dtype=dt), gamma=0.9)
    expected = 2 * float(_critic_penalty(np.array([-y]), 1.0)[0][0])
    assert_close(out["loss_qvalue"], expected, "SAC-LOSSES-1", what="critic loss bootstrapping through a truncation")


# ----------------------------------------------------------------------------- gradients of the loss-level op
def _grad_case(sac, data):
    require_differentiable("sac.losses")
    nets, batch, hp = data.draw(loss_batches(working_dtype()))
    return nets, batch, hp, _call_losses(sac, nets, batch, hp), _np_losses(nets, batch, hp)


@pytest.mark.clause("SAC-LOSSES-2")
@given(st.data())
def test_loss_actor_trains_only_the_policy(sac, data):
    nets, batch, hp, out, want = _grad_case(sac, data)
    b = len(batch["obs"])
    table = nets["policy"].table
    n = lambda m: np_(m.table)[:b]  # noqa: E731
    expected = np.zeros(tuple(table.shape))
    expected[:b] = _np_policy_lossgrad_of(want["p"], n(nets["critic"].q1), n(nets["critic"].q2),
                                        np_(batch["legal_mask"]), math.exp(hp["log_alpha"].item()))
    assert_close(grad_of(out["loss_actor"], table), expected, "SAC-LOSSES-2", approx="gradient",
                 what="d loss_actor / d policy table (next-state rows: 0)")
    # An α left attached is declared (alpha_in_actor_loss): then only the optimiser layout keeps log α still.
    unstepped = {} if convention("alpha_in_actor_loss") == "attached_unstepped" else {"log_alpha": hp["log_alpha"]}
    assert_no_grad_into(out["loss_actor"], "SAC-LOSSES-2", critic_q1=nets["critic"].q1.table,
                         critic_q2=nets["critic"].q2.table, target_q1=nets["target"].q1.table, **unstepped)


@pytest.mark.clause("SAC-LOSSES-2")
@given(st.data())
def test_loss_qvalue_trains_only_the_online_critics(sac, data):
    nets, batch, hp, out, want = _grad_case(sac, data)
    b = len(batch["obs"])
    rows, act = np.arange(b), np_(batch["action"]).astype(int)
    for name, q in (("critic_q1", nets["critic"].q1), ("critic_q2", nets["critic"].q2)):
        expected = np.zeros(tuple(q.table.shape))
        expected[rows, act] = _critic_penalty(np_(q.table)[rows, act] - want["y"], hp["delta"])[1] / b
        assert_close(grad_of(out["loss_qvalue"], q.table), expected, "SAC-LOSSES-2", approx="gradient",
                     what=f"d loss_qvalue / d {name} (taken actions only)")
    assert_no_grad_into(out["loss_qvalue"], "SAC-LOSSES-2", policy=nets["policy"].table,
                         target_q1=nets["target"].q1.table, target_q2=nets["target"].q2.table,
                         log_alpha=hp["log_alpha"])


@pytest.mark.clause("SAC-LOSSES-2")
@given(st.data())
def test_loss_alpha_trains_only_log_alpha(sac, data):
    nets, batch, hp, out, want = _grad_case(sac, data)
    gap = float(np.mean(want["h"] - want["h_tgt"]))
    assert_close(grad_of(out["loss_alpha"], hp["log_alpha"]), temperature_loss_scale(hp["log_alpha"].item()) * gap,
                 "SAC-LOSSES-2", approx="gradient", what="d loss_alpha / d log alpha = mean(H − H_tgt) (× α when "
                 "the loss is written in α)")
    assert_no_grad_into(out["loss_alpha"], "SAC-LOSSES-2", policy=nets["policy"].table,
                         critic_q1=nets["critic"].q1.table)
