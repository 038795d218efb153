"""Errors raised while reading uploaded profiling artifacts."""

from __future__ import annotations


class ArtifactError(ValueError):
    """An uploaded artifact is malformed, too large, or not the format it claims to be.

    The message is meant for the uploader: it says what is wrong with the file (never a stack
    trace), so the parsing task can store it as the artifact's failure reason as is.
    """
