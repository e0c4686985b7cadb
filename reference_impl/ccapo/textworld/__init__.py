"""CCAPO v4.1 on real TextWorld games: game generation, env wrapper, text policy, trainer, plots.

Needs the ``textworld`` package; ``reference_impl.ccapo`` itself does not import this package.
"""
