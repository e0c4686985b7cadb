"""Pieces every trainer shares: run directories, JSON-lines metrics, atomic checkpoints, progress."""
from reference_impl.common.config import add_config_flags, arg, config_overrides
from reference_impl.common.run import RunDir, atomic_save, load_checkpoint, progress, seed_everything

__all__ = ["RunDir", "add_config_flags", "arg", "atomic_save", "config_overrides", "load_checkpoint", "progress",
           "seed_everything"]
