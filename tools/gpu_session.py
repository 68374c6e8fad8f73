"""A lent GPU machine's session in the background: a plan of shell steps run across the node's
GPUs by one detached process that outlives the call that started it, resumes after interruption,
and that later calls poll and copy snapshots of back (each call at most 600 s; the machine goes
back when idle for 30 s, so a call polls until its time is nearly up).

    python -m tools.gpu_session print --plan tools/gpu_session.yaml --gpus 2
    python -m tools.gpu_session start --plan tools/gpu_session.yaml --state /tmp/gs
    python -m tools.gpu_session poll --state /tmp/gs --out "$OUT" --seconds 540   # repeat
    tar xzf snapshot.tgz files/ --strip-components=1      # here, in the repo: the new records

The plan (YAML): ``vars`` (defaults, formatted into the commands with ``str.format``) and
``steps``, each with ``name``, ``gpus`` (GPU indices or ``"all"``; index i is GPU i % N on an
N-GPU machine), ``after`` (earlier steps that must end with rc 0), ``run`` (a bash command; it may
use the vars, ``{state}`` and ``{gpus}``, how many GPUs the step gets), ``timeout_s`` and ``note``.
A step that writes ``{state}/vars/<name>`` sets that var for every step started after it (over
the default and ``--var``). Steps in plan order have priority; a step starts once its ``after``
steps succeeded and its GPUs are free; a step whose dependency failed or was skipped is skipped.

The state dir holds ``logs/<step>.log``, ``done/<step>.json`` (rc, times, GPUs, command, vars),
``vars/``, ``running/``, ``plan.json``, ``started``, ``serve.pid`` (while serve runs),
``serve.log`` and ``finished`` (counts); commands may put Hydra sweep folders under
``{state}/sweeps/`` (their job logs travel in the snapshot). Run again on the same state dir,
``start`` reruns only the steps without a done record of rc 0. ``poll`` writes
``<out>/snapshot.tgz``: the state files, a ``status.txt`` and, under ``files/``, every file of the
``--pack`` folders (default ``results``) changed since ``started``; over 15 MiB it comes as
``snapshot.tgz.part00``, ``part01``, ... (the device tool returns files of at most 16 MiB).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import string
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STEP_KEYS = {"name", "gpus", "after", "run", "timeout_s", "note"}
BUILTINS = ("state", "gpus")
KILL_GRACE_S = 10.0  # SIGTERM, then SIGKILL this long after
TICK_S = 0.05
PART_BYTES = 15 << 20  # a snapshot larger than this is cut into parts (the tool's limit: 16 MiB)
NOT_STARTED = "nothing was started on this machine (a fresh machine?): run start first"


class PlanError(ValueError):
    """A bad plan or command-line value (exit 2)."""


@dataclass
class Step:
    name: str
    gpus: list[int]  # after the i % N mapping
    after: list[str]
    run: str
    timeout_s: float | None = None
    note: str = ""


@dataclass
class Plan:
    vars: dict[str, str]
    steps: list[Step]


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def _scalar(key: str, v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (str, int, float)):
        return str(v)
    raise PlanError(f"var {key}: {v!r} is not a scalar")


def fields(cmd: str, where: str) -> set[str]:
    """The names a command formats (``{a.b}`` -> ``a``)."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(cmd) if f is not None]
    except ValueError as e:
        raise PlanError(
            f"{where}: bad braces in {cmd!r} ({e}; write {{{{ }}}} for literal ones)"
        ) from None
    return {re.match(r"[^.\[]*", f).group() for f in names}


def load_plan(path: str | Path, n_gpus: int, overrides: dict[str, str] | None = None) -> Plan:
    """Read and check a plan; ``overrides`` (``--var``) replace var defaults."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PlanError(f"cannot read plan {path}: {e}".splitlines()[0]) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("steps"), list) or not raw["steps"]:
        raise PlanError(f"plan {path}: expected a mapping with a non-empty list `steps`")
    if unknown := set(raw) - {"vars", "steps"}:
        raise PlanError(f"plan {path}: unknown top-level key {sorted(unknown)[0]!r}")
    vars_ = _plan_vars(raw.get("vars") or {}, overrides or {})
    names = [str(t.get("name")) for t in raw["steps"] if isinstance(t, dict)]
    steps: list[Step] = []
    for i, s in enumerate(raw["steps"]):
        steps.append(_plan_step(s, i, steps, names, vars_, n_gpus))
    return Plan(vars_, steps)


def _plan_vars(given: dict, overrides: dict[str, str]) -> dict[str, str]:
    """The plan's vars, ``--var`` overrides applied; refuses reserved names and unknown
    overrides."""
    vars_ = {str(k): _scalar(k, v) for k, v in given.items()}
    for k in vars_:
        if k in BUILTINS or not k.isidentifier():
            raise PlanError(f"var {k!r}: reserved or not an identifier")
    for k, v in overrides.items():
        if k not in vars_:
            raise PlanError(f"--var {k}: the plan has no such var (vars: {', '.join(vars_)})")
        vars_[k] = v
    return vars_


def _plan_step(s, i: int, before: list[Step], names: list[str], vars_: dict, n_gpus: int) -> Step:
    """Step ``i`` of the plan, checked against the steps ``before`` it (``names``: every step's
    name, to tell a later step from an unknown one)."""
    if not isinstance(s, dict):
        raise PlanError(f"step {i}: expected a mapping, got {s!r}")
    name = str(s.get("name", ""))
    where = f"step {name or i}"
    if unknown := set(s) - STEP_KEYS:
        raise PlanError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise PlanError(f"{where}: bad or missing name {name!r} ([A-Za-z0-9_-]+)")
    if any(t.name == name for t in before):
        raise PlanError(f"{where}: duplicate name {name!r}")
    after = s.get("after") or []
    after = [after] if isinstance(after, str) else after
    for a in after:
        if a == name or a not in {t.name for t in before}:
            later = "a later" if a in names else "an unknown"
            raise PlanError(f"{where}: after names {later} step {a!r}")
    gpus = _step_gpus(s.get("gpus", [0]), where, n_gpus)
    run = s.get("run")
    if not isinstance(run, str) or not run.strip():
        raise PlanError(f"{where}: missing command `run`")
    if bad := sorted(fields(run, where) - set(vars_) - set(BUILTINS)):
        raise PlanError(f"{where}: {{{bad[0]}}} in its command is not a var (nor state/gpus)")
    try:
        run.format(**vars_, state="/state", gpus=1)
    except (ValueError, IndexError, KeyError, AttributeError) as e:
        raise PlanError(f"{where}: its command does not format: {e}") from None
    timeout = s.get("timeout_s")
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if timeout is not None and not (number and timeout > 0):
        raise PlanError(f"{where}: timeout_s {timeout!r} is not a positive number")
    return Step(name, gpus, [str(a) for a in after], run, timeout, str(s.get("note") or ""))


def _step_gpus(gpus, where: str, n_gpus: int) -> list[int]:
    """A step's ``gpus`` (``'all'`` or indices, taken modulo the node's GPUs) as sorted indices."""
    if gpus == "all":
        return list(range(n_gpus))
    if isinstance(gpus, list) and gpus and all(type(g) is int and g >= 0 for g in gpus):
        return sorted({g % n_gpus for g in gpus})
    raise PlanError(f"{where}: gpus {gpus!r} is not 'all' or a list of indices >= 0")


# ---- state dir helpers


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _stat(path: Path) -> list[str]:
    """/proc/<pid>/stat's fields after the name: state, ppid, pgrp, ... ([] if unreadable)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _stat(Path(f"/proc/{pid}/stat"))[:1] != ["Z"]  # a zombie (unreaped child) is dead


def serve_pid(state: Path) -> int | None:
    """The pid of the live serve of ``state``, else None."""
    try:
        pid = int((state / "serve.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is left (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc").is_dir():
        return True
    stats = (_stat(p) for p in Path("/proc").glob("[0-9]*/stat"))
    return any(st[2] == str(pgid) and st[0] != "Z" for st in stats if len(st) > 2)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def prepare_state(state: Path, plan: Plan) -> None:
    for sub in ("logs", "done", "vars", "running"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    if not (state / "started").exists():  # the first start's time: poll packs files newer
        (state / "started").write_text(_now() + "\n")
    steps = [{"name": s.name, "gpus": s.gpus, "after": s.after} for s in plan.steps]
    _write_json(state / "plan.json", {"steps": steps})


# ---- serve


@dataclass
class Running:
    step: Step
    proc: subprocess.Popen
    record: dict
    t0: float = field(default_factory=time.monotonic)
    term_at: float | None = None  # when the timeout's SIGTERM went
    killed: bool = False


def _launch(plan: Plan, s: Step, state: Path, root: Path) -> Running | dict:
    """Start a step, or the done record of one whose command does not format."""
    values = dict(plan.vars)
    for f in sorted((state / "vars").glob("*")):
        if f.is_file() and not f.name.startswith("."):
            values[f.name] = (f.read_text().splitlines() or [""])[0].strip()
    cvd = ",".join(map(str, s.gpus))
    record = {"name": s.name, "gpus": s.gpus, "start": _now(), "note": s.note}
    record["vars"] = {k: values[k] for k in sorted(fields(s.run, s.name)) if k in values}
    try:
        record["command"] = cmd = s.run.format(**values, state=str(state), gpus=len(s.gpus))
    except (ValueError, IndexError, KeyError, AttributeError) as e:
        return record | {"rc": 2, "error": f"command does not format: {e}", "end": _now()}
    env = os.environ | {"CUDA_VISIBLE_DEVICES": cvd, "GS_STATE": str(state)}
    with open(state / "logs" / f"{s.name}.log", "a") as log:
        log.write(f"=== {record['start']} gpus {cvd}: {cmd}\n")
        log.flush()
        proc = subprocess.Popen(
            ["bash", "-c", cmd],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _write_json(state / "running" / f"{s.name}.json", {"start": time.time(), "pid": proc.pid})
    print(f"{record['start']} start {s.name} on GPUs {cvd}: {cmd}", flush=True)
    return Running(s, proc, record)


def _check(r: Running) -> int | None:
    """The step's rc once it has ended (124 past its timeout), else None; enforces the timeout."""
    now, pg = time.monotonic(), r.proc.pid
    if r.step.timeout_s and r.term_at is None and now - r.t0 > r.step.timeout_s:
        _killpg(pg, signal.SIGTERM)
        r.term_at = now
    if r.term_at is not None and not r.killed and now - r.term_at > KILL_GRACE_S:
        _killpg(pg, signal.SIGKILL)
        r.killed = True
    rc = r.proc.poll()
    if rc is None:
        return None
    if r.term_at is not None:
        return 124 if r.killed or not _group_alive(pg) else None
    _killpg(pg, signal.SIGTERM)  # what the step left running in its group
    return rc


class _Serve:
    """The steps of one serve: each step's outcome (rc; None: skipped), the running ones."""

    def __init__(self, plan: Plan, state: Path, root: Path):
        self.plan, self.state, self.root = plan, state, root
        self.outcome: dict[str, int | None] = {}
        self.running: dict[str, Running] = {}

    def resume(self) -> list[Step]:
        """The steps left to run: a step done with rc 0 stays done; a failed or skipped one runs
        again."""
        for s in self.plan.steps:
            done = _read_json(self.state / "done" / f"{s.name}.json")
            if done and done.get("rc") == 0:
                self.outcome[s.name] = 0
            elif done is not None:
                (self.state / "done" / f"{s.name}.json").unlink()
        return [s for s in self.plan.steps if s.name not in self.outcome]

    def finish(self, name: str, rec: dict) -> None:
        self.outcome[name] = rec.get("rc")
        _write_json(self.state / "done" / f"{name}.json", rec)
        (self.state / "running" / f"{name}.json").unlink(missing_ok=True)
        how = (
            f"skipped, {rec['skipped']}"
            if "skipped" in rec
            else f"rc {rec['rc']} in {rec.get('wall_s', 0):.1f} s"
        )
        print(f"{_now()} done {name}: {how}", flush=True)

    def ended(self, r: Running, rc: int) -> None:
        wall = round(time.monotonic() - r.t0, 3)
        self.finish(r.step.name, r.record | {"rc": rc, "end": _now(), "wall_s": wall})
        self.running.pop(r.step.name)

    def tick(self, pending: list[Step]) -> None:
        """Reap the ended steps; skip a pending step whose ``after`` failed or was skipped; start
        those whose ``after`` succeeded, in plan order, where their GPUs are free (a step that
        waits holds its GPUs against later ones: priority)."""
        for r in list(self.running.values()):
            if (rc := _check(r)) is not None:
                self.ended(r, rc)
        claimed = {g for r in self.running.values() for g in r.step.gpus}
        for s in list(pending):
            if bad := [a for a in s.after if a in self.outcome and self.outcome[a] != 0]:
                rc = self.outcome[bad[0]]
                why = f"{bad[0]} skipped" if rc is None else f"{bad[0]} failed (rc {rc})"
                self.finish(s.name, {"name": s.name, "rc": None, "skipped": why, "end": _now()})
                pending.remove(s)
            elif all(self.outcome.get(a) == 0 for a in s.after):
                if not claimed & set(s.gpus):
                    pending.remove(s)
                    r = _launch(self.plan, s, self.state, self.root)
                    if isinstance(r, Running):
                        self.running[s.name] = r
                    else:
                        self.finish(s.name, r)
                claimed |= set(s.gpus)

    def stop(self, sig: int) -> None:
        """SIGTERM to the running steps, SIGKILL after the grace; each ends with rc 128 + sig."""
        print(f"{_now()} signal {sig}: stopping {', '.join(self.running) or 'nothing'}")
        for r in self.running.values():
            _killpg(r.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + KILL_GRACE_S
        while (
            any(r.proc.poll() is None for r in self.running.values())
            and time.monotonic() < deadline
        ):
            time.sleep(TICK_S)
        for r in list(self.running.values()):
            _killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
            self.ended(r, 128 + sig)

    def summary(self, sig: int | None) -> int:
        """Writes ``finished``; 0 when every step succeeded, else 1."""
        rcs = list(self.outcome.values())
        counts = [rcs.count(0), sum(1 for v in rcs if v), rcs.count(None)]
        line = "ok {}, failed {}, skipped {}".format(*counts) + f" of {len(self.plan.steps)} steps"
        if sig is not None:
            line = f"interrupted by signal {sig}: {line}"
        (self.state / "finished").write_text(f"{_now()} {line}\n")
        print(f"{_now()} {line}", flush=True)
        return 0 if counts[0] == len(self.plan.steps) else 1


def serve(plan: Plan, state: Path, root: Path) -> int:
    """Run the plan to its end in the foreground; 0 when every step succeeded, else 1."""
    state = state.resolve()
    if (other := serve_pid(state)) and other != os.getpid():
        raise PlanError(f"a serve of {state} is running already (pid {other})")
    prepare_state(state, plan)
    for f in (state / "running").glob("*"):
        f.unlink()
    (state / "finished").unlink(missing_ok=True)
    (state / "serve.pid").write_text(f"{os.getpid()}\n")
    stop: list[int] = []
    old = {
        s: signal.signal(s, lambda n, _: stop.append(n)) for s in (signal.SIGTERM, signal.SIGINT)
    }
    run = _Serve(plan, state, root)
    try:
        pending = run.resume()
        print(f"{_now()} serve pid {os.getpid()}: {len(pending)} of {len(plan.steps)} steps to run")
        while (pending or run.running) and not stop:
            run.tick(pending)
            time.sleep(TICK_S)
        if stop:  # SIGTERM/SIGINT: stop the running steps, rc 128 + signal
            run.stop(stop[0])
        return run.summary(stop[0] if stop else None)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if serve_pid(state) == os.getpid():
            (state / "serve.pid").unlink(missing_ok=True)


# ---- status and poll


def _last_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [x.strip() for x in re.split(r"[\r\n]", f.read().decode(errors="replace"))]
    except OSError:
        return ""
    return next((x for x in reversed(lines) if x), "")[:100]


def status_lines(state: Path) -> list[str]:
    plan = _read_json(state / "plan.json")
    if plan is None:
        return [f"no plan in {state}: " + NOT_STARTED]
    pid = serve_pid(state)
    fin = (state / "finished").read_text().strip() if (state / "finished").exists() else ""
    lines = [f"serve: running, pid {pid}" if pid else f"serve: not running. {fin}".strip()]
    width = max(len(s["name"]) for s in plan["steps"])
    for s in plan["steps"]:
        done, wall = _read_json(state / "done" / f"{s['name']}.json"), None
        run = _read_json(state / "running" / f"{s['name']}.json")
        if done:
            rc, wall = done.get("rc"), done.get("wall_s")
            st = "skipped" if "skipped" in done else "ok" if rc == 0 else f"failed rc {rc}"
        elif run:
            st, wall = ("running" if pid else "interrupted"), time.time() - run["start"]
        else:
            st = "waiting"
        gpus = ",".join(map(str, s["gpus"]))
        wall_s = "-" if wall is None else f"{wall:.1f}s"
        last = _last_line(state / "logs" / f"{s['name']}.log")
        lines.append(f"{s['name']:<{width}}  {st:<12} gpus {gpus:<8} {wall_s:>6}  {last}")
    return lines


def _add_tree(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        try:
            tar.add(f, arcname if f == path else f"{arcname}/{f.relative_to(path).as_posix()}")
        except OSError:  # vanished or shrank while being read: the next snapshot has it
            pass


def write_snapshot(state: Path, out: Path, packs: list[str], root: Path) -> Path:
    """``out/snapshot.tgz``, atomically: the state files, status.txt and the new pack files."""
    out.mkdir(parents=True, exist_ok=True)
    since = (state / "started").stat().st_mtime
    skip = [state.resolve(), out.resolve()]
    tmp, dest = out / f".snapshot.tgz.{os.getpid()}.tmp", out / "snapshot.tgz"
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for name in ("logs", "done", "vars", "serve.log", "finished", "started", "plan.json"):
            if (state / name).exists():
                _add_tree(tar, state / name, name)
        for f in sorted((state / "sweeps").rglob("*.log")):  # each Hydra job's output
            if f.is_file():
                _add_tree(tar, f, f.relative_to(state).as_posix())
        text = ("\n".join(status_lines(state)) + "\n").encode()
        info = tarfile.TarInfo("status.txt")
        info.size, info.mtime = len(text), int(time.time())
        tar.addfile(info, io.BytesIO(text))
        for pack in packs:
            base = (root / pack).resolve()
            top = root.resolve() if base.is_relative_to(root.resolve()) else base.parent
            for f in sorted(base.rglob("*")) if base.is_dir() else [base] if base.exists() else []:
                try:
                    new = f.is_file() and f.stat().st_mtime > since
                except OSError:
                    continue
                if new and not any(f.resolve().is_relative_to(s) for s in skip):
                    _add_tree(tar, f, f"files/{f.relative_to(top).as_posix()}")
    for old in out.glob("snapshot.tgz.part*"):  # the last snapshot's parts
        old.unlink()
    if tmp.stat().st_size <= PART_BYTES:
        os.replace(tmp, dest)
        return dest
    # The device tool returns files of at most 16 MiB: cut a larger snapshot into parts that
    # `cat snapshot.tgz.part* > snapshot.tgz` joins again.
    dest.unlink(missing_ok=True)
    with open(tmp, "rb") as src:
        i = 0
        while chunk := src.read(PART_BYTES):
            part = out / f".snapshot.tgz.part{i:02d}.tmp"
            part.write_bytes(chunk)
            os.replace(part, out / f"snapshot.tgz.part{i:02d}")
            i += 1
    tmp.unlink()
    print(f"snapshot over {PART_BYTES >> 20} MiB: {i} parts; cat snapshot.tgz.part* > snapshot.tgz")
    return out / "snapshot.tgz.part00"


def poll(state: Path, out: Path, seconds: float, every: float, packs: list[str], root: Path) -> int:
    """Snapshots every ``every`` s until ``seconds`` have passed or serve has ended."""
    if not (state / "started").exists():
        print(NOT_STARTED)
        return 3
    deadline, cost, last = time.monotonic() + seconds, 0.0, False
    while True:
        alive = serve_pid(state) is not None
        t = time.monotonic()
        write_snapshot(state, out, packs, root)
        cost = time.monotonic() - t
        print(f"--- {_now()}\n" + "\n".join(status_lines(state)), flush=True)
        if not alive or last:
            return 0
        final_at = deadline - cost - 0.5  # the last snapshot must end by the deadline
        wake = min(time.monotonic() + every, final_at)
        last = wake >= final_at
        while time.monotonic() < wake and serve_pid(state) is not None:
            time.sleep(max(0.0, min(0.5, wake - time.monotonic())))


# ---- command line


def gpu_count(given: int | None) -> int:
    if given is not None:
        if given < 1:
            raise PlanError(f"--gpus {given}: must be at least 1")
        return given
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if r.returncode == 0 and (n := len(r.stdout.strip().splitlines())):
            return n
    raise PlanError("no GPUs found: pass --gpus N")


def parse_vars(items: list[str]) -> dict[str, str]:
    if bad := [v for v in items if "=" not in v]:
        raise PlanError(f"--var {bad[0]}: expected key=value")
    return dict(v.split("=", 1) for v in items)


def cmd_start(a: argparse.Namespace) -> int:
    state, root = Path(a.state).resolve(), Path(a.root).resolve()
    n = gpu_count(a.gpus)
    plan = load_plan(a.plan, n, parse_vars(a.var))
    if pid := serve_pid(state):
        raise PlanError(f"a serve of {state} is running already (pid {pid})")
    prepare_state(state, plan)
    cmd = [
        sys.executable,
        "-m",
        "tools.gpu_session",
        "serve",
        "--plan",
        str(Path(a.plan).resolve()),
        "--state",
        str(state),
        "--gpus",
        str(n),
        "--root",
        str(root),
        *[f"--var={v}" for v in a.var],
    ]
    with open(state / "serve.log", "a") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    t = time.monotonic()  # until serve has written its pid (or ended), so that poll sees it
    while serve_pid(state) != proc.pid and proc.poll() is None and time.monotonic() - t < 10:
        time.sleep(0.02)
    print(f"serve pid {proc.pid} on {n} GPU(s); its log: {state / 'serve.log'}")
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    plan = load_plan(a.plan, gpu_count(a.gpus), parse_vars(a.var))
    return serve(plan, Path(a.state), Path(a.root).resolve())


def cmd_print(a: argparse.Namespace) -> int:
    try:
        n = gpu_count(a.gpus)
    except PlanError:
        if a.gpus is not None:
            raise
        n = 1  # no GPU here: show the plan as on one
    plan = load_plan(a.plan, n, parse_vars(a.var))
    print(f"{len(plan.steps)} steps on {n} GPU(s); vars: {plan.vars}")
    for s in plan.steps:
        cmd = s.run.format(**plan.vars, state=a.state, gpus=len(s.gpus))
        timeout = f"  timeout {s.timeout_s:g}s" if s.timeout_s else ""
        gpus, after = ",".join(map(str, s.gpus)), ",".join(s.after) or "-"
        print(f"{s.name}  gpus {gpus}  after {after}{timeout}")
        print(f"    {cmd}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, fn, hlp in [
        ("start", cmd_start, "launch serve detached and return"),
        ("serve", cmd_serve, "run the plan in the foreground"),
        ("print", cmd_print, "the steps, their GPUs and commands"),
    ]:
        p = sub.add_parser(name, help=hlp)
        p.set_defaults(func=fn)
        p.add_argument("--plan", required=True)
        p.add_argument(
            "--gpus", type=int, default=None, help="default: nvidia-smi -L's count (print: else 1)"
        )
        p.add_argument("--var", action="append", default=[], metavar="K=V")
        if name == "print":
            p.add_argument("--state", default="{state}", help="the state dir shown in commands")
        else:
            p.add_argument("--state", required=True)
            p.add_argument("--root", default=".", help="the steps' working dir (default: cwd)")
    p = sub.add_parser("status", help="one line per step")
    p.add_argument("--state", required=True)
    p.set_defaults(func=lambda a: print("\n".join(status_lines(Path(a.state)))) or 0)
    p = sub.add_parser("poll", help="snapshots of the results into --out until --seconds pass")
    p.add_argument("--state", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--every", type=float, default=60.0)
    p.add_argument("--pack", action="append", default=None, help="default: results")
    p.add_argument("--root", default=".", help="the folder --pack paths are relative to")
    p.set_defaults(
        func=lambda a: poll(
            Path(a.state),
            Path(a.out),
            a.seconds,
            max(a.every, 0.1),
            a.pack or ["results"],
            Path(a.root),
        )
    )
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except PlanError as e:
        print(f"gpu_session: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
