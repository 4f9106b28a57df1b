"""The package's layering holds (docs/architecture.md): imports run one way, no cycles, no hidden
function-level imports of the package's own modules, no function body too long to read.

These read the source with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "memtp_sim"

#: Floors, lowest first (docs/architecture.md). A module may import its own floor or lower ones.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "_version", "_io", "_html", "_procs", "_lazy", "_compiled"),
    ("hardware", "acceptance", "workload", "memtp", "exactness", "measure", "_measure_shapes", "_measure_torch"),
    ("confidence", "telemetry", "policies", "lab"),
    ("drafting", "kv_cache"),
    ("config",),
    ("engine",),
    ("metrics",),
    ("api",),
    ("study", "capacity"),
    ("report",),
    ("tuning",),
    ("cli", "__main__", "__init__", "dashboard"),
]
FLOOR_OF = {name: i for i, names in enumerate(FLOORS) for name in names}

#: A function body longer than this needs a comment saying why it must be one piece.
MAX_BODY_LINES = 80
ONE_PIECE_MARK = "one piece"


def _modules() -> dict[str, Path]:
    """Dotted names relative to the package (``engine``, ``policies.dspark``) -> file."""
    out = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    """Package-relative names a statement imports (empty for third-party imports)."""
    if isinstance(node, ast.Import):
        return [a.name.removeprefix("memtp_sim.") for a in node.names
                if a.name == "memtp_sim" or a.name.startswith("memtp_sim.")]
    if node.level == 0:
        if node.module and (node.module == "memtp_sim" or node.module.startswith("memtp_sim.")):
            base = node.module.removeprefix("memtp_sim").lstrip(".")
            return [base or "__init__"]
        return []
    parts = module.split(".") if module != "__init__" else []
    if not is_pkg:
        parts = parts[:-1]
    up = node.level - 1
    parts = parts[: len(parts) - up] if up else parts
    base = ".".join(parts + ([node.module] if node.module else []))
    if not base:  # `from . import x` at the package root
        return [a.name for a in node.names]
    return [base]


def _imports(module: str, path: Path) -> list[tuple[str, int, bool, bool]]:
    """(imported module, line, inside a function, under TYPE_CHECKING) for each package import."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int, bool, bool]] = []

    def visit(node: ast.AST, in_func: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in _resolve(module, child, is_pkg):
                    out.append((name, child.lineno, in_func, type_only))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(child, in_func, True)
            else:
                visit(child, in_func, type_only)

    visit(tree, False, False)
    return out


MODULES = _modules()


def test_every_module_has_a_floor():
    missing = sorted({_top(m) for m in MODULES} - set(FLOOR_OF))
    assert not missing, f"add these modules to FLOORS and docs/architecture.md: {missing}"


def test_no_module_imports_a_higher_floor():
    bad = []
    for mod, path in MODULES.items():
        mine = FLOOR_OF[_top(mod)]
        for name, line, _, type_only in _imports(mod, path):
            if type_only or _top(name) == _top(mod):
                continue
            theirs = FLOOR_OF.get(_top(name))
            if theirs is not None and theirs > mine:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {name} (floor {theirs} > {mine})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for name, _, in_func, type_only in _imports(mod, path):
            if type_only or mod == "__init__":
                continue
            # a module imports a package's __init__ (and so its submodules) when it names the package
            target = name if name in MODULES else _top(name)
            if target in graph and target != mod and not mod.startswith(target + "."):
                graph[mod].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = dfs(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = dfs(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_function_level_imports_of_the_package_say_why():
    bad = []
    for mod, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for name, line, in_func, type_only in _imports(mod, path):
            if not in_func or type_only:
                continue
            here, above = lines[line - 1], lines[line - 2] if line >= 2 else ""
            if "#" not in here and not above.strip().startswith("#"):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {name} inside a function without a "
                           "comment saying why")
    assert not bad, "\n".join(bad)


def _long_functions() -> list[str]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            start = body[0].lineno
            if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and len(body) > 1:
                start = body[1].lineno  # the docstring does not count
            length = node.end_lineno - start + 1
            head = "\n".join(lines[node.lineno - 1: start + 2]).lower()
            if length > MAX_BODY_LINES and ONE_PIECE_MARK not in head:
                out.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_long_function_without_a_reason():
    long = _long_functions()
    assert not long, (f"function bodies over {MAX_BODY_LINES} lines need a comment near their top saying why "
                      f"they must be {ONE_PIECE_MARK!r}:\n" + "\n".join(long))


@pytest.mark.parametrize("bad", ["from .engine import Engine\n", "from memtp_sim.api import run\n"])
def test_the_floor_check_can_fail(tmp_path, bad):
    # the checker sees an upward import written the two ways the package writes imports
    f = tmp_path / "hardware.py"
    f.write_text(bad)
    names = [n for n, *_ in _imports("hardware", f)]
    assert names and all(FLOOR_OF[_top(n)] > FLOOR_OF["hardware"] for n in names)


#: Writers that take where to write, by name: (its keyword, its position). pandas' and plotly's are
#: methods (of a frame, of a figure); pyarrow's are functions (pq.write_table, or imported by name)
#: and ParquetWriter; numpy's are np.save... (a method call of that name on anything is counted).
_METHOD_WRITERS = {
    "to_csv": ("path_or_buf", 0), "to_parquet": ("path", 0), "to_json": ("path_or_buf", 0), "to_feather": ("path", 0),
    "to_pickle": ("path", 0), "to_excel": ("excel_writer", 0), "to_hdf": ("path_or_buf", 0), "to_html": ("buf", 0),
    "to_orc": ("path", 0), "to_latex": ("buf", 0), "to_markdown": ("buf", 0), "to_string": ("buf", 0),
    "to_xml": ("path_or_buffer", 0), "to_stata": ("path", 0),
    "write_html": ("file", 0), "write_image": ("file", 0), "write_json": ("file", 0),
    "save": ("file", 0), "savetxt": ("fname", 0), "savez": ("file", 0), "savez_compressed": ("file", 0)}
_ARROW_WRITERS = {"write_table": ("where", 1), "write_csv": ("output_file", 1), "write_feather": ("dest", 1),
                  "write_to_dataset": ("root_path", 1), "write_dataset": ("base_dir", 1),
                  "write_metadata": ("where", 1), "ParquetWriter": ("where", 0)}


def _writes_mode(modes: list[ast.AST]) -> bool:
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+") for m in modes)


def _direct_writes(tree: ast.AST) -> list[int]:
    """Lines that write a file other than through memtp_sim._io's atomic writers: Path.write_text /
    write_bytes, open() or ZipFile() in a writing mode, a frame's to_csv / to_parquet / to_json
    (...), a figure's write_html (...), np.save (...), or pyarrow's write_table / write_csv /
    ParquetWriter (...) given where to write, by position or keyword (a buffer named buf... is
    fine: its bytes then go through the atomic writer; None writes nowhere)."""
    # pyarrow's writers imported by name, under their own name or another (from pyarrow.csv import
    # write_csv as wcsv); a bare call of another name (the project's own write_csv) is not one
    arrow_names = {a.asname or a.name: a.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyarrow")
                   for a in node.names}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Attribute, ast.Name)):
            continue
        attr = isinstance(node.func, ast.Attribute)
        name = node.func.attr if attr else arrow_names.get(node.func.id, node.func.id)
        if name in ("write_text", "write_bytes"):
            out.append(node.lineno)
        elif name in ("open", "ZipFile"):
            modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
            if name == "open" and attr and node.args[:1] and not isinstance(node.func.value, ast.Name):
                modes = [node.args[0]] + modes  # Path(...).open("w")
            elif name == "open" and attr:
                modes = list(node.args[:1]) + modes  # path.open("w")
            into_buffer = name == "ZipFile" and node.args[:1] and isinstance(node.args[0], ast.Name) \
                and node.args[0].id.startswith("buf")  # (a zip built in memory)
            if _writes_mode(modes) and not into_buffer:
                out.append(node.lineno)
        elif (name in _METHOD_WRITERS and attr) or (name in _ARROW_WRITERS and (attr or node.func.id in arrow_names)):
            keyword, pos = _ARROW_WRITERS[name] if name in _ARROW_WRITERS else _METHOD_WRITERS[name]
            where = next((k.value for k in node.keywords if k.arg == keyword), None)
            if where is None and len(node.args) > pos:
                where = node.args[pos]
            if where is None or (isinstance(where, ast.Constant) and where.value is None):
                continue  # (returns the text, or writes nowhere)
            if not (isinstance(where, ast.Name) and where.id.startswith("buf")):
                out.append(node.lineno)
    return out


def test_every_file_the_package_writes_goes_through_the_atomic_writers():
    """Results are written atomically (an interrupted run never leaves half a file): the drafter
    lab's report.html and `measure`'s CSV were written directly; this finds any other."""
    found = []
    for name, path in _modules().items():
        if name == "_io":
            continue
        found += [f"memtp_sim/{path.relative_to(PKG)}:{line}" for line in _direct_writes(ast.parse(path.read_text()))]
    assert not found, f"write these with memtp_sim._io.atomic_write_text/_bytes: {found}"


@pytest.mark.parametrize("src", [
    'Path("x").write_text("a")', 'open(p, "w")', 'p.open("a")', 'open(p, "r+")', 'zipfile.ZipFile(p, "w")',
    'df.to_csv(path)', 'df.to_parquet("r.parquet")', 'df.to_parquet(path="r.parquet")', 'df.to_html(path)',
    'df.to_xml(path_or_buffer=p)', 'fig.write_html(path)', 'np.save(path, a)', 'np.savetxt(fname=p, X=a)',
    'pq.write_table(t, "r.parquet")', 'pq.write_table(t, where="r.parquet")', 'pq.write_table(t, pq_path)',
    'pyarrow.csv.write_csv(t, path)', 'pq.ParquetWriter("r.parquet", schema)', 'pq.write_metadata(schema, p)',
    'pyarrow.feather.write_feather(t, dest=p)', 'pq.write_to_dataset(t, root_path="d")',
    'from pyarrow.parquet import write_table\nwrite_table(t, "r.parquet")',
    'from pyarrow.csv import write_csv as wcsv\nwcsv(t, path)'])
def test_the_atomic_write_check_can_fail(src):
    assert _direct_writes(ast.parse(src)) == [src.count("\n") + 1]


def test_the_atomic_write_check_passes_buffers_and_other_calls():
    # buffers whose bytes go through the atomic writers; a frame's text returned; the project's own
    # write_csv (not pyarrow's); reading
    src = ("df.to_csv(buf, index=False); text = df.to_csv(index=False); open(p); p.open(); spec.to_json()\n"
           "pq.write_table(t, buf_pq); pq.write_table(t, where=buf); write_csv(path, rows); pq.read_table(p)\n"
           "df.to_csv(None, index=False); fig.to_html(full_html=False); zipfile.ZipFile(p); open(p, 'rb')\n"
           "zipfile.ZipFile(buf, 'w')")
    assert _direct_writes(ast.parse(src)) == []