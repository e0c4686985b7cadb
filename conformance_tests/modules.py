"""Suite-owned networks that output given tensors, for the loss-level ops.

A loss-level op (``sac.losses``, ``ppo.losses``) takes networks, as library loss modules do. The
suite hands it these: each holds the tensor it must output as an ``nn.Parameter`` and is indexed
by the observation, which the suite makes a row index (int64). An adapter wraps them in the
library's own module types (a TensorDict module, an actor class) and never replaces parameters;
the suite reads gradients back from ``.table.grad``.
"""
from __future__ import annotations

from torch import Tensor, nn

__all__ = ["TableModule", "TwinTable"]


class TableModule(nn.Module):
    """``forward(index) -> table[index]``: row ``i`` of the table is the output for observation ``i``.

    ``table`` is [N, ...] (e.g. [N, A] logits or Q-values, [N] state values); it is copied into a
    parameter, so the caller's tensor is never written and gradients land on ``self.table``.
    """

    def __init__(self, table: Tensor, *, requires_grad: bool = True):
        super().__init__()
        self.table = nn.Parameter(table.detach().clone(), requires_grad=requires_grad)

    def forward(self, index: Tensor) -> Tensor:
        return self.table[index.long()]


class TwinTable(nn.Module):
    """``forward(index) -> (q1[index], q2[index])``: the twin critics of SAC as two tables.

    ``.q1`` and ``.q2`` are :class:`TableModule` s, for libraries that take one module per critic.
    """

    def __init__(self, q1: Tensor, q2: Tensor, *, requires_grad: bool = True):
        super().__init__()
        self.q1 = TableModule(q1, requires_grad=requires_grad)
        self.q2 = TableModule(q2, requires_grad=requires_grad)

    def forward(self, index: Tensor) -> tuple[Tensor, Tensor]:
        return self.q1(index), self.q2(index)
