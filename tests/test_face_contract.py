"""tools/face_contract.py, the import-linter contract that holds the core's face (issue 38):
run in-process on a small package written here, whose frontend imports behind its core's face."""

from __future__ import annotations

import itertools
from pathlib import Path

import grimp
import pytest
from importlinter.domain.contract import InvalidContractOptions

from tools.face_contract import FaceContract

_names = itertools.count()


def _package(root: Path, files: dict[str, str]) -> str:
    """Writes `files` (paths under a fresh package) and returns the package's name."""
    name = f"face_case_{next(_names)}"
    for path, text in {"__init__.py": "", **files}.items():
        target = root / name / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return name


def _contract(package: str) -> FaceContract:
    """The contract as pyproject.toml states it, over `package`'s front and core."""
    return FaceContract(
        name="face",
        session_options={"root_packages": [package]},
        contract_options={
            "source_modules": [f"{package}.front"],
            "face_package": f"{package}.core",
        },
    )


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> list[str]:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, files)
    graph = grimp.build_graph(package, cache_dir=None)
    contract = _contract(package)
    check = contract.check(graph, verbose=False)
    found = [
        f"{v['importer']} -> {v['imported']} {v['line_numbers']}"
        for v in check.metadata["violations"]
    ] + [f"missing {name}" for name in check.metadata["missing"]]
    found = [text.replace(package + ".", "") for text in found]
    assert check.kept == (not found)
    return found


CORE = {
    "core/__init__.py": 'FACE = ("api", "room.open")\n',
    "core/api.py": "from . import behind\n",  # the face may use what lies behind it
    "core/behind.py": "",
    "core/room/__init__.py": "",
    "core/room/open.py": "",
    "core/room/shut.py": "",
    "front/__init__.py": "",
}


def test_imports_through_the_face_keep_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        **CORE,
        "front/ok.py": (
            "from ..core import api\nfrom ..core.room import open\nfrom .. import core\n"
        ),
    }
    assert _check(tmp_path, monkeypatch, files) == []


def test_every_import_behind_the_face_is_reported_with_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {
        **CORE,
        "front/deep/__init__.py": "",
        # a room that is not listed, its unlisted child beside a listed one, twice on two lines
        "front/deep/bad.py": (
            "from ...core import room\nfrom ...core import behind\n"
            "from ...core.room import shut\nimport os\nfrom ...core import behind as again\n"
        ),
    }
    assert _check(tmp_path, monkeypatch, files) == [
        "front.deep.bad -> core.behind (2, 5)",
        "front.deep.bad -> core.room (1,)",
        "front.deep.bad -> core.room.shut (3,)",
    ]


def test_a_face_entry_that_names_no_module_breaks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {**CORE, "core/__init__.py": 'FACE = ("api", "gone")\n'}
    assert _check(tmp_path, monkeypatch, files) == ["missing core.gone"]


def test_a_package_without_face_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {**CORE, "core/__init__.py": "FACE = ['api']\n"}
    with pytest.raises(ValueError, match="declares no FACE tuple"):
        _check(tmp_path, monkeypatch, files)


def test_a_contract_without_its_face_package_is_refused() -> None:
    with pytest.raises(InvalidContractOptions):
        FaceContract(
            name="face",
            session_options={"root_packages": ["oceanus"]},
            contract_options={"source_modules": ["oceanus.frontends"]},
        )


def test_a_broken_face_is_rendered_one_import_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    package = _package(tmp_path, {**CORE, "front/bad.py": "import os\nfrom ..core import behind\n"})
    contract = _contract(package)
    contract.render_broken_contract(
        contract.check(grimp.build_graph(package, cache_dir=None), verbose=False)
    )
    printed = capsys.readouterr().out
    assert f"-   {package}.front.bad -> {package}.core.behind (l.2)" in printed
