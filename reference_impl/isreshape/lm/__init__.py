"""IS Reshape v4 on a Hugging Face causal LM (seed 003).

``task`` (addition with an exact-match reward), ``model`` (load / build / score / sample),
``losses`` (masked token reductions), ``trainer`` (the loop and ``cli``), ``plot`` (results page).
Run ``python -m reference_impl.isreshape.lm --help``.
"""
