"""One number format on every page (issue 28 item 7): the trace diff showed "Kernels 80.000 / 7140.000",
"Steps 3.000", "Launch delay p90 8941.800 µs" and "1e+03 ms"."""

from __future__ import annotations

import math

import pytest
from django.template import Context, Template

from jobs.outputs.compare_traces import kernel_name_diff
from jobs.outputs.numbers import format_number
from jobs.profiling.schema.common import lenient
from jobs.profiling.schema.trace import KernelBreakdown


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (80.0, "80"),
        (7140.0, "7,140"),
        (3.0, "3"),
        (8941.8, "8,942"),
        (999.5, "1,000"),  # not "1e+03"
        (3.214, "3.21"),
        (0.04523, "0.0452"),
        (-2.5, "\u22122.5"),
        (0.0, "0"),
        (None, "—"),
        (math.nan, "—"),
        (math.inf, "—"),
    ],
)
def test_numbers_are_whole_or_three_significant_digits_with_separators(value, text):
    assert format_number(value) == text


def test_changes_carry_their_sign():
    assert format_number(7060.0, signed=True) == "+7,060"
    assert format_number(-0.25, signed=True) == "\u22120.25"
    assert format_number(0.0, signed=True) == "±0"


def test_the_diff_rows_template_writes_measures_not_floatformat():
    template = Template(
        '{% include "jobs/compare_rows.html" with title="Kernels and launches" rows=rows sid="x" %}'
    )
    rows = [
        {
            "key": "kernel_count",
            "label": "Kernels",
            "unit": "kernels",
            "a": 80.0,
            "b": 7140.0,
            "delta": 7060.0,
        },
        {"key": "p90", "label": "Launch delay p90", "unit": "µs", "a": 8941.8, "b": None, "delta": None},
    ]
    html = Template.render(template, Context({"rows": rows}))
    assert ">80<" in html and ">7,140<" in html and ">+7,060<" in html
    assert ">8,942<" in html and ">unknown<" in html
    assert "000<" not in html.replace("7,140", "")


def test_kernels_that_share_a_short_name_are_told_apart():
    def row(name: str, ms: float) -> dict:
        return {"name": name, "short_name": "gemv2T_kernel_val", "count": 10, "total_ms": ms}

    names = [
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 4, 4, false>(params)",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 2, 4, false>(params)",
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 64, 16, 4, 4, false>(params)",
    ]
    kb = {"top_kernels": [row(n, 1.0 + i) for i, n in enumerate(names)], "distinct_kernels": 3}
    decoded = lenient(kb, KernelBreakdown)
    diff = kernel_name_diff(decoded, decoded)
    shown = [r["short_name"] for r in diff["rows"]]
    assert len(set(shown)) == 3, shown
    assert all(s.startswith("gemv2T_kernel_val ‹") for s in shown)
