"""The SAC results page (docs/results/sac/): the n-gram ceiling, re-evaluation and supervised probes, the plot,
and ``build``, which writes the page's figures from a finished suite of ``python -m rlconform.golive``."""
