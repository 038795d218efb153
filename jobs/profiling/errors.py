"""Errors raised while reading uploaded profiling artifacts."""

from __future__ import annotations


class ArtifactError(ValueError):
    """An uploaded artifact is malformed, too large, or not the format it claims to be.

    The message is meant for the uploader: it says what is wrong with the file (never a stack
    trace), so the parsing task can store it as the artifact's failure reason as is.
    """


class ParserBug(ArtifactError):
    """A parser failed in a way it does not expect (a bug): reported to the uploader as a failed parse.

    `jobs.profiling.guard` turns any exception other than `ArtifactError` that escapes a parser into this,
    so the pipeline still sees only `ArtifactError`; the fuzz tests treat it as a failure.
    """
