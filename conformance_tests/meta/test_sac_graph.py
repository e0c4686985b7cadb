"""The SAC update as a graph: what CUDA-graph capture needs, checked on the CPU.

A captured update (``reference_impl.sac.graphed``) records every op of the update once and replays
them. That only works if the phases have no host read, no Python branch on a tensor's value and no
shape that depends on data. TorchDynamo with ``fullgraph=True`` refuses exactly those (a graph break is
an error), so tracing each phase's objective on the accelerator plan is the CPU's proof that the GPU
can capture it. Where capture does not apply, the captured update must be the eager one, value for
value; on a real GPU the replayed graph must follow the eager update (run by tools/gpu_checks.sh).
"""
from __future__ import annotations

import functools
from unittest import mock

import pytest
import torch

from conformance_tests import simdevice
from conformance_tests.harness import assert_close
from conformance_tests.meta.test_sac_fastpaths import _case, _nets
from reference_impl import _checks
from reference_impl.sac import backup, fast, step
from reference_impl.sac.graphed import CapturedUpdate
from reference_impl.sac.step import (
    critic_objective,
    policy_objective,
    step_hp,
    temperature_objective,
    update_step,
)

pytestmark = pytest.mark.meta
D, A, N = 5, 23, 16


def _batch(seed: int, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    _, mask, *_ = _case(seed, torch.float32, rows=N, width=A)
    _, nmask, *_ = _case(seed + 1, torch.float32, rows=N, width=A)
    b = {"obs": torch.randn(N, D, generator=g), "next_obs": torch.randn(N, D, generator=g),
         "action": torch.multinomial(mask.double(), 1, generator=g).squeeze(1),
         "reward": torch.randn(N, generator=g), "done": torch.rand(N, generator=g) < 0.2,
         "is_demo": torch.rand(N, generator=g) < 0.5, "legal_mask": mask, "next_legal_mask": nmask}
    return {k: v.to(device) for k, v in b.items()}


def _state(nets) -> dict:
    policy, critic, target, log_alpha, _ = nets
    return {"policy": policy, "critic": critic, "target": target, "log_alpha": log_alpha}


def _losses(out) -> list[torch.Tensor]:
    """The tensors an objective returns, flattened (loss, diagnostics, the pre-step entropy)."""
    flat = []
    for x in out:
        flat.extend(x.values() if isinstance(x, dict) else [x])
    return flat


@pytest.mark.clause("SAC-STEP-1")
@pytest.mark.parametrize("objective", [critic_objective, policy_objective, temperature_objective])
@pytest.mark.parametrize("fast", [True, False], ids=["fused", "plain"])
def test_each_phase_traces_as_one_graph_on_the_accelerator_plan(objective, fast):
    """fullgraph=True: no graph break (no host read, no value-dependent branch or shape) on the plan a
    GPU takes, and the traced objective gives the eager one's values. On the host, the simulated device
    suspended: the trace is of the reference's code, and TorchDynamo would trace the simulation too."""
    s, b = _state(_nets(0, D, A)), _batch(3)
    hp = step_hp(top_p=0.9, kpi_rows=7, fast=fast)
    torch._dynamo.reset()
    with simdevice.suspended(), mock.patch.object(backup, "blocked", lambda t: False), _checks.validation(False):
        traced = torch.compile(functools.partial(objective, s), fullgraph=True, backend="eager")(b, hp)
        eager = objective(s, b, hp)
    for got, want in zip(_losses(traced), _losses(eager), strict=True):
        assert_close(got.detach(), want.detach(), "SAC-STEP-1", what=f"{objective.__name__} traced")


@pytest.mark.clause("SAC-STEP-1")
def test_where_capture_does_not_apply_the_update_is_the_eager_one():
    """On the CPU (no CUDA graph), CapturedUpdate runs update_step: the same diagnostics and parameters."""
    bound, plain = _nets(1, D, A), _nets(1, D, A)
    upd = CapturedUpdate(*bound, top_p=0.9, kpi_rows=7)
    for i in range(4):
        got, want = upd(_batch(10 + i)), update_step(*plain, _batch(10 + i), top_p=0.9, kpi_rows=7)
        assert got.keys() == want.keys()
        for k in want:
            assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=f"diagnostic {k}")
    assert not upd.captured
    for a, b in zip(bound[1].parameters(), plain[1].parameters()):
        assert_close(a.detach(), b.detach(), "SAC-STEP-1", what="critic parameters after 4 updates")


@pytest.mark.clause("SAC-STEP-1")
@pytest.mark.parametrize("plan", ["accelerator", "cpu"])
def test_the_compiled_update_follows_the_plain_formulas(plan):
    """``compile=True`` (Inductor, the CPU's code generator here): three updates give the plain formulas'
    diagnostics and parameters (the oracle is ``fast=False``, eager), and the fused heads really ran compiled
    (the critic's backup and loss heads, the policy head: three graphs at least)."""
    compiled, plain = _nets(4, D, A), _nets(4, D, A)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    blocked = (lambda t: False) if plan == "accelerator" else backup.blocked
    with simdevice.suspended(), mock.patch.object(backup, "blocked", blocked), _checks.validation(False):
        for i in range(3):
            got = update_step(*compiled, _batch(30 + i), top_p=0.9, kpi_rows=7, compile=True)
            want = update_step(*plain, _batch(30 + i), top_p=0.9, kpi_rows=7, fast=False)
            for k in want:
                assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=f"update {i}: {k}")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs >= 3
    for net_c, net_p in zip(compiled[:3], plain[:3]):
        for a, b in zip(net_c.parameters(), net_p.parameters()):
            assert_close(a.detach(), b.detach(), "SAC-STEP-1", what="parameters after 3 updates")


def test_compile_applies_to_the_fused_heads_of_an_unguarded_step():
    """A validated call reads values on the host: it takes the head as it is; so does ``compile=False``.
    Otherwise the head's compiled twin, made once."""
    on = step_hp(compile=True)
    with _checks.validation(True):
        assert step._head(fast.critic_heads_fused, on) is fast.critic_heads_fused
    with _checks.validation(False):
        assert step._head(fast.critic_heads_fused, step_hp()) is fast.critic_heads_fused
        twin = step._head(fast.critic_heads_fused, on)
        assert twin is not fast.critic_heads_fused and step._head(fast.critic_heads_fused, on) is twin


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tools/gpu_checks.sh runs it)")
@pytest.mark.clause("SAC-STEP-1")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager-objectives", "compiled-objectives"])
def test_the_replayed_graph_follows_the_eager_update_on_cuda(compiled):
    dev = torch.device("cuda")
    nets = [_nets(2, D, A) for _ in range(2)]
    moved = []
    for policy, critic, target, log_alpha, _ in nets:
        policy, critic, target = policy.to(dev), critic.to(dev), target.to(dev)
        log_alpha = log_alpha.detach().to(dev).requires_grad_(True)
        opts = {"q": torch.optim.Adam(critic.parameters(), lr=0.05), "pi": torch.optim.Adam(policy.parameters(), lr=0.05),
                "alpha": torch.optim.Adam([log_alpha], lr=0.05)}
        moved.append((policy, critic, target, log_alpha, opts))
    upd = CapturedUpdate(*moved[0], top_p=0.9, kpi_rows=7, compile=compiled)
    with _checks.validation(False):
        for i in range(6):
            got, want = upd(_batch(20 + i, dev)), update_step(*moved[1], _batch(20 + i, dev), top_p=0.9, kpi_rows=7)
            for k in want:
                assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=f"update {i}: {k}")
    assert upd.captured
    for net_g, net_e in zip(moved[0][:3], moved[1][:3]):
        for a, b in zip(net_g.parameters(), net_e.parameters()):
            assert_close(a.detach(), b.detach(), "SAC-STEP-1", what="parameters after 6 updates")
