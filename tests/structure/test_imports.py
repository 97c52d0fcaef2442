"""The import graph, read from the source with `ast` (function-level imports included): no
cycles, stages import only the stages below them, an import inside a function only where it
avoids a real cost, `analysis` stays free of JAX and imports of cgpt only the directories'
contract, and of cgpt only the command-line face imports `analysis` (one direction between the
packages), `resolve` decides a run without importing JAX; and cgpt's code is not squeezed: no
line over 100 characters, no statements joined on one line."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_CHARS = 100  # a line, as most Python style guides (nanoGPT and MaxText fit in it)
# stages of cgpt, lowest first: a module may import its own stage and the ones below
LAYERS = [("cgpt.errors", "cgpt.fileio", "cgpt.paths", "cgpt.rundir", "cgpt.record",
           "cgpt.results_schema", "cgpt.stop"), ("cgpt.config",),
          ("cgpt.data", "cgpt.model"), ("cgpt.sharding",), ("cgpt.train",),
          ("cgpt.plan", "cgpt.eval"), ("cgpt.sweep",),
          ("cgpt.cli", "cgpt.commands", "cgpt.__main__", "cgpt.sweep.__main__", "cgpt")]
# The command-line face: the only modules of cgpt that import `analysis` (the report after a
# sweep, --suggest, compare), so that `analysis` depends on cgpt and cgpt's library not on it.
# An entry point (`python -m cgpt.sweep`: a package's `__main__`) is the face too.
FACE = ("cgpt.cli", "cgpt.commands")
# what `analysis` may import of cgpt: the JAX-free contract of the run and sweep directories
# (which loads `cgpt.errors` and `cgpt.paths` with it), of a logged step and of results.csv's
# columns, never a module that trains or starts JAX
CONTRACT = ("cgpt.rundir", "cgpt.record", "cgpt.results_schema")


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = {**_modules("cgpt"), **_modules("analysis")}


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in the file, as dotted names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{node.module}.{a.name}"
                names.add(sub if sub in MODULES else node.module)
    return names


GRAPH = {m: {i for i in _imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def _layer(module: str) -> int:
    if module.endswith(".__main__"):  # an entry point, the face's wherever its package sits
        return len(LAYERS) - 1
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes
               if p != "cgpt" or module == "cgpt"):
            return i
    raise AssertionError(f"{module} is in no layer of tests/structure/test_imports.py: add it")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_stages_never_import_higher_ones():
    up = [f"{m} -> {i}" for m in GRAPH if m.startswith("cgpt") for i in GRAPH[m]
          if i.startswith("cgpt") and _layer(i) > _layer(m) and m != "cgpt"]
    assert up == []


def test_loading_a_run_never_reaches_into_train():
    """`cgpt.load` reads a run through `cgpt.rundir` and the Orbax format's one reader
    (`cgpt.model.orbax_format`), which training shares: nothing it imports is under train/."""
    seen, todo = set(), ["cgpt.eval.lm"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(GRAPH[m])
    assert "cgpt.model.orbax_format" in seen
    assert sorted(m for m in seen if m.startswith("cgpt.train")) == []


def test_analysis_imports_no_jax_and_of_cgpt_only_the_contract():
    bad = [f"{m}: {i}" for m, p in MODULES.items() if m.startswith("analysis")
           for i in _imports(p) if i.split(".")[0] in ("jax", "jaxlib", "flax", "optax")
           or i.split(".")[0] == "cgpt" and i not in CONTRACT]
    assert bad == []


def _face(module: str) -> bool:
    return module.endswith(".__main__") or any(module == p or module.startswith(p + ".")
                                               for p in FACE)


def test_only_the_command_line_face_imports_analysis():
    """`analysis` depends on cgpt's JAX-free contract, never the reverse: the results.csv
    columns the sweep writes are cgpt's (`cgpt.results_schema`), and the report, --suggest and
    compare, which read results through `analysis`, are the command line's (`cgpt/commands/`):
    the sweep library (`launch` is handed the report) and everything below never import it."""
    back = [f"{m} -> {i}" for m, p in MODULES.items() if m.startswith("cgpt") and not _face(m)
            for i in _imports(p) if i.split(".")[0] == "analysis"]
    assert back == []
    assert any(i.startswith("analysis") for i in GRAPH["cgpt.commands.suggest"])  # the face may


def test_the_face_is_found():
    assert _face("cgpt.cli") and _face("cgpt.commands.sweep") and _face("cgpt.sweep.__main__")
    assert not _face("cgpt.sweep.launcher") and not _face("cgpt.clix") and not _face("cgpt")


def test_analysis_loads_no_jax_and_no_more_of_cgpt_than_the_contract():
    """Every analysis module imported: no JAX, and of cgpt only the contract and what it
    imports itself (the package's `__init__` loads its presets and `cgpt.load` lazily)."""
    mods = sorted(m for m in MODULES if m.startswith("analysis"))
    code = (f"import sys, {', '.join(mods)}; print(' '.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('cgpt', 'jax', 'jaxlib', 'flax', 'optax', 'orbax'))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert set(p.stdout.split()) == {"cgpt", "cgpt.errors", "cgpt.paths", *CONTRACT}


def test_no_line_over_100_characters():
    """Readable without squeezing: no cap on a module's length (one concept per module is a
    reviewer's call, and a cap only made code wider and denser to stay under it), but no line
    wider than `MAX_CHARS`."""
    wide = [f"{p.relative_to(ROOT)}:{i}" for m, p in MODULES.items()
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > MAX_CHARS]
    assert wide == []


def _joined(tree: ast.AST) -> list[int]:
    """Lines holding two statements: `a; b`, or a compound statement's body on its header."""
    lines = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body:
                continue
            if (isinstance(node, (ast.stmt, ast.excepthandler)) and field == "body"
                    and body[0].lineno == node.lineno):
                lines.append(body[0].lineno)
            lines += [b.lineno for a, b in zip(body, body[1:]) if b.lineno == a.end_lineno]
    return sorted(set(lines))


def test_no_statements_joined_on_one_line():
    joined = [f"{p.relative_to(ROOT)}:{i}" for m, p in MODULES.items()
              for i in _joined(ast.parse(p.read_text()))]
    assert joined == []


def test_joined_statements_are_found():
    assert _joined(ast.parse("a = 1; b = 2\nif a: b = 3\nfor x in y:\n    pass\n")) == [1, 2]


# What an import inside a function may put off: JAX's start-up (and the libraries built on it),
# the heavy optional dependencies, and the scientific stack a JAX-free path need not load.
COSTLY = {"jax", "jaxlib", "flax", "optax", "orbax", "torch", "transformers", "wandb", "lm_eval",
          "datasets", "pyarrow", "pandas", "scipy", "matplotlib", "tensorboardX", "submitit",
          "zstandard"}  # the last three: absent on the GPU machines (bench/gpu_check.py)


def _top_level_imports(path: Path) -> set[str]:
    """What importing `path` runs: its imports outside functions (and TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text(), str(path))
    inner = {id(n) for f in ast.walk(tree)
             if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    checking = {id(n) for i in ast.walk(tree) if isinstance(i, ast.If)
                and "TYPE_CHECKING" in ast.unparse(i.test) for n in ast.walk(i)}
    return {name for node in ast.walk(tree) if id(node) not in inner | checking
            for name in _names(node)}


def _names(node: ast.AST) -> list[str]:
    """The modules an import statement loads (`from analysis import f`: f's home module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
        return []
    out = []
    for a in node.names:
        sub = f"{node.module}.{a.name}"
        home = LAZY.get(node.module, {}).get(a.name)
        out.append(f"{node.module}.{home}" if home else sub if sub in MODULES else node.module)
    return out


def _lazy_names(path: Path) -> dict[str, str]:
    """A package that loads its names on first use (PEP 562: `_EXPORTS`, {module: names}):
    name -> the submodule `from package import name` loads."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "_EXPORTS":
            return {n: m for m, names in ast.literal_eval(node.value).items() for n in names}
    return {}


LAZY = {m: _lazy_names(p) for m, p in MODULES.items() if p.name == "__init__.py"}


TOP = {m: _top_level_imports(p) for m, p in MODULES.items()}


def _costs(module: str, seen: frozenset = frozenset()) -> set[str]:
    """The costly packages importing `module` loads (its parent packages run first)."""
    if module.split(".")[0] not in ("cgpt", "analysis"):
        return {module.split(".")[0]} & COSTLY
    parts = module.split(".")
    deps = TOP.get(module, set()) | {".".join(parts[:i]) for i in range(1, len(parts))}
    return set().union(set(), *(_costs(d, seen | {module}) for d in deps
                                if d not in seen and d != module))


def _guarded(tree: ast.AST) -> set[int]:
    """Imports inside `try: ... except ImportError`: an optional dependency, imported where it is
    used so that its absence is one error there."""
    return {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and any(
        "ImportError" in ast.unparse(h.type or ast.Constant(None)) for h in t.handlers)
        for b in t.body for n in ast.walk(b) if isinstance(n, (ast.Import, ast.ImportFrom))}


def _function_level_imports() -> list[tuple[str, ast.stmt, str]]:
    """(module, import statement, its first line and the one above) for every import inside a
    function, less the
    guarded imports of optional dependencies (`_guarded`)."""
    out = []
    for m, p in MODULES.items():
        lines, tree = p.read_text().splitlines(), ast.parse(p.read_text())
        optional = _guarded(tree)
        for f in ast.walk(tree):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out += [(m, n, "\n".join(lines[n.lineno - 2:n.lineno])) for n in ast.walk(f)
                        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in optional]
    return out


def test_imports_inside_functions_avoid_a_cost_and_say_so():
    """An import is at the top of its module, where a reader sees what the module depends on,
    unless putting it off saves a real cost: a COSTLY package the module does not load anyway
    (JAX in a JAX-free path such as `cgpt list`, `--dry-run` or `cgpt.rundir`; torch,
    transformers, wandb, lm-eval only when used). Each such import says why in a comment (on
    its line or the one above)."""
    free = sorted({f"{m}:{n.lineno}" for m, n, _ in _function_level_imports()
                   if not set().union(*(_costs(x) for x in _names(n))) - _costs(m)
                   and m not in ("cgpt", "cgpt.cli")})  # the package's own init: every path
    # loads it, `analysis` too, so it loads even the presets on first use
    # (test_analysis_loads_no_jax_...); the process's edge loads the commands once its stop
    # guard is in place (test_importing_cgpt_installs_nothing)
    silent = sorted({f"{m}:{n.lineno}" for m, n, line in _function_level_imports()
                     if "#" not in line})
    assert free == [] and silent == []


def test_the_cost_of_an_import_is_seen():
    assert "jax" in _costs("cgpt.train.loop") and "jax" not in _costs("cgpt.rundir")
    assert _costs("cgpt.results_schema") == set() and "pandas" in _costs("analysis.results")
    assert _names(ast.parse("from analysis import sweep_report").body[0]) == ["analysis.report"]
    assert "jax" in _costs(_names(ast.parse("from cgpt.sharding import build_mesh").body[0])[0])


@pytest.mark.parametrize("module", ["cgpt.rundir", "cgpt.record", "cgpt.paths",
                                    "cgpt.train.resolve", "cgpt.config.recipe",
                                    "cgpt.sharding.auto", "cgpt.sweep.spec"])
def test_deciding_a_run_imports_no_jax(module):
    code = f"import sys, {module}; assert 'jax' not in sys.modules, 'jax imported'"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr


def test_the_graph_sees_function_level_imports():
    assert "cgpt.model.gpt" in GRAPH["cgpt.model.hf"]  # `from cgpt.model.gpt import` in a def
    assert "cgpt.config.model" in GRAPH["cgpt.config.flops"]
    assert "cgpt.config.flops" not in GRAPH["cgpt.config.model"]
    assert "cgpt.config.run" in GRAPH["cgpt.config.overrides"]
    assert "cgpt.config.overrides" not in GRAPH["cgpt.config.run"]


def test_every_exception_is_defined_in_errors():
    """One error hierarchy: callers (the CLI, the sweep's worker) import it from one place."""
    found = []
    for m, p in MODULES.items():
        if not m.startswith("cgpt") or m == "cgpt.errors":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            bases = [getattr(b, "id", getattr(b, "attr", "")) for b in getattr(node, "bases", ())]
            if isinstance(node, ast.ClassDef) and any(
                    b.endswith(("Error", "Exception", "Interrupt")) for b in bases):
                found.append(f"{m}.{node.name}")
    assert found == []


def test_the_cli_catches_the_hierarchy():
    from cgpt import errors

    for name in ("LoadError", "TrainError", "RunDirError", "BranchError", "DataError",
                 "DistributedError", "AllocationError", "Preempted"):
        assert issubclass(getattr(errors, name), errors.CgptError), name
    assert issubclass(errors.DataError, ValueError) and issubclass(errors.TrainError, RuntimeError)


def _string_constants(path: Path) -> list[str]:
    """Every whole string literal of `path` (not the pieces of an f-string)."""
    tree = ast.parse(path.read_text())
    pieces = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in pieces]


def test_run_directory_names_are_spelled_once():
    """The run and sweep directories' contract is `cgpt.rundir` and a data store's
    `cgpt.data.store`: no other module of cgpt or analysis spells one of their names (they read
    `rundir.SUMMARY_FILE`, `rundir.RESULTS_FILE`, `store.MANIFEST` and the like; a store and a
    Hugging Face directory keep their tokenizer as `rundir.TOKENIZER_FILE` too)."""
    from cgpt import rundir
    from cgpt.data import store

    names = {v: "cgpt.rundir" for k, v in vars(rundir).items() if k.endswith(("_FILE", "_DIR"))}
    names.update({store.MANIFEST: "cgpt.data.store", store.PLAN: "cgpt.data.store"})
    assert {"summary.json", "tokenizer.json", "checkpoints", "plan.json", "results.csv",
            ".superseded"} <= set(names)
    spelled = {m: sorted(n for n in set(_string_constants(p)) if names.get(n, m) != m)
               for m, p in MODULES.items()}
    assert {m: s for m, s in spelled.items() if s} == {}


def test_nothing_under_train_defines_a_file_name():
    found = []
    for m, p in MODULES.items():
        if not m.startswith("cgpt.train"):
            continue
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    isinstance(t, ast.Name) and t.id.endswith(("_FILE", "_DIR"))
                    for t in node.targets):
                found.append(f"{m}: {ast.unparse(node)}")
    assert found == []


def test_train_keeps_no_unbounded_module_cache():
    """A long-lived worker trains job after job: module-level memos are `Memo`s (bounded,
    owned by the function that fills them), never bare dicts or lists; no ContextVar carries
    a value around the arguments."""
    found = []
    for m, p in MODULES.items():
        if not m.startswith("cgpt.train"):
            continue
        for node in ast.parse(p.read_text()).body:
            value = getattr(node, "value", None)  # an empty container, to be filled later
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and (
                    isinstance(value, (ast.Dict, ast.List)) and not ast.unparse(value)[1:-1]
                    or isinstance(value, ast.Call) and not value.args and
                    getattr(value.func, "id", "") in ("dict", "list", "set", "OrderedDict")
                    or isinstance(value, ast.Call) and "ContextVar" in ast.unparse(value.func)):
                found.append(f"{m}: {ast.unparse(node)[:60]}")
    assert found == []


# Where configuration is checked and a sweep expanded and launched, a function reads in one
# screen: a check belongs to the checking module (`cgpt.sweep.validate`, `cgpt.config`), not
# to an orchestrator that grows a case at a time (`load_sweep` was 194 lines, `launch` 146).
SHORT = ("cgpt.config", "cgpt.sweep", "cgpt.commands")
MAX_FUNCTION_LINES = 60


def _long_functions(tree: ast.AST, limit: int) -> list[str]:
    return [f"{n.name}: {n.end_lineno - n.lineno + 1}" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit]


def test_config_and_sweep_functions_fit_a_screen():
    long = [f"{m}.{f}" for m, p in MODULES.items() if m.startswith(SHORT)
            for f in _long_functions(ast.parse(p.read_text()), MAX_FUNCTION_LINES)]
    assert long == []


def test_long_functions_are_found():
    assert _long_functions(ast.parse("def f():\n" + "    x = 1\n" * 3), 3) == ["f: 4"]


def test_no_function_in_train_takes_more_than_eight_parameters():
    wide = []
    for m, p in MODULES.items():
        if m.startswith("cgpt.train"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    n = len(a.posonlyargs + a.args + a.kwonlyargs) - (
                        1 if a.args and a.args[0].arg in ("self", "cls") else 0)
                    if n > 8:
                        wide.append(f"{m}.{node.name}: {n}")
    assert wide == []


def test_one_module_installs_signal_handlers():
    """A stop has one owner: `cgpt.stop` installs every signal handler of cgpt's processes
    (the guard, a run's checkpoint triggers, a launcher's and a pool worker's ignored
    signals), also in code that cgpt runs as a string (`python -c`)."""
    found = sorted(m for m, p in MODULES.items() if "signal.signal(" in p.read_text())
    assert found == ["cgpt.stop"]


def test_a_sweep_catches_a_stop_in_one_place():
    """In `cgpt.sweep` one `except` takes a stop (`KeyboardInterrupt`): the launch's, which
    records the results and says the line; the runs are stopped by leaving a `LiveRuns`."""
    found = []
    for m, p in MODULES.items():
        if m.startswith("cgpt.sweep"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.ExceptHandler) and node.type is not None and \
                        "KeyboardInterrupt" in ast.unparse(node.type):
                    found.append(m)
    assert len(found) <= 1, found


def test_importing_cgpt_installs_nothing():
    """`import cgpt` (and its command line's module) leaves the process's signal handlers as
    they were: the process entry, `cgpt.cli.entry`, installs the stop guard, before it
    imports the commands. Before: `cgpt/__init__.py` installed it, reading `sys.orig_argv`."""
    code = ("import signal, sys\n"
            "sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)\n"
            "before = [signal.getsignal(s) for s in sigs]\n"
            "import cgpt, cgpt.cli, cgpt.stop\n"
            "assert [signal.getsignal(s) for s in sigs] == before, 'handlers changed'\n"
            "assert not cgpt.stop.GUARD.installed, 'the guard was installed'\n"
            "assert 'cgpt.cli.commands' not in sys.modules, 'the commands loaded'\n")
    # as `python -m cgpt` locates the package: its import sees the argv of `-m cgpt train`
    p = subprocess.run([sys.executable, "-c", f"import sys; sys.argv[:1] = ['-m']; "
                        f"sys.orig_argv[1:] = ['-m', 'cgpt', 'train']; exec({code!r})"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
