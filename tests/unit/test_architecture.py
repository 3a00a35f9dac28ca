"""The shape of the code: packages by role that import only the layers below them, no import
cycle, no module past 800 lines, the engine store/'s business alone, nothing pointing
outside the repository. Read from the source with ast, every import counted, those inside
functions and under TYPE_CHECKING too: a cycle hidden there is still a cycle for whoever
reads or moves the code."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

from ..conftest import ROOT

PACKAGE = ROOT / "notifier"
STORE = "notifier.store"
MAX_LINES = 800
# The modules that open or speak to one engine: only store/ may import them.
ENGINES = ("sqlite3", "psycopg", "psycopg_pool")
ENGINE_MODULES = tuple(
    f"{STORE}.{name}" for name in ("sqlite", "postgres", "opening", "postgres_store")
)


@cache
def modules() -> Mapping[str, Path]:
    """Every module of notifier/, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[tuple[str, ...]]:
    """What each import statement anywhere in the module brings in, made absolute."""
    return names_in(name, path.read_text("utf-8"), is_package=path.name == "__init__.py")


def names_in(name: str, source: str, *, is_package: bool) -> Iterator[tuple[str, ...]]:
    """For each name imported by module `name` (with this source), what it may be, most
    precise first: `from .x import y` is `notifier...x.y` if that is a module, else a name
    of `notifier...x`; `import a.b` is `a.b`."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            yield from ((f"{origin}.{alias.name}", origin) for alias in node.names)


@cache
def graph() -> Mapping[str, frozenset[str]]:
    """Module -> the notifier modules it imports (a name imported from a module counts as
    that module; a submodule's import of its own package's other submodules does not count
    as importing the package, which Python has always loaded first anyway)."""
    known = modules()
    edges: dict[str, frozenset[str]] = {}
    for name, path in known.items():
        deps = {
            next(candidate for candidate in candidates if candidate in known)
            for candidates in imported_names(name, path)
            if any(candidate in known for candidate in candidates)
        }
        deps.discard(name)
        edges[name] = frozenset(deps)
    return edges


def cycles(edges: Mapping[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative: the
    graph is small, but recursion depth should not be what fails)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def in_store(name: str) -> bool:
    return name == STORE or name.startswith(f"{STORE}.")


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    """The check below can fail: a cycle closed only by an import inside a function is found."""
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert cycles(edges) == [["a", "b", "c"]]
    source = "def f():\n    from .b import thing\n    from ..c import other\n"
    names = set(names_in("notifier.p.a", source, is_package=False))
    assert names == {("notifier.p.b.thing", "notifier.p.b"), ("notifier.c.other", "notifier.c")}


def test_no_import_cycle_outside_the_store() -> None:
    """No import cycle among notifier's modules outside notifier/store/."""
    outside = {
        name: frozenset(dep for dep in deps if not in_store(dep))
        for name, deps in graph().items()
        if not in_store(name)
    }
    assert cycles(outside) == []


def test_no_import_cycle_through_the_store() -> None:
    """No import cycle at all in notifier/, the store's modules included."""
    assert cycles(graph()) == []


def test_no_module_is_over_800_lines() -> None:
    """A module is one concern; one concern may pass 500 lines, but none passes 800."""
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text("utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_top_level_is_a_dozen_packages_by_role() -> None:
    """notifier/ holds at most 12 modules beside its __init__: the packages by role (domain,
    engine, content, ops, api, cli, store, channels, observe, sandbox) and the few modules
    every layer shares, so the layout shows the architecture."""
    top = sorted(
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    )
    assert len(top) <= 12, top


def test_no_two_modules_share_a_name() -> None:
    """One name per concept: no two modules of notifier/ share a file name (a package's
    __init__ aside, and store/statements/, whose modules hold the SQL of the store module of
    the same name)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        if path.name == "__init__.py" or name.startswith(f"{STORE}.statements."):
            continue
        where.setdefault(name.rsplit(".", 1)[-1], []).append(name)
    packages = {
        name.rsplit(".", 1)[-1] for name, path in modules().items() if path.name == "__init__.py"
    }
    clashes = {leaf: found for leaf, found in where.items() if len(found) > 1 or leaf in packages}
    assert clashes == {}


def layer_of(name: str) -> str:
    """The package by role a module belongs to (`notifier.engine.runner` -> `engine`)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


# What each layer may not import: pure rules know no store, engine, channel, content,
# operator or command; the engine knows no command and not the API that drives it; the
# store and the channels nothing above them; content, operators' tools and observers no
# command line; the API not the command line; configuration only channels and the domain.
FORBIDDEN = {
    "domain": {"store", "engine", "channels", "content", "ops", "api", "cli", "sandbox",
               "observe", "config"},
    "engine": {"cli", "api"},
    "store": {"engine", "cli", "api", "ops", "content"},
    "channels": {"engine", "cli", "api", "store", "ops"},
    "content": {"cli", "api", "ops"},
    "ops": {"cli", "api"},
    "observe": {"cli", "api", "content"},
    "api": {"cli"},
    "config": {"store", "engine", "cli", "api", "ops", "content", "observe"},
}  # fmt: skip


def layer_breaches(edges: Mapping[str, frozenset[str]]) -> dict[str, list[str]]:
    found = {
        name: sorted(dep for dep in deps if layer_of(dep) in FORBIDDEN.get(layer_of(name), ()))
        for name, deps in edges.items()
    }
    return {name: deps for name, deps in found.items() if deps}


def test_the_layer_rule_finds_a_breach() -> None:
    """The check below can fail: the domain importing the store is a breach."""
    edges = {
        "notifier.domain.decide": frozenset({"notifier.store.core", "notifier.domain.records"})
    }
    assert layer_breaches(edges) == {"notifier.domain.decide": ["notifier.store.core"]}


def test_each_layer_imports_only_the_layers_below_it() -> None:
    """domain/ imports nothing from the store, the engine, the channels or the commands;
    engine/ imports no command and not the API; store/ and channels/ know neither the engine
    nor anything above it."""
    assert layer_breaches(graph()) == {}


def test_nothing_outside_the_store_imports_an_engine() -> None:
    """No module outside notifier/store/ imports sqlite3, psycopg or the store's engine
    modules: which engine holds the receipts is the store's business."""
    offending = {
        name: sorted(
            imported
            for candidates in imported_names(name, path)
            for imported in candidates[:1]
            if imported.split(".")[0] in ENGINES
            or any(imported == m or imported.startswith(f"{m}.") for m in ENGINE_MODULES)
        )
        for name, path in modules().items()
        if not in_store(name)
    }
    assert {name: found for name, found in offending.items() if found} == {}


def repository_text() -> Iterator[tuple[str, str]]:
    """(path from the root, text) of every text file of the project, tests and docs too."""
    for top in ("notifier", "tests", "docs", "bench", "examples", ".ci"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in {"", ".py", ".md", ".toml", ".sql", ".csv"}:
                yield str(path.relative_to(ROOT)), path.read_text("utf-8", errors="replace")
    for name in ("README.md", "pyproject.toml", ".gitignore"):
        yield name, (ROOT / name).read_text("utf-8")


# The needles are built from parts, so that this file does not hold what it looks for.
ENGINE_FLAG = "is_" + "postgres"
CTE_FLAG = "_WRITING" + "_CTES"
GONE = "wal" + "watch"


def test_nothing_above_the_store_asks_which_engine_it_has() -> None:
    """The engine is store/'s business: nothing outside notifier/store/ (code, tests, docs)
    names the store's engine flag or its writing-CTE switch, and nothing names the
    WAL watcher that was removed."""
    found = [
        (path, needle)
        for path, text in repository_text()
        for needle in (ENGINE_FLAG, CTE_FLAG, GONE)
        if needle in text and (needle == GONE or not path.startswith("notifier/store/"))
    ]
    assert found == []


def test_nothing_points_outside_the_repository() -> None:
    """No file sends its reader to a document outside the repository (another folder's
    design notes): what the project promises is written in it."""
    needles = ("shared" + " folder", "shared" + "/design", "../" + "shared")
    found = [
        (path, needle)
        for path, text in repository_text()
        for needle in needles
        if needle in text.lower()
    ]
    assert found == []


def test_the_readme_is_under_250_lines() -> None:
    """README.md stays a user's page (under 250 lines); measurements live in docs/."""
    assert len((ROOT / "README.md").read_text("utf-8").splitlines()) < 250


# What reads text: a string's own methods, and a pattern's.
_TEXT_READERS = frozenset(
    {"startswith", "endswith", "find", "rfind", "index", "rindex", "split", "rsplit",
     "partition", "rpartition", "count", "removeprefix", "removesuffix", "lower", "casefold",
     "match", "fullmatch", "search", "findall", "finditer", "sub", "subn"}
)  # fmt: skip


def stop_reason_parsed(source: str) -> list[int]:
    """The lines where a run's `stop_reason` (an attribute, or a record's key), or a name
    given it, is read as text: a string method called on it, an `in` test on it, or it
    handed to a string or pattern method."""
    found: list[int] = []
    for scope in ast.walk(ast.parse(source)):
        if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        given = {
            target.id
            for node in ast.walk(scope)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            and any((isinstance(n, ast.Attribute) and n.attr == "stop_reason")
                    or (isinstance(n, ast.Constant) and n.value == "stop_reason")
                    for n in ast.walk(node.value))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }  # fmt: skip

        def reason(node: ast.AST, given: set[str] = given) -> bool:
            return (isinstance(node, ast.Attribute) and node.attr == "stop_reason") or (
                isinstance(node, ast.Name) and node.id in given
            )

        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and node.attr in _TEXT_READERS:
                if reason(node.value):
                    found.append(node.lineno)
            elif isinstance(node, ast.Compare):
                tested = [node.left, *node.comparators]
                if any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                    reason(operand) for operand in tested
                ):
                    found.append(node.lineno)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _TEXT_READERS
                and any(reason(arg) for arg in node.args)
            ):
                found.append(node.lineno)
    return sorted(set(found))


def test_the_stop_reason_finder_finds_prose_parsed() -> None:
    source = (
        "def f(run):\n"
        "    why = run.stop_reason or ''\n"
        "    if why.startswith('its approval'):\n"
        "        return 1\n"
        "    if ' is down: ' in why:\n"
        "        return 2\n"
        "    return PATTERN.fullmatch(run.stop_reason)\n"
        "def g(run):\n"
        "    return run.stop_reason == 'x' or run.stop_cause in CAUSES\n"
        "def h(stored):\n"
        "    reason = stored.get('stop_reason')\n"
        "    return reason.split(' ', 1)[0]\n"
    )
    assert stop_reason_parsed(source) == [3, 5, 7, 12]


def test_no_stop_reason_is_parsed_from_its_text() -> None:
    """Why a run stopped is read from `runs.stop_cause`; the prose `stop_reason` is only
    stored and shown, never read back as text anywhere in notifier/."""
    found = {
        name: lines
        for name, path in modules().items()
        if (lines := stop_reason_parsed(path.read_text("utf-8")))
    }
    assert found == {}


def advice_strings(source: str) -> list[int]:
    """The lines of string literals (docstrings aside) that tell the operator a command to
    run: "`notifier …`"."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "`notifier " in node.value
            and id(node) not in docstrings
        }
    )


def test_advice_is_worded_only_in_the_command_line() -> None:
    """What to do after a failure is a fact below the command line (an errors.NextStep, a
    typed field or result) that the command layer words: no string that tells the operator
    a command to run is written outside notifier/cli, in any layer (content/ and api/
    included). Each module that holds one is named with the lines where it does."""
    found = {
        name: lines
        for name, path in modules().items()
        if not name.startswith("notifier.cli")
        if (lines := advice_strings(path.read_text("utf-8")))
    }
    assert found == {}


def test_no_advice_plans_every_row_again() -> None:
    """No command the tool suggests carries --new-run: followed word for word after a run
    that delivered rows (or after an earlier run that did), it plans every row again and
    sends those a second time. Advice to plan a file again relies on the comparison with
    earlier runs, which leaves delivered rows out."""
    found = {
        name: node.lineno
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Constant | ast.JoinedStr)
        and _SUGGESTS_NEW_RUN.search(_literal(node))
    }
    assert found == {}


# A command in backticks, as advice is written, that carries --new-run.
_SUGGESTS_NEW_RUN = re.compile(r"`notifier [^`]*--new-run")


def _literal(node: ast.expr) -> str:
    """A string literal's text, an f-string's with `{}` for each value it formats."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else ""
    assert isinstance(node, ast.JoinedStr)
    return "".join(_literal(part) if isinstance(part, ast.Constant) else "{}"
                   for part in node.values)  # fmt: skip


def test_no_two_classes_share_a_name() -> None:
    """One name per concept: a class name found in two modules would be two things a reader
    must tell apart by where they were imported from (an item's attempts and the rows of
    earlier runs are `History` and `RowHistory`, not two `History`)."""
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert {cls: found for cls, found in where.items() if len(found) > 1} == {}


# ---------------------------------------------------------------- the run control

RUN_CONTROL = "notifier.engine.run_control"
# The modules that send a run, or stop one: each reads the run control, none keeps a flag.
# Every module of engine/, and the two outside it that watch a run being worked.
ENGINE = (
    *(
        name
        for name in modules()
        if name.startswith("notifier.engine.") and name != "notifier.engine.run_control"
    ),
    "notifier.ops.approval",
    "notifier.api.working",
)
# Stop flags the run control replaced: written anywhere else, each would be a second holder.
RETIRED = frozenset(
    {"halt", "halting", "cancel_seen", "moved_seen", "rate_wake", "lease_lost", "renewal_failing"}
)
# What an attribute name says when it holds whether to stop (the engine's own flags).
_STOPPY = re.compile(r"stop|halt|cancel|interrupt|lost|loss|expire|moved|wake|signal")
# Engine attributes with such a name that are no stop state of the run, and why.
NOT_STOP_STATE = {
    (
        "notifier.engine.membership",
        "_stop",
    ): "the heartbeat thread's own stop, set when the lease is released",
    ("notifier.engine.runner", "_revisit_at"): "when to look for revisits: a time, not a stop",
}
_MUTATORS = frozenset(
    {"set", "clear", "mark", "mark_stale", "trip", "append", "extend", "update", "setdefault",
     "pop", "popitem", "add", "discard", "remove", "insert"}
)  # fmt: skip


def control_state(source: str) -> tuple[frozenset[str], frozenset[str]]:
    """RunControl's instance attributes (each `self.x = ...` in its body) and the names a
    caller may read its state by (its properties)."""
    (cls,) = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "RunControl"
    ]
    attributes = {
        target.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    properties = {
        node.name
        for node in cls.body
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
    }
    return frozenset(attributes), frozenset(properties)


def stop_state_written(source: str, names: frozenset[str], *, engine: bool) -> list[int]:
    """The lines where a module writes stop state: assigns, deletes or mutates an attribute
    by one of `names` (the run control's state and properties, the retired flags), reaches
    into another object's private run-control state, or makes a flag of its own (a subclass
    of threading.Event; in the engine, an Event or any attribute named like a stop)."""
    private = {name for name in names if name.startswith("_")}
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for written in map(_subscripted, targets):
            if isinstance(written, ast.Attribute) and (
                (written.attr in names and (written.attr not in private or not _own(written)))
                or (engine and _stoppy(written))
            ):
                found.append(written.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr in names
        ):
            found.append(node.lineno)
        if isinstance(node, ast.Attribute) and node.attr in private and not _own(node):
            found.append(node.lineno)
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) in ("threading.Event", "Event") for base in node.bases
        ):
            found.append(node.lineno)
        if engine and isinstance(node, ast.Call) and ast.unparse(node.func) == "threading.Event":
            found.append(node.lineno)
    return sorted(set(found))


def _subscripted(target: ast.expr) -> ast.expr:
    """What `x.y[k] = ...` writes into: `x.y`."""
    while isinstance(target, ast.Subscript):
        target = target.value
    return target


def _own(node: ast.Attribute) -> bool:
    """An attribute of the object itself (`self._x`): another class's own private state."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _stoppy(target: ast.Attribute) -> bool:
    return bool(_STOPPY.search(target.attr.lower()))


def test_the_stop_state_finder_finds_a_flag_written_outside_the_run_control() -> None:
    names = frozenset({"_requests", "lost", *RETIRED})
    source = (
        "class Flag(threading.Event):\n"  # 1: a flag of its own
        "    pass\n"
        "def f(self, control, dispatch):\n"
        "    dispatch.halting = 'gone'\n"  # 4: a retired flag
        "    control._requests[Stop.HALTED] = None\n"  # 5: into the control's state
        "    control.lost = True\n"  # 6: over a property
        "    self.p.halt = (1, 'x')\n"  # 7
        "    self.lease_lost.set()\n"  # 8
        "    self.stop_now = True\n"  # 9: a new flag, in the engine
        "    self.wake = threading.Event()\n"  # 10: both
        "    control.request(Stop.HALTED, 'x')\n"  # the way to ask: fine
        "    return control.lost or decision.halt or self._requests\n"  # reads: fine
    )
    assert stop_state_written(source, names, engine=True) == [1, 4, 5, 6, 7, 8, 9, 10]
    assert stop_state_written(source, names, engine=False) == [1, 4, 5, 6, 7, 8]


def test_the_run_control_keeps_its_state_to_itself() -> None:
    """Every attribute RunControl holds is private: read through its properties and
    methods, written only by its own methods (the rule below finds any other writer)."""
    attributes, properties = control_state(modules()[RUN_CONTROL].read_text("utf-8"))
    assert attributes, "RunControl holds no state: the rule below would check nothing"
    assert {name for name in attributes if not name.startswith("_")} == set()
    assert {"lost", "loss"} <= properties


def test_stop_state_is_written_only_in_the_run_control() -> None:
    """Whether to stop has one holder and writer, notifier/engine/run_control.py: every other
    module asks it (`request`, `interrupt`, `lose`, `expires_at`) and reads it, none writes a flag
    of its own or reaches into its state."""
    attributes, properties = control_state(modules()[RUN_CONTROL].read_text("utf-8"))
    names = attributes | properties | RETIRED
    found = {
        name: lines
        for name, path in modules().items()
        if name != RUN_CONTROL
        and (
            lines := [
                line
                for line in stop_state_written(
                    path.read_text("utf-8"), names, engine=name in ENGINE
                )
                if not _allowed(name, path, line)
            ]
        )
    }
    assert found == {}
    assert set(ENGINE) <= set(modules()), "an engine module was renamed: update ENGINE"


def _allowed(module: str, path: Path, line: int) -> bool:
    """Whether `line` of `module` writes only an attribute NOT_STOP_STATE names."""
    text = path.read_text("utf-8").splitlines()[line - 1]
    return any(
        owner == module and re.search(rf"\.{re.escape(attr)}\b", text)
        for owner, attr in NOT_STOP_STATE
    )
