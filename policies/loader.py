"""Load policy files and report every problem as ``FILE:LINE:COL: field.path: message``.

Design:

* Text in, :class:`~policies.model.Policy` out. The only file access is :func:`read_sources`, a
  small function at the edge; everything else takes :class:`Source` values (name + text), so the
  engine, the CLI, tests and hot reload share one code path.
* ruamel.yaml's round-trip loader keeps the line and column of every key and value. While the
  YAML is turned into plain data, each path (``("spec", "services", "chat", "slo")``) is recorded
  with the position of its key and of its value. pydantic's error ``loc`` is the same path (the
  model uses the authors' camelCase aliases), so each error is placed by looking its path up;
  an error about a missing field points at the parent key.
* Several files (or several ``---`` documents) merge into one policy: ``spec.pools`` and
  ``spec.services`` are unions by name, ``spec.protectedNamespaces`` is concatenated, and any
  other key defined twice is a conflict, reported at the second definition with the first one's
  position. Merging happens before validation, so positions survive it.
* Every problem is collected (YAML syntax, merge conflicts, schema errors, undefined pools) and
  reported together, sorted by file and position, as KEDA joins its validation errors.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from policies.model import Loc, Policy, format_loc
from policies.policy_errors import PoliciesError

__all__ = [
    "PolicyError",
    "PolicyLoadError",
    "Source",
    "check_policy",
    "check_values",
    "load_policy",
    "load_policy_text",
    "read_sources",
    "validate_document",
]

_M = TypeVar("_M", bound=BaseModel)
_MERGED_MAPS: Final = frozenset({"pools", "services"})
_CONCATENATED: Final = frozenset({"protectedNamespaces"})


@dataclass(frozen=True, slots=True)
class Source:
    """One policy document: where it came from (for messages) and its text."""

    name: str
    text: str


@dataclass(frozen=True, slots=True, order=True)
class PolicyError:
    """One problem in a policy, placed in its file (1-based line and column)."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}:{self.col}: {where}{self.message}"


class PolicyLoadError(PoliciesError):
    """A policy was refused; ``errors`` holds every problem found."""

    def __init__(self, errors: Sequence[PolicyError]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


@dataclass(frozen=True, slots=True)
class _Pos:
    file: str
    line: int
    col: int


@dataclass(slots=True)
class _Positions:
    """Where each path's key (or list item) and value were written."""

    keys: dict[Loc, _Pos]
    values: dict[Loc, _Pos]

    def find(self, loc: Loc, *, prefer_key: bool) -> tuple[_Pos | None, Loc]:
        """The best position for ``loc``: itself if written, else its nearest written ancestor."""
        for end in range(len(loc), -1, -1):
            path = loc[:end]
            exact = end == len(loc)
            order = (
                (self.keys, self.values) if (prefer_key or not exact) else (self.values, self.keys)
            )
            for table in order:
                if path in table:
                    return table[path], path
        return None, ()


def read_sources(paths: Iterable[str | Path]) -> list[Source]:
    """Read policy files: the loader's only I/O. Unreadable files raise PolicyLoadError."""
    sources: list[Source] = []
    errors: list[PolicyError] = []
    for path in paths:
        try:
            sources.append(Source(str(path), Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(PolicyError(str(path), 1, 1, "", f"cannot read: {exc}"))
    if errors:
        raise PolicyLoadError(errors)
    return sources


def load_policy(sources: Sequence[Source]) -> Policy:
    """Merge and validate ``sources``; raise :class:`PolicyLoadError` with every problem."""
    policy, errors = check_policy(sources)
    if errors or policy is None:
        raise PolicyLoadError(errors)
    return policy


def load_policy_text(text: str, name: str = "<policy>") -> Policy:
    """Load one policy document from a string."""
    return load_policy([Source(name, text)])


def check_policy(sources: Sequence[Source]) -> tuple[Policy | None, list[PolicyError]]:
    """The policy (when valid) and the sorted list of every problem found."""
    if not sources:
        return None, [PolicyError("<none>", 1, 1, "", "no policy files given")]
    errors: list[PolicyError] = []
    fragments: list[tuple[CommentedMap, str]] = []
    yaml = YAML(typ="rt")
    for source in sources:
        try:
            docs = [d for d in yaml.load_all(source.text) if d is not None]
        except YAMLError as exc:
            errors.append(_yaml_error(source, exc))
            continue
        if not docs:
            errors.append(PolicyError(source.name, 1, 1, "", "empty document"))
        for doc in docs:
            if not isinstance(doc, CommentedMap):
                line, col = _node_pos(doc)
                errors.append(PolicyError(source.name, line, col, "", "a policy is a mapping"))
            else:
                fragments.append((doc, source.name))
    if not fragments:
        return None, sorted(errors)
    return _check_fragments(fragments, errors)


def check_values(sources: Sequence[Source]) -> tuple[Policy | None, list[PolicyError]]:
    """The policy the Helm chart would give the controller from these values files, checked
    like policy files, with each problem placed in its values file.

    The chart's selection (``ebbtide.policies`` in helm/ebbtide/templates/_helpers.tpl): the
    documents under ``policies``, by file name; ``defaultPolicies`` too when ``policies`` is
    empty or ``mergeDefaultPolicies`` is true; an empty document is skipped. Helm merges
    several values files key by key, so a document of one name given in two files is refused
    here rather than merged: keep each policy in one file."""
    errors: list[PolicyError] = []
    tables: dict[str, dict[str, tuple[Any, str]]] = {"policies": {}, "defaultPolicies": {}}
    merge_defaults = False
    yaml = YAML(typ="rt")
    for source in sources:
        try:
            doc = yaml.load(source.text)
        except YAMLError as exc:
            errors.append(_yaml_error(source, exc))
            continue
        if doc is None:
            continue
        if not isinstance(doc, CommentedMap):
            line, col = _node_pos(doc)
            errors.append(PolicyError(source.name, line, col, "", "values are a mapping"))
            continue
        merge_defaults = doc.get("mergeDefaultPolicies", merge_defaults) is True
        for key, table in tables.items():
            entries = doc.get(key)
            if entries is None:
                continue
            if not isinstance(entries, CommentedMap):
                line, col = doc.lc.value(key)
                errors.append(
                    PolicyError(source.name, line + 1, col + 1, key, "a mapping of file names")
                )
                continue
            for name, policy_doc in entries.items():
                kline, kcol = entries.lc.key(name)
                if name in table:
                    errors.append(
                        PolicyError(
                            source.name, kline + 1, kcol + 1, f"{key}.{name}",
                            f"also given in {table[name][1]}; Helm would merge the two "
                            "mappings key by key: keep each policy in one values file",
                        )
                    )  # fmt: skip
                elif policy_doc is not None and not isinstance(policy_doc, CommentedMap):
                    errors.append(
                        PolicyError(
                            source.name, kline + 1, kcol + 1, f"{key}.{name}",
                            "a policy document is a mapping (apiVersion, kind, metadata, spec)",
                        )
                    )  # fmt: skip
                else:
                    table[name] = (policy_doc, source.name)
    chosen = dict(tables["policies"])
    if not chosen or merge_defaults:
        chosen = {**tables["defaultPolicies"], **chosen}
    fragments = [(doc, file) for _, (doc, file) in sorted(chosen.items()) if doc]
    if not fragments and not errors:
        names = ", ".join(s.name for s in sources) or "<none>"
        errors.append(
            PolicyError(
                names, 1, 1, "policies", "no policy documents (policies or defaultPolicies)"
            )
        )
    if not fragments:
        return None, sorted(errors)
    return _check_fragments(fragments, errors)


def _check_fragments(
    fragments: list[tuple[CommentedMap, str]], errors: list[PolicyError]
) -> tuple[Policy | None, list[PolicyError]]:
    """Merge parsed documents (each with its file name) and validate the result."""

    positions = _Positions({}, {})
    merged: dict[str, Any] = {}
    for doc, file in fragments:
        scratch = _Positions({}, {})
        data = _plain(doc, (), file, scratch)
        _merge(merged, data, scratch, file, positions, errors)
    first_file = fragments[0][1]

    try:
        policy: Policy | None = Policy.model_validate(merged)
    except ValidationError as exc:
        policy = None
        for err in exc.errors(include_url=False):
            errors.append(_place(err, positions, first_file, Policy))
        problems = _raw_reference_problems(merged)
    else:
        assert policy is not None
        problems = [(p.loc, p.message) for p in policy.problems()]
    for loc, message in problems:
        pos, _ = positions.find(loc, prefer_key=False)
        pos = pos or _Pos(first_file, 1, 1)
        errors.append(PolicyError(pos.file, pos.line, pos.col, format_loc(loc), message))
    errors = sorted(set(errors))
    return (policy if not errors else None), errors


def validate_document(model: type[_M], source: Source) -> tuple[_M | None, list[PolicyError]]:
    """Validate one YAML document against any pydantic ``model`` with the same positioned
    errors as policies (case files use this)."""
    try:
        doc = YAML(typ="rt").load(source.text)
    except YAMLError as exc:
        return None, [_yaml_error(source, exc)]
    positions = _Positions({}, {})
    data = _plain(doc, (), source.name, positions)
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        errors = [_place(e, positions, source.name, model) for e in exc.errors(include_url=False)]
        return None, sorted(set(errors))


def _yaml_error(source: Source, exc: YAMLError) -> PolicyError:
    """A YAML syntax error, placed where the parser saw it when it says."""
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        return PolicyError(source.name, line, col, "", f"invalid YAML: {exc.problem or exc}")
    return PolicyError(source.name, 1, 1, "", f"invalid YAML: {exc}")


def _node_pos(node: object) -> tuple[int, int]:
    lc = getattr(node, "lc", None)
    if lc is None or lc.line is None:
        return 1, 1
    return lc.line + 1, lc.col + 1


def _plain(node: Any, loc: Loc, file: str, positions: _Positions) -> Any:
    """Plain Python data from a ruamel node, recording the position of every path below ``loc``."""
    if isinstance(node, CommentedMap):
        out: dict[Any, Any] = {}
        for key in node:
            child = (*loc, str(key))
            kline, kcol = node.lc.key(key)
            vline, vcol = node.lc.value(key)
            positions.keys.setdefault(child, _Pos(file, kline + 1, kcol + 1))
            positions.values.setdefault(child, _Pos(file, vline + 1, vcol + 1))
            out[str(key)] = _plain(node[key], child, file, positions)
        return out
    if isinstance(node, CommentedSeq):
        items: list[Any] = []
        for i, item in enumerate(node):
            line, col = node.lc.item(i)
            positions.keys.setdefault((*loc, i), _Pos(file, line + 1, col + 1))
            items.append(_plain(item, (*loc, i), file, positions))
        return items
    if isinstance(node, ScalarBoolean):
        return bool(node)
    if isinstance(node, bool | type(None)):
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _merge(
    merged: dict[str, Any],
    data: dict[str, Any],
    scratch: _Positions,
    file: str,
    positions: _Positions,
    errors: list[PolicyError],
) -> None:
    """Fold one fragment (positions in ``scratch``) into ``merged``; conflicts are reported at
    the second definition."""

    def keep(prefix: Loc) -> None:
        for table, into in ((scratch.keys, positions.keys), (scratch.values, positions.values)):
            for loc, pos in table.items():
                if loc[: len(prefix)] == prefix:
                    into.setdefault(loc, pos)

    def conflict(loc: Loc) -> None:
        first = positions.keys.get(loc)
        here = scratch.keys[loc]
        where = f" (first defined at {first.file}:{first.line}:{first.col})" if first else ""
        errors.append(
            PolicyError(file, here.line, here.col, format_loc(loc), f"defined twice{where}")
        )

    for key, value in data.items():
        if key == "metadata" and "metadata" in merged:
            continue  # the first file names the policy
        if key in ("apiVersion", "kind") and key in merged:
            if merged[key] != value:
                conflict((key,))
            continue
        if key != "spec" or not isinstance(value, dict) or not isinstance(merged.get("spec"), dict):
            if key in merged:
                conflict((key,))
            else:
                merged[key] = value
                keep((key,))
            continue
        spec = merged["spec"]
        for skey, svalue in value.items():
            loc: Loc = ("spec", skey)
            if skey not in spec:
                spec[skey] = svalue
                keep(loc)
            elif skey in _MERGED_MAPS and isinstance(svalue, dict) and isinstance(spec[skey], dict):
                for name, entry in svalue.items():
                    if name in spec[skey]:
                        conflict((*loc, name))
                    else:
                        spec[skey][name] = entry
                        keep((*loc, name))
            elif (
                skey in _CONCATENATED and isinstance(svalue, list) and isinstance(spec[skey], list)
            ):
                offset = len(spec[skey])
                for i, item in enumerate(svalue):
                    spec[skey].append(item)
                    if (*loc, i) in scratch.keys:
                        positions.keys.setdefault((*loc, offset + i), scratch.keys[(*loc, i)])
            else:
                conflict(loc)


def _place(
    err: Any, positions: _Positions, first_file: str, model: type[BaseModel] = Policy
) -> PolicyError:
    """Turn one pydantic error into a positioned :class:`PolicyError`."""
    loc: Loc = tuple(p for p in err["loc"] if p != "[key]")
    kind = err["type"]
    message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind == "extra_forbidden":
        message = "unknown key" + _suggest(loc, model)
    elif kind == "missing":
        message = "required key is missing"
    is_container = isinstance(err.get("input"), dict | list)
    prefer_key = kind in ("extra_forbidden", "missing") or is_container
    pos, _found = positions.find(loc, prefer_key=prefer_key)
    pos = pos or _Pos(first_file, 1, 1)
    return PolicyError(pos.file, pos.line, pos.col, format_loc(loc), message)


def _suggest(loc: Loc, model: type[BaseModel]) -> str:
    """``" (did you mean 'objectiveMs'?)"`` for a misspelt key, from the model's aliases."""
    allowed = _allowed_keys(model, loc[:-1])
    if not allowed:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (allowed: {', '.join(sorted(allowed))})"


def _allowed_keys(model: type[BaseModel], loc: Loc) -> list[str]:
    """The keys the model accepts at ``loc`` (following nested models, dicts and lists)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            fields = {(f.alias or n): f for n, f in current.model_fields.items()}
            if str(part) not in fields:
                return []
            current = fields[str(part)].annotation
        elif typing.get_origin(current) is dict:
            current = typing.get_args(current)[1]
        elif typing.get_origin(current) is list:
            current = typing.get_args(current)[0]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [(f.alias or n) for n, f in current.model_fields.items()]
    return []


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``X | None`` to the interesting type."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _raw_reference_problems(data: dict[str, Any]) -> list[tuple[Loc, str]]:
    """Undefined-pool references in data that failed schema validation (so they are reported
    together with the schema errors rather than after the author fixes those)."""
    spec = data.get("spec")
    if not isinstance(spec, dict):
        return []
    pools = spec.get("pools")
    names = set(pools) if isinstance(pools, dict) else set()
    known = ", ".join(sorted(names)) or "none"
    out: list[tuple[Loc, str]] = []

    def check(loc: Loc, ref: object) -> None:
        if isinstance(ref, str) and ref not in names:
            out.append((loc, f"undefined pool {ref!r} (pools: {known})"))

    services = spec.get("services")
    if isinstance(services, dict):
        for name, svc in services.items():
            if isinstance(svc, dict):
                check(("spec", "services", name, "pool"), svc.get("pool"))
    training = spec.get("training")
    if isinstance(training, dict) and isinstance(training.get("pools"), list):
        for i, ref in enumerate(training["pools"]):
            check(("spec", "training", "pools", i), ref)
    mig = spec.get("mig")
    if isinstance(mig, dict):
        check(("spec", "mig", "fromPool"), mig.get("fromPool"))
        check(("spec", "mig", "toPool"), mig.get("toPool"))
    return out
