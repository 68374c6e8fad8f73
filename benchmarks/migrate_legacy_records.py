"""Rewrite the records of the former benchmark scripts in the harness's schema, in place (issue 30).

    python -m benchmarks.migrate_legacy_records [--results results] [--dry-run]

Before ``benchmarks/common.py`` every kernel script wrote its own layout: ``bench_s2o`` (``env``,
``shape``, ``generator``, ``lengths`` with ``flash_ms``/``cudnn_ms``, a top-level ``abcd``), the
Step-1 probe (``env``, ``L``, ``S``, ``shape`` as a list, ``rows``, ``by_S``, ``by_L``), the
Pass-2 probe (``env``, ``L``, ``S``, ``variants``) and ``bench_baselines`` (``environment`` with
``gpu``/``git_rev``, ``shape``, ``input``, ``methods``, ``kernel``). This script turns each into
the record :class:`benchmarks.common.Recorder` writes, so ``analysis/`` reads one schema:

* ``kind: benchmark``, ``benchmark`` (the script's name), ``status: ok``, ``command`` (the recorded
  command line, else null), ``elapsed_s`` null (not recorded);
* ``environment``: every key of :func:`experiments.provenance.environment`; ``device_name`` is the
  recorded ``gpu``, ``git_revision`` the recorded ``git_rev``, ``time`` the recorded ``date`` (as
  written, without a time zone; null where none was), torch / Triton / CUDA as recorded, the keys
  the old scripts did not record null;
* ``config``: what the old record said about its run under the current key names (``shape`` as
  ``{B, Hq, Hkv, D, dtype, device}`` with the dtype spelled as today, ``segment_len``, ``block``,
  ``stop_chunk`` as ``[n, grow]``, ``step1``, the old generator's knobs, ``input`` as recorded);
* ``metrics``: the measurements unchanged; ``bench_s2o``'s per-length ``flash_ms``/``cudnn_ms``
  become ``full_ms: {flash, cudnn}`` as the current script writes them, and its top-level ``abcd``
  (a copy of the per-length ``abcd``, checked equal here) and ``block_n`` (checked equal to
  ``block_m``: ``block``) are dropped;
* ``id`` / ``identity``: :func:`experiments.records.benchmark_id` of that config, revision and GPU;
* ``migrated_from``: ``{schema, sha256}``: the old layout's name and the sha256 of the old file.

The files keep their paths (the READMEs, docs and code comments quote them), so a migrated record
does not sit at ``<benchmark>/<id>/record.json``. Every number of the old record is checked to be
in the new one before anything is written. A record already in the harness's schema is left as it
is, so a second run changes nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

from experiments.records import benchmark_id, write_record

DTYPES = {"bf16": "bfloat16", "torch.bfloat16": "bfloat16"}
ENV_KEYS = (
    "device", "device_name", "driver", "gpu_processes", "jobs_per_gpu", "torch", "triton", "cuda",
    "transformers", "python", "git_revision", "hostname", "time", "cpu_threads",
)  # fmt: skip
OLD_ENV_KEYS = {"gpu", "git_rev", "torch", "triton", "cuda", "date", "command"}
# bench_s2o's former input (benchmarks/bench_s2o.structured_qkv), as analysis has always named it
OLD_S2O_INPUT = "bench_s2o's former structured synthetic Q/K/V"


class LegacyError(ValueError):
    """A file that looks like an old benchmark record but has none of the known layouts."""


def legacy_schema(rec: object) -> str | None:
    """The old layout of ``rec`` (``bench_s2o``, ``step1_probe``, ``pass2_probe``,
    ``bench_baselines``), None for anything else (a harness record, a capture, a summary)."""
    if not isinstance(rec, dict) or "kind" in rec:
        return None
    env = rec.get("env") if "env" in rec else rec.get("environment")
    if not isinstance(env, dict) or "git_rev" not in env or "gpu" not in env:
        return None
    if "env" in rec and "lengths" in rec:
        return "bench_s2o"
    if "env" in rec and "variants" in rec:
        return "pass2_probe"
    if "env" in rec and "rows" in rec and "S" in rec:
        return "step1_probe"
    if "environment" in rec and "methods" in rec and "kernel" in rec:
        return "bench_baselines"
    raise LegacyError(
        f"an old environment block ({sorted(env)}) but no known layout: {sorted(rec)}"
    )


def _environment(env: dict) -> dict:
    unknown = set(env) - OLD_ENV_KEYS
    if unknown:
        raise LegacyError(
            f"environment keys with no home in the harness's schema: {sorted(unknown)}"
        )
    out = dict.fromkeys(ENV_KEYS)
    out.update(device="cuda", device_name=env["gpu"], torch=env.get("torch"),
               triton=env.get("triton"), cuda=env.get("cuda"), git_revision=env["git_rev"],
               time=env.get("date"))  # fmt: skip
    return out


def _shape(sh: dict | list) -> dict:
    """``{B, Hq, Hkv, D, dtype, device}`` from an old ``shape`` (a dict, or the Step-1 probe's
    ``[B, Hq, Hkv, D]``)."""
    if isinstance(sh, list):
        return dict(zip(("B", "Hq", "Hkv", "D"), sh, strict=True)) | {"device": "cuda"}
    dtype = DTYPES.get(sh["dtype"], sh["dtype"])
    return {"B": sh["B"], "Hq": sh["Hq"], "Hkv": sh["Hkv"], "D": sh["D"], "dtype": dtype,
            "device": "cuda"}  # fmt: skip


def _bench_s2o(old: dict) -> tuple[dict, dict]:
    sh, stop = old["shape"], old.get("stop_chunk")
    if sh["block_m"] != sh["block_n"]:
        raise LegacyError(f"block {sh['block_m']}x{sh['block_n']} is not square")
    per_length = [{"L": x["L"], **x["abcd"]} for x in old["lengths"] if "abcd" in x]
    if "abcd" in old and old["abcd"] != per_length:
        raise LegacyError("the top-level abcd differs from the per-length abcd")
    config = {"lengths": [x["L"] for x in old["lengths"]], "segment_len": sh["segment_len"],
              "block": sh["block_m"], "local_window": sh["local_window"], "causal": sh["causal"],
              "input": OLD_S2O_INPUT, "seed": old["generator"]["seed"],
              "generator": old["generator"]}  # fmt: skip
    if stop is not None:
        config["stop_chunk"] = [stop["n"], stop["grow"]] if isinstance(stop, dict) else stop
    if "step1_config" in old:
        config["step1"] = old["step1_config"]
    if "tune_length" in old:
        config["tune_length"] = old["tune_length"]
    config["shape"] = _shape(sh)
    lengths = [_s2o_length(x) for x in old["lengths"]]
    rest = ("env", "shape", "generator", "stop_chunk", "step1_config", "tune_length", "lengths",
            "abcd")  # fmt: skip
    return config, {"lengths": lengths, **{k: v for k, v in old.items() if k not in rest}}


def _s2o_length(x: dict) -> dict:
    """One length as the current ``bench_s2o`` writes it (``full_ms`` per SDPA backend)."""
    out = {"L": x["L"], "full_ms": {"flash": x["flash_ms"], "cudnn": x["cudnn_ms"]}}
    return out | {k: v for k, v in x.items() if k not in ("L", "flash_ms", "cudnn_ms")}


def _probe(old: dict) -> tuple[dict, dict]:
    """The Step-1 and Pass-2 probes: ``L``, ``S`` (and the shape) are the config, the rest was
    measured."""
    config = {"L": old["L"], "S": old["S"]}
    if "shape" in old:
        config["shape"] = _shape(old["shape"])
    return config, {k: v for k, v in old.items() if k not in ("env", "L", "S", "shape")}


def _bench_baselines(old: dict) -> tuple[dict, dict]:
    sh = old["shape"]
    config = {"input": old["input"], "causal": sh["causal"], "block": sh["block"],
              "shape": _shape(sh)}  # fmt: skip
    rest = ("environment", "shape", "input", "command")
    return config, {k: v for k, v in old.items() if k not in rest}


CONVERT = {"bench_s2o": _bench_s2o, "step1_probe": _probe, "pass2_probe": _probe,
           "bench_baselines": _bench_baselines}  # fmt: skip


def _numbers(obj: object) -> Counter:
    """Every number in ``obj`` (ints and floats, not booleans), with its multiplicity."""
    if isinstance(obj, dict):
        return sum((_numbers(v) for v in obj.values()), Counter())
    if isinstance(obj, list):
        return sum((_numbers(v) for v in obj), Counter())
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return Counter([repr(obj)])
    return Counter()


def _without_copies(old: dict) -> dict:
    """``old`` less what the conversion drops as a checked copy: ``bench_s2o``'s top-level
    ``abcd`` and its ``block_n`` (equal to ``block_m``, one ``block`` now)."""
    if "lengths" not in old:
        return old
    shape = {k: v for k, v in old["shape"].items() if k != "block_n"}
    return {**{k: v for k, v in old.items() if k != "abcd"}, "shape": shape}


def migrate(old: dict, raw: bytes) -> dict:
    """The harness-schema record of the old record ``old`` (read from the bytes ``raw``)."""
    schema = legacy_schema(old)
    if schema is None:
        raise LegacyError("not a record of an old benchmark layout")
    env = old["env"] if "env" in old else old["environment"]
    config, metrics = CONVERT[schema](old)
    environment = _environment(env)
    code, gpu = environment["git_revision"], environment["device_name"]
    rid = benchmark_id(config, code, gpu)
    new = {"status": "ok", "id": rid, "kind": "benchmark", "benchmark": schema,
           "command": old.get("command", env.get("command")), "config": config,
           "identity": {"code": code, "device_model": gpu, "id": rid}, "environment": environment,
           "metrics": metrics, "elapsed_s": None,
           "migrated_from": {"schema": f"legacy {schema}",
                             "sha256": hashlib.sha256(raw).hexdigest()}}  # fmt: skip
    lost = _numbers(_without_copies(old)) - _numbers(new)
    if lost:
        raise LegacyError(f"numbers of the old record missing from the new one: {dict(lost)}")
    return new


def migrate_tree(results: Path, dry_run: bool = False) -> list[Path]:
    """Rewrite every old benchmark record under ``results`` in place; the paths rewritten."""
    done = []
    for path in sorted(results.rglob("*.json")):
        raw = path.read_bytes()
        try:
            old = json.loads(raw)
            schema = legacy_schema(old)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        except LegacyError as e:
            raise LegacyError(f"{path}: {e}") from None
        if schema is None:
            continue
        try:
            new = migrate(old, raw)
        except (LegacyError, KeyError) as e:
            raise LegacyError(f"{path} ({schema}): {e!r}") from None
        if not dry_run:
            write_record(path, new)
        done.append(path)
    return done


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=Path("results"))
    ap.add_argument("--dry-run", action="store_true", help="convert and check, write nothing")
    args = ap.parse_args(argv)
    done = migrate_tree(args.results, args.dry_run)
    for path in done:
        print(path)
    verb = "would migrate" if args.dry_run else "migrated"
    print(f"{verb} {len(done)} record(s); the others are in the harness's schema or no benchmark's")


if __name__ == "__main__":
    main()
