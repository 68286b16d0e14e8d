"""Fail when a function of the product code is longer than MAX_LINES (def to last line, docstring included):
the project keeps functions small enough to read at once. Usage: python .ci/long_functions.py [FOLDER ...]"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 60
FOLDERS = ("schemas", "infra", "streams", "trainer", "workers", "app", "bench")


def long_functions(path: Path) -> Iterator[tuple[int, str, int]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                yield node.lineno, node.name, lines


def main(folders: list[str]) -> int:
    found = [f"{path}:{line}: {name} has {lines} lines (at most {MAX_LINES}): split it into named helpers"
             for folder in folders for path in sorted(Path(folder).rglob("*.py"))
             for line, name, lines in long_functions(path)]
    print("\n".join(found) or f"no function over {MAX_LINES} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(FOLDERS)))
