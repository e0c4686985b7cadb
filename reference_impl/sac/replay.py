"""Ring-buffer replay for the dual-buffer scheme of seed 000 §7 (one instance each for agent and demo)."""
from __future__ import annotations

import torch

FIELDS = ("obs", "action", "reward", "next_obs", "done", "is_demo", "is_relabeled")


class Replay:
    """Fixed-capacity FIFO of transitions; observations are stored as int32 character windows."""

    def __init__(self, capacity: int, history: int):
        self.capacity, self.ptr, self.size = capacity, 0, 0
        self.data = {
            "obs": torch.zeros(capacity, history, dtype=torch.int32),
            "action": torch.zeros(capacity, dtype=torch.long),
            "reward": torch.zeros(capacity),
            "next_obs": torch.zeros(capacity, history, dtype=torch.int32),
            "done": torch.zeros(capacity, dtype=torch.bool),
            "is_demo": torch.zeros(capacity, dtype=torch.bool),
            "is_relabeled": torch.zeros(capacity, dtype=torch.bool),
        }

    def __len__(self) -> int:
        return self.size

    def add(self, **batch: torch.Tensor) -> None:
        """Append N transitions (every field a tensor with leading dimension N)."""
        n = len(batch["action"])
        if n == 0:
            return
        idx = (self.ptr + torch.arange(n)) % self.capacity
        for k in FIELDS:
            self.data[k][idx] = batch[k].to(self.data[k].dtype)
        self.ptr = int((self.ptr + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, self.size, (n,), generator=generator)
        out = {k: v[idx] for k, v in self.data.items()}
        out["obs"], out["next_obs"] = out["obs"].long(), out["next_obs"].long()
        return out

    def state_dict(self) -> dict:
        return {"ptr": self.ptr, "size": self.size, "data": {k: v[: self.size].clone() for k, v in self.data.items()}}

    def load_state_dict(self, s: dict) -> None:
        self.ptr, self.size = s["ptr"], s["size"]
        for k, v in s["data"].items():
            self.data[k][: len(v)] = v


def merge(*batches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """B = B_agent ∪ B_demo (concatenate field by field; empty parts are skipped)."""
    parts = [b for b in batches if b is not None and len(b["action"])]
    return {k: torch.cat([b[k] for b in parts]) for k in parts[0]}
