"""Tests of the suite itself, of the engine (audit, matrix, mutants, site) and of the reference's own machinery
(trainers, stores, fast paths). Checkout-only: the wheel leaves this package out."""
