"""Meta-tests of the audited device: the simulated CUDA device (``--device sim``) refuses each device
mistake a GPU run would hit (numpy on a result, a host generator, network, optimiser state or tensor), GPU-only
code can be audited, and bad ``--device`` values exit 3.

Each failure class is put back in the form a test would write it and must fail under the simulation, while
the harness's way of writing the same thing passes there: the simulation is CI's gate, so a class it let
through would reach a GPU unseen.
"""
from __future__ import annotations

import functools
import math
import types

import numpy as np
import pytest
import torch
from rlconform import cli
from rlconform.audit import clause_report, run_suite

import reference_impl
from conformance_tests import contract, harness, simdevice
from conformance_tests.harness import (
    assert_close,
    assert_equal,
    generator,
    host,
    named_leaves,
    on_device,
)

pytestmark = pytest.mark.meta
F64 = torch.float64


@pytest.fixture
def sim():
    """This test on the simulated device: the harness builds inputs there, the mode watches every call."""
    prev = harness.configure(harness.session_impl(), simdevice.NAME)
    try:
        with simdevice.simulate():
            harness.begin_test(clauses=("META",))
            yield
    finally:
        harness.end_test()
        harness.configure(*prev)


def _device_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the implementation error wrapping it) is a device mistake the simulation caught."""
    seen = exc
    while seen is not None:
        if isinstance(seen, simdevice.SimulatedDeviceError) or "cuda:0 device type tensor to numpy" in str(seen):
            return True
        seen = seen.__cause__
    return False


def _refused(fn):
    with pytest.raises(Exception) as info:  # noqa: PT011 - which kind is checked below
        fn()
    assert _device_error(info.value), f"not a device error: {type(info.value).__name__}: {info.value}"


# ----------------------------------------------------------------------------- the failure classes
def test_numpy_on_a_result_is_refused_and_host_is_the_way(sim, ppo):
    r = ppo.ratio(torch.zeros(3, dtype=F64), torch.log(torch.full((3,), 2.0, dtype=F64)))
    assert r.device == simdevice.DEVICE
    _refused(lambda: r.numpy())
    _refused(lambda: np.asarray(r))
    _refused(lambda: r.tolist())
    _refused(lambda: r.sum().item())
    assert harness.to_numpy(r).tolist() == [0.5] * 3
    assert host(r).tolist() == [0.5] * 3


def test_item_and_tolist_are_legal_inside_the_implementation(sim):
    t = torch.arange(3.0, device=simdevice.DEVICE)
    with simdevice.implementation_call():
        assert t.tolist() == [0.0, 1.0, 2.0] and t.sum().item() == 3.0


def test_a_host_generator_handed_to_an_op_is_refused(sim, ppo):
    z, mask = torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=torch.bool)
    _refused(lambda: ppo.sample_actions(z, mask, generator=torch.Generator().manual_seed(0)))
    action, _ = ppo.sample_actions(z, mask, generator=generator(0))
    assert action.device == simdevice.DEVICE
    _refused(lambda: torch.rand(3, generator=generator(0)))  # a device generator making host tensors


class _Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.z = torch.nn.Parameter(torch.zeros(2, dtype=F64))

    def forward(self, obs, legal):
        return torch.log_softmax(self.z.expand(*legal.shape).masked_fill(~legal, -math.inf), -1)


def _ccapo_batch():
    return {"obs": torch.zeros(1, 1, 1, dtype=F64), "legal": torch.ones(1, 1, 2, dtype=torch.bool),
            "action": torch.tensor([[0]]), "logp_old": torch.tensor([[math.log(0.5)]], dtype=F64),
            "advantage": torch.tensor([[2.0]], dtype=F64), "mask": torch.tensor([[True]])}


def test_a_network_built_on_the_host_is_refused(sim, ccapo):
    def update(policy, ref):
        return ccapo.ccapo_update(policy, ref, torch.optim.SGD(policy.parameters(), lr=0.5), _ccapo_batch(),
                                  epochs=1, minibatch_size=1, max_grad_norm=10.0)

    _refused(lambda: update(_Table(), _Table().requires_grad_(False)))
    policy = on_device(_Table())
    update(policy, on_device(_Table().requires_grad_(False)))
    assert_close(policy.z.detach(), [0.5, -0.5], "CCAPO-UPDATE-1")


def test_optimiser_state_left_on_the_host_is_refused(sim):
    net = torch.nn.Linear(3, 2).double()
    opt = torch.optim.Adam(net.parameters(), lr=0.1, foreach=True)
    net(torch.ones(1, 3, dtype=F64)).sum().backward()
    opt.step()  # moments made on the host
    on_device(net)
    net(on_device(torch.ones(1, 3, dtype=F64))).sum().backward()
    _refused(opt.step)
    fresh = torch.optim.Adam(net.parameters(), lr=0.1, foreach=True)  # built after the move: state on the device
    fresh.step()
    assert fresh.state[net.weight]["exp_avg"].device == simdevice.DEVICE


def test_a_host_tensor_meeting_a_result_is_refused(sim, ppo):
    r = ppo.ratio(torch.zeros(2, dtype=F64), torch.zeros(2, dtype=F64))
    expected = torch.ones(2, dtype=F64)
    _refused(lambda: r == expected)
    _refused(lambda: torch.stack([r, expected]))
    assert bool((host(r) == expected).all())
    assert bool((r == 1.0).all()) and bool((r * torch.tensor(1.0)).eq(1.0).all())  # scalars may cross, as on CUDA


def test_bit_equality_on_a_reduction_fails_as_on_a_gpu_and_the_tolerance_holds(sim, ppo):
    # the first GPU run: CUDA's mean multiplies by 1/n, the CPU divides by n (0.8333333333333333 vs ...334)
    r = torch.tensor([1.0] + [0.5] * 5, dtype=F64)
    got = ppo.clip_fraction(r, clip_eps=0.01)
    with pytest.raises(pytest.fail.Exception, match="0.8333333333333333, but should be 0.8333333333333334"):
        assert_equal(got, 5 / 6, "PPO-CLIPFRAC-1")
    assert_close(got, 5 / 6, "PPO-CLIPFRAC-1")


def test_an_invalid_cuda_ordinal_is_refused(sim):
    _refused(lambda: torch.zeros(1, device="cuda:1"))


# ----------------------------------------------------------------------------- GPU-only code
class HostInput(ValueError):
    pass


def _tensors(x, where: str):
    """(where, tensor) for every tensor ``x`` holds: nested containers, modules' parameters and buffers,
    optimisers' parameters and state."""
    for where, leaf in named_leaves(x, where):
        if isinstance(leaf, torch.Tensor):
            yield where, leaf
        elif isinstance(leaf, torch.nn.Module):
            for name, t in [*leaf.named_parameters(), *leaf.named_buffers()]:
                yield f"{where}.{name}", t
        elif isinstance(leaf, torch.optim.Optimizer):
            for i, group in enumerate(leaf.param_groups):
                for j, p in enumerate(group["params"]):
                    yield f"{where}.param_groups[{i}][{j}]", p
                    for key, s in leaf.state.get(p, {}).items():
                        if isinstance(s, torch.Tensor) and s.dim() > 0:  # a 0-dim step counter may live on the host
                            yield f"{where}.state[{j}][{key!r}]", s


def _device_only(name: str, op):
    """``op`` behind a GPU trainer's front door: any host tensor, network, optimiser or generator is refused."""
    @functools.wraps(op)
    def call(*args, **kwargs):
        for where, x in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
            if isinstance(x, torch.Generator) and x.device.type != "cuda":
                raise HostInput(f"{name}: generator {where} is on {x.device}; this implementation runs on CUDA only")
            for path, t in _tensors(x, where):
                if t.device.type != "cuda":
                    raise HostInput(f"{name}: {path} is on {t.device}; this implementation runs on CUDA only")
        return op(*args, **kwargs)

    return call


def gpu_only():
    """The reference as a GPU-only implementation: every operation refuses host inputs and state."""
    base = reference_impl.make()
    fams = {fam: types.SimpleNamespace(**{op: _device_only(f"{fam}.{op}", fn) for op, fn in vars(getattr(base, fam)).items()})
            for fam in contract.FAMILIES if hasattr(base, fam)}
    return types.SimpleNamespace(name="gpu-only-reference", version=base.version, capabilities=base.capabilities, **fams)


@pytest.mark.long
@pytest.mark.parametrize("family", contract.FAMILIES)  # one audit each: xdist spreads them over its workers
def test_gpu_only_code_is_audited_on_the_simulated_device(family):
    """Every input the suite hands a GPU-only implementation is on the device, so it gets the reference's
    verdict: every clause passes (none errors on a host input the suite built by mistake). Where inputs are
    built is a matter of structure, not of values: the smoke profile."""
    report = clause_report(run_suite("conformance_tests.meta.test_device:gpu_only", device=simdevice.NAME,
                                     profile="smoke", families=[family]))
    assert report["clauses"] and {c["family"] for c in report["clauses"]} == {family}
    bad = {c["id"]: c.get("message", "") for c in report["clauses"] if c["status"] not in ("pass", "not_applicable")}
    assert not bad, bad
    assert report["summary"]["must_failed"] == []


def test_gpu_only_code_refuses_the_host():
    impl = gpu_only()
    with pytest.raises(HostInput, match="on cpu; this implementation runs on CUDA only"):
        impl.ppo.ratio(torch.zeros(2), torch.zeros(2))


# ----------------------------------------------------------------------------- bad --device values
@pytest.mark.parametrize("device, message", [
    ("cuda", "sees no CUDA device"),  # a machine without CUDA (skipped on one with it)
    ("cuda:7", "CUDA device"),  # more GPUs than the machine has: none, or fewer than 8
    ("quantum", "is not a torch device"),
    ("cuda:x", "is not a torch device"),
])
def test_a_device_that_is_not_there_exits_3_before_any_test(tmp_path, device, message):
    import contextlib
    import io

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the case is a machine without it")
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main(["audit", "--device", device, "--family", "ppo", "--out", str(tmp_path)])
    assert code == 3 and message in err.getvalue(), (code, err.getvalue())
    assert not (tmp_path / "report.json").exists()


def test_diagnostics_that_mix_python_numbers_with_device_tensors_join_on_the_device(sim):
    """A minibatch step may report a Python number beside its 0-d device tensors: the diagnostics are stacked
    on the tensors' device (one transfer), as a GPU needs; a host tensor inside a stack is refused there."""
    from reference_impl.ppo.update import as_floats

    with simdevice.implementation_call():
        out = as_floats({"loss": torch.tensor(0.5, device=simdevice.DEVICE), "kl": 0.25})
    assert out == {"loss": 0.5, "kl": 0.25}


def test_the_ppo_update_shuffles_on_its_generators_device(sim):
    """A generator on the device draws the minibatch order there (a device generator handed to an op that
    makes host tensors is refused, as on CUDA), and the update runs through on the device."""
    from reference_impl.ppo.update import ppo_update

    torch.manual_seed(0)
    actor, critic = torch.nn.Linear(5, 4).to(simdevice.DEVICE), torch.nn.Linear(5, 1).to(simdevice.DEVICE)
    opt = torch.optim.SGD([*actor.parameters(), *critic.parameters()], lr=0.1)
    mask = torch.ones(6, 4, dtype=torch.bool)
    batch = {k: v.to(simdevice.DEVICE) for k, v in {
        "obs": torch.randn(6, 5), "action": torch.zeros(6, dtype=torch.long), "old_log_prob": torch.full((6,), -1.4),
        "mask": mask, "advantage": torch.randn(6), "return": torch.randn(6)}.items()}
    gen = torch.Generator(device=simdevice.DEVICE).manual_seed(1)
    with simdevice.implementation_call():
        recs = ppo_update(actor, critic, opt, batch, epochs=2, minibatch_size=4, clip_eps=0.2, vf_coef=0.5,
                          ent_coef=0.0, max_grad_norm=0.5, target_kl=None, generator=gen)
    assert len(recs) == 4 and actor.weight.device == simdevice.DEVICE


class _LogPolicy(torch.nn.Module):
    """policy(obs, legal) -> [b, T, A] log-probabilities over the legal actions."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 3)

    def forward(self, obs, legal):
        return torch.log_softmax(self.lin(obs).masked_fill(~legal, -1e9), -1)


def test_the_ccapo_update_shuffles_on_its_generators_device(sim):
    """As the PPO update: a device generator draws the trajectory order on the device (a host draw is refused)."""
    from reference_impl.ccapo.update import ccapo_update

    torch.manual_seed(0)
    policy, ref = _LogPolicy().to(simdevice.DEVICE), _LogPolicy().to(simdevice.DEVICE)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    batch = {k: v.to(simdevice.DEVICE) for k, v in {
        "obs": torch.randn(4, 3, 1), "legal": torch.ones(4, 3, 3, dtype=torch.bool),
        "action": torch.zeros(4, 3, dtype=torch.long), "logp_old": torch.full((4, 3), -1.1),
        "advantage": torch.randn(4, 3), "mask": torch.ones(4, 3, dtype=torch.bool)}.items()}
    gen = torch.Generator(device=simdevice.DEVICE).manual_seed(1)
    with simdevice.implementation_call():
        recs = ccapo_update(policy, ref, opt, batch, epochs=2, minibatch_size=2, generator=gen)
    assert [(r["epoch"], r["minibatch"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]


# ----------------------------------------------------------------------------- where a result lives
def results_on_the_host():
    """The reference, but ``sac.td_target`` and ``sac.init_target`` hand their results back on the host (a
    ``.cpu()`` at the end, a target network built on the CPU): right values, wrong device."""
    impl = reference_impl.make()
    td, init = impl.sac.td_target, impl.sac.init_target
    sac = types.SimpleNamespace(**{**vars(impl.sac), "td_target": lambda *a, **k: td(*a, **k).cpu(),
                                   "init_target": lambda *a, **k: init(*a, **k).cpu()})
    return types.SimpleNamespace(**{**vars(impl), "sac": sac})


@pytest.mark.parametrize("clause", ["SAC-TD-1", "SAC-TARGET-2"])
def test_a_result_moved_off_the_device_fails_under_the_simulation(clause):
    """Every value test passes a result on the host, which breaks the caller's next operation on the GPU: the
    call wrapper fails it, naming the op, under sim as on a real GPU."""
    report = clause_report(run_suite("conformance_tests.meta.test_device:results_on_the_host", device=simdevice.NAME,
                                     clauses=[clause]))
    (c,) = report["clauses"]
    assert c["status"] == "fail" and "off the device" in c["message"], c.get("message")
