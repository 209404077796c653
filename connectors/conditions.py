"""Approval conditions: a small, safe expression language over an action's declared params.

``approval: {when: "amount > 500 and currency in ['EUR', 'USD']"}`` is parsed with Python's
``ast`` in eval mode and only these nodes are accepted; nothing is ever passed to ``eval``::

    expression  := or
    or / and    := a `or` b | a `and` b | `not` a | (a)
    comparison  := operand (== | != | < | <= | > | >= | in | not in) operand  (chains: 1 < x <= 5)
    operand     := a param name | a literal: number, "text", true/false (True/False), null (None)
                   | a list or tuple of literals (for `in`) | -number
    a bare name :  a boolean param (``urgent``)

No attribute access, subscripts, calls, arithmetic, comprehensions or lambdas. The text is
bounded in length (``MAX_LENGTH``) and its tree in depth (``MAX_DEPTH``) before anything walks it.

At run time a param the intent left out is ``None``: ``==``/``!=``/``in`` compare it as such, and
an ordering (``<`` ...) with it, or between values of different kinds, is false.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class FieldSpec(Protocol):
    """What a condition is checked against: ``connectors.spec.FieldSpec`` (not imported: spec
    imports this module to parse conditions)."""

    @property
    def type(self) -> str: ...

    @property
    def values(self) -> list[Any] | None: ...

    @property
    def items(self) -> FieldSpec | None: ...


MAX_LENGTH = 1000  # characters of a condition
MAX_DEPTH = 24  # nesting of its tree
MAX_LIST = 100  # literals in one list

_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_EQUAL = (ast.Eq, ast.NotEq)
_MEMBER = (ast.In, ast.NotIn)
_SYMBOL = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
}
# literal words a YAML author writes, as Python's own
_WORDS = {"true": True, "false": False, "null": None}


class ConditionError(ValueError):
    """The text is not a condition this language accepts; the message says why."""


@dataclass(frozen=True)
class Condition:
    """A parsed, checked condition; ``evaluate`` runs it over an intent's params."""

    text: str
    tree: ast.expr
    names: frozenset[str]

    def evaluate(self, params: Mapping[str, Any]) -> bool:
        return _truth(_eval(self.tree, params))

    def type_problems(self, fields: Mapping[str, FieldSpec]) -> list[str]:
        """What the condition gets wrong about ``fields`` (the action's declared input): a name
        not declared there, a comparison of values of different kinds, a non-boolean used as a
        condition."""
        problems: list[str] = []
        _check(self.tree, fields, problems, want_bool=True)
        return list(dict.fromkeys(problems))


def parse_condition(text: Any) -> Condition:
    """Parse and check ``text``.

    Raises:
        ConditionError: not a string, too long, not valid syntax, too deep, or uses something
            the language does not have.
    """
    if not isinstance(text, str):
        raise ConditionError('a condition must be a string, e.g. "amount > 500"')
    if not text.strip():
        raise ConditionError("the condition is empty")
    if len(text) > MAX_LENGTH:
        raise ConditionError(f"the condition is {len(text)} characters; at most {MAX_LENGTH}")
    try:
        module = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"cannot parse {text!r}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ConditionError("the condition nests too deeply") from None
    names: set[str] = set()
    _accept(module.body, 1, names)
    return Condition(text, module.body, frozenset(names))


def _accept(node: ast.AST, depth: int, names: set[str]) -> None:
    """Refuse anything outside the language, and trees deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ConditionError(f"the condition nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, ast.BoolOp) and isinstance(node.op, (ast.And, ast.Or)):
        for value in node.values:
            _accept(value, depth + 1, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _accept(node.operand, depth + 1, names)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        if not (isinstance(node.operand, ast.Constant) and _is_number(node.operand.value)):
            raise ConditionError("'-' only goes before a number")
    elif isinstance(node, ast.Compare):
        if not all(isinstance(op, (*_ORDER, *_EQUAL, *_MEMBER)) for op in node.ops):
            raise ConditionError("only ==, !=, <, <=, >, >=, in and not in compare values")
        for operand in (node.left, *node.comparators):
            if isinstance(operand, (ast.BoolOp, ast.Compare)) or (
                isinstance(operand, ast.UnaryOp) and isinstance(operand.op, ast.Not)
            ):
                raise ConditionError("compare a param with a value; combine comparisons with and/or")
            _accept(operand, depth + 1, names)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        if node.id not in _WORDS:
            names.add(node.id)
    elif isinstance(node, ast.Constant):
        if not (node.value is None or isinstance(node.value, (bool, int, float, str))):
            raise ConditionError(f"{node.value!r} is not a literal this language has")
    elif isinstance(node, (ast.List, ast.Tuple)):
        if len(node.elts) > MAX_LIST:
            raise ConditionError(f"a list holds at most {MAX_LIST} values")
        for element in node.elts:
            if not isinstance(element, (ast.Constant, ast.UnaryOp, ast.Name)) or (
                isinstance(element, ast.Name) and element.id not in _WORDS
            ):
                raise ConditionError("a list holds literals only")
            _accept(element, depth + 1, names)
    else:
        raise ConditionError(
            f"{type(node).__name__.lower()} is not allowed in a condition (only comparisons, and/or/not, in)"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# -- evaluation ---------------------------------------------------------------------------------


def _eval(node: ast.expr, params: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_truth(_eval(v, params)) for v in node.values)
        return any(_truth(_eval(v, params)) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            return not _truth(_eval(node.operand, params))
        value = node.operand.value if isinstance(node.operand, ast.Constant) else None
        assert isinstance(value, (int, float))  # _accept lets '-' stand only before a number
        return -value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, params)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, params)
            if not _compare(op, left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        if node.id in _WORDS:
            return _WORDS[node.id]
        return params.get(node.id)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, params) for e in node.elts]
    raise ConditionError(f"{type(node).__name__} cannot be evaluated")  # refused by _accept already


def _truth(value: Any) -> bool:
    return value is True  # a bare name is true only when it is the boolean true


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    if isinstance(op, _MEMBER):
        if isinstance(right, list):
            found = any(_kind(left) == _kind(v) and left == v for v in right)
        elif isinstance(right, str) and isinstance(left, str):
            found = left in right
        else:
            found = False
        return found if isinstance(op, ast.In) else not found
    if isinstance(op, _EQUAL):
        same = _kind(left) == _kind(right) and left == right
        return same if isinstance(op, ast.Eq) else not same
    if left is None or right is None or _kind(left) != _kind(right) or _kind(left) not in ("number", "string"):
        return False
    if isinstance(op, ast.Lt):
        return bool(left < right)
    if isinstance(op, ast.LtE):
        return bool(left <= right)
    if isinstance(op, ast.Gt):
        return bool(left > right)
    return bool(left >= right)


# -- checking against the declared params -------------------------------------------------------

_FIELD_KIND = {
    "string": "string",
    "enum": "enum",
    "datetime": "string",
    "date": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
}


def _literal_kind(node: ast.expr) -> str | None:
    """The kind of a literal operand, None when it is not one."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return "number"
    if isinstance(node, ast.Name) and node.id in _WORDS:
        return "null" if _WORDS[node.id] is None else "boolean"
    if isinstance(node, ast.Constant):
        return "null" if node.value is None else _kind(node.value)
    if isinstance(node, (ast.List, ast.Tuple)):
        return "list"
    return None


def _literal_value(node: ast.expr) -> Any:
    return _eval(node, {})


def _check(node: ast.expr, fields: Mapping[str, FieldSpec], problems: list[str], want_bool: bool = False) -> None:
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _check(value, fields, problems, want_bool=True)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _check(node.operand, fields, problems, want_bool=True)
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for operand in operands:
            _check(operand, fields, problems)
        for op, left, right in zip(node.ops, operands, operands[1:]):
            _check_pair(op, left, right, fields, problems)
    elif isinstance(node, ast.Name) and node.id not in _WORDS:
        spec = fields.get(node.id)
        if spec is None:
            known = ", ".join(sorted(fields)) or "none"
            problems.append(f"condition names {node.id!r}, which is not a declared param (declared: {known})")
        elif want_bool and spec.type != "boolean":
            problems.append(f"{node.id!r} is a {spec.type} param; compare it with a value (e.g. {node.id} > 0)")
    elif want_bool and _literal_kind(node) not in ("boolean", None):
        problems.append("a literal on its own is not a condition; compare a param with it")


def _operand_kind(node: ast.expr, fields: Mapping[str, FieldSpec]) -> tuple[str | None, FieldSpec | None]:
    if isinstance(node, ast.Name) and node.id not in _WORDS:
        spec = fields.get(node.id)
        return (None, None) if spec is None else (_FIELD_KIND[spec.type], spec)
    return _literal_kind(node), None


def _check_pair(
    op: ast.cmpop, left: ast.expr, right: ast.expr, fields: Mapping[str, FieldSpec], problems: list[str]
) -> None:
    symbol = _SYMBOL[type(op)]
    left_kind, left_spec = _operand_kind(left, fields)
    right_kind, right_spec = _operand_kind(right, fields)
    if left_kind is None or right_kind is None:
        return  # an undeclared name: reported on its own
    if isinstance(op, _MEMBER):
        if right_kind == "list":
            assert isinstance(right, (ast.List, ast.Tuple))
            for element in right.elts:
                element_kind = _literal_kind(element) or "list"
                _check_kinds(symbol, left, left_kind, left_spec, element_kind, None, problems, element)
            return
        if right_kind == "array" and right_spec is not None and right_spec.items is not None:
            item = right_spec.items
            _check_kinds(symbol, left, left_kind, left_spec, _FIELD_KIND[item.type], None, problems, right)
            return
        if left_kind in ("string", "enum") and right_kind in ("string", "enum"):
            return  # a substring
        problems.append(f"'{symbol}' needs a list of values (or a text) on its right: {ast.unparse(right)}")
        return
    if "list" in (left_kind, right_kind):
        problems.append(f"a list can only follow 'in' or 'not in', not '{symbol}'")
        return
    if isinstance(op, _ORDER):
        for kind, node in ((left_kind, left), (right_kind, right)):
            if kind not in ("number", "string", "enum"):
                problems.append(f"'{symbol}' orders numbers or texts; {ast.unparse(node)} is a {kind}")
                return
    _check_kinds(symbol, left, left_kind, left_spec, right_kind, right_spec, problems, right)


def _check_kinds(
    symbol: str,
    left: ast.expr,
    left_kind: str,
    left_spec: FieldSpec | None,
    right_kind: str,
    right_spec: FieldSpec | None,
    problems: list[str],
    right: ast.expr | None = None,
) -> None:
    """Both sides must be of one kind (an enum counts as a text; null matches a nullable param)."""
    texts = ("string", "enum")
    if left_kind in texts and right_kind in texts:
        for spec, other in ((left_spec, right), (right_spec, left)):
            if spec is not None and spec.type == "enum" and other is not None and _literal_kind(other) == "string":
                value = _literal_value(other)
                if spec.values is not None and value not in spec.values:
                    problems.append(f"{value!r} is not one of the enum's values {spec.values}")
        return
    if "null" in (left_kind, right_kind):
        return  # comparing with null asks whether a param was given
    if left_kind != right_kind:
        shown = ast.unparse(right) if right is not None else right_kind
        what = f"a list of {right_kind}s" if symbol in ("in", "not in") else f"a {right_kind}"
        problems.append(f"{ast.unparse(left)} is a {left_kind} but is compared ('{symbol}') with {shown}, {what}")
