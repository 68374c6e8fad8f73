"""How the pages name what a record ran on: a model's captured attention (and whether its
text was mis-tokenized) or a synthetic input (the calibrated one, or other knobs)."""

from __future__ import annotations

from analysis.sections import Ctx
from eval.tokenizers import faulty_tokenizer


def calibrated(ctx: Ctx, data: dict) -> bool:
    """Whether a synthetic record's knobs are those of the pinned calibration fit
    (``records.calibration_fit``): the calibrated input, not the generator's defaults."""
    fit, _ = ctx.record("calibration_fit")
    return bool(fit) and all(data.get(k) == v for k, v in fit["knobs"].items())


def mistokenized(rec: dict) -> str:
    """A captured-attention record whose text went through a GGUF tokenizer that its transformers
    release built wrong (eval/tokenizers.py), said where the record is described."""
    model = rec["config"].get("model") or {}
    why = faulty_tokenizer(model.get("gguf_file"), rec["environment"].get("transformers"))
    if why is None:
        return ""
    version = rec["environment"]["transformers"]
    return (
        f"; its text was mis-tokenized (transformers {version}: no SentencePiece merges, no BOS), "
        "to be re-captured"
    )


def input_label(ctx: Ctx, rec: dict) -> str:
    """A record's input for the Differs notes: which model's captured attention, or which
    synthetic input (the calibrated one, or its knobs)."""
    data = rec["config"]["data"]
    if data["source"] == "model":
        name = rec["config"]["model"]["name"]
        return f"{name}'s captured attention ({data['text']}, L={data['L']}){mistokenized(rec)}"
    if calibrated(ctx, data):
        return f"the calibrated synthetic input (L={data['L']})"
    return (
        f"the synthetic generator with knobs other than the calibration fit's (sink "
        f"{data['sink']}, background {data['background']}), L={data['L']}"
    )
