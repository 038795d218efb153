"""Typed view of a stored py-spy profile analysis (jobs.profiling.pyspy.analyze_pyspy).

Shares are percentages (0-100) of samples. Pure: no Django.
"""

from __future__ import annotations

from typing import Any

import msgspec

from jobs.profiling.schema.blocks import Capture
from jobs.profiling.schema.common import Num, lenient


class HotFrame(msgspec.Struct, frozen=True, kw_only=True):
    """A Python frame with its self and inclusive shares of samples (%) and its class (data_loading, ...)."""

    label: str | None = None
    file: str | None = None
    frame_class: str | None = msgspec.field(default=None, name="class")
    self_pct: Num | None = None
    inclusive_pct: Num | None = None


class Icicle(msgspec.Struct, frozen=True, kw_only=True):
    """The stored call tree as Plotly icicle columns (jobs.profiling.pyspy._icicle), one entry per node:
    `ids`, `labels`, `parents` (the parent's id, "" for the root), `values` (the node's inclusive weight,
    in the analysis' `weight_unit`), `classes` (its frame class); `branchvalues` "total" (a node's value
    includes its children's). It keeps the heaviest `kept_nodes` of `total_nodes`.
    """

    ids: list[str] = []
    labels: list[str] = []
    parents: list[str] = []
    values: list[Num] = []
    classes: list[str] = []
    branchvalues: str | None = None
    kept_nodes: int | None = None
    total_nodes: int | None = None


class PySpyAnalysis(msgspec.Struct, frozen=True, kw_only=True):
    """A py-spy profile analysis (pyspy.analyze_pyspy): samples by class (% of samples).

    `total_weight` is in `weight_unit` ("seconds" for speedscope time-weighted profiles, else samples).
    """

    samples: Num | None = None
    total_weight: Num | None = None
    weight_unit: str | None = None
    classes_pct: dict[str, Num] | None = None
    input_pipeline_pct: Num | None = None
    hot_self: list[HotFrame] = []
    hot_inclusive: list[HotFrame] = []
    icicle: Icicle = Icicle()
    capture: Capture | None = None


def decode_pyspy(payload: Any) -> PySpyAnalysis:
    """A stored py-spy analysis."""
    return lenient(payload, PySpyAnalysis)
