"""Mutants of the sac family: V1's rules and the bugs the V2 document warns about."""
from __future__ import annotations

import torch

from conformance_tests.mutants import mutant, override


@mutant("SAC-MASK-2", doc="V1's -inf mask with no epsilon-clip: illegal actions get probability 0 and log pi = -inf.",
        source="001 §2")
def inf_mask_without_clip(ref):
    def masked_softmax(logits, legal_mask, *, eps=1e-8):
        return torch.softmax(logits.masked_fill(~legal_mask, float("-inf")), dim=-1)

    return override(ref, "sac", masked_softmax=masked_softmax)
