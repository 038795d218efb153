"""The Slurm prolog/epilog and the Kubernetes registrar examples register and end jobs against a live server
with the cluster's scheduler credential (jobs.access.ownership): the jobs they register are `scheduler`
jobs."""

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
    make_team("llm")
    # The cluster's scheduler credential, filed under a service account that is in no team.
    _, key = ApiToken.issue(make_user("slurm"), "slurmctld", kind="scheduler", cluster="slurm-a")
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
    assert (job.registered_by, job.cluster) == ("scheduler", "slurm-a")
    subprocess.run(["bash", str(DEPLOY / "slurm-epilog.sh")], env=env, check=True, timeout=60)
    job.refresh_from_db()
    assert job.ended_at is not None and job.status == Job.Status.ENDED


def test_kubernetes_example_keeps_the_scheduler_token_out_of_the_teams_namespace():
    import yaml

    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes-job.yaml").read_text()))
    kinds = [(d["kind"], d["metadata"].get("namespace", "")) for d in docs]
    assert ("Job", "llm") in kinds and ("Deployment", "efficiency") in kinds
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["template"]["metadata"]["labels"]["efficiency.io/register"] == "true"
    described = json.loads(job["spec"]["template"]["metadata"]["annotations"]["efficiency.io/job"])
    assert described["model"]["name"] == "llama-7b"
    secrets = {d["metadata"]["name"]: d["metadata"]["namespace"] for d in docs if d["kind"] == "Secret"}
    assert secrets["efficiency-scheduler-token"] == "efficiency"  # never in the team's namespace
    rbac = yaml.safe_load_all((DEPLOY / "idle-policy-rbac.yaml").read_text())
    role = next(d for d in rbac if d["kind"] == "Role")
    verbs = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert verbs[("", "pods")] == {"get"}  # the policy no longer deletes pods
    assert {"get", "patch"} <= verbs[("batch", "jobs")] and "patch" in verbs[("jobset.x-k8s.io", "jobsets")]


def _fake_kubectl(tmp_path: Path, phase: str) -> Path:
    """`kubectl` answering the registrar's two reads: the team namespaces and the labelled pods."""
    bin_dir = tmp_path / f"kube-{phase}"
    bin_dir.mkdir()
    namespaces = {
        "items": [
            {"metadata": {"name": "llm", "labels": {"efficiency.io/team": "llm"},
                          "annotations": {"efficiency.io/owner": "alice"}}},
        ]
    }  # fmt: skip
    described = {"model": {"name": "llama-7b", "n_params": 6.7e9}, "gpu_model": "NVIDIA H100 80GB HBM3",
                 "team": "vision", "owner": "mallory", "selector": {"job": "dcgm-exporter"}}  # fmt: skip
    pod = {
        "metadata": {
            "name": "pretrain-7b-x1", "namespace": "llm",
            "ownerReferences": [{"kind": "Job", "name": "pretrain-7b", "controller": True}],
            "annotations": {"efficiency.io/job": json.dumps(described)},
        },
        "spec": {"containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        "status": {"phase": phase, "startTime": "2026-11-23T08:00:00Z"},
    }  # fmt: skip
    if phase == "Succeeded":
        pod["status"]["containerStatuses"] = [
            {"state": {"terminated": {"finishedAt": "2026-11-23T20:00:00Z"}}}
        ]
    bare = {**pod, "metadata": {**pod["metadata"], "name": "bare-pod", "ownerReferences": []}}
    (bin_dir / "namespaces.json").write_text(json.dumps(namespaces))
    (bin_dir / "pods.json").write_text(json.dumps({"items": [pod, bare]}))
    answers = f'"get namespaces"*) cat "{bin_dir}/namespaces.json";; *) cat "{bin_dir}/pods.json";;'
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\ncase "$*" in {answers} esac\n')
    (bin_dir / "kubectl").chmod(0o755)
    return bin_dir


@pytest.mark.django_db(transaction=True)
def test_kubernetes_registrar_registers_and_ends_jobs_as_the_platform_declares_them(
    live_server, make_team, make_user, catalog, tmp_path
):
    if not (shutil.which("jq") and shutil.which("curl")):
        pytest.skip("jq and curl are needed by the registrar (Debian packages jq, curl)")
    make_team("llm"), make_team("vision")
    _, key = ApiToken.issue(make_user("k8s"), "registrar", kind="scheduler", cluster="gpu-k8s-a")
    env = {"EFFICIENCY_URL": live_server.url, "EFFICIENCY_TOKEN": key, "REGISTRAR_ONCE": "1"}
    for phase in ("Running", "Succeeded"):
        path = f"{_fake_kubectl(tmp_path, phase)}:{os.environ['PATH']}"
        done = subprocess.run(
            ["bash", str(DEPLOY / "k8s-registrar.sh")], env={**env, "PATH": path}, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and "not registered" not in done.stderr, done.stderr
        job = Job.objects.get()  # the bare pod (no owning Job) is not registered
        # Team and owner from the platform's namespace labels, selector from the pod: the pod's own
        # description cannot move it to another team, name another owner or widen the selector.
        assert (job.external_id, job.team.slug, job.owner) == ("pretrain-7b-x1", "llm", "alice")
        assert job.selector == {"namespace": "llm", "pod": "pretrain-7b-x1"} and job.gpu_count == 8
        assert (job.registered_by, job.cluster) == ("scheduler", "gpu-k8s-a")
    assert job.ended_at is not None and job.ended_at.hour == 20
