"""The Slurm prolog/epilog examples register and end a job against a live server."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.models import ApiToken, Job
from tests.conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "efficiency" / "deploy"
COMMENT = {
    "team": "llm",
    "model": {"name": "llama-7b", "n_params": 6.7e9},
    "dtype": "bf16",
    "gpu_model": "NVIDIA H100 80GB HBM3",
}


def _fake_tools(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    line = (
        f"JobId=48213 JobName=pretrain UserId=alice(1000) Comment={json.dumps(COMMENT)} "
        "TRES=cpu=64,mem=512G,node=2,billing=64,gres/gpu=16 NumNodes=2"
    )
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\ncat <<'EOF'\n{line}\nEOF\n")
    (bin_dir / "logger").write_text('#!/bin/sh\necho "$@" >> "$LOGFILE"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


@pytest.mark.django_db(transaction=True)
def test_slurm_prolog_and_epilog_register_and_end_the_job(
    live_server, make_team, make_user, catalog, tmp_path
):
    if not (shutil.which("jq") and shutil.which("curl")):
        pytest.skip("jq and curl are needed by the Slurm examples (Debian packages jq, curl)")
    team = make_team("llm")
    _, key = ApiToken.issue(make_user("slurm", teams=[team]), "slurmctld")
    env = {
        "PATH": f"{_fake_tools(tmp_path)}:{os.environ['PATH']}",
        "LOGFILE": str(tmp_path / "log"),
        "EFFICIENCY_URL": live_server.url,
        "EFFICIENCY_TOKEN": key,
        "SLURM_JOB_ID": "48213",
        "SLURM_JOB_NAME": "pretrain",
        "SLURM_JOB_USER": "alice",
    }
    subprocess.run(["bash", str(DEPLOY / "slurm-prolog.sh")], env=env, check=True, timeout=60)
    log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
    job = Job.objects.filter(external_id="48213").first()
    assert job is not None, log
    assert job.selector == {"hpc_job": "48213"} and job.gpu_count == 16
    assert job.owner == "alice" and job.gpu_model.name == "H100 SXM"
    subprocess.run(["bash", str(DEPLOY / "slurm-epilog.sh")], env=env, check=True, timeout=60)
    job.refresh_from_db()
    assert job.ended_at is not None and job.status == Job.Status.ENDED


def test_kubernetes_example_is_valid_yaml_with_a_pod_selector():
    import yaml

    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes-job.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Secret", "Job"]
    script = docs[1]["spec"]["template"]["spec"]["initContainers"][0]["args"][0]
    assert '\\"pod\\": \\"$POD\\"' in script and "/api/v1/jobs/" in script
