"""Hypothesis strategies, named as nouns: ``logits()``, ``legal_masks()``, ``group_rewards()``...

One namespace for the whole suite: ``core`` holds the shared ones and each family adds a submodule
(``strategies/ppo.py``...) whose ``__all__`` is re-exported here, so tests always write
``from conformance_tests import strategies as st_``.
"""
import importlib as _importlib
import pkgutil as _pkgutil

__all__: list[str] = []
for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda i: (i.name != "core", i.name)):
    _mod = _importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_mod, "__all__", ()):
        if _name in globals():
            raise ImportError(f"strategy {_name!r} is defined twice (second time in {_info.name})")
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)
