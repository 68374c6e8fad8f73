"""Task accuracy with a method as the prefill attention (paper Tables: RULER, InfiniteBench,
LongBench v2), with every sample's prefill density.

    python run.py kind=accuracy benchmark=ruler model=smollm2_135m method=s2o tau=0.01 S=256 \\
        'benchmark.tasks=[niah_single_1,vt]' 'benchmark.lengths=[1024]' benchmark.n=3

Every method sees the same samples (RULER's are generated once per tokenizer and cached,
``eval/tasks/ruler``). Each sample: the prompt (the model's chat template for ``chat: true``
models, RULER's plain ``base`` template otherwise, then the task's answer prefix) is prefilled
with the method through ``s2o.hf.sparse_prefill`` and decoded densely and greedily up to the task's
tokens to generate, EOS or a ``benchmark.stop`` string (``decode_batch=N``: N samples, each
prefilled alone, decoded together; :func:`generate_batch`). Its line (id, task, length, prompt
tokens, prediction, gold, score, density overall and per layer, prefill and decode time) goes to
``samples.jsonl`` as soon as it is scored; a rerun of the same job skips the ids already there (a
line cut by a kill is dropped and redone). Code, data or config changes give another run id, so
stale samples are never reused. The job's metrics hold one cell per (task, length): accuracy
(x100) with its 95% interval (Wilson for 0/1 scores, bootstrap otherwise), mean density, n.

With ``benchmark.evidence=true``, a sample that names its evidence (RULER's niah tasks) also gets
``evidence``: its evidence recall per layer and head (:mod:`eval.evidence`, computed inside the
prefill after each layer's timed span; the forward's total time then includes it), and its cell
the mean ``evidence_recall``.

Where the time goes: each line's ``sample_ms`` is the sample's wall time from its start to its line
being written (prompt tokenization, the evidence probe, the decode loop ``loop_ms``, scoring; the
write itself is in the samples' wall time), and the job's ``timing`` block holds the model load
(``model_load_s``; ``model_reused`` when an earlier job of the process loaded it), the sample
building, the samples' wall time and the sums of the times of the samples this job ran
(:func:`timing`). Progress (:class:`Progress`): done / total (resumed included), samples per
minute and time left, on the tqdm bar with ``progress=true``, else one line on stderr every
``LOG_EVERY_S`` seconds.

Refused before the model loads (:func:`check_job`, one line from run.py, exit code 2): an unknown
benchmark or task, a length that is not a positive int or exceeds the model's context
(:func:`eval.models.context`), RULER without ``benchmark.n``, a data file that does not exist, a
hub dataset with no file given when the hub cannot be reached (:func:`check_sources`). Ctrl-C
ends the job with one line (samples saved, the command that resumes) and exit code 130; a rerun
says how many samples it resumed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from eval import models
from eval.evidence import EvidenceProbe, locate
from eval.significance import score_interval
from eval.tasks import base as tasks
from eval.tasks.common import hub_refusal
from eval.tasks.ruler.common import PromptFormat
from s2o.hf import sparse_prefill

from .common import ConfigError, JobContext, WandbLogger
from .records import SAMPLES, accuracy_record_path, unpack_samples


def check_job(resolved: dict, config=None) -> None:
    """Refuse, before the model's weights load, a job that cannot run: no benchmark or model, an
    unknown benchmark, a bad ``benchmark`` value (its task's ``check``), a length that is not a
    positive int or is longer than the model's context (:func:`eval.models.context`; ``config``: a
    loaded model's)."""
    bench = resolved.get("benchmark")
    if not bench:
        raise ConfigError(f"kind=accuracy needs benchmark={' | '.join(tasks.names())}")
    if not resolved.get("model"):
        raise ConfigError("kind=accuracy needs a model: model=smollm2_135m | gemma3_270m | ...")
    batch = resolved.get("decode_batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(
            f"decode_batch: {batch!r} is not a positive int (prompts decoded at once)"
        )
    n = bench.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ConfigError(f"benchmark.n={n!r} must be a positive int (samples per task and length)")
    check_data_files(bench)
    task = task_of(bench)
    with _config_errors():
        task.check(bench)
    lengths = task.lengths(bench)
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
            raise ConfigError(f"benchmark.lengths: {length!r} is not a positive int (tokens)")
    model_cfg = models.normalize(resolved["model"])
    context, where = models.context(model_cfg, config)
    too_long = [x for x in lengths if context is not None and x > context]
    if too_long:
        yarn = ", model.yarn=true (YaRN)" if resolved["model"].get("yarn") is False else ""
        raise ConfigError(
            f"benchmark.lengths: {', '.join(map(str, too_long))} tokens > the {context}-token "
            f"context of model {model_cfg['name']} ({where}); drop the length{yarn} or use a "
            "longer-context model"
        )


def record_path(resolved: dict) -> Path:
    """The job's record path, after its checks (:func:`check_job`, as run.py makes them)."""
    check_job(resolved)
    return accuracy_record_path(resolved)


def check_data_files(bench: dict) -> None:
    """Every file or folder a ``benchmark.data.<key>`` names exists (checked before the model
    loads, as ``data.path`` and ``model.path`` are): a :class:`ConfigError` naming the key."""
    for key, value in sorted((bench.get("data") or {}).items()):
        if isinstance(value, str) and value and not Path(value).exists():
            raise ConfigError(f"benchmark.data.{key}={value}: no such file or folder")


def check_sources(resolved: dict) -> None:
    """Every hub dataset the job's samples would load (no file at ``benchmark.data.<key>``:
    :meth:`eval.tasks.base.Task.hub_data`) can be had, found without the hub's retries (one
    request at most, none offline or with the set cached): a :class:`ConfigError` naming the key
    and how to supply the file. run.py asks it of a point that will compute, before its model
    loads (a point with an ok record reads no data)."""
    bench = resolved["benchmark"]
    for key, repo_id, how in task_of(bench).hub_data(bench):
        why = hub_refusal(repo_id)
        if why:
            raise ConfigError(f"benchmark.data.{key}: no file given and {why}; {how}")


@contextmanager
def _config_errors():
    """A task's :class:`eval.tasks.base.TaskConfigError` as this harness's ConfigError."""
    try:
        yield
    except tasks.TaskConfigError as e:
        raise ConfigError(str(e)) from None


def task_of(bench: dict) -> tasks.Task:
    """The benchmark task named by ``benchmark.name`` (:mod:`eval.tasks.base`)."""
    with _config_errors():
        return tasks.get(bench["name"])


def prompt_format(tokenizer, model_cfg: dict) -> PromptFormat:
    """The model's chat template for instruct models (its text carries the special tokens),
    RULER's ``base`` template (the text as is, the tokenizer adds BOS) otherwise."""
    chat = bool(model_cfg.get("chat"))
    return PromptFormat(
        tokenizer,
        render=lambda text: models.chat_prompt(tokenizer, text, model_cfg),
        add_special_tokens=not chat,
        chat=chat,
    )


def build_samples(bench: dict, fmt: PromptFormat) -> list[dict]:
    """Every sample of the job: ``id, task, length, prompt, gold, max_new_tokens`` + extras."""
    task = task_of(bench)
    with _config_errors():
        return task.samples(bench, fmt)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def stop_strings(values) -> list[str]:
    """``benchmark.stop`` as generation uses it. A Hydra override keeps ``\\n`` as two characters
    (``'benchmark.stop=["\\n"]'``): the escapes ``\\n``, ``\\t``, ``\\r`` and ``\\\\`` are
    decoded here, so the stop string that a user typed is the one that stops generation, instead
    of one that never occurs. Empty strings are refused."""
    out = []
    for v in list(values or []):
        if not isinstance(v, str) or not v:
            raise ConfigError(f"benchmark.stop: {v!r} is not a non-empty string")
        out.append(re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], v))
    return out


# ---------------------------------------------------------------- samples file, resumable


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in an accuracy job's sample loop: ``saved`` of its ``total`` samples are in the
    samples file (a rerun of the same command resumes from there)."""

    def __init__(self, saved: int, total: int):
        super().__init__(f"{saved} of {total} samples saved")
        self.saved, self.total = saved, total


def read_done(path: Path) -> dict[str, dict]:
    """Lines already scored, by id. A last line cut by a kill is removed from the file (its sample
    is redone); a malformed line elsewhere is an error naming the file and line."""
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    done, good_bytes = {}, 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:  # the unterminated tail a kill left
                with path.open("r+b") as f:
                    f.truncate(good_bytes)
                break
            raise ValueError(f"{path}:{i + 1}: malformed sample line ({e.msg})") from e
        done[obj["id"]] = obj
        good_bytes += len(line) + 1
    return done


def append_line(path: Path, obj: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------- progress and timing

LOG_EVERY_S = 30.0  # with progress=false (batch jobs): one progress line on stderr this often


class Progress:
    """Samples done / total (the resumed ones included), samples per minute and time left, of one
    job (``label``): on a tqdm bar when ``bar`` is true, else one line on stderr after the first
    sample, then at most every ``every_s`` seconds, and after the last. The rate counts only the
    samples run by this process, over the wall time since it started them."""

    def __init__(self, label: str, total: int, resumed: int, bar: bool,
                 every_s: float = LOG_EVERY_S, clock=time.perf_counter):  # fmt: skip
        self.label, self.total, self.resumed, self.every_s, self.clock = (
            label, total, resumed, every_s, clock)  # fmt: skip
        self.ran, self.t0, self.last = 0, clock(), None
        self.bar = tqdm(total=total, initial=resumed, desc=label, unit="sample") if bar else None

    def rate_per_min(self) -> float:
        return 60 * self.ran / max(self.clock() - self.t0, 1e-9)

    def line(self) -> str:
        rate, left = self.rate_per_min(), self.total - self.resumed - self.ran
        eta = _duration(60 * left / rate) if rate > 0 else "?"
        resumed = f" ({self.resumed} resumed)" if self.resumed else ""
        return (f"{self.label}: {self.resumed + self.ran}/{self.total} samples{resumed}, "
                f"{rate:.1f} samples/min, {eta} left")  # fmt: skip

    def step(self, n: int = 1) -> None:
        """``n`` more samples done (a batch's at once: ``decode_batch``)."""
        self.ran += n
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix(samples_per_min=f"{self.rate_per_min():.1f}")
            return
        now = self.clock()
        last = self.resumed + self.ran == self.total
        if self.last is None or now - self.last >= self.every_s or last:
            print(self.line(), file=sys.stderr, flush=True)
            self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _lap(parts: dict[str, float], key: str, since: float) -> float:
    """Add the seconds since ``since`` to ``parts[key]``; return now."""
    now = time.perf_counter()
    parts[key] += now - since
    return now


def timing(load_s: float | None, reused: bool | None, build_s: float, wall_s: float,
           ran: list[dict], parts: dict[str, float],
           load_phases: dict[str, float] | None = None) -> dict:  # fmt: skip
    """The job's ``timing`` block: the model load (``None`` when the caller gave the model; near 0
    with ``reused`` when an earlier job of the process loaded it), the sample building, and over
    the samples this job ran (``ran``: their lines; resumed ones were timed by another process):
    their wall time (the loop, line writing and progress included) and the sums of their
    per-sample times, plus ``parts`` (s): where a sample's time outside the decode loop went, and
    ``load_phases`` (s): where the model load went (:data:`eval.models.LAST_LOAD`), when it ran."""
    total = lambda k: None if any(r.get(k) is None for r in ran) else sum(r[k] for r in ran) / 1e3
    return {
        "model_load_s": load_s, "model_reused": reused, "build_samples_s": build_s,
        **({"model_load_phases": load_phases} if load_phases else {}),
        "samples_run": len(ran), "samples_wall_s": wall_s,
        "sample_s_sum": total("sample_ms"), "loop_s_sum": total("loop_ms"),
        "prefill_s_sum": total("prefill_ms"), "decode_s_sum": total("decode_ms"),
        **{f"{k}_s_sum": v for k, v in parts.items()},
    }  # fmt: skip


# ---------------------------------------------------------------- generation


def _prompt_ids(tokenizer, model, prompt: str, add_special: bool) -> torch.Tensor:
    ids = tokenizer(prompt, add_special_tokens=add_special, return_tensors="pt")
    return ids["input_ids"].to(next(model.parameters()).device)


def _fields(tokenizer, stats: dict, prompt_tokens: int, out, stop: list[str]) -> dict:
    """A sample's generation fields from its decode (:class:`experiments.decode.Greedy`) and its
    prefill's stats (``run.stats.summary()``)."""
    new = out.tokens
    text = tokenizer.decode(new, skip_special_tokens=True)
    for s in stop:  # decoding stops after the stop string; the answer ends before it
        text = text.split(s, 1)[0]
    prefill_ms = stats["total_ms"]
    return {
        "prompt_tokens": prompt_tokens, "new_tokens": int(new.numel()), "prediction": text,
        "density": stats["density"], "density_per_layer": stats["density_per_layer"],
        "prefill_ms": prefill_ms,
        "decode_ms": None if prefill_ms is None else out.total_ms - prefill_ms,
        "estimate_ms": stats["estimate_ms"], "decode_steps": out.decode_steps,
        "loop_ms": out.total_ms,
        **{k: stats[k] for k in ("mse", "rel_mse", "error_per_layer") if k in stats},
    }  # fmt: skip


def generate_one(model, tokenizer, run, sample: dict, add_special: bool, stop: list[str],
                 sync) -> dict:  # fmt: skip
    """Prefill (the method, through ``run``) + greedy dense decode of one sample
    (:func:`experiments.decode.greedy_decode`: ``model.generate``'s greedy semantics without its
    per-call cost). ``loop_ms``: the whole loop's wall time; ``decode_ms``: that minus the
    plug-in's prefill forward; ``decode_steps``: decode forwards (new tokens - 1)."""
    from .decode import greedy_decode

    ids = _prompt_ids(tokenizer, model, sample["prompt"], add_special)
    run.reset()
    out = greedy_decode(
        model, ids, sample["max_new_tokens"], tokenizer=tokenizer, stop=stop, sync=sync
    )
    return _fields(tokenizer, run.stats.summary(), int(ids.shape[1]), out, stop)


def generate_batch(model, tokenizer, run, samples: list[dict], add_special: bool,
                   stop: list[str], sync, probe=None) -> list[tuple[dict, float]]:  # fmt: skip
    """:func:`generate_one` for several samples at once: each prefilled alone through ``run``
    (its stats and evidence taken right after its prefill), then decoded together
    (:func:`experiments.decode.greedy_decode_batch`). Returns each sample's fields (with
    ``decode_batch``: the rows decoded together; its ``decode_ms`` its share of the batch's
    decode) and its own seconds: its tokenization, evidence, prefill and fields plus its decode
    share, and an even share of the rest of the call (so that the samples' seconds sum to the
    call's)."""
    from .decode import greedy_decode_batch, prefill

    pending, t0 = [], time.perf_counter()
    for s in samples:
        t = time.perf_counter()
        if probe is not None:
            probe.start(sample_evidence(tokenizer, s, add_special))
        ids = _prompt_ids(tokenizer, model, s["prompt"], add_special)
        run.reset()
        p = prefill(model, ids, s["max_new_tokens"], sync=sync)
        stats = run.stats.summary()
        evidence = ()  # none asked for; None: the sample names no evidence
        if probe is not None:
            evidence = probe.summary()
            probe.start(None)
        pending.append((p, stats, int(ids.shape[1]), evidence, time.perf_counter() - t))
    outs = greedy_decode_batch(
        model, [x[0] for x in pending], tokenizer=tokenizer, stop=stop, sync=sync
    )
    done = []
    for (_, stats, n, evidence, own_s), out in zip(pending, outs):
        t = time.perf_counter()
        gen = _fields(tokenizer, stats, n, out, stop)
        gen["decode_batch"] = out.batch
        if evidence != ():
            gen["evidence"] = evidence
        done.append((gen, own_s + out.decode_ms / 1e3 + time.perf_counter() - t))
    rest = (time.perf_counter() - t0 - sum(x[1] for x in done)) / len(done)  # the batch's own
    return [(gen, own + rest) for gen, own in done]


def sample_evidence(tokenizer, sample: dict, add_special: bool):
    """Where the sample's evidence and question are in its prompt's tokens
    (:func:`eval.evidence.locate`), or ``None`` for a sample that names none."""
    if not sample.get("evidence") or not sample.get("question"):
        return None
    return locate(tokenizer, sample["prompt"], add_special, sample["evidence"], sample["question"])


def cells(lines: list[dict]) -> list[dict]:
    """One row per (task, length): accuracy x100 with its 95% interval, mean density, n."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in lines:
        groups[(r["task"], r["length"])].append(r)
    out = []
    for (task, length), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        ci = score_interval([r["score"] for r in rows])
        dens = [r["density"] for r in rows if r["density"] is not None]
        out.append({
            "task": task, "length": length, "n": ci["n"], "accuracy": 100 * ci["mean"],
            "lo": 100 * ci["lo"], "hi": 100 * ci["hi"], "interval": ci["interval"],
            "density": sum(dens) / len(dens) if dens else None,
            "prefill_ms": _mean([r["prefill_ms"] for r in rows]),
            "evidence_recall": _mean([(r.get("evidence") or {}).get("evidence_recall")
                                      for r in rows]),  # fmt: skip
            "mse": _mean([r.get("mse") for r in rows]),
            "rel_mse": _mean([r.get("rel_mse") for r in rows]),
        })  # fmt: skip
    return out


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


_LOADED: dict = {}


def _load_key(model_cfg: dict, device: torch.device, seed: int) -> str:
    return json.dumps([model_cfg, str(device), seed], sort_keys=True, default=str)


def _load_once(model_cfg: dict, device: torch.device, seed: int):
    """The model of this config, loaded once per process: the jobs of an in-process multirun
    (``-m method=full,s2o,...``) share it (the plug-in restores it after every job)."""
    key = _load_key(model_cfg, device, seed)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = models.load(model_cfg, device, seed=seed)
    return _LOADED[key]


def evaluate(resolved: dict, samples_file: Path, model=None, tokenizer=None,
             logger: WandbLogger | None = None) -> dict:  # fmt: skip
    """Run (or resume) every sample of the job; ``model``/``tokenizer`` override the config's.
    The job is checked (:func:`check_job`) before the model loads. Ctrl-C in the sample loop
    raises :class:`Interrupted` (how many samples are saved)."""
    check_job(resolved, getattr(model, "config", None))
    bench, device = resolved["benchmark"], torch.device(resolved["device"])
    model_cfg = models.normalize(resolved["model"])
    load_s = reused = phases = None
    if model is None:
        model_cfg["dtype"] = resolved["dtype"]
        reused = _load_key(model_cfg, device, resolved["seed"]) in _LOADED
        t = time.perf_counter()
        model, tokenizer = _load_once(model_cfg, device, resolved["seed"])
        load_s = time.perf_counter() - t
        phases = None if reused else dict(models.LAST_LOAD)
    if tokenizer is None:
        raise ConfigError("kind=accuracy needs a tokenizer: pretrained weights, not random")
    t = time.perf_counter()
    fmt = prompt_format(tokenizer, model_cfg)
    task = task_of(bench)
    samples = build_samples(bench, fmt)
    build_s = time.perf_counter() - t
    samples_file.parent.mkdir(parents=True, exist_ok=True)
    done = read_done(samples_file)
    todo = [s for s in samples if s["id"] not in done]
    if len(todo) < len(samples):
        print(f"resumed {len(samples) - len(todo)} of {len(samples)} samples from {samples_file}; "
              f"{len(todo)} to run", file=sys.stderr, flush=True)  # fmt: skip
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    method, knobs = resolved["method_name"], dict(resolved["method"])
    batch = int(resolved.get("decode_batch", 1))
    stop = stop_strings(bench.get("stop"))
    label = f"{bench['name']} {method} {samples_file.parent.name}"
    bar = Progress(label, len(samples), len(samples) - len(todo), bool(resolved["progress"]))
    if batch > 1 and todo:
        print(f"decode_batch={batch}: each sample prefilled alone, then {batch} decoded together; "
              f"samples are written {batch} at a time", file=sys.stderr, flush=True)  # fmt: skip
    t0, total, ran = time.perf_counter(), 0.0, []
    parts = dict.fromkeys(("evidence_probe", "generate_one", "score"), 0.0)
    measure = bool(bench.get("measure_error", False))
    probe = EvidenceProbe() if bench.get("evidence") else None

    def ask(text: str, max_new: int) -> dict:  # a task's further turn (LongBench v2's CoT answer)
        turn = {"prompt": fmt.render(text), "max_new_tokens": max_new}
        return generate_one(model, tokenizer, run, turn, fmt.add_special_tokens, stop, sync)

    try:
        with (
            torch.inference_mode(),
            sparse_prefill(model, method, measure_error=measure, observe=probe, **knobs) as run,
        ):
            for chunk in (todo[i : i + batch] for i in range(0, len(todo), batch)):
                if batch == 1:  # one sample: prefill, decode
                    s = chunk[0]
                    start = time.perf_counter()
                    if probe is not None:
                        probe.start(sample_evidence(tokenizer, s, fmt.add_special_tokens))
                    t = _lap(parts, "evidence_probe", start)
                    gen = generate_one(model, tokenizer, run, s, fmt.add_special_tokens, stop,
                                       sync)  # fmt: skip
                    t = _lap(parts, "generate_one", t)
                    if probe is not None:
                        gen["evidence"] = probe.summary()
                        probe.start(None)
                    _lap(parts, "evidence_probe", t)
                    gens = [(gen, time.perf_counter() - start)]
                else:  # each sample's prefill alone, their decodes together
                    t = time.perf_counter()
                    gens = generate_batch(model, tokenizer, run, chunk, fmt.add_special_tokens,
                                          stop, sync, probe)  # fmt: skip
                    _lap(parts, "generate_one", t)
                for s, (gen, pre_s) in zip(chunk, gens):
                    t = start = time.perf_counter()
                    gen = task.second_turn(s, gen, ask)
                    t = _lap(parts, "generate_one", t)
                    value, extra = task.score(s, gen["prediction"])
                    _lap(parts, "score", t)
                    line = {"id": s["id"], "task": s["task"], "length": s["length"], **gen,
                            "gold": s["gold"], "score": value, **extra}  # fmt: skip
                    line["sample_ms"] = 1e3 * (pre_s + time.perf_counter() - start)
                    append_line(samples_file, line)
                    done[s["id"]] = line
                    ran.append(line)
                    rate = len(ran) / max(time.perf_counter() - t0, 1e-9)
                    total += value
                    if logger is not None:
                        logger.log({"score": value, "running_accuracy": 100 * total / len(ran),
                                    "density": gen["density"], "samples_per_s": rate},
                                   len(ran) - 1)  # fmt: skip
                bar.step(len(chunk))  # after the chunk's lines: the rate counts whole batches
    except KeyboardInterrupt:
        bar.close()
        saved = read_done(samples_file)
        raise Interrupted(sum(s["id"] in saved for s in samples), len(samples)) from None
    wall_s = time.perf_counter() - t0
    bar.close()
    lines = [done[s["id"]] for s in samples]
    out = {
        "benchmark": bench["name"], "model": models.describe(model_cfg), "method": method,
        "knobs": knobs, "n_samples": len(lines), "resumed": len(samples) - len(todo),
        "samples_file": str(samples_file), "cells": cells(lines),
        "template": "chat" if model_cfg.get("chat") else "base", "stop": stop,
        "tokenizer": models.tokenizer_summary(tokenizer),
        "timing": timing(load_s, reused, build_s, wall_s, ran, parts, phases),
    }  # fmt: skip
    if (breakdown := task.aggregate(lines)) is not None:
        out[task.name] = breakdown
    return out


def table(m: dict) -> str:
    f = lambda x, s=".1f": "-" if x is None else format(x, s)
    rows = [
        f"{m['benchmark']} {m['model']} {m['method']} ({m['template']} template)",
        f"{'task':<18}{'length':>8}{'n':>5}{'acc':>7}{'95% CI':>15}{'density':>9}",
    ]
    for c in m["cells"]:
        ci = f"[{f(c['lo'])}, {f(c['hi'])}]"
        rows.append(f"{c['task']:<18}{f(c['length'], 'd'):>8}{c['n']:>5}{f(c['accuracy']):>7}"
                    f"{ci:>15}{f(c['density'], '.3f'):>9}")  # fmt: skip
    return "\n".join(rows)


def resume_command(ctx: JobContext) -> str:
    """The command that reruns this job: the command line as typed when this process is run.py
    (a multirun resumes as a whole), else run.py with the job's overrides."""
    if Path(sys.argv[0]).name == "run.py":
        return shlex.join(["python", *sys.argv])
    return shlex.join(["python", "run.py", *ctx.overrides])


def run(cfg, resolved: dict, ctx: JobContext, logger: WandbLogger) -> dict:
    path = record_path(resolved)
    unpack_samples(path)  # a packed record's samples resume like plain ones
    samples_file = path.with_name(SAMPLES)
    try:
        m = evaluate(resolved, samples_file, logger=logger)
    except KeyboardInterrupt as e:  # one line instead of a traceback; the samples file stays
        ours = isinstance(e, Interrupted)  # else before the samples were built: loading
        saved = f"{e.saved} of {e.total}" if ours else len(read_done(samples_file))
        print(f"interrupted: {saved} samples saved in {samples_file}; rerun the same command to "
              f"resume: {resume_command(ctx)}", file=sys.stderr, flush=True)  # fmt: skip
        logger.finish(exit_code=130)
        raise SystemExit(130) from None
    print(table(m))
    return m
