"""The source tree's shape: every folder of Python under oceanus/ is a package.

A folder without __init__.py is a namespace package: it imports, but import-linter's graph
leaves its modules out, so its contracts would report "kept" over imports they never saw
(issue 38: oceanus/frontends/workers/ was such a folder). Folders of assets alone (no .py, like
frontends/metrics/static) are no packages and need none.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "oceanus"


def folders_missing_init(root: Path) -> list[str]:
    """The folders under `root` (itself included) holding .py files but no __init__.py."""
    folders = {path.parent for path in root.rglob("*.py") if "__pycache__" not in path.parts}
    return sorted(
        str(folder.relative_to(root.parent))
        for folder in folders
        if not (folder / "__init__.py").is_file()
    )


def test_every_folder_of_python_under_oceanus_is_a_package() -> None:
    assert folders_missing_init(ROOT) == []


def test_a_folder_of_python_without_init_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "room").mkdir(parents=True)
    (tmp_path / "pkg" / "static").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "room" / "module.py").write_text("")
    (tmp_path / "pkg" / "static" / "page.js").write_text("")
    assert folders_missing_init(tmp_path / "pkg") == ["pkg/room"]
