"""The SAC update as a graph: what CUDA-graph capture needs, checked on the CPU.

A captured update (``reference_impl.sac.graphed``) records every op of the update once and replays
them. That only works if the phases have no host read, no Python branch on a tensor's value and no
shape that depends on data. TorchDynamo with ``fullgraph=True`` refuses exactly those (a graph break is
an error), so tracing each phase's objective on the accelerator plan is the CPU's proof that the GPU
can capture it. Where capture does not apply, the captured update must be the eager one, value for
value; on a real GPU the replayed graph must follow the eager update (run by tools/gpu_checks.sh).
What ``CapturedUpdate`` does around the graph (warm-up, capture, replay, fallbacks) runs here on a CUDA
graph simulated on the CPU (``_SimulatedGraphs``), so CI checks it without a GPU.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import re
import sys
import warnings
from unittest import mock

import pytest
import torch

from conformance_tests import simdevice
from conformance_tests.harness import assert_close
from conformance_tests.meta.test_sac_fastpaths import _case, _nets
from reference_impl import _checks
from reference_impl.sac import backup, fast, graphed, step
from reference_impl.sac.graphed import CapturedUpdate, can_capture, make_capturable
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


# ------------------------------------------------------------------ the capture logic, on a simulated CUDA graph
_HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


class _SimulatedGraphs:
    """CUDA-graph semantics on the CPU, so that what ``CapturedUpdate`` does around the graph (when it
    warms up, when it records, what the graph reads and writes) is checked where CI runs.

    Capture records the update and runs nothing: the real networks, optimisers and batch stay as they are
    (the recorded call runs on a deep copy, which only gives the diagnostics' keys and shapes), and a read
    of a value on the host raises, as a synchronisation inside a capture does on a GPU. Replay runs
    the recorded call on the objects bound at capture, as a graph reads fixed addresses: a batch rebound
    rather than copied into its buffers after capture would go unseen, as on a GPU. It writes the
    diagnostics into the tensor recorded as the graph's output, with the guards off, as a graph has none.
    """

    def __init__(self, fail: bool = False):
        self.fail, self.graphs, self.active = fail, [], []

    def graph_class(self):
        sim = self

        class Graph:
            def __init__(self):
                self.call, self.output, self.replays = None, None, 0
                sim.graphs.append(self)

            def replay(self):
                order, nets, batch, hp = self.call
                with _checks.validation(False):
                    out = step.phase_diagnostics(order, *nets, batch, **hp)
                    with torch.no_grad():
                        self.output.copy_(step.stack_diagnostics(out))
                self.replays += 1

        return Graph

    @contextlib.contextmanager
    def capture(self, graph):
        if self.fail:
            raise RuntimeError("simulated: operation not permitted when stream is capturing")

        def refused(name):
            original = getattr(torch.Tensor, name)

            def read(t, *args, **kwargs):
                # the optimisers' own step counts excepted: on a GPU they are capturable (no read); a CPU Adam reads
                if sys._getframe(1).f_globals.get("__name__", "").startswith("torch.optim"):
                    return original(t, *args, **kwargs)
                raise RuntimeError(f"simulated: operation not permitted when stream is capturing (Tensor.{name})")

            return read

        self.active.append(graph)
        try:
            with contextlib.ExitStack() as st:
                for name in _HOST_READS:
                    st.enter_context(mock.patch.object(torch.Tensor, name, refused(name)))
                yield
        finally:
            self.active.pop()

    def phase_diagnostics(self, order, *args, **hp):
        if not self.active:
            return step.phase_diagnostics(order, *args, **hp)
        *nets, batch = args
        self.active[-1].call = (tuple(order), tuple(nets), dict(batch), hp)
        return step.phase_diagnostics(order, *copy.deepcopy(args), **hp)

    def stack_diagnostics(self, out):
        vec = step.stack_diagnostics(out)
        if self.active:
            self.active[-1].output = vec
        return vec

    @contextlib.contextmanager
    def patched(self):
        """``graphed`` on a CPU that claims CUDA: streams are no-ops; the optimisers keep their CPU step
        (Adam refuses ``capturable`` off an accelerator), so ``make_capturable`` only records its calls. The
        simulated device (``--device sim``) is suspended: its own handling of host reads would stand between
        a read and the code that made it, and the graph simulation needs no device."""
        stream = mock.MagicMock()
        self.made_capturable = []
        with contextlib.ExitStack() as st:
            st.enter_context(simdevice.suspended())
            st.enter_context(mock.patch.object(graphed, "can_capture", lambda *t, all_rows=None: all_rows is None))
            st.enter_context(mock.patch.object(graphed, "make_capturable", self.made_capturable.append))
            st.enter_context(mock.patch.object(graphed, "phase_diagnostics", self.phase_diagnostics))
            st.enter_context(mock.patch.object(graphed, "stack_diagnostics", self.stack_diagnostics))
            st.enter_context(mock.patch.object(torch.cuda, "CUDAGraph", self.graph_class()))
            st.enter_context(mock.patch.object(torch.cuda, "graph", self.capture))
            st.enter_context(mock.patch.object(torch.cuda, "Stream", stream))
            st.enter_context(mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()))
            st.enter_context(mock.patch.object(torch.cuda, "current_stream", stream))
            yield self


def _assert_same_update(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys(), what
    for k in want:
        assert_close(torch.tensor(got[k]), torch.tensor(want[k]), "SAC-STEP-1", what=f"{what}: {k}")


def _assert_same_nets(a_nets, b_nets, what: str) -> None:
    for net_a, net_b in zip(a_nets[:3], b_nets[:3]):
        for a, b in zip(net_a.parameters(), net_b.parameters(), strict=True):
            assert_close(a.detach(), b.detach(), "SAC-STEP-1", what=what)
    assert_close(a_nets[3].detach(), b_nets[3].detach(), "SAC-STEP-1", what=f"{what}: log alpha")


@pytest.mark.clause("SAC-STEP-1")
@pytest.mark.parametrize("validated", [0, 2])
def test_the_graph_is_recorded_after_the_warm_up_and_replayed_for_every_later_batch(validated):
    """Validated calls (guards on) run eagerly and do not count; the next ``warmup`` unguarded calls run
    eagerly; the one after records the graph (and its replay is that call's update); every later call
    replays it. Each call's diagnostics and the networks after it are the eager update's."""
    bound, plain = _nets(5, D, A), _nets(5, D, A)
    with _SimulatedGraphs().patched() as sim:
        upd = CapturedUpdate(*bound, top_p=0.9, kpi_rows=7, warmup=2)
        assert sim.made_capturable == list(bound[4].values())
        for i in range(validated + 6):
            guards = i < validated
            with _checks.validation(guards):
                got = upd(_batch(40 + i))
                want = update_step(*plain, _batch(40 + i), top_p=0.9, kpi_rows=7)
            _assert_same_update(got, want, f"call {i}")
            _assert_same_nets(bound, plain, f"networks after call {i}")
            unguarded = i + 1 - validated
            assert upd.captured == (unguarded >= 3), f"call {i}"
            assert len(sim.graphs) == (unguarded >= 3)
        assert sim.graphs[0].replays == 4


@pytest.mark.clause("SAC-STEP-1")
def test_a_batch_of_another_signature_runs_eagerly_and_leaves_the_graph_as_recorded():
    bound, plain = _nets(6, D, A), _nets(6, D, A)
    short = {k: v[: N - 4] for k, v in _batch(60).items()}
    with _SimulatedGraphs().patched() as sim, _checks.validation(False):
        upd = CapturedUpdate(*bound, top_p=0.9, kpi_rows=7, warmup=1)
        for i, b in enumerate([_batch(61), _batch(62), short, {**_batch(63), "reward": _batch(63)["reward"].double()},
                               _batch(64)]):
            want = update_step(*plain, b, top_p=0.9, kpi_rows=7)
            _assert_same_update(upd(b), want, f"call {i}")
            _assert_same_nets(bound, plain, f"networks after call {i}")
        assert len(sim.graphs) == 1 and sim.graphs[0].replays == 2  # calls 1 and 4; 2 and 3 were eager


@pytest.mark.clause("SAC-STEP-1")
def test_a_failed_capture_warns_and_every_later_call_is_the_eager_update():
    bound, plain = _nets(7, D, A), _nets(7, D, A)
    with _SimulatedGraphs(fail=True).patched(), _checks.validation(False):
        upd = CapturedUpdate(*bound, top_p=0.9, kpi_rows=7, warmup=1)
        for i in range(4):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = upd(_batch(70 + i))
            _assert_same_update(got, update_step(*plain, _batch(70 + i), top_p=0.9, kpi_rows=7), f"call {i}")
            failed = [w for w in caught if "could not be captured" in str(w.message)]
            assert len(failed) == (i == 1), f"call {i}"
            for w in failed:  # the RuntimeError's text, at the caller's line
                assert re.fullmatch(r"the SAC update could not be captured as a CUDA graph \(simulated: .*\); "
                                    r"it runs eagerly", str(w.message))
                assert (w.category, w.filename) == (RuntimeWarning, __file__)
        assert not upd.captured and upd.enabled is False
        _assert_same_nets(bound, plain, "networks after 4 calls")


@pytest.mark.parametrize("setting", ["capture=False", "all_rows"])
def test_no_capture_is_attempted_where_it_does_not_apply(setting):
    """``capture=False``, or gradients averaged over ranks (``all_rows``): eager, optimisers left as they are."""
    kw = {"capture": False} if setting == "capture=False" else {"all_rows": lambda x: x}
    bound, plain = _nets(8, D, A), _nets(8, D, A)
    with _SimulatedGraphs().patched() as sim, _checks.validation(False):
        upd = CapturedUpdate(*bound, top_p=0.9, kpi_rows=7, warmup=0, **kw)
        for i in range(3):
            want = update_step(*plain, _batch(80 + i), top_p=0.9, kpi_rows=7, all_rows=kw.get("all_rows"))
            _assert_same_update(upd(_batch(80 + i)), want, f"call {i}")
    assert not upd.enabled and not sim.graphs and not sim.made_capturable


def test_can_capture_needs_cuda_for_every_tensor_and_one_process():
    on, off = mock.Mock(is_cuda=True), mock.Mock(is_cuda=False)
    with mock.patch.object(torch.cuda, "is_available", lambda: True):
        assert can_capture(on, on)
        assert not can_capture(on, off)
        assert not can_capture(on, all_rows=lambda x: x)
    with mock.patch.object(torch.cuda, "is_available", lambda: False):
        assert not can_capture(on)
    assert not can_capture(torch.zeros(2))


def test_make_capturable_sets_the_flag_and_moves_step_counts_to_the_parameters():
    """Adam's groups become capturable and a step count held elsewhere joins its parameter's device (a
    checkpoint loaded on the host); SGD has no such flag and is left as it is."""
    p, q = torch.zeros(3, device="meta"), torch.zeros(2, device="meta")
    adam = torch.optim.Adam([{"params": [p]}, {"params": [q]}], lr=0.1)
    adam.state[p] = {"step": torch.tensor(3.0)}
    adam.state[q] = {"step": 4.0}
    make_capturable(adam)
    assert all(g["capturable"] for g in adam.param_groups)
    assert adam.state[p]["step"].device == p.device
    assert adam.state[q]["step"] == 4.0
    sgd = torch.optim.SGD([torch.zeros(2)], lr=0.1)
    before = [dict(g) for g in sgd.param_groups]
    make_capturable(sgd)
    assert [dict(g) for g in sgd.param_groups] == before and "capturable" not in sgd.param_groups[0]


def test_the_warm_up_silences_the_warning_torch_gives_for_a_capturable_step_run_eagerly():
    """The warm-up steps capturable optimisers outside a graph, on purpose; torch can warn about exactly that
    and the filter must match its text. Torch warns on a GPU only (the accelerator is patched in here) and
    once per optimiser, behind a flag that torch 2.13 sets at construction (re-armed here)."""
    opt = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=0.1, capturable=True)
    opt._warned_capturable_if_run_uncaptured = False
    check = getattr(opt, "_accelerator_graph_capture_health_check", None) or opt._cuda_graph_capture_health_check
    on_gpu = {(torch.accelerator, "current_accelerator"): lambda check_available=False: torch.device("cuda"),
              (torch.accelerator, "current_stream"): lambda *a: mock.Mock(is_capturing=lambda: False),
              (torch.cuda, "is_available"): lambda: True, (torch.backends.cuda, "is_built"): lambda: True,
              (torch.cuda, "is_current_stream_capturing"): lambda: False}  # the newer check, then the older one
    with contextlib.ExitStack() as st, warnings.catch_warnings(record=True) as caught:
        for (module, name), fake in on_gpu.items():
            st.enter_context(mock.patch.object(module, name, fake, create=True))
        warnings.simplefilter("always")
        check()
    assert len(caught) == 1
    assert re.match(graphed._UNCAPTURED, str(caught[0].message))
