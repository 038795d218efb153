"""`manage.py mfu` reproduces PaLM's published figures and refuses what it cannot know."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

PALM = [
    "--n-params", "540.35e9", "--n-layers", "118", "--n-heads", "48", "--head-dim", "256",
    "--seq-len", "2048", "--tokens-per-second", "238.3e3", "--devices", "6144",
]  # fmt: skip


def _run(*args: str) -> dict:
    out = StringIO()
    call_command("mfu", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_palm_540b_mfu_and_hfu_match_the_paper_with_the_catalog_peak():
    result = _run(*PALM, "--gpu", "TPU v4", "--dtype", "bf16", "--recompute", "0.751")
    assert result["mfu"] == pytest.approx(0.462, abs=0.0005)
    assert result["hfu"] == pytest.approx(0.578, abs=0.0005)
    assert result["flops_per_token"] == pytest.approx(6 * 540.35e9 + 12 * 118 * 48 * 256 * 2048)
    assert "PaLM" in result["mfu_variant"]


@pytest.mark.django_db
def test_palm_with_explicit_peak_full_recompute_and_no_attention():
    full = _run(*PALM, "--peak-tflops", "275", "--recompute", "full")
    assert full["mfu"] == pytest.approx(0.4623, abs=0.0001)
    assert full["hfu"] == pytest.approx(0.616, abs=0.0005)
    bare = _run(*PALM, "--peak-tflops", "275", "--no-attention")
    assert bare["mfu"] == pytest.approx(0.4573, abs=0.0001)


@pytest.mark.django_db
def test_moe_uses_active_parameters_and_says_so():
    result = _run(
        "--n-params", "47e9", "--active-params", "13e9", "--tokens-per-second", "1e5", "--devices", "64",
        "--gpu", "NVIDIA H100 80GB HBM3", "--no-attention",
    )  # fmt: skip
    assert result["flops_per_token"] == pytest.approx(6 * 13e9)
    assert result["peak_tflops_per_device"] == pytest.approx(989.5)
    assert "MoE" in result["mfu_variant"]


@pytest.mark.django_db
def test_l40s_is_not_mistaken_for_l4():
    result = _run("--n-params", "1e9", "--tokens-per-second", "1e4", "--devices", "1", "--gpu", "NVIDIA L40S",
                  "--no-attention")  # fmt: skip
    assert result["peak_tflops_per_device"] == pytest.approx(362)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "NVIDIA Quantum 9000"], "unknown GPU model"),
        ([], "give --gpu NAME"),
        (["--peak-tflops", "0"], "must be positive"),
        (["--gpu", "H100 SXM", "--dtype", "fp13"], "unknown dtype"),
        (["--gpu", "V100 SXM2", "--dtype", "fp8"], "no dense fp8 peak"),
        (["--peak-tflops", "100", "--recompute", "most"], "--recompute must be"),
        (["--peak-tflops", "100", "--n-layers", "2"], "--no-attention"),
    ],
)
def test_unusable_inputs_give_a_clear_error(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("mfu", "--n-params", "1e9", "--tokens-per-second", "1", "--devices", "1", *args)
