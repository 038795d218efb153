"""Seed the GPU catalog and the price book from jobs.catalog (reference/gpus.md).

Only adds what is missing, so running it again (a new release with more GPUs) never overwrites an
admin's edits. Used by the data migration, the `sync_catalog` command and test fixtures.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobs.catalog import GPU_SPECS, PRICE_SEEDS


def seed_catalog(gpu_model_cls: Any, price_entry_cls: Any) -> tuple[int, int]:
    """Create missing GPU models and seed prices; returns (models created, prices created).

    Takes the model classes so the data migration can pass its historical models.
    """
    models_created = prices_created = 0
    by_name = {}
    for spec in GPU_SPECS:
        fields = spec.to_dict()
        name = fields.pop("name")
        gpu, created = gpu_model_cls.objects.get_or_create(name=name, defaults=fields)
        by_name[name] = gpu
        models_created += created
    for price in PRICE_SEEDS:
        start = datetime.combine(price.effective_from, datetime.min.time(), tzinfo=UTC)
        _, created = price_entry_cls.objects.get_or_create(
            gpu_model=by_name[price.gpu],
            tier=price.tier,
            effective_from=start,
            defaults={"usd_per_gpu_hour": price.usd_per_gpu_hour, "source": price.source},
        )
        prices_created += created
    return models_created, prices_created
