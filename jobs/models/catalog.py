"""The GPU catalog (peak FLOPs, clocks, memory per model) and the dated price book per GPU model and tier."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from jobs.evaluation.catalog import DTYPE_KEYS
from jobs.evaluation.catalog import peak_flops as catalog_peak_flops


class GpuModel(models.Model):
    """A GPU model of the catalog: dense peak TFLOP/s per dtype and the specs the math needs."""

    name = models.CharField(max_length=100, unique=True, help_text="Canonical name, e.g. 'H100 SXM'.")
    vendor = models.CharField(max_length=32, default="NVIDIA")
    aliases = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    peak_tflops = models.JSONField(
        default=dict,
        help_text="Dense (no sparsity) peak TFLOP/s per dtype: fp64, fp64_tensor, tf32, bf16, fp16, fp8…",
    )
    memory_mib = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="memory (MiB)",
        help_text="Capacity as the GPU reports it (nvidia-smi memory.total), e.g. 81559 for H100 80GB.",
    )
    bandwidth_tbps = models.FloatField(null=True, blank=True, verbose_name="memory bandwidth (TB/s)")
    sm_count = models.PositiveIntegerField(null=True, blank=True)
    tdp_w = models.FloatField(null=True, blank=True, verbose_name="TDP (W)")
    peak_clock_mhz = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="peak clock (MHz)",
        help_text="SM clock the dense peaks assume (H100 SXM 1830); the MFU cross-check scales by it.",
    )
    max_clock_mhz = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="max boost clock (MHz)",
        help_text="Maximum SM boost clock (H100 SXM 1980); throttling is judged against it.",
    )
    mamf_bf16_tflops = models.FloatField(
        null=True, blank=True, help_text="Measured best dense BF16 matmul (achievable ceiling), TFLOP/s."
    )
    single_source = models.BooleanField(
        default=False, help_text="Some figures rest on one source only: verify."
    )
    source = models.TextField(blank=True)

    class Meta:
        ordering = ["vendor", "name"]
        verbose_name = "GPU model"

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Refuse peak keys outside the catalog's dtype table and non-positive peaks (admin edits): a key
        such as "bf16-mixed" or "BF16" would never be looked up, and 0 would read as a real peak."""
        super().clean()
        if not isinstance(self.peak_tflops, dict):
            raise ValidationError({"peak_tflops": "a JSON object {dtype: TFLOP/s}"})
        unknown = sorted(set(self.peak_tflops) - set(DTYPE_KEYS))
        if unknown:
            raise ValidationError(
                {"peak_tflops": f"unknown dtype keys {unknown}; use {', '.join(DTYPE_KEYS)}"}
            )
        for key, value in self.peak_tflops.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValidationError({"peak_tflops": f"{key}: a positive number of TFLOP/s, got {value!r}"})

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for a dtype (any alias: "bf16-mixed", "torch.bfloat16"), or None when the
        catalog has no figure for it; the one lookup is jobs.evaluation.catalog.peak_flops."""
        return catalog_peak_flops(self.peak_tflops or {}, dtype)


class PriceEntry(models.Model):
    """USD per GPU-hour for a GPU model and tier, in force from `effective_from` until the next entry."""

    class Tier(models.TextChoices):
        ON_DEMAND = "on_demand", "On-demand"
        RESERVED = "reserved", "Reserved / committed"
        SPOT = "spot", "Spot"
        ON_PREM = "on_prem", "On-prem amortised"

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="prices")
    tier = models.CharField(max_length=16, choices=Tier.choices)
    usd_per_gpu_hour = models.DecimalField(max_digits=10, decimal_places=4, validators=[MinValueValidator(0)])
    effective_from = models.DateTimeField()
    source = models.TextField(blank=True)

    class Meta:
        ordering = ["gpu_model", "tier", "-effective_from"]
        verbose_name_plural = "price entries"
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "tier", "effective_from"], name="price_entry_unique")
        ]

    def __str__(self) -> str:
        return (
            f"{self.gpu_model} {self.tier} ${self.usd_per_gpu_hour}/GPU-h from {self.effective_from:%Y-%m-%d}"
        )
