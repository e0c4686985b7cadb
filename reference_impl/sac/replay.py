"""Ring-buffer replay for the dual-buffer scheme of seed 000 §7 (one instance each for agent and demo).

The buffers live on the training device. Their write pointer and fill count are device tensors too, so a
step's rows go in (a masked share of them: the demo rows to one buffer, the others to the other) and a
batch comes out without reading anything back to the host; only ``len()`` reads the count.
"""
from __future__ import annotations

import torch

FIELDS = ("obs", "action", "reward", "next_obs", "done", "is_demo", "is_relabeled")


class Replay:
    """Fixed-capacity FIFO of transitions; observations are stored as int32 character windows."""

    def __init__(self, capacity: int, history: int, device: torch.device | str = "cpu"):
        dev, rows = torch.device(device), capacity + 1  # row ``capacity`` is scratch: add() parks unkept rows there
        self.capacity = capacity
        self.ptr = torch.zeros((), dtype=torch.long, device=dev)  # next slot to write
        self.size = torch.zeros((), dtype=torch.long, device=dev)  # rows stored (at most capacity)
        self.data = {
            "obs": torch.zeros(rows, history, dtype=torch.int32, device=dev),
            "action": torch.zeros(rows, dtype=torch.long, device=dev),
            "reward": torch.zeros(rows, device=dev),
            "next_obs": torch.zeros(rows, history, dtype=torch.int32, device=dev),
            "done": torch.zeros(rows, dtype=torch.bool, device=dev),
            "is_demo": torch.zeros(rows, dtype=torch.bool, device=dev),
            "is_relabeled": torch.zeros(rows, dtype=torch.bool, device=dev),
        }

    def __len__(self) -> int:
        return int(self.size)  # a read back to the host

    def add(self, batch: dict[str, torch.Tensor], keep: torch.Tensor | None = None) -> None:
        """Append the rows of ``batch`` (every field a tensor with leading dimension N) where ``keep``
        (bool [N], default all) is set, in order. How many that is stays on the device."""
        if keep is None:
            keep = torch.ones(len(batch["action"]), dtype=torch.bool, device=self.ptr.device)
        rank = keep.cumsum(0) - 1  # place of each kept row among the kept ones
        slot = torch.where(keep, (self.ptr + rank) % self.capacity, self.capacity)
        for k in FIELDS:
            self.data[k][slot] = batch[k].to(self.data[k].dtype)
        n = keep.sum()
        self.ptr = (self.ptr + n) % self.capacity
        self.size = (self.size + n).clamp_max(self.capacity)

    def rows(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored rows ``idx``, observations as long ids."""
        out = {k: v[idx] for k, v in self.data.items()}
        out["obs"], out["next_obs"] = out["obs"].long(), out["next_obs"].long()
        return out

    def sample(self, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``n`` rows drawn uniformly with replacement (the buffer must not be empty)."""
        u = torch.rand(n, generator=generator, device=self.ptr.device, dtype=torch.float64)
        return self.rows(_uniform_index(u, self.size))

    def state_dict(self) -> dict:
        size = int(self.size)
        return {"ptr": int(self.ptr), "size": size,
                "data": {k: v[:size].to("cpu", copy=True) for k, v in self.data.items()}}

    def load_state_dict(self, s: dict) -> None:
        self.ptr.fill_(s["ptr"])
        self.size.fill_(s["size"])
        for k, v in s["data"].items():
            self.data[k][: len(v)] = v


def _uniform_index(u: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """u ~ U[0, 1) (float64) -> an index uniform over [0, size), size a device count (0 gives 0)."""
    return torch.minimum((u * size).long(), (size - 1).clamp_min(0))


def sample_mixed(agent: Replay, demo: Replay, n_agent: int, n_demo: int,
                 generator: torch.Generator) -> dict[str, torch.Tensor]:
    """B = B_agent ∪ B_demo, with replacement: the first ``n_agent`` rows from ``agent``, the rest from
    ``demo``. A buffer that is still empty lends its quota to the other (warm-up, when the teacher writes
    nearly every step, or a run without teacher); the split is made on the device, from the fill counts."""
    n = n_agent + n_demo
    split = torch.where(agent.size == 0, 0, torch.where(demo.size == 0, n, n_agent))
    from_agent = torch.arange(n, device=agent.size.device) < split
    u = torch.rand(n, generator=generator, device=agent.size.device, dtype=torch.float64)
    a, d = agent.rows(_uniform_index(u, agent.size)), demo.rows(_uniform_index(u, demo.size))
    return {k: torch.where(from_agent.view(-1, *[1] * (a[k].dim() - 1)), a[k], d[k]) for k in a}
