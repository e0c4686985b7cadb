"""What a collected test says about itself: the clauses it checks and what kind of evidence it is."""
from __future__ import annotations


def item_clauses(item) -> tuple[str, ...]:
    ids: list[str] = []
    for m in item.iter_markers("clause"):
        ids.extend(m.args)
    return tuple(dict.fromkeys(ids))


def test_kind(item) -> str:
    """``golden`` (hand-computed values), ``example`` (other fixed inputs) or ``property`` (hypothesis):
    the order in which a clause's failures are most informative to a reader."""
    fn = getattr(item, "function", None)
    if getattr(fn, "is_hypothesis_test", False):
        return "property"
    return "golden" if "golden" in item.name else "example"
