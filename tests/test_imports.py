"""Import hygiene: no import cycles through cgpt.config or cgpt.plan (function-level imports
included)."""
import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def import_graph(package: str) -> nx.DiGraph:
    """Module -> module edges for every `import` / `from ... import` anywhere in the files."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / package).rglob("*.py")}
    g = nx.DiGraph()
    for mod, path in files.items():
        g.add_node(mod)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            g.add_edges_from((mod, t) for t in targets if t in files and t != mod)
    return g


@pytest.mark.parametrize("sub", ["cgpt.config", "cgpt.plan"])
def test_no_import_cycles(sub):
    g = import_graph("cgpt")
    cycles = [c for c in nx.simple_cycles(g) if any(m.startswith(sub) for m in c)]
    assert cycles == []


def test_the_graph_sees_function_level_imports():
    g = import_graph("cgpt")
    assert g.has_edge("cgpt.model.hf", "cgpt.model.gpt")  # `from cgpt.model.gpt import` in a def
    assert g.has_edge("cgpt.config.flops", "cgpt.config.model")
    assert not g.has_edge("cgpt.config.model", "cgpt.config.flops")
    assert g.has_edge("cgpt.config.overrides", "cgpt.config.run")
    assert not g.has_edge("cgpt.config.run", "cgpt.config.overrides")
