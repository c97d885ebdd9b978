"""The mutants of a module: one small edit each, found in its syntax tree (the operators
are ``OPERATORS``). ``bench/mutate.py`` runs them."""

from __future__ import annotations

import ast
import copy
import hashlib

import attrs

OPERATORS = {
    "compare": "a comparison flipped (== !=, < >=, <= >, is / is not, in / not in)",
    "boundary": "a comparison's boundary moved (< <=, > >=)",
    "boolop": "and / or exchanged",
    "not": "a `not` removed",
    "negate-if": "an if/elif/while/ternary condition negated",
    "negate-return": "the result of a function returning bool negated",
    "constant": "True / False exchanged, an integer n made n + 1",
    "arith": "+ / - exchanged (also += / -=)",
    "delete-call": "a statement that is a call removed",
    "delete-assign": "an assignment to an attribute or subscript removed",
    "break": "break / continue exchanged",
    "row-delete": "a table row (or an element of a module-level collection) removed",
    "row-dest": "a table row sent to the next state instead",
    "row-unguard": "a table row's guard removed",
    "row-swap": "two neighbouring rows of one group exchanged",
}

_COMPARE_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
}
_STATES = [
    "Ready",
    "AwaitingModel",
    "DispatchingTools",
    "CollectingResults",
    "TurnBoundary",
    "Aborting",
    "AwaitingUser",
    "Done",
    "Aborted",
    "TurnLimitExceeded",
    "Failed",
]


@attrs.frozen
class Mutant:
    module: str
    operator: str
    line: int
    start: tuple[int, int]  # (line, column) of the replaced source, 1-based lines
    end: tuple[int, int]
    replacement: str
    original: str
    # False when the edit runs at import (module or class level, a decorator): it
    # changes state any test may read, so every test of the selection runs against it.
    in_function: bool = attrs.field(default=True, eq=False)

    @property
    def ident(self) -> str:
        digest = hashlib.sha1(
            f"{self.start}{self.end}{self.replacement}".encode(), usedforsecurity=False
        ).hexdigest()[:8]
        return f"{self.module}:{self.line}:{self.operator}:{digest}"

    def describe(self) -> str:
        def short(text: str) -> str:
            text = " ".join(text.split())
            return text if len(text) <= 70 else text[:67] + "..."

        return f"`{short(self.original)}` -> `{short(self.replacement) or '(removed)'}`"

    def apply(self, source: str) -> str:
        lines = source.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line.encode()))
        data = source.encode()
        begin = offsets[self.start[0] - 1] + self.start[1]
        finish = offsets[self.end[0] - 1] + self.end[1]
        return (data[:begin] + self.replacement.encode() + data[finish:]).decode()


# -- generating mutants ---------------------------------------------------------------------


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))
    )


def _is_log_call(node: ast.AST) -> bool:
    # ``self._log.debug(...)``, ``log.warning(...)``: observability, not behaviour.
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    target = node.func.value
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
    return "log" in name.lower()


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, source: str) -> None:
        self.module = module
        self.source = source
        self.found: list[Mutant] = []
        self.in_function = 0
        self.decorating = 0
        self.returns_bool: list[bool] = []

    def _add(self, operator: str, node: ast.AST, replacement: str) -> None:
        original = ast.get_source_segment(self.source, node) or ""
        if replacement == original:
            return
        self.found.append(
            Mutant(
                self.module,
                operator,
                node.lineno,  # type: ignore[attr-defined]
                (node.lineno, node.col_offset),  # type: ignore[attr-defined]
                (node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
                replacement,
                original,
                self.in_function > 0 and not self.decorating,
            )
        )

    def _swap(self, operator: str, node: ast.expr, new: ast.expr) -> None:
        self._add(operator, node, f"({ast.unparse(new)})")

    # functions ---------------------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.in_function += 1
        self.returns_bool.append(isinstance(node.returns, ast.Name) and node.returns.id == "bool")
        body = node.body
        if body and isinstance(body[0], ast.Expr) and _is_text(body[0].value):
            body = body[1:]  # the docstring
        for statement in body:
            self.visit(statement)
        self.decorating += 1
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.decorating -= 1
        self.returns_bool.pop()
        self.in_function -= 1

    # statements ----------------------------------------------------------------------------

    def visit_Expr(self, node: ast.Expr) -> None:
        if self.in_function and isinstance(node.value, (ast.Call, ast.Await)):
            call = node.value.value if isinstance(node.value, ast.Await) else node.value
            if not _is_log_call(call):
                self._add("delete-call", node, "pass")
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.in_function and all(
            isinstance(t, (ast.Attribute, ast.Subscript)) for t in node.targets
        ):
            self._add("delete-assign", node, "pass")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        # The annotation is never evaluated (``from __future__ import annotations``).
        if node.value is not None:
            self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        flips = {ast.Add: ast.Sub, ast.Sub: ast.Add}
        new_op = flips.get(type(node.op))
        if new_op is not None:
            self._add("arith", node, ast.unparse(ast.AugAssign(node.target, new_op(), node.value)))
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and self.returns_bool and self.returns_bool[-1]:
            self._swap("negate-return", node.value, ast.UnaryOp(ast.Not(), node.value))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def visit_While(self, node: ast.While) -> None:
        if not (isinstance(node.test, ast.Constant) and node.test.value is True):
            self._negate(node.test)
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._negate(node.test)
        self.generic_visit(node)

    def _negate(self, test: ast.expr) -> None:
        if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)):
            self._swap("negate-if", test, ast.UnaryOp(ast.Not(), test))

    def visit_Break(self, node: ast.Break) -> None:
        self._add("break", node, "continue")

    def visit_Continue(self, node: ast.Continue) -> None:
        self._add("break", node, "break")

    # expressions ---------------------------------------------------------------------------

    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            for operator, table in (("compare", _COMPARE_FLIP), ("boundary", _BOUNDARY)):
                new_op = table.get(type(op))
                if new_op is not None:
                    ops = [*node.ops[:i], new_op(), *node.ops[i + 1 :]]
                    self._swap(operator, node, ast.Compare(node.left, ops, node.comparators))
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        self._swap("boolop", node, ast.BoolOp(other, node.values))
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self._swap("not", node, node.operand)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        flips = {ast.Add: ast.Sub, ast.Sub: ast.Add}
        new_op = flips.get(type(node.op))
        if new_op is not None and not (_is_text(node.left) or _is_text(node.right)):
            self._swap("arith", node, ast.BinOp(node.left, new_op(), node.right))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value is True or node.value is False:
            self._add("constant", node, str(not node.value))
        elif type(node.value) is int:
            self._add("constant", node, str(node.value + 1))

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return None  # text

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id == "Transition":
            self._row(node)
        self.generic_visit(node)

    # the table -----------------------------------------------------------------------------

    def _row(self, node: ast.Call) -> None:
        args = node.args
        if len(args) >= 3 and isinstance(args[2], ast.Attribute) and args[2].attr in _STATES:
            dest = args[2].attr
            nxt = _STATES[(_STATES.index(dest) + 1) % len(_STATES)]
            new = copy.copy(args[2])
            new.attr = nxt
            self._add("row-dest", args[2], ast.unparse(new))
        if len(args) >= 4 and not (isinstance(args[3], ast.Constant) and args[3].value is None):
            self._add("row-unguard", args[3], "None")

    def visit_Tuple(self, node: ast.Tuple) -> None:
        self._collection(node, node.elts, lambda elts: ast.Tuple(elts, ast.Load()))
        if self.in_function == 0 and len(node.elts) > 1:
            for i in range(len(node.elts) - 1):
                a, b = node.elts[i], node.elts[i + 1]
                if _row_key(a) is not None and _row_key(a) == _row_key(b):
                    elts = [*node.elts[:i], b, a, *node.elts[i + 2 :]]
                    self._swap("row-swap", node, ast.Tuple(elts, ast.Load()))
        self.generic_visit(node)

    def visit_Set(self, node: ast.Set) -> None:
        self._collection(node, node.elts, lambda elts: ast.Set(elts))
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if self.in_function == 0 and len(node.keys) > 1:
            for i in range(len(node.keys)):
                keys = [*node.keys[:i], *node.keys[i + 1 :]]
                values = [*node.values[:i], *node.values[i + 1 :]]
                self._swap("row-delete", node, ast.Dict(keys, values))
        self.generic_visit(node)

    def _collection(self, node: ast.expr, elts: list[ast.expr], make: object) -> None:
        if self.in_function or len(elts) < 2 or all(_is_text(e) for e in elts):
            return
        for i in range(len(elts)):
            rest = [*elts[:i], *elts[i + 1 :]]
            self._swap("row-delete", node, make(rest))  # type: ignore[operator]


def _row_key(node: ast.expr) -> tuple[str, str] | None:
    """(source, trigger) of a ``Transition(...)`` row, for the row-swap operator."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Transition"):
        return None
    if len(node.args) < 2:
        return None
    return ast.unparse(node.args[0]), ast.unparse(node.args[1])


def find_mutants(name: str, source: str) -> list[Mutant]:
    """The mutants of one module's source, each one parsing, without duplicates."""
    finder = _Finder(name, source)
    tree = ast.parse(source)
    # Module level: skip the docstring and the imports; visit the rest.
    for statement in tree.body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(statement, ast.Expr) and _is_text(statement.value):
            continue
        if isinstance(statement, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets
        ):
            continue
        finder.visit(statement)
    unique: dict[str, Mutant] = {}
    for mutant in finder.found:
        mutated = mutant.apply(source)
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        unique.setdefault(mutant.ident, mutant)
    return list(unique.values())
