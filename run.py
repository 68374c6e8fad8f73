"""Hydra entry point: compose the config, dispatch to ``experiments/<kind>.py``, write the record.

    python run.py method=s2o tau=0.005                          # the operator study (CPU or GPU)
    python run.py -m method=s2o tau=0.001,0.005 S=1024,2048     # a sweep, resumable
    python run.py experiment=hparams_tau                         # a paper table, by name

The record of a run lands in ``results/runs/<method>/<id>/record.json`` (kind=operator) or
``results/experiments/<name>/<id>/record.json`` (sweep, matched), and so on by kind
(experiments/records.py), ``<id>`` being a hash of the
resolved config, the GPU model, the code revision and the data files' content; a rerun skips a
record that exists with status ok. Config errors end in one line (exit code 2). See
docs/harness.md.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from experiments.common import (
    ConfigError,
    JobContext,
    WandbLogger,
    check_writable,
    resolved_config,
)
from experiments.provenance import code_revision, jobs_per_gpu
from experiments.records import compute, record_path, reusable

KINDS = ("operator", "sweep", "matched", "e2e", "accuracy")


def flashprefill_alpha(model_type: str | None, model_name: str | None, no_model: float) -> float:
    """``${flashprefill_alpha:...}`` in conf/method/flashprefill.yaml: the official alpha of the
    model's family (``model.arch.model_type``), ``no_model`` for a run without a model; a family
    without an official value is a :class:`ConfigError` (give ``method.alpha``)."""
    from s2o.methods.flashprefill import official_alpha

    if model_name is None:
        return no_model
    try:
        return official_alpha(model_type)
    except ValueError as exc:
        raise ConfigError(f"model={model_name}: {exc} (method.alpha=<value>)") from None


OmegaConf.register_new_resolver("flashprefill_alpha", flashprefill_alpha, replace=True)


def job_context(cfg: DictConfig) -> JobContext:
    """Method choice, run mode and job number from Hydra (``cfg.hydra`` when composed by hand)."""
    hc = cfg.hydra if "hydra" in cfg else HydraConfig.get()
    mode = str(hc.get("mode", "RUN"))
    return JobContext(
        method=hc.runtime.choices["method"],
        multirun=mode.endswith("MULTIRUN"),
        job_num=int(hc.job.get("num", 0) or 0),
        overrides=list(hc.overrides.task),
    )


def explicit_keys(overrides: list[str]) -> set[str]:
    """Dotted keys set on the command line (``S=100``, ``+x.y=1``, ``data=file``)."""
    return {o.lstrip("+~").split("=", 1)[0] for o in overrides}


def prepare(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """Drop the hydra node and, for ``dry_run=true``, merge the ``tiny`` block (strict keys).

    A key given on the command line wins over the ``tiny`` block (``S=100 dry_run=true`` runs
    S=100). A dry run needs no weights: an experiment's ``data=model`` becomes synthetic inputs
    unless ``data``, ``data.text`` or ``model*`` was given on the command line. A GGUF file named
    by ``model.path`` is split into its folder and ``model.gguf_file`` (:func:`gguf_file_path`).
    """
    cfg = cfg.copy()
    if "hydra" in cfg:
        with_flag = OmegaConf.is_struct(cfg)
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        OmegaConf.set_struct(cfg, with_flag)
    gguf_file_path(cfg, explicit_keys(overrides or []))
    if cfg.dry_run:
        explicit = explicit_keys(overrides or [])
        if cfg.data.get("source") == "model" and not any(
            k in ("data", "data.text") or k.startswith("model") for k in explicit
        ):
            synthetic = OmegaConf.load(Path(__file__).parent / "conf" / "data" / "synthetic.yaml")
            for key in (k.removeprefix("data.") for k in explicit if k.startswith("data.")):
                if key in synthetic:
                    synthetic[key] = cfg.data[key]
            cfg.data, cfg.model = synthetic, None
        _merge_existing(cfg, OmegaConf.to_container(cfg.tiny), explicit)
    return cfg


def gguf_file_path(cfg: DictConfig, explicit: set[str]) -> None:
    """``model.path`` may name the GGUF file itself (docs: "the GGUF file at ``model.path``") as
    well as its folder: a file becomes ``model.path=<its folder> model.gguf_file=<its name>``, the
    same config (and record) as the two keys given apart. A ``model.gguf_file`` given on the
    command line that names another file is refused."""
    model = cfg.get("model")
    if not isinstance(model, DictConfig) or model.get("source") != "gguf":
        return
    if OmegaConf.is_missing(model, "path") or not model.get("path"):
        return
    path = Path(str(model.path))
    if not path.is_file():
        return
    if "model.gguf_file" in explicit and model.gguf_file != path.name:
        raise ConfigError(
            f"model.path={path} is a file and model.gguf_file={model.gguf_file} names another: "
            "give the file as model.path, or its folder as model.path and its name as "
            "model.gguf_file"
        )
    model.path, model.gguf_file = str(path.parent), path.name


def _merge_existing(node: DictConfig, values: dict, explicit: set[str], prefix: str = "") -> None:
    """Apply ``values`` where the key exists in ``node`` (one ``tiny`` block serves every data
    source) and was not given on the command line; dicts recurse, anything else replaces."""
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in node:
            continue
        if isinstance(value, dict) and isinstance(node[key], DictConfig):
            _merge_existing(node[key], value, explicit, f"{dotted}.")  # data=... picks a group
        elif dotted not in explicit:
            node[key] = value


def warn_shared_gpu(resolved: dict) -> None:
    """A timed kind on a GPU that ``node_gpus`` shares between jobs (``jobs_per_gpu`` > 1): its
    times are not clean. Say so up front (the record's ``environment`` says it too)."""
    k = jobs_per_gpu()
    timed = resolved["kind"] == "e2e" or (
        resolved["kind"] in ("operator", "sweep", "matched") and resolved["timing"]["enabled"]
    )
    if k is not None and k > 1 and timed:
        print(
            f"warning: {k} jobs share this GPU (hydra.launcher.jobs_per_gpu={k}): the times of "
            f"this kind={resolved['kind']} run are not clean, and analysis marks its records so; "
            "keep jobs_per_gpu=1 for latency",
            file=sys.stderr,
        )


def warn_unread_keys(overrides: list[str]) -> None:
    """``+key=value`` adds a key the config does not have: no code reads it (a misspelt key),
    except a model option that only ``eval.models.DEFAULTS`` names (``+model.dequant_cache``)."""
    from eval.models import DEFAULTS as MODEL_DEFAULTS

    read = tuple(f"model.{k}" for k in MODEL_DEFAULTS)
    for o in overrides:
        key = o.lstrip("+").split("=", 1)[0]
        if o.startswith("+") and not key.startswith(("hydra.", "method.")) and key not in read:
            print(
                f"warning: {o} adds the key '{key}', which no code reads (misspelt? keys that "
                "exist are set without '+'); it only changes the run's identity",
                file=sys.stderr,
            )


# Top-level keys that are S2O's shortcuts: conf/method/s2o.yaml reads them (``${tau}``, ``${S}``).
SHORTCUTS = {"tau": "tau", "S": "segment_len"}


def _strings(node: object):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def refuse_unread_shortcuts(cfg: DictConfig, ctx: JobContext) -> None:
    """``tau`` / ``S`` given on the command line (or as sweep keys) that no config value reads (no
    ``${tau}`` / ``${S}`` interpolation: ``method`` is not s2o and no other block reads them) would
    be silently ignored: :class:`ConfigError` naming the method. Call after :func:`prepare`."""
    given = {k: f"{k}={cfg[k]}" for k in explicit_keys(ctx.overrides) if k in SHORTCUTS}
    if cfg.kind == "sweep" and cfg.sweep is not None:
        sweep = OmegaConf.to_container(cfg.sweep, resolve=False)
        keys = set(sweep.get("grid") or {})
        keys |= {k for p in sweep.get("points") or [] for k in (p.get("set") or {})}
        given.update({k: f"the sweep key {k!r}" for k in keys if k in SHORTCUTS})
    values = list(_strings(OmegaConf.to_container(cfg, resolve=False)))
    for key, origin in given.items():
        read = re.compile(r"\$\{\s*" + key + r"\s*\}")
        if not any(read.search(v) for v in values):
            knobs = sorted(cfg.method) if cfg.method is not None else []
            raise ConfigError(
                f"{origin}: top-level {key} is S2O's shortcut for method.{SHORTCUTS[key]} (read "
                f"by conf/method/s2o.yaml), but method={ctx.method} does not read it and the run "
                f"would ignore it; use method=s2o, or set method={ctx.method}'s own knob "
                f"(method.<knob>=<value>, knobs: {knobs})"
            )


def check(cfg: DictConfig, ctx: JobContext) -> tuple[DictConfig, dict, Path]:
    """Every refusal that needs no computation, for one job: the kind, the shortcuts, value types,
    device, a writable ``results_dir``, the data files and the kind's own checks
    (:func:`check_job`), then the record's path (it hashes the data files).
    Returns the prepared config, the resolved one and the record's path; raises what
    :func:`refusal` turns into one line. A sweep's launcher asks this of every point before its
    first job runs (hydra_plugins/s2o_launchers/report.py ``preflight``)."""
    if cfg.kind not in KINDS:
        raise ConfigError(f"kind={cfg.kind!r} is not one of {list(KINDS)}")
    cfg = prepare(cfg, ctx.overrides)
    refuse_unread_shortcuts(cfg, ctx)
    resolved = resolved_config(cfg, ctx)
    check_git_rev(resolved["git_rev"])
    check_writable(resolved["results_dir"])
    check_job(resolved)
    return cfg, resolved, record_path(resolved)


def check_git_rev(rev) -> None:
    """A commit is a string: Hydra reads an all-digit one (``git_rev=6059204``) as a number, which
    would land in the record as one (and lose a leading zero)."""
    if rev is not None and not isinstance(rev, str):
        raise ConfigError(
            f"git_rev={rev!r} was read as a number ({type(rev).__name__}), not a commit: quote "
            f"it for Hydra, e.g. \"git_rev='{rev}'\""
        )


REFUSALS = (ConfigError, MissingMandatoryValue, InterpolationResolutionError)


def one_line(exc: Exception) -> str:
    """The one line that says why a job was refused (:data:`REFUSALS`)."""
    if isinstance(exc, MissingMandatoryValue):
        return f"{exc.full_key} is required (??? in the config): give {exc.full_key}=<value>"
    return str(exc).splitlines()[0]


def refusal(cfg: DictConfig) -> str | None:
    """Why the job of ``cfg`` (a composed config with its ``hydra`` node) would be refused before
    it computes, in one line; None when :func:`check` passes."""
    try:
        _, resolved, path = check(cfg, job_context(cfg))
        if reusable(resolved, path)[0] is None:
            check_sources(resolved)
    except REFUSALS as exc:
        return one_line(exc)
    return None


def check_job(resolved: dict) -> None:
    """The kind's own refusals that need no computation (kind=accuracy:
    experiments.accuracy.check_job), before the record's path is asked for."""
    kind = importlib.import_module(f"experiments.{resolved['kind']}")
    getattr(kind, "check_job", lambda resolved: None)(resolved)


def check_sources(resolved: dict) -> None:
    """The data the kind reads can be had (kind=accuracy: a hub dataset with no file given needs
    the hub or its cache, experiments.accuracy.check_sources), asked of a point that will compute
    (one with a reusable record reads none, offline too): a :class:`ConfigError` before any
    model loads."""
    kind = importlib.import_module(f"experiments.{resolved['kind']}")
    getattr(kind, "check_sources", lambda resolved: None)(resolved)


def typed_names(message: str, overrides: list[str]) -> str:
    """``message`` with each knob set through a shortcut named as it was typed (``S=0``: ``S
    must be a positive int``, not ``segment_len``), unless ``method.<knob>`` was typed too."""
    typed = explicit_keys(overrides)
    for short, knob in SHORTCUTS.items():
        if short != knob and short in typed and f"method.{knob}" not in typed:
            message = re.sub(rf"\b{knob}\b", short, message)
    return message


def as_typed(body: Callable, ctx: JobContext) -> Callable:
    """``body`` whose ``ValueError`` (a bad knob value, found when the method is bound) names the
    keys as typed (:func:`typed_names`); the original stays as its cause, in the traceback."""

    def run(*args: object) -> dict:
        try:
            return body(*args)
        except ValueError as exc:
            renamed = typed_names(str(exc), ctx.overrides)
            if renamed == str(exc):
                raise
            raise ValueError(renamed) from exc

    return run


def run_job(cfg: DictConfig, ctx: JobContext | None = None) -> dict:
    """Run one Hydra job and return its record (also written to disk)."""
    ctx = ctx or job_context(cfg)
    warn_unread_keys(ctx.overrides)
    cfg, resolved, path = check(cfg, ctx)
    if code_revision(resolved["git_rev"]) == "unknown":
        print(
            "warning: no git revision here (a copied tree?): pass git_rev=<commit> so records "
            "made by different code are told apart",
            file=sys.stderr,
        )
    warn_shared_gpu(resolved)
    done, how = reusable(resolved, path)
    if done is not None:
        if how == "stale":
            print(f"reuse (stale: other code or data, reuse_stale=true): {done['stale']['path']}")
        else:
            print(f"skip: {path} exists with status ok")
        return {"status": "ok", "skipped": True, "path": str(path), "stale": done.get("stale")}
    check_sources(resolved)
    kind = importlib.import_module(f"experiments.{resolved['kind']}")
    logger = WandbLogger(resolved["wandb"], resolved, name=f"{resolved['name']}-{path.parent.name}")
    try:
        record = compute(
            resolved, path, lambda: as_typed(kind.run, ctx)(cfg, resolved, ctx, logger)
        )
    except KeyboardInterrupt:
        logger.finish(exit_code=130)
        raise Interrupted(path) from None
    logger.finish(exit_code=0 if record["status"] == "ok" else 1)
    if record["status"] != "ok":
        print(f"error: {record['error']} (traceback in the record)", file=sys.stderr)
    print(f"record: {path} ({record['status']}, {record['elapsed_s']:.1f} s)")
    return {**record, "path": str(path)}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while a point computed: its record (``path``) was not written."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


def interrupted(exc: KeyboardInterrupt) -> str:
    """The one line Ctrl-C prints (every kind; kind=accuracy says how many samples it saved)."""
    path = getattr(exc, "path", None)
    lost = f"the point in progress left no record ({path.parent})" if path else "no point started"
    return (
        f"interrupted: {lost}; records already written stay; rerun the same command to resume "
        f"(points with an ok record are skipped): {shlex.join(['python', *sys.argv])}"
    )


def outcome(record: dict) -> dict:
    """What a launcher needs of a job (small, picklable): status, record path, error, and the
    failed points of an in-process sweep."""
    failed = (record.get("metrics") or {}).get("failed") or []
    return {"status": record["status"], "path": record.get("path"), "error": record.get("error"),
            "failed": list(failed), "skipped": bool(record.get("skipped"))}  # fmt: skip


def sweep_table(points: list[dict]) -> str:
    """The table that closes a ``-m`` sweep (hydra_plugins/s2o_launchers/report.py ``finish``):
    one row per point (``num``, ``point``: the overrides that set it apart, ``status``: ok,
    skipped, error or failed, ``path``: its record) with the record's headline metrics
    (:mod:`analysis.runs_table`, which tabulates any records: ``python -m analysis.runs_table``)."""
    import pandas as pd

    from analysis.runs_table import HEADLINE, metrics_of, text
    from experiments.records import read_record

    rows = []
    for p in points:
        rec = read_record(Path(p["path"])) if p.get("path") else None
        got = metrics_of(rec) if rec is not None and rec.get("status") == "ok" else {}
        row = {"#": p["num"], "point": p["point"], "status": p["status"]}
        rows.append(
            {**row, **{k: got[k] for k in HEADLINE if k in got}, "record": p["path"] or "-"}
        )
    return f"sweep: {len(points)} points\n" + text(pd.DataFrame(rows))


def _close(word: str, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    match = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def hydra_error(exc: Exception) -> str:
    """One line for a mistake Hydra finds in the command line (a key that does not exist, a
    config group option that does not exist, an override that does not parse), with the closest
    name where there is one (``tua`` -> ``tau``)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = exc.__cause__
    key = getattr(cause, "full_key", None)
    if key and isinstance(getattr(cause, "parent_node", None), DictConfig):
        leaf = str(key).rsplit(".", 1)[-1]
        return (f"{key}: no such key{_close(leaf, cause.parent_node.keys())} (keys are strict; "
                f"+{key}=<value> adds one)")  # fmt: skip
    if isinstance(exc, MissingConfigException) and exc.options:
        group, _, option = str(exc.missing_cfg_file).rpartition("/")
        return (f"{group}={option}: no such option{_close(option, exc.options)}; options: "
                f"{', '.join(exc.options)}")  # fmt: skip
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, OverrideParseException) and len(lines) > 1:
        return f"{lines[0]}: {lines[1]}"
    return lines[0] if lines else type(exc).__name__


def one_line_errors(run_and_report: Callable) -> Callable:
    """Hydra's ``run_and_report`` (it prints a failed composition in 7-15 lines and exits 1) with
    its mistakes in one line, exit code 2, as run.py's own refusals. Anything else (a job's own
    exception, a ``SweepFailed``: points that ran and failed) and every error under
    ``HYDRA_FULL_ERROR=1`` is Hydra's to report."""
    from hydra.errors import HydraException

    def run(func: Callable) -> object:
        try:
            return func()
        except Exception as exc:  # noqa: BLE001  (what is not ours goes back to Hydra's printer)
            ours = isinstance(exc, HydraException) and type(exc).__name__ != "SweepFailed"
            if not ours or os.environ.get("HYDRA_FULL_ERROR") == "1":
                return run_and_report(functools.partial(_reraise, exc))
            print(f"error: {hydra_error(exc)}", file=sys.stderr)
            sys.exit(2)

    return run


def _reraise(exc: Exception) -> None:
    raise exc


def unknown_option(argv: list[str]) -> str | None:
    """One line for a command-line option Hydra does not know (argparse would print its usage and
    exit 2), with the closest known option."""
    from hydra._internal.utils import get_args_parser

    known = [s for a in get_args_parser()._actions for s in a.option_strings]
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and flag not in known:
            return f"{flag}: no such option{_close(flag, known)}; options: {', '.join(known)}"
    return None


class _ArgvError(Exception):
    """argparse's error message, raised instead of its usage and exit."""


def options_first(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's options (and their values) before the overrides (``--info`` without
    its value after them), each group in its order: argparse refuses overrides on both sides of
    an option (``tau=0.01 -m S=64`` printed its usage and exited 2), Hydra reads the two apart,
    so the order between them means nothing. Unchanged when it holds ``--``."""
    from hydra._internal.utils import get_args_parser

    actions = get_args_parser()._option_string_actions
    if "--" in argv:
        return list(argv)
    options, overrides, last, rest = [], [], [], list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        action = actions.get(arg)
        if action is None:  # --flag=value, or not Hydra's (refused by unknown_option)
            options.append(arg)
            continue
        optional = action.nargs == "?"
        takes = action.nargs is None or (
            optional and rest and not rest[0].startswith("-")
            and (action.choices is None or rest[0] in action.choices)
        )  # fmt: skip
        if takes and rest:
            options += [arg, rest.pop(0)]
        else:  # an optional value not given: last, where no override can be taken for it
            (last if optional else options).append(arg)
    return options + overrides + last


def argv_error(argv: list[str]) -> str | None:
    """argparse's complaint about ``argv`` (a missing or invalid option value: it would print its
    usage and exit 2), or Hydra's about two commands (``-m --cfg job``: a traceback), as one
    line; None when Hydra takes ``argv``."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def error(message: str):
        raise _ArgvError(message)

    parser.error = error
    try:
        args = parser.parse_args(argv)
    except _ArgvError as exc:
        return str(exc)
    commands = [args.run, args.multirun, args.cfg is not None, args.info is not None,
                args.shell_completion]  # fmt: skip
    if sum(map(bool, commands)) > 1:  # Hydra raises a ValueError with its traceback
        return "only one of --run, --multirun, --cfg, --info and --shell-completion at a time"
    return None


def job(cfg: DictConfig) -> dict:
    """One job as ``python run.py`` runs it: a refusal is one line and exit code 2, Ctrl-C one line
    and exit code 130, a failed point exit code 1 (outside a multirun)."""
    ctx = job_context(cfg)
    try:
        result = outcome(run_job(cfg, ctx))
    except REFUSALS as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as exc:
        print(interrupted(exc), file=sys.stderr, flush=True)
        sys.exit(130)
    if not ctx.multirun and (result["status"] != "ok" or result["failed"]):
        sys.exit(1)
    return result  # a multirun's launcher reads it: hydra_plugins/s2o_launchers/report.py


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    return job(cfg)


if __name__ == "__main__":
    import hydra._internal.utils as hydra_internal  # run_and_report: Hydra's error printer

    sys.argv[1:] = options_first(sys.argv[1:])  # -m may follow the overrides
    if (bad := unknown_option(sys.argv[1:]) or argv_error(sys.argv[1:])) is not None:
        print(f"error: {bad}", file=sys.stderr)
        sys.exit(2)
    hydra_internal.run_and_report = one_line_errors(hydra_internal.run_and_report)
    main()
