"""The scripts that write ``docs/results/``: results studies (seeds x initial models x arms, run in parallel,
summarised with paired bootstrap intervals) and the training, plotting and page-building scripts of each results
family. Checkout-only: not part of the ``rlconform`` wheel. Run them from the repository root, e.g.
``python -m tools.experiments study isreshape-lm --out DIR`` or ``python -m tools.experiments.sac.build ...``."""
