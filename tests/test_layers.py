"""The package order holds (issue #27 item 2): every import in jobs/, module level and inside functions, runs
from a higher floor to a lower one or within a floor, except the few deliberate ones named in EXCEPTIONS.

Floors, lowest first:
  0 data      profiling, metrics (reads Prometheus, writes the archive), models and the plumbing they use
  1 evaluate  evaluation (KPIs, costs, sharing attribution), the registry, the simulator
  2 diagnose  diagnosis (rules)
  3 drive     pipeline (the one driver: load -> evaluate -> store -> archive -> diagnose -> alert; its
  findings
              module stores the rules' findings), alerts,
              outputs, charts
  4 serve     views, api, management commands, tasks, the artifact parse and the other callers

Read with `ast` (nothing is imported, no database): `import a.b`, `from a import b` (b a module or a name),
relative imports and imports inside functions or `if TYPE_CHECKING:` blocks all count. Migrations are left
out: they are frozen history that `migrate` replays, not a floor of the running service.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jobs"

#: Module prefix -> floor. The longest matching prefix wins; a module no prefix matches fails
#: `test_every_module_has_a_floor` (a new package must be placed deliberately).
FLOORS: dict[str, int] = {
    # 0: data
    "jobs": 0,  # the package's own __init__
    "jobs.models": 0,
    "jobs.metrics": 0,
    "jobs.profiling": 0,
    "jobs.runtime": 0,  # locks, enqueue, service_health (health, the /healthz view, is below)
    "jobs.access": 0,  # ownership, permissions (login_throttle, an auth backend, is below)
    "jobs.sso.emails": 0,
    # 1: evaluate
    "jobs.evaluation": 1,
    "jobs.intake.registry": 1,
    "jobs.demo.seed": 1,  # seeds the GPU catalog (the data migration runs it), not demo data
    "jobs.simulate": 1,
    # 2: diagnose
    "jobs.diagnosis": 2,
    # 3: drive
    "jobs.pipeline": 3,
    "jobs.alerts": 3,
    "jobs.outputs": 3,
    "jobs.charts": 3,
    # 4: serve (callers)
    "jobs.views": 4,
    "jobs.api": 4,
    "jobs.management": 4,
    "jobs.templatetags": 4,
    "jobs.tasks": 4,
    "jobs.urls": 4,
    "jobs.admin": 4,
    "jobs.apps": 4,
    "jobs.demo": 4,
    "jobs.runtime.health": 4,
    "jobs.sso": 4,
    "jobs.access.login_throttle": 4,
    "jobs.intake": 4,  # uploads, artifacts, artifact_review, client (the registry is on floor 1 above)
}

#: (importing module, imported module) -> why this import runs up a floor. Each must still be in the code
#: (`test_every_exception_is_still_needed`), so the list only shrinks.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("jobs.models.jobs", "jobs.evaluation.schema"): (
        "Job.evaluation is decoded through the typed schema; schema.py is pure (no Django, no model), so the "
        "model reads its own column's type without depending on the evaluation's code"
    ),
    ("jobs.models.jobs", "jobs.evaluation.costs"): (
        "the job's cost fields are typed Amounts; costs.py is pure arithmetic with no model import"
    ),
    ("jobs.models.catalog", "jobs.evaluation.catalog"): (
        "GpuModel.peak_flops answers from the one sourced GPU table (catalog.py, pure, #27 item 3) "
        "instead of a second copy of the dtype rules in the model"
    ),
    ("jobs.metrics.archive.layout", "jobs.evaluation.schema"): (
        "the derived series' names (DERIVED_MFU, DERIVED_THROUGHPUT) are defined once, with the evaluation "
        "that produces them; the archive stores them under those names"
    ),
    ("jobs.evaluation.kpis", "jobs.diagnosis.thresholds"): (
        "the idle cut-off (IDLE_UTIL_MAX) is one number for the KPI's idle share and the rules; "
        "thresholds.py is a leaf of constants that imports nothing from jobs"
    ),
    ("jobs.profiling.monitoring_common", "jobs.diagnosis.thresholds"): (
        "the same idle cut-off for GPU utilisation read from monitoring logs; a leaf of constants"
    ),
    ("jobs.outputs.compare_data", "jobs.templatetags.units"): (
        "the job's waste total is defined in the template filter the pages use; its one definition moves to "
        "jobs/evaluation under #27 item 3 (definitions once), which removes this exception"
    ),
    ("jobs.outputs.report_render", "jobs.templatetags.units"): (
        "the weekly report formats numbers with the pages' filters, so a figure reads the same in both"
    ),
    ("jobs.outputs.exporter", "jobs.intake.artifacts"): (
        "the exporter reports artifacts stuck in parsing past the parse's hard limit; the grace constant is "
        "defined once, beside the parse that enforces it"
    ),
}


def module_name(path: Path) -> str:
    """The dotted module name of a file under the repository root."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool, known: set[str]) -> set[str]:
    """Every module of `known` that `source` (the text of `module`) imports, at any depth of the tree:
    `from a import b` names a.b when that is a module, else a; relative imports are resolved."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            # `from a import b` with b a module imports b (a's __init__ only incidentally); names import a.
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(target)
    return {name for name in found if name in known}


def floor_of(module: str) -> int | None:
    """The floor of the longest FLOORS prefix of `module` (None when none matches)."""
    best: tuple[int, int] | None = None
    for prefix, floor in FLOORS.items():
        matches = module == prefix or module.startswith(prefix + ".")
        if matches and (best is None or len(prefix) > best[0]):
            best = (len(prefix), floor)
    return None if best is None else best[1]


def _modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.relative_to(PACKAGE).parts
    }


def upward_imports() -> dict[tuple[str, str], tuple[int, int]]:
    """Every (importer, imported) pair of jobs/ whose imported module sits on a higher floor."""
    modules = _modules()
    known = set(modules)
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for name, path in modules.items():
        here = floor_of(name)
        deps = imported_modules(path.read_text(), name, is_package=path.name == "__init__.py", known=known)
        for dep in deps:
            there = floor_of(dep)
            if here is not None and there is not None and there > here:
                out[(name, dep)] = (here, there)
    return out


def test_the_reader_sees_imports_inside_functions_relative_ones_and_modules_named_in_from() -> None:
    known = {"jobs", "jobs.a", "jobs.a.b", "jobs.a.c", "jobs.d", "jobs.e"}  # NAME: a name, not a module
    source = (
        "from jobs.a import b\n"
        "from jobs import NAME\n"
        "from . import c\n"
        "def f():\n"
        "    import jobs.d\n"
        "class K:\n"
        "    def g(self):\n"
        "        from jobs.e import NAME\n"
    )
    assert imported_modules(source, "jobs.a.x", is_package=False, known=known) == {
        "jobs",
        "jobs.a.b",
        "jobs.a.c",
        "jobs.d",
        "jobs.e",
    }


def test_every_module_has_a_floor() -> None:
    assert [name for name in _modules() if floor_of(name) is None] == []


def test_no_import_runs_up_a_floor_except_the_named_ones() -> None:
    upward = upward_imports()
    unexplained = {pair: floors for pair, floors in upward.items() if pair not in EXCEPTIONS}
    assert unexplained == {}, "imports from a lower floor to a higher one (importer, imported): (floors)"


def test_every_exception_is_still_needed() -> None:
    upward = upward_imports()
    assert [pair for pair in EXCEPTIONS if pair not in upward] == []


def test_metrics_reads_and_archives_only_it_calls_no_evaluation_diagnosis_alerting_or_driver() -> None:
    # The data floor's one deliberate upward import is the derived series' names (EXCEPTIONS).
    allowed = {("jobs.metrics.archive.layout", "jobs.evaluation.schema")}
    up = {pair for pair in upward_imports() if pair[0].startswith("jobs.metrics")}
    assert up <= allowed
