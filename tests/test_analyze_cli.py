"""`manage.py analyze_artifact` without Django (jobs.profiling.analyze) prints what Django's command does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from jobs.models import Artifact
from jobs.profiling import analyze
from tests.conftest import sample_path

REPO = Path(__file__).resolve().parents[1]
KINETO_SAMPLE = "kineto/hta_a100_nccl_allreduce_rank0.json.gz"


def _django(*args: str) -> str:
    out = StringIO()
    call_command("analyze_artifact", *args, stdout=out)
    return out.getvalue()


def _fast(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = analyze.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_json_output_is_the_django_commands(capsys):
    path = str(sample_path(KINETO_SAMPLE))
    status, out, _ = _fast(capsys, path, "--json")
    assert status == 0
    assert out == _django(path, "--json")
    assert json.loads(out)["ranks"][0]["rank"] == 0


def test_summary_output_is_the_django_commands_but_the_elapsed_time(capsys):
    path = str(sample_path(KINETO_SAMPLE))
    status, out, _ = _fast(capsys, path)
    assert status == 0

    def timeless(text: str) -> str:
        return re.sub(r"analysed in \d+\.\d\d s", "analysed in T s", text)

    assert "rank 0: idle" in out
    assert timeless(out) == timeless(_django(path))


def test_refusals_are_the_django_commands(capsys, tmp_path):
    svg = str(sample_path("pyspy/pyspy_readme_flamegraph.svg"))
    for path in (str(tmp_path / "nope.json"), svg):
        status, out, err = _fast(capsys, path)
        with pytest.raises(CommandError) as refused:
            _django(path)
        assert (status, out) == (1, "")
        assert err == f"CommandError: {refused.value}\n"


def test_kinds_are_the_artifact_models():
    assert set(analyze.KINDS) == set(Artifact.Kind.values)


def test_decompressed_limit_is_read_as_the_settings_read_it(monkeypatch):
    # Same environment, same helper: the command line and the settings agree, default included.
    assert analyze.max_decompressed_bytes_from_env() == settings.ARTIFACT_MAX_DECOMPRESSED_BYTES
    monkeypatch.setenv("ARTIFACT_MAX_DECOMPRESSED_BYTES", "4096")
    assert analyze.max_decompressed_bytes_from_env() == 4096
    monkeypatch.setenv("ARTIFACT_MAX_DECOMPRESSED_BYTES", "12")
    with pytest.raises(ValueError, match="ARTIFACT_MAX_DECOMPRESSED_BYTES"):
        analyze.max_decompressed_bytes_from_env()


def test_djangos_own_options_go_through_django():
    assert analyze.wants_django(["trace.json", "-v", "2"])
    assert analyze.wants_django(["trace.json", "--settings=efficiency.settings"])
    assert not analyze.wants_django(["trace.json", "--json", "--kind", "kineto", "--rank", "3"])


def test_manage_py_parses_without_importing_django():
    path = str(sample_path(KINETO_SAMPLE))
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "manage.py", "analyze_artifact", path, "--json"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")
    }
    assert "jobs.profiling.kineto" in imported
    assert not {m for m in imported if m.split(".")[0] in ("django", "celery", "efficiency")}
    assert proc.stdout == _django(path, "--json")


@pytest.mark.parametrize("user_value", [None, "4"])
def test_manage_py_gives_numpy_one_blas_thread_unless_the_user_chose_and_no_cyclic_gc(
    user_value: str | None,
) -> None:
    # Read inside the command's own process, after manage.py ran and numpy was imported by the parse.
    probe = (
        "import os, runpy, sys; sys.argv = ['manage.py', 'analyze_artifact', sys.argv[1], '--json']\n"
        "try:\n    runpy.run_path('manage.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "import gc; print(os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules, gc.isenabled(),"
        " file=sys.stderr)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user_value:
        env["OPENBLAS_NUM_THREADS"] = user_value
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(sample_path(KINETO_SAMPLE))],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=120, env=env,
    )  # fmt: skip
    # The command's process also runs without the cyclic collector (it exits after one parse).
    assert proc.stderr.strip().splitlines()[-1] == f"{user_value or 1} True False"


def test_the_efficiency_client_imports_only_requests_and_the_standard_library():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "jobs.intake.client", "--help"],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {
        line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")
    }
    assert "requests" in imported
    heavy = ("django", "celery", "numpy", "efficiency", "msgspec", "orjson")
    assert not {m for m in imported if m.split(".")[0] in heavy}
    # Its parent packages load first (jobs/intake/__init__.py is a docstring): nothing else of the service.
    assert not {m for m in imported if m.startswith("jobs.")} - {"jobs.intake", "jobs.intake.client"}
