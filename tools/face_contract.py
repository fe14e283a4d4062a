"""An import-linter contract type: source packages import only a package's declared face.

`forbidden` contracts list what may not be imported, so every new module behind a face would be
public until someone remembered to forbid it. This contract inverts that: the package under
guard (`face_package`, e.g. oceanus.core) states the modules it offers in a module-level tuple
`FACE` of names relative to itself, and every direct import from a module in `source_modules`
into that package must name the package itself or one of those modules, exactly (listing a
package opens its __init__, not its children). Indirect imports are fine: modules of the face
may use whatever lies behind it. `FACE` is declared once, in the guarded package, and read here
by importing it, so the guarded package's __init__ must stay cheap to import.

    [tool.importlinter]
    contract_types = ["face: tools.face_contract.FaceContract"]

    [[tool.importlinter.contracts]]
    type = "face"
    source_modules = ["oceanus.frontends", "oceanus.backends"]
    face_package = "oceanus.core"
"""

from __future__ import annotations

import importlib
from typing import Any

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def read_face(package: str) -> tuple[str, ...]:
    """The `FACE` tuple `package` declares, as absolute module names."""
    face = getattr(importlib.import_module(package), "FACE", None)
    if not isinstance(face, tuple) or not all(isinstance(name, str) for name in face):
        raise ValueError(f"{package} declares no FACE tuple of module names")
    return tuple(f"{package}.{name}" for name in face)


def face_violations(
    graph: ImportGraph, sources: list[str], package: str, face: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every direct import from `sources` (packages, with their descendants) into `package`
    behind `face`, as {importer, imported, line_numbers}; and the face's names missing from the
    graph (a renamed or deleted module left listed)."""
    allowed = {package, *face}
    behind = package + "."
    violations = []
    for source in sorted(sources):
        importers = {source} | graph.find_descendants(source)
        for importer in sorted(importers):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported.startswith(behind) and imported not in allowed:
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = tuple(sorted(d["line_number"] for d in details))
                    violations.append(
                        {"importer": importer, "imported": imported, "line_numbers": lines}
                    )
    missing = sorted(name for name in face if name not in graph.modules)
    return violations, missing


class FaceContract(Contract):
    """Modules in `source_modules` import `face_package` only through its `FACE` (above)."""

    type_name = "face"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    face_package = fields.ModuleField()

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        package = self.face_package.name  # type: ignore[attr-defined]
        sources = [module.name for module in self.source_modules]  # type: ignore[attr-defined]
        for module in [package, *sources]:
            if module not in graph.modules:
                raise ValueError(f"Module '{module}' does not exist.")
        face = read_face(package)
        violations, missing = face_violations(graph, sources, package, face)
        output.verbose_print(verbose, f"{package}'s face: {', '.join(face)}")
        return ContractCheck(
            kept=not violations and not missing,
            metadata={"package": package, "violations": violations, "missing": missing},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        package = check.metadata["package"]
        for name in check.metadata["missing"]:
            output.print_error(f"{package}.FACE lists {name}, which does not exist.")
            output.new_line()
        for violation in check.metadata["violations"]:
            lines = ", ".join(f"l.{n}" for n in violation["line_numbers"])
            output.print_error(f"{violation['imported']} is not in {package}.FACE:")
            output.new_line()
            output.print_error(
                f"-   {violation['importer']} -> {violation['imported']} ({lines})", bold=False
            )
            output.new_line()
