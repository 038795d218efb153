"""One dtype table (jobs.evaluation.catalog.DTYPES): the API, the KPIs, the rules and the pages agree.

Decision (issue 27 item 3): a Lightning precision string such as "bf16-mixed" is accepted everywhere and
means BF16 (its matmuls run in BF16, so its MFU is a share of the BF16 dense peak). Before, the catalog
found the BF16 peak for it while the API refused it.
"""

from __future__ import annotations

import pytest

from jobs.api.serializers import JobRegisterSerializer
from jobs.evaluation import catalog
from jobs.evaluation.kpis import target_mfu
from jobs.views.pages import _dtype_order

ALIASES = [
    "bf16-mixed",
    "torch.bfloat16",
    "BF16",
    "bfloat16",
    "half",
    "16-mixed",
    "fp8_e4m3",
    "float8",
    "tf32",
]


def test_every_alias_maps_onto_a_key_of_the_one_table() -> None:
    for alias, key in catalog._DTYPE_ALIASES.items():
        assert key in catalog.DTYPES, alias
    assert set(catalog.DTYPE_KEYS) <= set(catalog.DTYPES)
    assert set(catalog.DTYPES) >= catalog.TENSOR_CORE_DTYPES
    assert catalog.FP8 in catalog.DTYPES


@pytest.mark.parametrize("alias", ALIASES)
def test_the_api_stores_the_canonical_key_the_catalog_gives(alias: str) -> None:
    assert JobRegisterSerializer().validate_dtype(alias) == catalog.normalise_dtype(alias)


@pytest.mark.parametrize("dtype", catalog.DTYPES)
def test_the_api_accepts_every_dtype_of_the_table(dtype: str) -> None:
    assert JobRegisterSerializer().validate_dtype(dtype) == dtype


def test_the_api_refuses_what_the_catalog_does_not_know_and_names_the_table() -> None:
    from rest_framework.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        JobRegisterSerializer().validate_dtype("fp13")
    assert "bf16, fp16" in str(refused.value.detail) or all(
        d in str(refused.value.detail) for d in catalog.DTYPES
    )


def test_bf16_mixed_reads_as_bf16_in_the_peak_the_fp8_target_and_the_tensor_rule() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    assert h100 is not None
    assert h100.peak_flops("bf16-mixed") == h100.peak_flops("bf16")
    assert target_mfu("bf16-mixed", 0.45, 0.3) == target_mfu("bf16", 0.45, 0.3)
    assert target_mfu("fp8_e4m3", 0.45, 0.3)[0] == 0.3
    assert target_mfu("float8-e5m2", 0.45, 0.3)[0] == 0.3
    # The tensor-core rule reads the same table: see test_diagnosis_rules'
    # test_tensor_cores_idle_needs_a_tensor_core_dtype (bf16-mixed fires as bf16, fp32 never).
    assert catalog.normalise_dtype("bf16-mixed") in catalog.TENSOR_CORE_DTYPES
    assert catalog.normalise_dtype("fp32") not in catalog.TENSOR_CORE_DTYPES


def test_the_catalog_page_orders_columns_by_the_table() -> None:
    shown = sorted(["int8", "bf16", "fp64", "fp8", "tf32", "made_up"], key=_dtype_order)
    assert shown == ["fp64", "tf32", "bf16", "fp8", "int8", "made_up"]
