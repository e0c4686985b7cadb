"""The specification: the YAML files beside this module, loaded and validated.

Every other part of rlconform (the suite's markers, the coverage check, the audit report, the docs
site) reads clauses through :func:`load_spec`, so a malformed file fails here, once, with a message
that names the file and the clause.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping

from rlconform.spec.yamlfile import YamlFileError, load_yaml, validate

FAMILIES = ("sac", "ppo", "isreshape", "ccapo")
ID_PREFIX = {"sac": "SAC", "ppo": "PPO", "isreshape": "ISR", "ccapo": "CCAPO"}
LEVELS = ("MUST", "SHOULD")
# How a gate turns a run's per-update values into one figure (rlconform.spec.gates.aggregate).
AGGREGATES = ("last", "mean", "median", "min", "max", "mean_last_half", "median_last_half", "first")
KINDS = ("formula", "rule", "default", "gate", "input")
# What a clause's level governs: whether an implementation may LEAVE THE BEHAVIOUR OUT (MUST: no;
# SHOULD: yes, and then its tests are not applicable). It never lets a behaviour that is there be wrong:
# a SHOULD formula or rule the implementation provides and computes wrongly fails the audit like a MUST.
# Only the advisory kinds stay advisory when they fail: a recommended default, or an input check, where
# "fails" means the recommendation was not followed (another default, no rejection), not a wrong result.
# A gate's threshold is judged on a run (rlconform gate), not here; what the suite tests of a gate is the
# operation that computes its metric, and a wrong metric is a wrong result: it binds.
BINDING_KINDS = ("formula", "rule", "gate")
# How much a failure hurts a user, worst first: the harness classifies each failing test, the audit and the
# matrix order findings by it.
SEVERITIES = ("critical", "major", "minor")
# The floating dtypes a library may declare (capabilities['dtypes']): every tolerance class but exact gives
# rtol/atol for each, so no dtype a library declares meets a tolerance the spec never wrote.
DTYPES = ("float16", "bfloat16", "float32", "float64")
SEVERITY_MEANING = ("critical (NaN/inf where the answer is finite, a crash or a hang), major (a wrong result or "
                    "decision), minor (a numerical residue past a tight tolerance)")


def worst_severity(*severities: str | None) -> str | None:
    """The worst of the given severities (None ignored; None when all are)."""
    known = [s for s in severities if s]
    return min(known, key=SEVERITIES.index) if known else None
GATE_OPS = ("<", "<=", ">", ">=", "==", "in")
SEEDS = {
    "000_7634b58bbee437f3.txt",
    "001_1dec206837da3656.txt",
    "002_246153a871eb2e2f.txt",
    "003_4301ea661b89248c.txt",
    "004_7fb0ad4f8a70eeae.txt",
}
_ID_RE = re.compile(r"^(?P<prefix>[A-Z]+)-(?P<section>[A-Z0-9]+(?:-[A-Z0-9]+)*)-(?P<n>\d+)$")
_REQUIRED = ("id", "title", "kind", "level", "statement", "source", "tolerance")


class SpecError(ValueError):
    """A spec file breaks the schema; the message names the file, the line and the clause or field."""


_SOURCE = {"type": "object", "required": ["seed", "section"],
           "properties": {"seed": {"type": "string"}, "section": {"type": "string", "minLength": 1}}}
CLAUSE_SCHEMA = {
    "type": "object",
    "required": list(_REQUIRED),
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string"}, "title": {"type": "string", "minLength": 1},
        "kind": {"enum": list(KINDS)}, "level": {"enum": list(LEVELS)},
        "statement": {"type": "string", "minLength": 1}, "source": _SOURCE,
        "tolerance": {"type": "string"}, "formula": {"type": "string"},
        "errata": {"type": "string"}, "notes": {"type": "string"}, "value": {"type": "object"},
        "exact_because": {"type": "string", "minLength": 1},
        "gate": {"type": "object", "required": ["metric", "op", "threshold"],
                 "properties": {"metric": {"type": "string"}, "op": {"enum": list(GATE_OPS)}}},
        "implemented_by": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "deprecated": {"type": "boolean"}, "audited": {"type": "boolean"},
        "normative": {"type": "string", "minLength": 1},
        "conventions": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
}
FAMILY_SCHEMA = {
    "type": "object",
    "required": ["family", "document", "clauses"],
    "additionalProperties": False,
    "properties": {
        "family": {"enum": list(FAMILIES)},
        "name": {"type": "string"},
        "document": {"type": "object", "required": ["title", "version", "seed"]},
        "related": {"type": "array", "items": {"type": "object"}},
        "checklist": {"type": "array", "items": {
            "type": "object", "required": ["title", "clauses"], "additionalProperties": False,
            "properties": {"title": {"type": "string"}, "source": _SOURCE,
                           "clauses": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}},
        "clauses": {"type": "array", "items": CLAUSE_SCHEMA},
    },
}
TOLERANCES_SCHEMA = {
    "type": "object",
    "required": ["exact"],
    "additionalProperties": {
        "type": "object",
        "properties": {"description": {"type": "string"}},
        "additionalProperties": {"type": "object", "required": ["rtol", "atol"], "additionalProperties": False,
                                 "properties": {"rtol": {"type": "number", "minimum": 0},
                                                "atol": {"type": "number", "minimum": 0}}},
    },
}


_CONVENTION_ID = r"^[a-z][a-z0-9_]*$"
CONVENTIONS_SCHEMA = {
    "type": "object",
    "required": ["conventions"],
    "additionalProperties": False,
    "properties": {"conventions": {"type": "array", "items": {
        "type": "object",
        "required": ["id", "title", "seed", "allowed", "clauses", "source", "normative", "alternatives"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "string", "pattern": _CONVENTION_ID},
            "title": {"type": "string", "minLength": 1},
            "seed": {},
            "seed_by_clause": {"type": "object"},
            "allowed": {"type": "object"},
            "clauses": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"type": "string"}},
            "source": {"type": "array", "minItems": 1, "items": _SOURCE},
            "normative": {"type": "string", "minLength": 1},
            "alternatives": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["when", "consequence"], "additionalProperties": False,
                "properties": {"when": {}, "consequence": {"type": "string", "minLength": 1}}}},
        }}}},
}


def _read(path: Path, schema: Mapping[str, Any]) -> tuple[Any, dict]:
    """Parse and schema-check one spec file; every problem becomes a SpecError naming file:line: field."""
    try:
        data, lines = load_yaml(path)
        validate(data, schema, path.name, lines)
    except YamlFileError as e:
        raise SpecError(str(e).replace(str(path), path.name, 1)) from None
    return data, lines


@dataclasses.dataclass(frozen=True)
class Tolerance:
    name: str
    description: str
    per_dtype: Mapping[str, Mapping[str, float]]

    @property
    def exact(self) -> bool:
        return not self.per_dtype

    def for_dtype(self, dtype: str) -> tuple[float, float]:
        """(rtol, atol) for a dtype name such as 'float64'; exact tolerances give (0, 0)."""
        if self.exact:
            return 0.0, 0.0
        if dtype not in self.per_dtype:
            raise SpecError(f"tolerance {self.name!r} has no entry for dtype {dtype}")
        t = self.per_dtype[dtype]
        return float(t["rtol"]), float(t["atol"])


@dataclasses.dataclass(frozen=True)
class Clause:
    id: str
    family: str
    title: str
    kind: str
    level: str
    statement: str
    source: Mapping[str, str]
    tolerance: Tolerance
    formula: str | None = None
    errata: str | None = None
    value: Any = None
    gate: Mapping[str, Any] | None = None
    implemented_by: tuple[str, ...] = ()
    deprecated: bool = False
    # false: no operation of the contract reaches the clause; only the reference's own machinery is checked
    # against it (go-live gates on training runs, the STDB store), so an audit leaves it out of its verdict
    audited: bool = True
    notes: str | None = None
    normative: str | None = None
    conventions: tuple[str, ...] = ()
    exact_because: str | None = None

    @property
    def section(self) -> str:
        return _ID_RE.match(self.id).group("section")

    @property
    def binding(self) -> bool:
        """Whether a failure of this clause fails the audit (see :data:`BINDING_KINDS`)."""
        return self.level == "MUST" or self.kind in BINDING_KINDS


@dataclasses.dataclass(frozen=True)
class Convention:
    """A choice the seeds make that an implementation may declare otherwise (spec/conventions.yaml)."""

    id: str
    title: str
    seed: Any
    allowed: Mapping[str, Any]
    clauses: tuple[str, ...]
    source: tuple[Mapping[str, str], ...]
    normative: str
    alternatives: tuple[Mapping[str, Any], ...]
    seed_by_clause: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def seed_for(self, clause_ids: Iterable[str] = ()) -> Any:
        """The seed's value for the first of ``clause_ids`` that fixes its own, else the convention's seed."""
        return next((self.seed_by_clause[c] for c in clause_ids if c in self.seed_by_clause), self.seed)

    def allows(self, value: Any) -> bool:
        import jsonschema

        return jsonschema.Draft202012Validator(self.allowed).is_valid(value)

    def consequence(self, value: Any) -> str:
        """The documented consequence of declaring ``value``: every alternative it matches, in file order.

        ``when`` matches a value equal to it, a mapping containing its items, or ("*") any value no
        other alternative names.
        """
        def hit(when):
            if isinstance(when, Mapping) and isinstance(value, Mapping):
                return all(k in value and _same_value(value[k], v) for k, v in when.items())
            return _same_value(value, when)

        named = [a["consequence"] for a in self.alternatives if a["when"] != "*" and hit(a["when"])]
        if isinstance(value, Mapping):  # a structured value also names its free fields (eps...)
            fixed = {k for a in self.alternatives if isinstance(a["when"], Mapping) for k in a["when"]}
            seed = self.seed if isinstance(self.seed, Mapping) else {}
            free = any(not _same_value(value.get(k), seed.get(k)) for k in set(value) - fixed)
        else:
            free = not named
        rest = [a["consequence"] for a in self.alternatives if a["when"] == "*"] if free else []
        return " ".join(" ".join(str(c).split()) for c in named + rest)


def _same_value(a: Any, b: Any) -> bool:
    """Equality that treats 1 and 1.0 alike but keeps True apart from 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same_value(a[k], b[k]) for k in a)
    return a == b


def same_value(a: Any, b: Any) -> bool:
    """Whether a declared convention value equals the seed's (1 == 1.0, mappings compared by items)."""
    return _same_value(a, b)


@dataclasses.dataclass(frozen=True)
class ChecklistItem:
    title: str
    source: Mapping[str, str]
    clauses: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    family: str
    name: str
    document: Mapping[str, str]
    clauses: tuple[Clause, ...]
    related: tuple[Mapping[str, str], ...] = ()
    checklist: tuple[ChecklistItem, ...] = ()
    path: str = ""

    @property
    def version(self) -> str:
        return str(self.document.get("version", ""))


@dataclasses.dataclass(frozen=True)
class Spec:
    families: Mapping[str, FamilySpec]
    tolerances: Mapping[str, Tolerance]
    conventions: Mapping[str, Convention] = dataclasses.field(default_factory=dict)

    def convention(self, convention_id: str) -> Convention:
        try:
            return self.conventions[convention_id]
        except KeyError:
            raise SpecError(f"unknown convention {convention_id!r} (known: {', '.join(sorted(self.conventions))})") from None

    @functools.cached_property
    def clauses(self) -> dict[str, Clause]:
        return {c.id: c for f in self.families.values() for c in f.clauses}

    def clause(self, clause_id: str) -> Clause:
        try:
            return self.clauses[clause_id]
        except KeyError:
            raise SpecError(f"unknown clause id {clause_id!r}") from None

    def family_of(self, clause_id: str) -> str:
        return self.clause(clause_id).family

    def versions(self) -> dict[str, str]:
        return {name: f.version for name, f in self.families.items()}


def spec_dir() -> Path:
    """The directory holding the spec files (the repo's spec/ in a checkout, package data when installed)."""
    return Path(str(resources.files("rlconform.spec")))


def _check_formula(where: str, formula: Any) -> None:
    if not isinstance(formula, str) or not formula.strip():
        raise SpecError(f"{where}: 'formula' must be a non-empty LaTeX string")
    if "$" in formula:
        raise SpecError(f"{where}: 'formula' is bare LaTeX; drop the $ delimiters")
    depth = 0
    for i, ch in enumerate(formula):
        if ch == "{" and (i == 0 or formula[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or formula[i - 1] != "\\"):
            depth -= 1
            if depth < 0:
                raise SpecError(f"{where}: 'formula' closes a brace it never opened")
    if depth:
        raise SpecError(f"{where}: 'formula' has {depth} unclosed brace(s)")
    if len(re.findall(r"\\left(?![a-zA-Z])", formula)) != len(re.findall(r"\\right(?![a-zA-Z])", formula)):
        raise SpecError(rf"{where}: 'formula' has unbalanced \left/\right")


# Why bit-equality holds for a whole kind of clause; a formula or rule clause that demands it says why itself
# (``exact_because``): a reduction runs in another order on a GPU, so its last bit is no clause's business.
EXACT_BY_KIND = {
    "input": "the verdict is whether the input is rejected, not a computed value",
    "default": "a default is a configured value, compared as written",
    "gate": "a gate's threshold is a configured value, compared as written",
}


def _check_exactness(where: str, raw: Mapping[str, Any], tol: Tolerance) -> None:
    if not tol.exact:
        if raw.get("exact_because"):
            raise SpecError(f"{where}: 'exact_because' explains an exact tolerance, but the tolerance is {tol.name!r}")
        return
    if raw["kind"] not in EXACT_BY_KIND and not raw.get("exact_because"):
        raise SpecError(f"{where}: a {raw['kind']} clause with tolerance 'exact' must say why bit-equality holds "
                        "on every device ('exact_because': booleans, indices, counts, a value copied or compared "
                        "with itself); a floating reduction takes a tolerance class")


def exact_reason(clause: "Clause") -> str | None:
    """Why ``clause`` may demand bit-equality (None when its tolerance is not exact)."""
    if not clause.tolerance.exact:
        return None
    return clause.exact_because or EXACT_BY_KIND.get(clause.kind)


def _load_tolerances(path: Path) -> dict[str, Tolerance]:
    raw, _ = _read(path, TOLERANCES_SCHEMA)
    out = {}
    for name, body in raw.items():
        body = dict(body or {})
        desc = body.pop("description", "")
        if body and (missing := [d for d in DTYPES if d not in body]):
            raise SpecError(f"{path.name}: tolerance {name!r} has no entry for {', '.join(missing)} (a class "
                            f"that is not exact gives rtol and atol for each of {', '.join(DTYPES)})")
        if unknown := sorted(set(body) - set(DTYPES)):
            raise SpecError(f"{path.name}: tolerance {name!r} names unknown dtype(s) {', '.join(unknown)}")
        out[name] = Tolerance(name, desc, body)
    return out


def _parse_clause(where: str, family: str, raw: Mapping[str, Any], tolerances) -> Clause:
    missing = [k for k in _REQUIRED if k not in raw or raw[k] in (None, "")]
    if missing:
        raise SpecError(f"{where}: missing field(s) {', '.join(missing)}")
    unknown = set(raw) - {f.name for f in dataclasses.fields(Clause)} - {"implemented_by"}
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    cid = raw["id"]
    m = _ID_RE.match(str(cid))
    if not m or m.group("prefix") != ID_PREFIX[family]:
        raise SpecError(f"{where}: id {cid!r} must look like {ID_PREFIX[family]}-SECTION-N")
    if raw["level"] not in LEVELS:
        raise SpecError(f"{where}: level must be one of {LEVELS}, got {raw['level']!r}")
    if raw["kind"] not in KINDS:
        raise SpecError(f"{where}: kind must be one of {KINDS}, got {raw['kind']!r}")
    src = raw["source"]
    if not isinstance(src, Mapping) or not src.get("seed") or not src.get("section"):
        raise SpecError(f"{where}: source needs 'seed' (file name) and 'section' (original heading)")
    if src["seed"] not in SEEDS:
        raise SpecError(f"{where}: source seed {src['seed']!r} is not one of the five documents")
    if raw["tolerance"] not in tolerances:
        raise SpecError(
            f"{where}: unknown tolerance {raw['tolerance']!r} (known: {', '.join(sorted(tolerances))})"
        )
    if raw.get("formula") is not None:
        _check_formula(where, raw["formula"])
    _check_exactness(where, raw, tolerances[raw["tolerance"]])
    if raw["kind"] == "default":
        if not isinstance(raw.get("value"), Mapping) or not raw["value"]:
            raise SpecError(f"{where}: a default clause needs 'value', a mapping of defaults() keys to values")
        for k, v in raw["value"].items():
            if isinstance(v, str) and re.fullmatch(r"[-+]?[0-9.]+[eE][0-9]+", v):
                raise SpecError(f"{where}: value {k}={v!r} is a string to YAML; write the exponent with a sign (1.0e+9)")
    if raw["kind"] == "gate":
        gate = raw.get("gate")
        if not isinstance(gate, Mapping) or not {"metric", "op", "threshold"} <= set(gate):
            raise SpecError(f"{where}: a gate clause needs gate: {{metric, op, threshold}}")
        if gate["op"] not in GATE_OPS:
            raise SpecError(f"{where}: gate op must be one of {GATE_OPS}")
        if gate.get("aggregate", "last") not in AGGREGATES:
            raise SpecError(f"{where}: gate aggregate must be one of {AGGREGATES}")
    impl = raw.get("implemented_by") or ()
    if isinstance(impl, str):
        impl = (impl,)
    fields = dict(raw)
    fields.update(
        conventions=tuple(raw.get("conventions") or ()),
        normative=" ".join(str(raw["normative"]).split()) if raw.get("normative") else None,
        family=family,
        tolerance=tolerances[raw["tolerance"]],
        implemented_by=tuple(impl),
        statement=" ".join(str(raw["statement"]).split()),
        exact_because=" ".join(str(raw["exact_because"]).split()) if raw.get("exact_because") else None,
    )
    return Clause(**fields)


def _load_family(path: Path, tolerances) -> FamilySpec:
    raw, lines = _read(path, FAMILY_SCHEMA)
    where = path.name
    family = raw.get("family")
    if path.stem != family:
        raise SpecError(f"{where}: 'family' must be the file's stem and one of {FAMILIES}")
    doc = raw["document"]
    clauses = []
    for i, c in enumerate(raw.get("clauses") or []):
        cw = f"{where}:{lines.get(('clauses', i), '?')}: clause #{i + 1} ({c.get('id', '?')})"
        clauses.append(_parse_clause(cw, family, c, tolerances))
    ids = [c.id for c in clauses]
    for i, cid in enumerate(ids):
        if cid in ids[:i]:
            raise SpecError(f"{where}:{lines.get(('clauses', i), '?')}: duplicate clause id {cid} "
                            f"(first at line {lines.get(('clauses', ids.index(cid)), '?')})")
    checklist = []
    for i, item in enumerate(raw.get("checklist") or []):
        unknown = [c for c in item.get("clauses", []) if c not in ids]
        if unknown:
            at = lines.get(("checklist", i), "?")
            raise SpecError(f"{where}:{at}: checklist item {item.get('title')!r} names unknown clause(s) {unknown}")
        checklist.append(ChecklistItem(item["title"], item.get("source", {}), tuple(item["clauses"])))
    return FamilySpec(
        family=family,
        name=raw.get("name", family),
        document=doc,
        clauses=tuple(clauses),
        related=tuple(raw.get("related") or ()),
        checklist=tuple(checklist),
        path=str(path),
    )


def _load_conventions(path: Path) -> tuple[dict[str, Convention], dict]:
    if not path.exists():
        return {}, {}
    raw, lines = _read(path, CONVENTIONS_SCHEMA)
    out: dict[str, Convention] = {}
    for i, c in enumerate(raw["conventions"]):
        where = f"{path.name}:{lines.get(('conventions', i), '?')}: convention {c['id']}"
        if c["id"] in out:
            raise SpecError(f"{where}: duplicate convention id")
        conv = Convention(id=c["id"], title=c["title"], seed=c["seed"], allowed=c["allowed"],
                          clauses=tuple(c["clauses"]), source=tuple(c["source"]),
                          normative=" ".join(c["normative"].split()), alternatives=tuple(c["alternatives"]),
                          seed_by_clause=dict(c.get("seed_by_clause") or {}))
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(conv.allowed)
        except jsonschema.SchemaError as e:
            raise SpecError(f"{where}: 'allowed' is not a JSON Schema: {e.message}") from None
        for src in conv.source:
            if src["seed"] not in SEEDS:
                raise SpecError(f"{where}: source seed {src['seed']!r} is not one of the five documents")
        stray = sorted(set(conv.seed_by_clause) - set(conv.clauses))
        if stray:
            raise SpecError(f"{where}: seed_by_clause names clause(s) {stray} missing from its clauses")
        for label, value in [("seed", conv.seed), *((f"seed_by_clause.{k}", v) for k, v in conv.seed_by_clause.items()),
                             *((f"alternative {a['when']!r}", a["when"]) for a in conv.alternatives
                               if a["when"] != "*" and not isinstance(a["when"], Mapping))]:
            if not conv.allows(value):
                raise SpecError(f"{where}: {label} {value!r} is not among its allowed values")
        out[conv.id] = conv
    return out, lines


def _check_conventions(conventions: Mapping[str, Convention], lines: Mapping, families) -> dict[str, Convention]:
    """Every convention names existing clauses that list it back, and every convention a clause lists exists.

    Returns the conventions with their clauses completed by the clauses that list them (a clause file
    may add itself to a convention without editing conventions.yaml)."""
    clauses = {c.id: (f, c) for f in families.values() for c in f.clauses}
    for i, conv in enumerate(conventions.values()):
        where = f"conventions.yaml:{lines.get(('conventions', i), '?')}: convention {conv.id}"
        unknown = [c for c in conv.clauses if c not in clauses]
        if unknown:
            raise SpecError(f"{where}: names unknown clause(s) {unknown}")
        unlisted = [c for c in conv.clauses if conv.id not in clauses[c][1].conventions]
        if unlisted:
            raise SpecError(f"{where}: clause(s) {unlisted} do not list it under 'conventions:'")
    for fam, clause in clauses.values():
        for cid in clause.conventions:
            if cid not in conventions:
                raise SpecError(f"{Path(fam.path).name}: clause {clause.id} lists unknown convention {cid!r}")
    listing = {cid: [c.id for _, c in clauses.values() if cid in c.conventions] for cid in conventions}
    return {cid: dataclasses.replace(conv, clauses=tuple(dict.fromkeys((*conv.clauses, *listing[cid]))))
            for cid, conv in conventions.items()}


def load_spec(directory: str | Path | None = None) -> Spec:
    """Read and validate every family file; raise :class:`SpecError` on the first problem."""
    d = Path(directory) if directory is not None else spec_dir()
    tolerances = _load_tolerances(d / "tolerances.yaml")
    families = {}
    for fam in FAMILIES:
        p = d / f"{fam}.yaml"
        if p.exists():
            families[fam] = _load_family(p, tolerances)
    all_ids: dict[str, str] = {}
    for f in families.values():
        for c in f.clauses:
            if c.id in all_ids:
                raise SpecError(f"duplicate clause id {c.id} in {all_ids[c.id]} and {f.family}.yaml")
            all_ids[c.id] = f"{f.family}.yaml"
    conventions, conv_lines = _load_conventions(d / "conventions.yaml")
    conventions = _check_conventions(conventions, conv_lines, families)
    return Spec(families=families, tolerances=tolerances, conventions=conventions)


@functools.lru_cache(maxsize=1)
def default_spec() -> Spec:
    return load_spec()


def clauses_of(spec: Spec, families: Iterable[str] | None = None) -> list[Clause]:
    fams = list(families) if families else list(spec.families)
    return [c for f in fams if f in spec.families for c in spec.families[f].clauses]
