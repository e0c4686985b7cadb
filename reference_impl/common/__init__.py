"""Pieces every trainer shares: run directories, JSON-lines metrics, atomic checkpoints, progress."""
from reference_impl.common.run import RunDir, atomic_save, load_checkpoint, progress, seed_everything

__all__ = ["RunDir", "atomic_save", "load_checkpoint", "progress", "seed_everything"]
