"""Differential tests of the SAC update's fused fast paths against the plain formulas beside them.

The plain formulas are the oracle (each is held to independent oracles in the other test_sac_*
files): the fused masked softmax, soft backup, critic head and policy head must give the same
values and the same gradients, and ``update_step(fast=True)`` the same trajectory as
``update_step(fast=False)``. Inputs cover ties, flat and peaked rows, masks with one legal action,
ε-clipped entries, blocks of a single row (row_blocks with tiny blocks), the accelerator plan (one pass,
Top-p by sort), float32 and float64.
"""
from __future__ import annotations

import importlib
from unittest import mock

import pytest
import torch

from conformance_tests import simdevice
from conformance_tests.harness import assert_close, assert_equal
from reference_impl import _checks
from reference_impl.sac import backup, fast, masking, reward
from reference_impl.sac.nets import TwinMLP
from reference_impl.sac.step import init_target, update_step

pytestmark = pytest.mark.meta
losses = importlib.import_module("reference_impl.sac.losses")  # the package re-exports a name `losses`

SEEDS = range(4)
DTYPES = (torch.float32, torch.float64)


def _case(seed: int, dtype, rows: int = 9, width: int = 37):
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.01, 1.0, 8.0, 40.0])[torch.randint(0, 4, (rows, 1), generator=g)]  # flat .. peaked
    logits = (scale * torch.randn(rows, width, generator=g)).round(decimals=1).to(dtype)  # rounding: ties
    mask = torch.rand(rows, width, generator=g) < 0.6
    mask[:, 0] = True
    mask[0] = False
    mask[0, 3] = True  # a row with a single legal action
    q1 = torch.randn(rows, width, generator=g, dtype=dtype)
    q2 = torch.randn(rows, width, generator=g, dtype=dtype)
    actions = torch.multinomial(mask.double(), 1, generator=g).squeeze(1)
    demo = torch.rand(rows, generator=g) < 0.5
    return logits, mask, q1, q2, actions, demo


@pytest.fixture(params=["one block", "row by row", "accelerator plan"])
def blocks(request):
    """Run each fast path with the CPU plan's real block size, then one row per block, then with the plan
    a GPU takes (one pass over the batch, Top-p by sort); the simulated device takes it in the suite too."""
    if request.param == "one block":
        yield
        return
    real = fast.row_blocks
    if request.param == "row by row":
        with mock.patch.object(fast, "row_blocks", lambda like, **kw: real(like, block_bytes=1)):
            yield
    else:  # the accelerator's plan: no row blocks, and the Top-p set by sort
        with mock.patch.object(backup, "blocked", lambda t: False), mock.patch.object(fast, "blocked", lambda t: False):
            yield


@pytest.mark.clause("SAC-MASK-1", "SAC-MASK-2")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_fast_masked_softmax_equals_the_plain_one(seed, dtype):
    logits, mask, *_ = _case(seed, dtype)
    assert_equal(fast.masked_softmax_fast(logits, mask), masking.masked_softmax(logits, mask), "SAC-MASK-1",
                 "fast == plain masked softmax")


@pytest.mark.clause("SAC-TOPP-3", "SAC-TOPP-4")
@pytest.mark.parametrize("p", [0.3, 0.98, 1.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_fused_backup_equals_the_plain_chain(blocks, seed, dtype, p):
    logits, mask, q1, q2, *_ = _case(seed, dtype)
    alpha = torch.tensor(0.3, dtype=dtype)
    pi = masking.masked_softmax(logits, mask)
    want_v = backup.top_p_soft_value(pi, q1, q2, mask, alpha=alpha, p=p, method="sorted")
    want_cov = (pi * backup.top_p_select(pi, mask, p=p, method="sorted")).sum(-1)
    v, cov = fast.top_p_backup_fused(logits, q1, q2, mask, alpha=alpha, p=p, eps=masking.PROB_EPS)
    assert_close(v, want_v, "SAC-TOPP-3", what="fused soft backup == plain chain")
    assert_close(cov, want_cov, "SAC-TOPP-4", what="fused coverage == plain coverage")


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(loss, x)[0]


@pytest.mark.clause("SAC-CRITIC-2", "SAC-CQL-1")
@pytest.mark.parametrize("use_cql", [True, False])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_fused_critic_head_equals_the_plain_total(blocks, seed, dtype, masked, use_cql):
    _, mask, q1, q2, actions, _ = _case(seed, dtype)
    mask = mask if masked else None
    y = torch.randn(q1.shape[0], dtype=dtype, generator=torch.Generator().manual_seed(seed)) * 3
    a, b = q1.clone().requires_grad_(), q2.clone().requires_grad_()
    kw = dict(legal_mask=mask, delta=1.0, lam_cql=0.5, use_cql=use_cql)
    want = losses.critic_loss_total(a, b, actions, y, **kw)
    want_ga, want_gb = torch.autograd.grad(want, (a, b))
    fa, fb = q1.clone().requires_grad_(), q2.clone().requires_grad_()
    (la, ha, ca), (lb, hb, cb) = (fast.critic_head_fused(x, actions, y, **kw) for x in (fa, fb))
    assert_close(la + lb, want, "SAC-CRITIC-2", what="fused total == plain total")
    assert_close(ha + hb, losses.critic_loss(a.gather(-1, actions[:, None]).squeeze(-1),
                                             b.gather(-1, actions[:, None]).squeeze(-1), y), "SAC-CRITIC-2",
                 what="Huber share")
    assert_close(_grad(la, fa), want_ga, "SAC-CRITIC-2", what="gradient into Q1")
    assert_close(_grad(lb, fb), want_gb, "SAC-CRITIC-2", what="gradient into Q2")
    # both critics at once (on an accelerator: stacked, one pass) give the same total, shares and gradients
    ta, tb = q1.clone().requires_grad_(), q2.clone().requires_grad_()
    lt, ht, ct, q_min = fast.critic_heads_fused(ta, tb, actions, y, **kw)
    assert_close(lt, want, "SAC-CRITIC-2", what="twin total == plain total")
    assert_close(ht, ha + hb, "SAC-CRITIC-2", what="twin Huber share")
    assert_close(ct, ca + cb, "SAC-CQL-1", what="twin CQL share")
    assert_close(q_min, torch.minimum(q1, q2).gather(-1, actions[:, None]).squeeze(-1), "SAC-V-1",
                 what="twin minimum at the taken actions")
    gta, gtb = torch.autograd.grad(lt, (ta, tb))
    assert_close(gta, want_ga, "SAC-CRITIC-2", what="twin gradient into Q1")
    assert_close(gtb, want_gb, "SAC-CRITIC-2", what="twin gradient into Q2")


@pytest.mark.clause("SAC-POL-3", "SAC-BC-1", "SAC-ENT-2")
@pytest.mark.parametrize("demos", ["drawn", "one", "none"])  # BC's mean over demo rows at its edges
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_fused_policy_head_equals_the_plain_total(blocks, seed, dtype, demos):
    logits, mask, q1, q2, actions, demo = _case(seed, dtype)
    if demos != "drawn":
        demo = torch.zeros_like(demo)
        demo[1] = demos == "one"
    alpha = torch.tensor(0.7, dtype=dtype)
    z = logits.clone().requires_grad_()
    pi = masking.masked_softmax(z, mask)
    want = losses.policy_loss_total(pi, q1, q2, mask, actions, demo, alpha=alpha, lam_bc=0.3)
    want_g = _grad(want, z)
    zf = logits.clone().requires_grad_()
    got, pol, bc, ent = fast.policy_head_fused(zf, q1, q2, mask, actions, demo, alpha=alpha, lam_bc=0.3)
    assert_close(got, want, "SAC-POL-3", what="fused total == plain total")
    assert_close(bc, losses.bc_loss(torch.log(pi.detach()), actions, demo, lam=0.3), "SAC-BC-1", what="BC share")
    assert_close(ent, masking.entropy(pi.detach(), mask), "SAC-ENT-2", what="entropy rows")
    assert_close(_grad(got, zf), want_g, "SAC-POL-3", what="gradient into the logits")


@pytest.mark.clause("SAC-MASK-2", "SAC-POL-3")
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_policy_head_passes_the_gradient_where_the_softmax_is_exactly_eps(blocks, dtype):
    """ε set to a softmax value a row really takes: the plain clamp's derivative at its own edge is 1, so the
    gradient passes there, and the fused head's pass-through must include the edge too."""
    logits, mask, q1, q2, actions, demo = _case(1, dtype)
    s = masking.masked_softmax(logits, mask, eps=0.0)
    top = s.amax(1).masked_fill(mask.sum(1) < 3, 2.0)
    eps = float(top.min())  # the flattest row's largest probability: its other entries sit below ε
    alpha = torch.tensor(0.7, dtype=dtype)
    z = logits.clone().requires_grad_()
    want = losses.policy_loss_total(masking.masked_softmax(z, mask, eps=eps), q1, q2, mask, actions, demo,
                                    alpha=alpha, lam_bc=0.3)
    zf = logits.clone().requires_grad_()
    got = fast.policy_head_fused(zf, q1, q2, mask, actions, demo, alpha=alpha, lam_bc=0.3, eps=eps)[0]
    assert_close(got, want, "SAC-POL-3", what=f"fused total == plain total at eps = {eps}")
    assert_close(_grad(got, zf), _grad(want, z), "SAC-POL-3", what=f"gradient into the logits at eps = {eps}")


class _Twin(torch.nn.Module):
    def __init__(self, d: int, a: int):
        super().__init__()
        self.q1, self.q2 = torch.nn.Linear(d, a), torch.nn.Linear(d, a)

    def forward(self, obs):
        return self.q1(obs), self.q2(obs)


MIXED = [(torch.float32, torch.float64), (torch.float64, torch.float32)]  # (network output, the other input)


@pytest.mark.clause("SAC-CRITIC-2", "SAC-POL-3", "SAC-TOPP-3")
@pytest.mark.parametrize("dtypes", MIXED, ids=["f32-net f64-rest", "f64-net f32-rest"])
@pytest.mark.parametrize("seed", SEEDS[:2])
def test_fused_heads_promote_mixed_dtypes_as_the_plain_formulas_do(blocks, seed, dtypes):
    """A float64 reward (a numpy replay) against float32 critics, or critics and policy of different
    dtypes: the plain formulas promote; each fused head gives their values, in their dtype, and a
    gradient in its input's dtype. Compared at the narrower dtype's tolerance."""
    net, rest = dtypes
    narrow = torch.float32
    logits, mask, q1, q2, actions, demo = _case(seed, net)
    y = (torch.randn(q1.shape[0], generator=torch.Generator().manual_seed(seed)) * 3).to(rest)
    a, b = q1.clone().requires_grad_(), q2.clone().requires_grad_()
    want = losses.critic_loss_total(a, b, actions, y, legal_mask=mask)
    want_ga = torch.autograd.grad(want, a)[0]
    for fused in (lambda x, z: fast.critic_heads_fused(x, z, actions, y, legal_mask=mask)[0],
                  lambda x, z: sum(fast.critic_head_fused(q, actions, y, legal_mask=mask)[0] for q in (x, z))):
        fa, fb = q1.clone().requires_grad_(), q2.clone().requires_grad_()
        got = fused(fa, fb)
        assert got.dtype == want.dtype
        assert_close(got, want, "SAC-CRITIC-2", dtype=narrow, what="fused critic total, mixed dtypes")
        ga = _grad(got, fa)
        assert ga.dtype == net
        assert_close(ga, want_ga, "SAC-CRITIC-2", dtype=narrow, what="gradient into Q1, mixed dtypes")
    q1r, q2r, alpha = q1.to(rest), q2.to(rest), torch.tensor(0.7, dtype=rest)
    z = logits.clone().requires_grad_()
    pi = masking.masked_softmax(z, mask)
    want = losses.policy_loss_total(pi, q1r, q2r, mask, actions, demo, alpha=alpha, lam_bc=0.3)
    zf = logits.clone().requires_grad_()
    got = fast.policy_head_fused(zf, q1r, q2r, mask, actions, demo, alpha=alpha, lam_bc=0.3)[0]
    assert got.dtype == want.dtype
    assert_close(got, want, "SAC-POL-3", dtype=narrow, what="fused policy total, mixed dtypes")
    gz = _grad(got, zf)
    assert gz.dtype == net
    assert_close(gz, _grad(want, z), "SAC-POL-3", dtype=narrow, what="gradient into the logits, mixed dtypes")
    pi = masking.masked_softmax(logits, mask)
    want_v = backup.top_p_soft_value(pi, q1r, q2r, mask, alpha=alpha, p=0.9)
    got_v, _ = fast.top_p_backup_fused(logits, q1r, q2r, mask, alpha=alpha, p=0.9, eps=masking.PROB_EPS)
    assert got_v.dtype == want_v.dtype
    assert_close(got_v, want_v, "SAC-TOPP-3", dtype=narrow, what="fused backup, mixed dtypes")


def _nets(seed: int, d: int, a: int):
    torch.manual_seed(seed)
    policy, critic = torch.nn.Linear(d, a), _Twin(d, a)
    log_alpha = torch.tensor(-0.5, requires_grad=True)
    opts = {"q": torch.optim.Adam(critic.parameters(), lr=0.05), "pi": torch.optim.Adam(policy.parameters(), lr=0.05),
            "alpha": torch.optim.Adam([log_alpha], lr=0.05)}
    return policy, critic, init_target(critic), log_alpha, opts


@pytest.mark.clause("SAC-STEP-1")
@pytest.mark.parametrize("reward", DTYPES, ids=["f32-reward", "f64-reward"])  # float32 nets; a numpy replay: float64
@pytest.mark.parametrize("guards", [True, False])
@pytest.mark.parametrize("seed", SEEDS)
def test_fast_update_step_follows_the_plain_one(blocks, seed, guards, reward):
    d, a, n = 5, 23, 16
    fast, plain = _nets(seed, d, a), _nets(seed, d, a)
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(3):
        _, mask, *_r = _case(int(torch.randint(0, 1 << 30, (), generator=g)), torch.float32, rows=n, width=a)
        _, nmask, *_r2 = _case(int(torch.randint(0, 1 << 30, (), generator=g)), torch.float32, rows=n, width=a)
        b = {"obs": torch.randn(n, d, generator=g), "next_obs": torch.randn(n, d, generator=g),
             "action": torch.multinomial(mask.double(), 1, generator=g).squeeze(1),
             "reward": torch.randn(n, generator=g, dtype=reward), "done": torch.rand(n, generator=g) < 0.2,
             "is_demo": torch.rand(n, generator=g) < 0.5, "legal_mask": mask, "next_legal_mask": nmask}
        with _checks.validation(guards):
            got = update_step(*fast, b, top_p=0.9, kpi_rows=7)
            want = update_step(*plain, b, top_p=0.9, kpi_rows=7, fast=False)
        for k in want:
            assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=f"diagnostic {k}")
    for net_f, net_p in zip(fast[:3], plain[:3]):
        for pf, pp in zip(net_f.parameters(), net_p.parameters()):
            assert_close(pf.detach(), pp.detach(), "SAC-STEP-1", what="parameters after 3 updates")
    assert_close(fast[3].detach(), plain[3].detach(), "SAC-STEP-1", what="log alpha after 3 updates")


def test_each_device_takes_its_plan():
    """The CPU works in cache-sized row blocks; a GPU (here the simulated one) in one pass over the batch."""

    x = torch.zeros(4000, 600)
    assert backup.blocked(x) and len(fast.row_blocks(x)) > 1
    with simdevice.simulate():
        d = x.to(simdevice.DEVICE)
        assert not backup.blocked(d) and fast.row_blocks(d) == [slice(0, 4000)]


@pytest.mark.clause("SAC-COV-1", "SAC-BIGRAM-1")
@pytest.mark.parametrize("seed", SEEDS)
def test_batched_text_rewards_equal_the_string_forms(seed):
    """The environment's batched reward terms on ids against the string forms (the formulas' oracles):
    texts shorter than the window, repeats and a small alphabet (many shared n-grams)."""

    g = torch.Generator().manual_seed(seed)
    alphabet, W, n = "abcde", 12, 3
    rows = [(int(torch.randint(0, W + 4, (), generator=g)), int(torch.randint(0, W + 4, (), generator=g)))
            for _ in range(16)]
    texts = [("".join(alphabet[i] for i in torch.randint(0, 5, (la,), generator=g).tolist()),
              "".join(alphabet[i] for i in torch.randint(0, 5, (lr,), generator=g).tolist())) for la, lr in rows]

    def ids(text):  # the last W characters, right-aligned after empty slots
        tail = [alphabet.index(c) for c in text[-W:]]
        return [reward.NO_CHAR] * (W - len(tail)) + tail

    got = reward.ngram_coverage_windows(torch.tensor([ids(a) for a, _ in texts]), torch.tensor([ids(r) for _, r in texts]),
                                        n=n)
    want = [reward.ngram_coverage(a, r, n=n, window=W) for a, r in texts]
    assert_close(got, torch.tensor(want, dtype=got.dtype), "SAC-COV-1", dtype=got.dtype,
                 what="batched coverage (in the default dtype, as the environment's rewards)")
    lexicon = {"ab", "ba", "cc", "ea"}
    pairs = torch.tensor(sorted(alphabet.index(w[0]) * 5 + alphabet.index(w[1]) for w in lexicon))
    prev, char = torch.randint(0, 5, (40,), generator=g), torch.randint(0, 5, (40,), generator=g)
    got = reward.bigram_bonus_ids(prev, char, pairs, 5, lam=0.7)
    want = [reward.bigram_bonus(alphabet[p], alphabet[c], lexicon, lam=0.7) for p, c in zip(prev.tolist(), char.tolist())]
    assert_close(got, torch.tensor(want, dtype=got.dtype), "SAC-BIGRAM-1", dtype=got.dtype, what="batched bigram bonus")


@pytest.mark.clause("SAC-COV-1", "SAC-BIGRAM-1")
def test_batched_text_rewards_at_their_edges():
    """The batched forms' defaults are the string forms' (n = 3, λ = 1); n = 1 and n = W are valid, n = 0 or
    n > W refused; fewer rows than n is fine (rows are not characters); an empty or one-pair lexicon."""
    agent, ref = torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]), torch.tensor([[1, 2, 0, 1], [2, 1, 0, 2]])
    text = lambda row: "".join("abc"[i] for i in row.tolist())  # noqa: E731
    for kw in ({}, {"n": 1}, {"n": 4}):
        got = reward.ngram_coverage_windows(agent, ref, **kw)
        want = [reward.ngram_coverage(text(a), text(r), window=4, **kw) for a, r in zip(agent, ref)]
        assert_close(got, torch.tensor(want, dtype=got.dtype), "SAC-COV-1", dtype=got.dtype, what=f"coverage, {kw}")
    for n in (0, 5):
        with pytest.raises(ValueError, match=r"^\[SAC-COV-1\]"):
            reward.ngram_coverage_windows(agent, ref, n=n)
    prev, char = torch.tensor([0, 1, 2]), torch.tensor([1, 0, 2])
    assert_close(reward.bigram_bonus_ids(prev, char, torch.tensor([0 * 3 + 1]), 3),
                 torch.tensor([reward.bigram_bonus("a", "b", {"ab"}), 0.0, 0.0]), "SAC-BIGRAM-1",
                 what="one-pair lexicon, default λ")
    assert_close(reward.bigram_bonus_ids(prev, char, torch.tensor([], dtype=torch.long), 3), torch.zeros(3),
                 "SAC-BIGRAM-1", what="empty lexicon")


def test_the_stacked_twin_mlp_is_two_independent_mlps():
    """reference_impl.sac.nets.TwinMLP: each copy computes its own MLP (values and gradients), and the two
    copies start from independent initialisations (twin critics that start equal are one critic)."""

    torch.manual_seed(0)
    twin = TwinMLP(5, 7, 3).double()
    assert not torch.equal(twin.weight[0][0], twin.weight[0][1])
    x = torch.randn(4, 5, dtype=torch.float64)
    q1, q2 = twin(x)
    for k, q in enumerate((q1, q2)):
        h = torch.relu(x @ twin.weight[0][k].T + twin.bias[0][k])
        assert_close(q, h @ twin.weight[1][k].T + twin.bias[1][k], "SAC-V-1", what=f"copy {k}")
    (q1.sum() + 2 * q2.sum()).backward()
    ones = torch.ones(4, 3, dtype=torch.float64)
    h2 = torch.relu(x @ twin.weight[0][1].T + twin.bias[0][1])
    assert_close(twin.weight[1].grad[1], 2 * ones.T @ h2, "SAC-V-1", what="gradient of copy 2's last layer")
