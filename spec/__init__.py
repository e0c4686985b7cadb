"""The rlconform specification, as data: one YAML file per family plus the shared tolerance table.

Read it through :mod:`rlconform.spec`, which validates every file.
"""
