"""Memory and time of moving one artifact blob to and from an S3-compatible store, as the web process (upload)
and a parse worker (download to a temporary file) do it.

Usage (from the repository root; needs the dev extras, which bring moto[server]):

    .venv/bin/python benchmarks/artifact_storage.py [--mib 200 400]

Starts `moto_server` in another process on a free loopback port (so its copy of the object is not counted),
writes a spool file of the given size, stores it with `jobs.intake.artifacts._put_blob` (django-storages'
S3Storage, boto3 multipart) and reads it back with `jobs.intake.artifacts.local_copy`, and prints wall times
and
this process' peak RSS before, after the upload and after the download. Each size runs in a fresh process.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(mib: int) -> None:
    """One run (in this process, configured by the environment the parent set): store, read back, print."""
    import django

    django.setup()
    import boto3

    from jobs.intake import artifacts

    boto3.client(
        "s3",
        endpoint_url=os.environ["ARTIFACT_S3_ENDPOINT_URL"],
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        region_name="us-east-1",
    ).create_bucket(Bucket=os.environ["ARTIFACT_S3_BUCKET"])
    spool = Path(os.environ["FILE_UPLOAD_TEMP_DIR"]) / "spool"
    digest = hashlib.sha256()
    block = os.urandom(1024 * 1024)
    with spool.open("wb") as out:
        for i in range(mib):
            chunk = block[:-8] + i.to_bytes(8, "big")
            digest.update(chunk)
            out.write(chunk)
    sha256 = digest.hexdigest()
    base = _peak_mib()
    started = time.perf_counter()
    artifacts._put_blob(spool, sha256)
    upload_s, after_upload = time.perf_counter() - started, _peak_mib()
    started = time.perf_counter()
    with artifacts.local_copy(sha256) as path:
        download_s = time.perf_counter() - started
        assert path.stat().st_size == mib * 1024 * 1024
    spool.unlink()
    print(
        f"{mib} MiB: upload {upload_s:.1f} s, download {download_s:.1f} s; peak RSS {base:.0f} MiB before, "
        f"{after_upload:.0f} after the upload, {_peak_mib():.0f} after the download; "
        f"temporary copy deleted: {not path.exists()}"
    )


def main() -> None:
    """Start moto_server, then one child process per size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[200, 400])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.child)
        return
    port = _free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)
        for i, mib in enumerate(args.mib):
            with tempfile.TemporaryDirectory() as tmp:
                env = {
                    **os.environ,
                    "PYTHONPATH": str(REPO),
                    "DJANGO_SETTINGS_MODULE": "efficiency.settings",
                    "ARTIFACT_STORAGE": "s3",
                    "ARTIFACT_S3_BUCKET": f"bench-{i}",
                    "ARTIFACT_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                    "ARTIFACT_S3_ACCESS_KEY_ID": "bench",
                    "ARTIFACT_S3_SECRET_ACCESS_KEY": "bench",
                    "ARTIFACT_S3_REGION": "us-east-1",
                    "FILE_UPLOAD_TEMP_DIR": tmp,
                }
                subprocess.run([sys.executable, __file__, "--child", str(mib)], env=env, check=True)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
