"""CCAPO v4.1 (seed 004): the pure math, the fingerprinters and the STDB.

Every public function implements clauses of ``spec/ccapo.yaml``; the trainer (``trainer.py``) and
the store backends (``stdb/``) call these and never re-derive a formula.
"""
from reference_impl.ccapo.advantages import (
    fuse_advantages,
    loop_mask,
    macro_advantage,
    macro_return,
    micro_advantage,
    micro_raw_advantage,
    micro_reward,
)
from reference_impl.ccapo.defaults import defaults
from reference_impl.ccapo.fingerprints import (
    FINGERPRINTERS,
    Fingerprinter,
    abstract_location,
    anchor,
    fingerprint,
    register_fingerprinter,
)
from reference_impl.ccapo.losses import policy_loss
from reference_impl.ccapo.scoring import criticality, distance_decay, importance, q_stdb, score_steps
from reference_impl.ccapo.stdb.update import empty_stats, stdb_update
from reference_impl.ccapo.update import ccapo_update

__all__ = [
    "fingerprint", "abstract_location", "anchor", "Fingerprinter", "FINGERPRINTERS", "register_fingerprinter",
    "importance", "criticality", "distance_decay", "q_stdb", "score_steps",
    "macro_return", "loop_mask", "micro_reward", "macro_advantage", "micro_raw_advantage",
    "micro_advantage", "fuse_advantages", "stdb_update", "empty_stats", "policy_loss", "defaults",
    "ccapo_update",
]
