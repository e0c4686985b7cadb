"""A verifiable task generated locally: small-number addition, ``"12+7="`` -> ``"19<eos>"``.

Every problem is pre-tokenised once into device tensors (left-padded prompts, right-padded targets),
so sampling a batch and checking its reward never leave the device: the reward is an exact match of
the response tokens, up to and including the end-of-sequence token, against the target tokens.
"""
from __future__ import annotations

import dataclasses

import torch

# The character-level vocabulary of the tiny default model: specials, then the task's characters.
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = tuple("0123456789+=")


@dataclasses.dataclass
class Problems:
    """One split of the task as device tensors; row i is problem i."""

    prompt_ids: torch.Tensor  # [N, P] long, left-padded with pad_id
    prompt_mask: torch.Tensor  # [N, P] long, 1 on real prompt tokens
    target_ids: torch.Tensor  # [N, T] long: answer tokens, eos, then pad_id
    target_mask: torch.Tensor  # [N, T] long, 1 on the answer tokens and their eos
    texts: list[str]  # the prompts, for logs

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def to(self, device) -> "Problems":
        return Problems(self.prompt_ids.to(device), self.prompt_mask.to(device), self.target_ids.to(device),
                        self.target_mask.to(device), self.texts)


def addition_pairs(max_operand: int, heldout_frac: float, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All (a, b) with 0 <= a, b <= max_operand, split by a fixed permutation into train / held-out."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = max(1, int(len(pairs) * heldout_frac))
    held = [pairs[i] for i in perm[:n_held]]
    train = [pairs[i] for i in perm[n_held:]]
    return train, held


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def answer_text(a: int, b: int) -> str:
    return str(a + b)


def encode(tokenizer, pairs: list[tuple[int, int]], max_new_tokens: int) -> Problems:
    """Tokenise prompts (left-padded) and targets (answer + eos, right-padded to ``max_new_tokens``)."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts = [tokenizer(prompt_text(a, b), add_special_tokens=False).input_ids for a, b in pairs]
    answers = [tokenizer(answer_text(a, b), add_special_tokens=False).input_ids + [eos] for a, b in pairs]
    longest = max(len(t) for t in answers)
    if longest > max_new_tokens:
        raise ValueError(f"max_new_tokens={max_new_tokens} cannot hold an answer of {longest} tokens")
    width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.long)
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    target_ids = torch.tensor([t + [pad] * (max_new_tokens - len(t)) for t in answers], dtype=torch.long)
    target_mask = torch.tensor([[1] * len(t) + [0] * (max_new_tokens - len(t)) for t in answers], dtype=torch.long)
    return Problems(prompt_ids, prompt_mask, target_ids, target_mask, [prompt_text(a, b) for a, b in pairs])


def exact_match(response_ids: torch.Tensor, target_ids: torch.Tensor) -> torch.Tensor:
    """Reward 1.0 where every response token equals the target token (pad after eos on both), else 0.0.

    ``response_ids`` must already carry pad after its first eos (``model.generate`` does this).
    """
    return (response_ids == target_ids).all(-1).to(torch.float32)


def demonstrations(problems: Problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, loss mask) of prompt + target for supervised pre-training; the loss
    mask covers the answer and its eos only."""
    ids = torch.cat([problems.prompt_ids, problems.target_ids], 1)
    attn = torch.cat([problems.prompt_mask, torch.ones_like(problems.target_ids)], 1)
    loss_mask = torch.cat([torch.zeros_like(problems.prompt_mask), problems.target_mask], 1)
    return ids, attn, loss_mask
