"""Assert tests judged in the trainer, where the program cannot reach (reward=code).

A test made of `import` statements (standard library) and `assert` statements is split in two. The sandbox
evaluates only the parts of each assertion that need the program, such as `add(1, 2)` in
`assert add(1, 2) == 3`, and sends back their values as plain data. The trainer decodes them and evaluates
the rest itself: the comparison, the expected value, builtins such as `abs` or `sorted`, and standard
library calls such as `math.isclose`. So the expected values never enter the sandbox, and nothing the program
does there (reading the harness's memory, patching `exec` or the builtins, returning an object that equals
anything, exiting early after printing) can make a wrong answer pass: the values it can send are ones an
honest program could return.

How it works in detail: docs/internals.md, grpo_cli/rewards/code_verdict.py.
"""

from __future__ import annotations

import ast
import builtins
import copy
from dataclasses import dataclass

MARK = "\x00grpo-values "  # starts the harness's line of values on stdout
# What the trainer evaluates over the program's values, each cheap on values of a bounded size (stdout is
# capped): comparisons, logic, displays, the operators below (not *, ** or <<, which a value could make
# huge) and the calls below. Anything else that touches the program's values is evaluated in the sandbox,
# as part of the piece: the expected values are on the other side of a comparison and never go there.
OPEN = (
    ast.Compare,
    ast.BoolOp,
    ast.UnaryOp,
    ast.IfExp,
    ast.List,
    ast.Tuple,
    ast.Set,
    ast.Dict,
    ast.keyword,
    ast.Starred,
)
OPERATORS = (ast.Add, ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor)
CALLS = frozenset(
    {
        "abs",
        "all",
        "any",
        "bool",
        "dict",
        "float",
        "frozenset",
        "int",
        "isinstance",
        "len",
        "list",
        "max",
        "min",
        "reversed",
        "set",
        "sorted",
        "str",
        "tuple",
        "type",
        "math.isclose",
        "math.isnan",
        "math.isinf",
        "math.isfinite",
        "math.floor",
        "math.ceil",
        "math.fabs",
        "collections.Counter",
    }
)
MODULES = frozenset({"math", "cmath", "collections", "fractions", "decimal", "string", "operator"})
TRUSTED = frozenset(name for name in dir(builtins) if name.islower() and not name.startswith("_")) - {
    "eval",
    "exec",
    "compile",
    "open",
    "input",
    "breakpoint",
    "globals",
    "locals",
    "vars",
    "getattr",
    "setattr",
    "delattr",
    "help",
    "exit",
    "quit",
    "memoryview",
    "print",
}


@dataclass
class Verdict:
    """A test judged in the trainer: the harness evaluates `imports` and `pieces` after the program;
    `asserts` are the assertions over the pieces' values, named _v0, _v1, ..."""

    imports: list[str]
    pieces: list[str]
    asserts: list[str]

    def passes(self, stdout: str) -> bool:
        """Whether every assertion holds over the values the harness printed last."""
        at = stdout.rfind(MARK)
        if at < 0:
            return False
        try:
            encoded = ast.literal_eval(stdout[at + len(MARK) :].split("\n", 1)[0])
            values = Values({f"_v{i}": decode(v) for i, v in enumerate(encoded) if not _raised(v)})
        except Exception:  # noqa: BLE001 - a line the program cut short or forged: not a pass
            return False
        scope = {"__builtins__": builtins}
        try:
            for line in self.imports:
                exec(line, scope)
            return all(eval(check, scope, values) for check in self.asserts)
        except Exception:  # noqa: BLE001 - an assertion that raises fails, as it would in Python
            return False


class Values(dict):
    """The pieces' values; a piece that raised is missing, and reading it raises as the piece did."""

    def __missing__(self, name):
        if name.startswith("_v"):
            raise AssertionError(f"{name} raised in the sandbox")
        raise KeyError(name)  # not a piece: eval goes on to the imports and builtins


def _raised(v) -> bool:
    return isinstance(v, dict) and "raised" in v


def verdict(source: str) -> Verdict | None:
    """The trainer-judged form of a test made of asserts and imports of MODULES; None otherwise."""
    try:
        tree = _flattened(ast.parse(source))
    except SyntaxError:
        return None
    imports, names, calls = [], set(TRUSTED), {c: c for c in CALLS if "." not in c}
    pieces: list = []
    asserts: list = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and all(a.name in MODULES for a in stmt.names):
            names |= {a.asname or a.name for a in stmt.names}
            calls |= {
                f"{a.asname or a.name}.{c.split('.')[1]}": c
                for a in stmt.names
                for c in CALLS
                if c.startswith(a.name + ".")
            }
        elif isinstance(stmt, ast.ImportFrom) and stmt.module in MODULES and not stmt.level:
            names |= {a.asname or a.name for a in stmt.names}
            calls |= {a.asname or a.name: f"{stmt.module}.{a.name}" for a in stmt.names}
        elif isinstance(stmt, ast.Assert):
            asserts.append(ast.unparse(_split(stmt.test, names, calls, pieces)))
            continue
        else:
            return None
        imports.append(ast.unparse(stmt))
    return Verdict(imports, pieces, asserts) if asserts else None


def _flattened(tree: ast.Module) -> ast.Module:
    """HumanEval's shape as the top-level statements it stands for: each `check(f)` call of a function whose
    body is asserts (a docstring, `pass` and imports beside them) becomes those asserts with the parameter
    read as `f`; the function's definition and constants no assert reads (METADATA) go. Any other tree, or
    one where the function or a constant is read elsewhere, comes back as it is."""
    defs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    if not defs:
        return tree
    body, called = [], set()
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        if isinstance(stmt, ast.FunctionDef):
            continue
        if call is not None and isinstance(call.func, ast.Name) and call.func.id in defs:
            inlined = _inlined(defs[call.func.id], call)
            if inlined is None:
                return tree
            body += inlined
            called.add(call.func.id)
        elif not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and _literal(stmt.value)
        ):
            body.append(stmt)
    read = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    constants = {t.id for s in tree.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    if called != set(defs) or read & (set(defs) | constants):
        return tree
    return ast.Module(body=body, type_ignores=[])


def _inlined(fn: ast.FunctionDef, call: ast.Call) -> list[ast.stmt] | None:
    """`fn`'s assertions and imports with its one parameter read as the call's one argument (a name), or None
    where `fn` or the call is of another shape."""
    a = fn.args
    if (
        fn.decorator_list
        or a.posonlyargs
        or a.vararg
        or a.kwonlyargs
        or a.kwarg
        or a.defaults
        or len(a.args) != 1
        or len(call.args) != 1
        or call.keywords
        or not isinstance(call.args[0], ast.Name)
    ):
        return None
    param, given = a.args[0].arg, call.args[0].id
    out: list[ast.stmt] = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if not isinstance(stmt, (ast.Assert, ast.Import, ast.ImportFrom)):
            return None
        stmt = copy.deepcopy(stmt)
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and node.id == param:
                node.id = given
        out.append(stmt)
    return out


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _needs_program(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id not in names for n in ast.walk(node))


def _opens(node: ast.AST, calls: dict[str, str]) -> bool:
    """Whether the trainer evaluates `node`'s own operation, its operands coming from the sandbox."""
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, OPERATORS)
    if isinstance(node, ast.Call):
        return calls.get(ast.unparse(node.func)) in CALLS
    return isinstance(node, OPEN)


def _split(node: ast.AST, names: set[str], calls: dict[str, str], pieces: list[str]) -> ast.AST:
    """`node` with each smallest part that needs the program replaced by a name for its value."""
    if not _needs_program(node, names):
        return node
    if _opens(node, calls):
        for field, value in ast.iter_fields(node):
            if field == "func":
                continue
            if isinstance(value, list):
                setattr(node, field, [_split(v, names, calls, pieces) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.expr):
                setattr(node, field, _split(value, names, calls, pieces))
        return node
    pieces.append(ast.unparse(node))
    return ast.Name(id=f"_v{len(pieces) - 1}", ctx=ast.Load())


def decode(v):
    """A value as the harness encoded it (sandbox/child.encode)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, list):  # never bare: lists come tagged
        raise ValueError("an untagged list")
    ((tag, body),) = v.items()
    items = lambda: [decode(x) for x in body]  # noqa: E731
    kinds = {
        "f": lambda: float(body),
        "c": lambda: complex(*map(float, body)),
        "b": lambda: bytes.fromhex(body),
        "r": lambda: range(*body),
        "l": items,
        "t": lambda: tuple(items()),
        "s": lambda: set(items()),
        "F": lambda: frozenset(items()),
        "i": lambda: iter(items()),
        "d": lambda: {decode(k): decode(x) for k, x in body},
    }
    return kinds[tag]()
