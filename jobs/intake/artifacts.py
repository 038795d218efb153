"""Profiling artifacts: content-addressed storage of uploads, kind detection, parsing into analyses.

Uploads are untrusted. They are streamed to a local spool file with a size limit while hashing, stored
once per sha256 as `artifacts/ab/cd/<sha256>` in the Django storage `storages["artifacts"]` (the local
filesystem under MEDIA_ROOT by default, an S3-compatible object store with ARTIFACT_STORAGE=s3), never
served inline (SVG and HTML are refused outright), and parsed by a worker with decompression and time
limits inside the parsers; a worker on another machine downloads the blob to a temporary file first. A
failed parse stores a reason for the user and leaves everything else as it was. A blob is deleted with the
last artifact that references its sha256.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from jobs.diagnosis.artifacts import capture as captured
from jobs.intake.registry import resolve_gpu_model
from jobs.models import Artifact, Job
from jobs.pipeline.refresh import reevaluate
from jobs.profiling.detect import detect_kind, read_head
from jobs.profiling.errors import ArtifactError, ParserBug
from jobs.profiling.monitoring_common import parse_zone
from jobs.profiling.run_check import JobFacts, RunCheckResult, check_run
from jobs.profiling.safe_json import clean_text, make_storable
from jobs.profiling.schema.trace import TraceAnalysis, decode_trace
from jobs.runtime.enqueue import enqueue

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
# Seconds between the soft time limit (the parse records why it stopped) and the hard one (the worker
# child is killed); the sweep waits for both.
PARSE_HARD_LIMIT_GRACE_S = 60
# First key of the advisory locks on blobs (pg_advisory_xact_lock(space, sha256 prefix)): "blob".
_BLOB_LOCK_SPACE = 0x626C6F62
REJECTED_KINDS = {
    "svg": "SVG flame graphs are not accepted (they carry scripts and cannot be analysed); "
    "upload py-spy's raw output (--format raw) or speedscope JSON (--format speedscope) instead",
    "html": "HTML files are not accepted; upload the profiler's raw data (Kineto JSON, nsys SQLite, CSV)",
}


class UploadError(ValueError):
    """An upload that is refused; the message is shown to the uploader."""


def artifact_storage() -> Storage:
    """The Django storage that holds artifact blobs (settings.STORAGES["artifacts"], looked up per call so
    a settings override in tests takes effect)."""
    return storages["artifacts"]


def storage_root() -> Path:
    """The local directory of the blobs with the default storage, and of the upload spool (`tmp/`) with
    every storage: an upload is hashed on local disk before it gets its content-addressed name."""
    return Path(settings.MEDIA_ROOT) / "artifacts"


def blob_name(sha256: str) -> str:
    """The content-addressed name of a blob in the artifact storage: artifacts/ab/cd/abcd...."""
    return f"artifacts/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def _local_path(storage: Storage, name: str) -> Path | None:
    try:
        return Path(storage.path(name))
    except NotImplementedError:  # object stores have no local path
        return None


def blob_path(sha256: str) -> Path:
    """The local path of a blob; NotImplementedError with a storage that has none (use `local_copy`)."""
    return Path(artifact_storage().path(blob_name(sha256)))


def _lock_blob(sha256: str) -> None:
    """Serialise, until the transaction ends, the uploads and deletions of one sha256 (a Postgres advisory
    lock): a blob is never deleted between an upload finding it stored and that upload's artifact commit."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_BLOB_LOCK_SPACE, int(sha256[:7], 16)])


def _put_blob(spooled: Path, sha256: str) -> None:
    """Store the spooled upload as its blob unless the blob is already there (same name, same bytes)."""
    storage, name = artifact_storage(), blob_name(sha256)
    local = _local_path(storage, name)
    if local is not None:
        if not local.exists():
            local.parent.mkdir(parents=True, exist_ok=True)
            os.replace(spooled, local)  # same filesystem as the spool: atomic, no copy
        return
    if storage.exists(name):
        return
    with spooled.open("rb") as source:  # the backend streams it (S3: multipart upload), never all in memory
        saved = storage.save(name, File(source, name=sha256))
    if saved != name:  # a backend that renames instead of overwriting lost a race with the same bytes
        storage.delete(saved)


@contextmanager
def local_copy(sha256: str) -> Iterator[Path]:
    """A local path to the blob for a parser: the blob itself on the filesystem storage, else a temporary
    file the blob is streamed into, deleted on exit. FileNotFoundError when the blob is missing; any other
    storage failure (object store unreachable, access denied) becomes an OSError with the reason."""
    storage, name = artifact_storage(), blob_name(sha256)
    local = _local_path(storage, name)
    if local is not None:
        if not local.is_file():
            raise FileNotFoundError(str(local))
        yield local
        return
    fd, temp_name = tempfile.mkstemp(prefix="artifact-", dir=settings.FILE_UPLOAD_TEMP_DIR)
    temp = Path(temp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, storage.open(name, "rb") as source:
                obj = getattr(source, "obj", None)
                if obj is not None and hasattr(obj, "download_fileobj"):
                    # django-storages' S3File: boto3 streams the object straight into the file (ranged GETs
                    # in parallel) instead of spooling it into the S3File's buffer first.
                    obj.download_fileobj(out)
                else:
                    shutil.copyfileobj(source, out, _CHUNK)
        except OSError:  # FileNotFoundError included: the parse says "missing"
            raise
        except Exception as exc:  # botocore's errors and other backends' own exceptions
            raise OSError(f"{type(exc).__name__}: {str(exc)[:300]}") from exc
        yield temp
    finally:
        temp.unlink(missing_ok=True)


def delete_blob_if_unreferenced(sha256: str) -> bool:
    """Delete the blob of `sha256` when no artifact references it any more; True when it was deleted."""
    with transaction.atomic():
        _lock_blob(sha256)
        if Artifact.objects.filter(sha256=sha256).exists():
            return False
        artifact_storage().delete(blob_name(sha256))
    return True


def artifact_deleted(sender: type[Artifact], instance: Artifact, **_: Any) -> None:
    """post_delete receiver of Artifact (a job's deletion cascades here too): once the deletion commits,
    delete the blob unless another artifact (another job's upload of the same bytes) still uses it."""
    sha256 = instance.sha256

    def delete() -> None:
        try:
            delete_blob_if_unreferenced(sha256)
        except Exception:  # storage down: the blob stays as an orphan, the deletion itself stands
            log.exception("blob %s of a deleted artifact could not be deleted", sha256)

    transaction.on_commit(delete)


def _stream_to_temp(stream: BinaryIO, max_bytes: int) -> tuple[Path, str, int]:
    root = storage_root()
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=root / "tmp", prefix="upload-")
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := stream.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise UploadError(
                        f"file is larger than the {max_bytes / 1024**2:.0f} MiB limit (ARTIFACT_MAX_BYTES)"
                    )
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name), digest.hexdigest(), size


def _chunks_of(upload: Any) -> BinaryIO:
    if hasattr(upload, "open") and hasattr(upload, "chunks"):
        upload.open("rb")
        upload.seek(0)
    return upload


def store_upload(
    job: Job,
    upload: Any,
    *,
    kind: str | None = None,
    rank: int | None = None,
    user: Any = None,
    filename: str | None = None,
    parse: bool = True,
    time_zone: str | None = None,
) -> Artifact:
    """Store an uploaded file for `job` (deduplicated by sha256) and queue its parsing.

    `upload` is a Django UploadedFile or any binary file object. Re-uploading the same bytes to the
    same job returns the existing artifact (re-queued for parsing if it had failed, or if `time_zone`
    changed). `time_zone` (IANA name or offset such as +02:00): the zone of a monitoring log's zone-less
    timestamps (nvidia-smi, dstat print the host's local time); kept in the analysis' `upload_options`
    (no model field), read by every parse of the artifact.
    """
    options = upload_options(time_zone)
    name = Path(filename or getattr(upload, "name", "") or "upload").name[:255]
    if kind and kind not in Artifact.Kind.values:
        raise UploadError(f"unknown kind {kind!r}; use one of {', '.join(Artifact.Kind.values)}")
    if rank is not None and not 0 <= rank < 2**31:
        raise UploadError("rank must be from 0 to 2147483647")
    temp, sha256, size = _stream_to_temp(_chunks_of(upload), settings.ARTIFACT_MAX_BYTES)
    try:
        if size == 0:
            raise UploadError("the file is empty")
        final_kind = _detect(name, temp, given=kind)
        if _local_path(artifact_storage(), blob_name(sha256)) is None:
            _put_blob(temp, sha256)  # the slow upload to an object store, outside the transaction
        with transaction.atomic():
            # Under the blob's lock: store it (again, if the last artifact using it was deleted meanwhile:
            # one HEAD request otherwise) and reference it in the same transaction.
            _lock_blob(sha256)
            _put_blob(temp, sha256)
            artifact, created = Artifact.objects.get_or_create(
                job=job,
                sha256=sha256,
                defaults={
                    "kind": final_kind,
                    "rank": rank,
                    "original_name": name,
                    "size_bytes": size,
                    "uploaded_by": user if getattr(user, "is_authenticated", False) else None,
                    "analysis": {UPLOAD_OPTIONS: options} if options else {},
                },
            )
            new_options = bool(options) and options != _options_of(artifact)
            requeue = (
                created
                or artifact.status == Artifact.Status.FAILED
                or (kind and kind != artifact.kind)
                or new_options
            )
            if not created and requeue:
                artifact.kind = final_kind
                artifact.status, artifact.error = Artifact.Status.QUEUED, ""
                artifact.parse_attempts, artifact.parse_started_at = 0, None
                fields = ["kind", "status", "error", "parse_attempts", "parse_started_at"]
                if new_options:
                    artifact.analysis = {UPLOAD_OPTIONS: options}
                    fields.append("analysis")
                artifact.save(update_fields=fields)
            if requeue and parse:
                transaction.on_commit(lambda: _enqueue(artifact.pk))
    finally:
        temp.unlink(missing_ok=True)
    return artifact


#: Key of the upload's options (the time zone of a monitoring log) inside Artifact.analysis.
UPLOAD_OPTIONS = "upload_options"


def upload_options(time_zone: str | None) -> dict[str, str]:
    """The options an upload keeps for its parses; UploadError when the time zone is unknown."""
    text = (time_zone or "").strip()
    if not text:
        return {}
    try:
        _, name = parse_zone(text)
    except ArtifactError as exc:
        raise UploadError(str(exc)) from None
    return {"timezone": name}


def _options_of(artifact: Artifact) -> dict[str, str]:
    analysis = artifact.analysis if isinstance(artifact.analysis, dict) else {}
    options = analysis.get(UPLOAD_OPTIONS)
    return {k: v for k, v in options.items() if isinstance(v, str)} if isinstance(options, dict) else {}


def _detect(name: str, path: Path, given: str | None = None) -> str:
    try:
        kind = detect_kind(name, read_head(path))
    except ArtifactError as exc:
        if given:
            return given  # the uploader says what it is; the parser will say if it is not
        raise UploadError(f"{exc}; pass the kind explicitly if the file is right") from None
    if kind in REJECTED_KINDS:
        raise UploadError(REJECTED_KINDS[kind])
    if kind not in Artifact.Kind.values:
        raise UploadError(f"unsupported file type {kind!r}")
    return given or kind


def _enqueue(artifact_id: int) -> None:
    """Queue the parse; when the broker cannot take it the artifact fails with the reason instead of
    waiting in "queued" for a message that was never sent (the upload itself is kept)."""
    try:
        enqueue("parse_artifact", artifact_id)
    except (KombuOperationalError, ConnectionError, TimeoutError) as exc:
        log.exception("artifact %s: the parse could not be queued", artifact_id)
        Artifact.objects.filter(pk=artifact_id, status=Artifact.Status.QUEUED).update(
            status=Artifact.Status.FAILED,
            error=f"the parse could not be queued ({type(exc).__name__}: the task broker is unreachable); "
            "the file is kept, re-parse it when the service is back",
            parsed_at=timezone.now(),
        )


def requeue(artifact: Artifact) -> Artifact:
    """Parse a stored artifact again (after a parser fix, or to retry a failure)."""
    Artifact.objects.filter(pk=artifact.pk).update(
        status=Artifact.Status.QUEUED, error="", parse_attempts=0, parse_started_at=None
    )
    transaction.on_commit(lambda: _enqueue(artifact.pk))
    artifact.refresh_from_db()
    return artifact


def analyze_file(
    path: str | Path,
    kind: str,
    *,
    rank: int | None = None,
    filename: str | None = None,
    time_zone: str | None = None,
) -> dict:
    """Parse and analyse one artifact file of a known kind; raises ArtifactError with a user-facing reason.
    `time_zone`: the zone of a monitoring log's zone-less timestamps (UTC when None, stated in the result)."""
    # One dispatch for the worker and the command line (jobs.profiling.analyze), with the configured limit.
    from jobs.profiling.analyze import analyze_path

    return analyze_path(
        path, kind, rank=rank, filename=filename, time_zone=time_zone,
        max_decompressed_bytes=settings.ARTIFACT_MAX_DECOMPRESSED_BYTES,
    )  # fmt: skip


def _rank_median(values: Iterable[float | None]) -> float | None:
    # The upper median of the ranks that have the number (one rank's value when it alone has it).
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def profiler_step_time_ms(trace: TraceAnalysis) -> float | None:
    """Median step time (ms) across ranks from a trace analysis, when the trace marks steps."""
    return _rank_median(r.step_times.median_ms for r in trace.ranks) or None


def profiler_comm_share_pct(trace: TraceAnalysis) -> float | None:
    """Median communication share of the step (%) across ranks (TensorBoard-style step breakdown)."""
    return _rank_median(r.step_breakdown.communication_pct for r in trace.ranks)


def sanitize_json(value: Any) -> Any:
    """A copy of an analysis that Postgres' jsonb and every page encoder accept (the one definition:
    `jobs.profiling.safe_json.make_storable`: NaN/Inf and integers past ±2^53 become None, NUL dropped,
    lone surrogates U+FFFD, strings capped)."""
    return make_storable(value)[0]


def parse_artifact(artifact_id: int) -> Artifact | None:
    """Parse one stored artifact and record the outcome: it always ends `done` or `failed` with a reason.

    Each start counts in `parse_attempts` (redeliveries after a lost worker included); past
    ARTIFACT_MAX_PARSE_ATTEMPTS the artifact fails instead of being parsed again. A message for an
    artifact that already finished (a redelivery after the result was saved) changes nothing; `requeue`
    and a new upload reset the count. The analysis is sanitised before it is saved, and a save that the
    database still refuses fails the artifact with the reason.
    """
    artifact = Artifact.objects.select_related("job").filter(pk=artifact_id).first()
    if artifact is None:
        return None
    if artifact.status in (Artifact.Status.DONE, Artifact.Status.FAILED):
        log.info("artifact %s already %s; duplicate parse message ignored", artifact.pk, artifact.status)
        return artifact
    now = timezone.now()
    options = _options_of(artifact)
    Artifact.objects.filter(pk=artifact.pk).update(
        status=Artifact.Status.PARSING, error="", parse_started_at=now, parse_attempts=F("parse_attempts") + 1
    )
    artifact.refresh_from_db(fields=["status", "error", "parse_started_at", "parse_attempts"])
    limit = settings.ARTIFACT_MAX_PARSE_ATTEMPTS
    if artifact.parse_attempts > limit:
        return _failed(
            artifact,
            f"parsing was started {artifact.parse_attempts - 1} times without finishing (the worker was lost "
            f"each time, e.g. killed for memory; ARTIFACT_MAX_PARSE_ATTEMPTS={limit}); the file is kept, "
            "re-parse it to try again",
        )
    try:
        # A worker without the blob on its disk parses a temporary copy, deleted as soon as the parse ends.
        with local_copy(artifact.sha256) as path:
            analyzed = analyze_file(
                path,
                artifact.kind,
                rank=artifact.rank,
                filename=artifact.original_name,
                time_zone=options.get("timezone"),
            )
            if options:
                analyzed[UPLOAD_OPTIONS] = options  # kept for the next parse of the same upload
            analysis = sanitize_json(analyzed)
    except ParserBug as exc:  # always a bug in our parser, not in the file: logged with its traceback
        log.error("artifact %s: parser bug: %s", artifact.pk, exc, exc_info=exc)
        return _failed(artifact, str(exc))
    except ArtifactError as exc:
        return _failed(artifact, str(exc))
    except FileNotFoundError:
        return _failed(artifact, "the stored file is missing; upload it again")
    except SoftTimeLimitExceeded:
        budget = settings.ARTIFACT_PARSE_BUDGET_S
        return _failed(
            artifact,
            f"parsing took longer than {budget:.0f} s (ARTIFACT_PARSE_BUDGET_S) and was stopped; "
            "the file is kept",
        )
    except MemoryError:
        return _failed(artifact, "parsing ran out of memory and was stopped; the file is kept")
    except OSError as exc:
        log.exception("artifact %s: storage error while parsing", artifact.pk)
        return _failed(
            artifact, f"the stored file could not be read ({type(exc).__name__}: {exc.strerror or exc})"
        )
    except Exception as exc:  # a parser bug must not lose the upload or kill the worker
        log.exception("artifact %s: unexpected error while parsing", artifact.pk)
        return _failed(artifact, f"internal error while parsing ({type(exc).__name__}); the file is kept")
    try:
        checked = run_check(artifact, analysis)
        with transaction.atomic():
            artifact.analysis = analysis
            artifact.status = Artifact.Status.DONE
            artifact.error = ""
            artifact.parsed_at = timezone.now()
            artifact.run_check, artifact.run_mismatches = checked.status, checked.mismatches
            artifact.save(
                update_fields=["analysis", "status", "error", "parsed_at", "run_check", "run_mismatches"]
            )
            refresh_profiler_facts(artifact.job_id)
    except (DatabaseError, ValueError, TypeError) as exc:
        log.exception("artifact %s: the analysis could not be saved", artifact.pk)
        artifact.analysis = None
        return _failed(
            artifact,
            f"the analysis could not be saved ({type(exc).__name__}: {str(exc)[:200]}); the file is kept",
        )
    if checked.mismatches:
        log.warning(
            "artifact %s (%s) does not match job %s: %s; not used until a user confirms it",
            artifact.pk,
            artifact.original_name,
            artifact.job.external_id,
            "; ".join(checked.mismatches),
        )
    after_parse(artifact)
    return artifact


def run_check(artifact: Artifact, analysis: dict[str, Any]) -> RunCheckResult:
    """Compare the analysis' capture metadata (GPU, time, rank) with the artifact's job."""
    job = artifact.job
    facts = JobFacts(
        gpu_model=job.gpu_model.name if job.gpu_model else None,
        gpu_count=job.gpu_count,
        start_unix=job.started_at.timestamp(),
        end_unix=job.ended_at.timestamp() if job.ended_at else None,
        hosts=tuple(
            str(g["hostname"])
            for g in (job.gpus if isinstance(job.gpus, list) else [])
            if isinstance(g, dict) and g.get("hostname")
        ),
    )

    def canonical(name: str) -> str | None:
        gpu = resolve_gpu_model(name)
        return gpu.name if gpu is not None else None

    # nvidia-smi analyses stored before their parser wrote a capture block get one from their own columns.
    capture = captured(analysis)
    return check_run(
        capture, facts, rank=artifact.rank, now_unix=timezone.now().timestamp(), canonical_gpu=canonical
    )


def refresh_profiler_facts(job_id: int) -> None:
    """Set the job's profiler step time and communication share from the artifacts the diagnosis uses
    (the most recently uploaded one that has each), or clear them when none has: the only writer of these
    two columns, called after a parse and after a user confirms or excludes an artifact."""
    found: dict[str, float | None] = {"profiler_step_time_ms": None, "profiler_comm_share_pct": None}
    for art in Artifact.objects.used_in_diagnosis().filter(job_id=job_id).order_by("uploaded_at", "pk"):
        trace = decode_trace(art.analysis)
        for key, value in (
            ("profiler_step_time_ms", profiler_step_time_ms(trace)),
            ("profiler_comm_share_pct", profiler_comm_share_pct(trace)),
        ):
            if value is not None:
                found[key] = value
    Job.objects.filter(pk=job_id).update(**found)


def _failed(artifact: Artifact, reason: str) -> Artifact:
    log.warning("artifact %s (%s) failed to parse: %s", artifact.pk, artifact.original_name, reason)
    artifact.status, artifact.error, artifact.parsed_at = (
        Artifact.Status.FAILED,
        clean_text(reason, 2000),
        timezone.now(),
    )
    # An update, not save(): a stale in-memory analysis the database refused must not be written again.
    Artifact.objects.filter(pk=artifact.pk).update(
        status=artifact.status, error=artifact.error, parsed_at=artifact.parsed_at
    )
    return artifact


def sweep_stuck(now: Any = None) -> list[int]:
    """Fail the artifacts left in `parsing` past their budget (ARTIFACT_PARSE_BUDGET_S plus the hard-limit
    grace): their worker was lost (host killed, OOM) and no redelivery finished them. Returns their ids."""
    now = now or timezone.now()
    budget = settings.ARTIFACT_PARSE_BUDGET_S
    cutoff = now - timedelta(seconds=budget + PARSE_HARD_LIMIT_GRACE_S)
    stuck = Artifact.objects.filter(status=Artifact.Status.PARSING).filter(
        Q(parse_started_at__lt=cutoff) | Q(parse_started_at__isnull=True, uploaded_at__lt=cutoff)
    )
    reason = (
        f"parsing did not finish within {budget:.0f} s (ARTIFACT_PARSE_BUDGET_S): the worker was lost or "
        "stopped; the file is kept, re-parse it to try again"
    )
    failed = []
    for artifact_id in stuck.values_list("pk", flat=True):
        # Conditional: a parse finishing at this moment wins.
        if Artifact.objects.filter(pk=artifact_id, status=Artifact.Status.PARSING).update(
            status=Artifact.Status.FAILED, error=reason, parsed_at=now
        ):
            failed.append(artifact_id)
            log.warning("artifact %s stuck in parsing: %s", artifact_id, reason)
    return failed


def after_parse(artifact: Artifact) -> None:
    """Re-evaluate the job (a trace's step time can give its throughput) and re-run its diagnosis."""
    reevaluate(artifact.job_id)
