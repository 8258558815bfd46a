"""Facts that live in one place (issue: one source of truth), checked mechanically."""
import ast

from kestrel_lab.book.cache import Project
from kestrel_lab.paths import REPO_ROOT

PROJECT = Project(REPO_ROOT)


def _calls(path, owner, name):
    return [n.lineno for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
            and isinstance(n.func.value, ast.Name) and n.func.value.id == owner]


def test_only_the_threads_module_sets_numba_threads():
    callers = {m: _calls(p, "numba", "set_num_threads") for m, p in PROJECT.modules().items()}
    assert {m for m, lines in callers.items() if lines} == {"kestrel_lab.threads"}, callers


def test_the_engine_has_no_shape_table_of_its_own():
    """Shapes come from vqf.layout: the model module never derives a tensor shape from config fields."""
    src = (REPO_ROOT / "kestrel_lab/engine/model.py").read_text(encoding="utf-8")
    for field in ("q_dim", "kv_dim", "intermediate_size", "moe_intermediate_size"):
        assert field not in src, f"engine/model.py computes shapes from config.{field}: use vqf.layout"
    assert "text_specs(" in src


def test_quant_names_are_read_in_one_place():
    """A quant name is lower-cased (read) only in vqf.layout.resolve_quant; everything else gets a QType."""
    offenders = [f"{mod}:{node.lineno}" for mod, path in PROJECT.modules().items()
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "lower"
                 and isinstance(node.func.value, ast.Name) and node.func.value.id == "quant"]
    assert offenders and all(o.startswith("kestrel_lab.vqf.layout:") for o in offenders), offenders
