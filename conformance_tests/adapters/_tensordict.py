"""Contract batch dicts as TensorDicts under TorchRL's default keys (torchrl 0.14), and the default
dtype libraries build their constants in.

The contract names a batch's fields after the seeds (``obs``, ``legal_mask``, ``old_log_prob``...);
TorchRL's loss modules read them under the keys its environments write (``observation``,
``("next", "reward")``...). One table maps the two, so an adapter never spells a key itself.
"""
from __future__ import annotations

import contextlib

import torch

# contract field -> TorchRL key: env specs (observation, action_mask, next/*), the tensor_keys
# defaults of DiscreteSACLoss and ClipPPOLoss (action_log_prob, advantage, value_target).
KEYS = {"obs": "observation", "action": "action", "legal_mask": "action_mask", "mask": "action_mask",
        "old_log_prob": "action_log_prob", "advantage": "advantage", "return": "value_target",
        "next_obs": ("next", "observation"), "next_legal_mask": ("next", "action_mask"),
        "reward": ("next", "reward"), "done": ("next", "terminated"), "truncated": ("next", "truncated")}
_TRAILING = {"reward", "done", "truncated", "advantage"}  # TorchRL keeps a trailing singleton axis here


def to_tensordict(batch: dict, **renames):
    """``batch`` -> a TensorDict of its batch size; ``renames`` override :data:`KEYS` (e.g. a loss
    module's own ``tensor_keys.sample_log_prob``). The contract's ``done`` is a termination; TorchRL's
    ``("next", "done")`` is any end of episode, so it is written as terminated | truncated. A batch is
    data: it is stored detached, as TorchRL's collectors and replay buffers store it (ClipPPOLoss
    refuses a stored log-prob that requires grad, objectives/ppo.py:858)."""
    from tensordict import TensorDict

    keys = {**KEYS, **renames}
    td = TensorDict({}, batch_size=[batch["action"].shape[0]])
    for name, value in batch.items():
        if name in keys:
            td.set(keys[name], (value.unsqueeze(-1) if name in _TRAILING else value).detach())
    if "done" in batch:
        terminated = td.get(keys["done"]).bool()
        td.set(keys["done"], terminated)
        td.set(("next", "done"), terminated | td.get(keys["truncated"], torch.zeros_like(terminated)).bool())
    return td


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build library objects whose constants come from ``torch.tensor(python_float)`` (TorchRL's loss
    buffers, Tianshou's AutoAlpha) in ``dtype``: a float32 constant in a float64 loss is a 1e-8 error."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
