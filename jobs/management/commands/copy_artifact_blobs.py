"""`manage.py copy_artifact_blobs --from DIR`: copy the blobs of a local artifact store into the configured
artifact storage (moving to ARTIFACT_STORAGE=s3); blobs already there are skipped, so reruns are safe."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.files import File
from django.core.management.base import BaseCommand, CommandError

from jobs.intake.artifacts import artifact_storage, blob_name
from jobs.models import Artifact


class Command(BaseCommand):
    help = "Copy artifact blobs from a local MEDIA_ROOT into the artifact storage (STORAGES['artifacts'])."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--from", dest="source", required=True, help="the old MEDIA_ROOT (holds artifacts/ab/cd/<sha256>)"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        source = Path(opts["source"])
        if not (source / "artifacts").is_dir():
            raise CommandError(f"{source}/artifacts: no such directory")
        storage = artifact_storage()
        copied = present = missing = 0
        for sha256 in Artifact.objects.values_list("sha256", flat=True).distinct().iterator():
            name = blob_name(sha256)
            if storage.exists(name):
                present += 1
                continue
            local = source / name
            if not local.is_file():
                missing += 1
                self.stderr.write(f"{sha256}: not in {source} (its artifacts cannot be parsed again)")
                continue
            with local.open("rb") as blob:  # streamed by the backend (S3: multipart), never all in memory
                storage.save(name, File(blob, name=sha256))
            copied += 1
        self.stdout.write(f"copied {copied}, already stored {present}, missing {missing}")
