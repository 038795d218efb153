"""`manage.py mfu`: MFU and HFU of a training run from its model shape and throughput."""

from __future__ import annotations

import json
from argparse import ArgumentParser, BooleanOptionalAction
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from jobs.evaluation.catalog import normalise_dtype
from jobs.evaluation.flops import hardware_flops_per_token, hfu, mfu, model_flops_per_token
from jobs.intake.registry import resolve_gpu_model


class Command(BaseCommand):
    help = (
        "Compute MFU and HFU: model FLOPs per token (6N + 12·L·H·Q·T, PaLM) × tokens/s ÷ "
        "(devices × dense peak). Give --gpu and --dtype to take the peak from the GPU catalog, "
        "or --peak-tflops."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--n-params", type=float, required=True, help="non-embedding parameters N")
        parser.add_argument(
            "--active-params", type=float, help="MoE: active parameters per token (replaces N)"
        )
        parser.add_argument("--n-layers", type=int)
        parser.add_argument("--n-heads", type=int)
        parser.add_argument("--head-dim", type=int)
        parser.add_argument("--seq-len", type=int)
        parser.add_argument("--tokens-per-second", type=float, required=True, help="whole job, all devices")
        parser.add_argument("--devices", type=int, required=True)
        parser.add_argument("--gpu", help="GPU model name as reported, e.g. 'NVIDIA H100 80GB HBM3'")
        parser.add_argument("--dtype", default="bf16")
        parser.add_argument(
            "--peak-tflops", type=float, help="dense peak TFLOP/s per device (overrides --gpu)"
        )
        parser.add_argument(
            "--attention", action=BooleanOptionalAction, default=True, help="count attention FLOPs"
        )
        parser.add_argument("--causal", action="store_true", help="halve attention FLOPs for causal masks")
        parser.add_argument(
            "--recompute",
            default="none",
            help="none | selective | full | a fraction 0-1 of the forward pass recomputed (for HFU)",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **opts: Any) -> None:
        peak, peak_source = self._peak(opts)
        moe = opts["active_params"] is not None
        n = opts["active_params"] if moe else opts["n_params"]
        recompute: str | float = opts["recompute"]
        if recompute not in ("none", "selective", "full"):
            try:
                recompute = float(recompute)
            except ValueError:
                raise CommandError(
                    "--recompute must be none, selective, full or a number between 0 and 1"
                ) from None
        shape = {
            "n_layers": opts["n_layers"],
            "n_heads": opts["n_heads"],
            "head_dim": opts["head_dim"],
            "seq_len": opts["seq_len"],
            "attention": opts["attention"],
            "causal": opts["causal"],
            "moe": moe,
        }
        try:
            model = model_flops_per_token(n, **shape)
            hardware = hardware_flops_per_token(n, recompute=recompute, **shape)
            m = mfu(model, opts["tokens_per_second"], opts["devices"], peak)
            h = hfu(hardware, opts["tokens_per_second"], opts["devices"], peak)
        except ValueError as exc:
            raise CommandError(str(exc).replace("attention=False", "--no-attention")) from None
        result = {
            "mfu": m.value,
            "hfu": h.value,
            "flops_per_token": model.flops_per_token,
            "hardware_flops_per_token": hardware.flops_per_token,
            "mfu_variant": model.variant,
            "hfu_variant": hardware.variant,
            "achieved_tflops_per_device": m.achieved_flops_per_s / opts["devices"] / 1e12,
            "peak_tflops_per_device": peak / 1e12,
            "peak_source": peak_source,
            "devices": opts["devices"],
            "tokens_per_second": opts["tokens_per_second"],
        }
        if m.exceeds_peak:
            result["warning"] = "MFU above 100 %: the parameters, dtype or peak are wrong"
        if opts["json"]:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(f"MFU  {m.value * 100:6.2f} %   ({model.variant})")
        self.stdout.write(f"HFU  {h.value * 100:6.2f} %   ({hardware.variant})")
        self.stdout.write(f"model FLOPs per token: {model.flops_per_token:.4g}")
        self.stdout.write(
            f"achieved {result['achieved_tflops_per_device']:.1f} of {peak / 1e12:.1f} TFLOP/s per device"
        )
        self.stdout.write(f"peak: {peak_source}")
        if "warning" in result:
            self.stderr.write(result["warning"])

    def _peak(self, opts: dict[str, Any]) -> tuple[float, str]:
        if opts["peak_tflops"] is not None:
            if opts["peak_tflops"] <= 0:
                raise CommandError("--peak-tflops must be positive")
            return opts["peak_tflops"] * 1e12, f"given: {opts['peak_tflops']} TFLOP/s"
        if not opts["gpu"]:
            raise CommandError("give --gpu NAME (with --dtype) or --peak-tflops X")
        dtype = normalise_dtype(opts["dtype"])
        if dtype is None:
            raise CommandError(f"unknown dtype {opts['dtype']!r}")
        gpu = resolve_gpu_model(opts["gpu"])
        if gpu is None:
            raise CommandError(
                f"unknown GPU model {opts['gpu']!r}: add it to the GPU catalog in the admin, "
                "or pass --peak-tflops"
            )
        peak = gpu.peak_flops(dtype)
        if peak is None:
            raise CommandError(f"the catalog has no dense {dtype} peak for {gpu.name}; pass --peak-tflops")
        return peak, f"{gpu.name} dense {dtype} {peak / 1e12:g} TFLOP/s (GPU catalog)"
