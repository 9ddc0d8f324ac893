"""`python -m streamwal.testing.layers`: the import contracts of the packages, checked.

The parts are folders mapped onto `streamwal.*` without `__init__.py` (pyproject.toml,
docs/decisions.md), which import-linter's graph builder cannot see, so the contracts are
checked here from the source with `ast`; imports under `if TYPE_CHECKING:` do not count.
The contracts live in pyproject.toml, [tool.streamwal.imports]:

- `independent`: no chain of imports leads from one of these parts to another (they
  share only what they import in common: `streamwal` itself and `streamwal.proto`);
- `layers`: a part may import the parts listed after it, never one listed before;
- `harness`: production parts never import these (harnesses import everything);
- `pure` / `pure_forbidden`: decision modules import none of these packages, directly or
  through any streamwal module they import;
- `allow`: single imports ("a -> b") exempt from the rules, each with its reason there.

Exit status 1 with one line per broken contract, naming the chain of imports.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Contracts:
    independent: tuple[str, ...]
    layers: tuple[str, ...]
    harness: tuple[str, ...]
    pure: tuple[str, ...]
    pure_forbidden: tuple[str, ...]
    allow: tuple[str, ...] = ()


def load(root: Path = ROOT) -> tuple[dict[str, Path], Contracts]:
    """Every module of the project by name, and the contracts."""
    project = tomllib.loads((root / "pyproject.toml").read_text())
    package_dir: Mapping[str, str] = project["tool"]["setuptools"]["package-dir"]
    modules: dict[str, Path] = {}
    for package, folder in package_dir.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            # A sub-folder mapped on its own (streamwal.testing.sim) keeps its mapping.
            modules.setdefault(name, path)
    rules = project["tool"]["streamwal"]["imports"]
    contracts = Contracts(**{k: tuple(rules.get(k, ())) for k in Contracts.__dataclass_fields__})
    return modules, contracts


def imports(path: Path, name: str, known: Iterable[str]) -> set[str]:
    """What a module imports at run time: project modules by full name, other packages
    by their top-level name; imports under `if TYPE_CHECKING:` left out."""
    tree = ast.parse(path.read_text(), str(path))
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        if target.startswith("streamwal"):
            while target and target not in known:  # `from x import name`: name is no module
                target = target.rpartition(".")[0]
            if target:
                out.add(target)
        else:
            out.add(target.partition(".")[0])

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                for alias in child.names:
                    add(f"{base}.{alias.name}")
            visit(child)

    visit(tree)
    out.discard(name)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _within(module: str, part: str) -> bool:
    return module == part or module.startswith(part + ".")


def _chain(graph: Mapping[str, set[str]], start: str, goal) -> list[str] | None:
    """The shortest chain of imports from `start` to a module `goal` accepts."""
    seen = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, ())):
                if target in seen:
                    continue
                seen[target] = [*seen[module], target]
                if goal(target):
                    return seen[target]
                following.append(target)
        frontier = following
    return None


def check(modules: Mapping[str, Path], contracts: Contracts) -> list[str]:
    """Every broken contract, one line each."""
    graph = {name: imports(path, name, modules) for name, path in modules.items()}
    for edge in contracts.allow:
        source, _, target = (part.strip() for part in edge.partition("->"))
        graph.get(source, set()).discard(target)
    problems: list[str] = []

    def parts_of(prefix: str) -> list[str]:
        return [m for m in sorted(graph) if _within(m, prefix)]

    for part in contracts.independent:
        others = [p for p in contracts.independent if p != part]

        def other(target: str, others: list[str] = others) -> bool:
            return any(_within(target, o) for o in others)

        for module in parts_of(part):
            chain = _chain(graph, module, other)
            if chain:
                problems.append(f"independence: {' -> '.join(chain)}")
    for i, upper in enumerate(contracts.layers):
        for lower in contracts.layers[i + 1 :]:
            for module in parts_of(lower):
                for target in graph[module]:
                    if _within(target, upper):
                        problems.append(f"layers: {module} -> {target} ({lower} is below {upper})")
    production = [m for m in graph if not any(_within(m, h) for h in contracts.harness)]
    for module in production:
        for target in graph[module]:
            if any(_within(target, h) for h in contracts.harness):
                problems.append(f"harness: {module} -> {target} (production imports a harness)")
    forbidden = set(contracts.pure_forbidden)
    for pure in contracts.pure:
        chain = _chain(graph, pure, forbidden.__contains__)
        if chain:
            problems.append(f"pure: {' -> '.join(chain)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    del argv
    modules, contracts = load()
    problems = check(modules, contracts)
    for problem in problems:
        print(problem)
    count = len(contracts.pure) + len(contracts.independent) + len(contracts.layers)
    print(f"import contracts: {len(modules)} modules, {count} rules, {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
