"""The SAC update recorded once as a CUDA graph and replayed for every batch (the GPU plan).

Run eagerly on a GPU, the update is bound by launches, not arithmetic: each of its few hundred ops is a
kernel launched from Python, and the GPU waits between them. A CUDA graph records the whole update
(the forward passes, the backward passes, the clipping, the three optimiser steps, the clamp and the
soft target update) and replays it with one launch. What capture needs, the update already is: no
host read inside it (its diagnostics stay tensors until the end), no shape that depends on data (the
accelerator plan selects Top-p by a sort), and optimisers whose step counts live on the device
(``capturable=True``, set here).

The graph reads its batch from fixed buffers, so each call copies the batch in, replays, and reads the
diagnostics back in one transfer. Where capture does not apply (not CUDA, gradients averaged over
ranks, a batch of another signature) the call is the eager :func:`~reference_impl.sac.step.update_step`:
the same phases and the same results (the GPU check compares the two, tools/gpu_checks.sh).
"""
from __future__ import annotations

import warnings
from typing import Sequence

import torch

from reference_impl import _checks
from reference_impl.sac.step import ORDER, phase_diagnostics, run_phases, stack_diagnostics, step_hp

_UNCAPTURED = ".*capturable=True.*running without"  # torch warns when a capturable optimiser steps eagerly


def _signature(batch: dict) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype, v.device) for k, v in sorted(batch.items()))


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Switch an optimiser to its graph-safe step: step counts on the parameters' device (Adam's
    ``capturable``); an optimiser without the flag (SGD) is graph-safe as it is."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                if torch.is_tensor(st.get("step")) and st["step"].device != p.device:
                    st["step"] = st["step"].to(p.device)


def can_capture(*tensors: torch.Tensor, all_rows=None) -> bool:
    """Whether the update on these tensors can be captured: real CUDA, one process's rows."""
    return all_rows is None and torch.cuda.is_available() and all(t.is_cuda for t in tensors)


class CapturedUpdate:
    """``update_step`` bound to its networks and optimisers, replayed from a CUDA graph on a GPU.

    ``capture=False`` (or a process that cannot capture) makes every call the eager update. Otherwise the
    first ``warmup`` calls with the guards off run eagerly on a side stream (real updates: they also create
    the optimiser state, the library workspaces and any compiled kernels, which capture must not make;
    validated calls before them run there too); the next call records the graph,
    and every later call with a batch of the same signature replays it. Returns what ``update_step``
    returns: the diagnostics as floats, one host read per call.

    Implements: SAC-STEP-1 (the phases of ``update_step``, replayed).
    """

    def __init__(self, policy, critic, target, log_alpha, optimizers: dict, *, order: Sequence[str] = ORDER,
                 capture: bool = True, warmup: int = 2, **hp):
        self.nets = (policy, critic, target, log_alpha, optimizers)
        self.order, self.hp, self.warmup = tuple(order), step_hp(**hp), warmup
        params = [log_alpha, *policy.parameters(), *critic.parameters()]
        self.enabled = capture and can_capture(*params, all_rows=self.hp["all_rows"])
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict | None = None
        self.keys: list[str] = []
        self.vector: torch.Tensor | None = None
        self.calls = 0
        if self.enabled:
            for opt in optimizers.values():
                make_capturable(opt)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, batch: dict) -> dict:
        if not self.enabled or (self.static is not None and _signature(batch) != _signature(self.static)):
            return run_phases(self.order, *self.nets, batch, **self.hp)  # the eager update, same phases
        if self.static is None:
            self.static = {k: v.clone() for k, v in batch.items()}
        else:
            for k, v in batch.items():
                self.static[k].copy_(v)
        if not _checks._on():  # a warm-up call runs what capture records: guards off (and, with compile, compiles)
            self.calls += 1
        if self.graph is None:
            if self.calls <= self.warmup:
                return self._eager_on_side_stream()
            if not self._capture():
                return run_phases(self.order, *self.nets, self.static, **self.hp)
        self.graph.replay()
        return dict(zip(self.keys, self.vector.tolist()))

    def _eager_on_side_stream(self) -> dict:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNCAPTURED)
            out = run_phases(self.order, *self.nets, self.static, **self.hp)  # reads back: the side stream is done
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _capture(self) -> bool:
        """Record the update; False (and eager from now on, with a warning) where capture fails."""
        graph = torch.cuda.CUDAGraph()
        try:  # capture records and runs nothing: the replay that follows is this call's update
            with _checks.validation(False), torch.cuda.graph(graph):  # the guards read values: the warm-up ran them
                out = phase_diagnostics(self.order, *self.nets, self.static, **self.hp)
                self.keys, self.vector = list(out), stack_diagnostics(out)
        except RuntimeError as exc:
            warnings.warn(f"the SAC update could not be captured as a CUDA graph ({exc}); it runs eagerly",
                          RuntimeWarning, stacklevel=3)
            self.enabled = False
            return False
        self.graph = graph
        return True
