"""Seed the GPU catalog and the price book from jobs.evaluation.catalog (reference/gpus.md).

Only adds what is missing, so running it again (a new release with more GPUs) never overwrites an
admin's edits. Used by the data migration, the `sync_catalog` command and test fixtures.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobs.evaluation.catalog import GPU_SPECS, PRICE_SEEDS


def seed_catalog(gpu_model_cls: Any, price_entry_cls: Any) -> tuple[int, int]:
    """Create missing GPU models and seed prices; returns (models created, prices created).

    Takes the model classes so the data migration can pass its historical models; catalog fields the given
    model class does not have are skipped.
    """
    models_created = prices_created = 0
    by_name = {}
    # A historical model (migration 0002 runs before 0004 split the clock and moved memory to MiB) lacks
    # some of today's fields: seed only the ones it has; the later migration fills the rest.
    known = {f.name for f in gpu_model_cls._meta.get_fields()}
    for spec in GPU_SPECS:
        fields = {key: value for key, value in spec.to_dict().items() if key in known}
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
