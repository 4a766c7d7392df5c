"""How fast the ``core-jobs`` commands that do not touch the database answer, as whole processes.

    uv run python bench/cli.py                            # this checkout, 5 rounds
    uv run python bench/cli.py --against /tmp/cj-main     # and another checkout (e.g. main), interleaved
    uv run python bench/cli.py --rounds 9 --top 15

1. The commands are read from the CLI's own parser (``maintenance.cli.build_parser``): ``--help``,
   every subcommand's ``--help`` (nested ones included), ``check-config`` and
   ``check-config --json``. Each runs as the operator runs it: the ``core-jobs`` console script
   beside this interpreter (``python -m maintenance`` where there is none), a new process each
   time, stdout a pipe.
2. Beside them, in the same rounds, the floor any Python CLI pays: ``python -c pass`` and
   ``python -c "import pydantic"`` (and ``import pydantic_settings``, which check-config needs).
3. ``--rounds`` rounds (default 5); in each, every process runs once, in a shuffled order, so load
   from the other processes of a shared machine hits them alike. Printed per command: best and
   median wall seconds, the best over ``python -c pass``'s and over ``import pydantic``'s, and the
   start-up target: ≤ 0.3 s for every command, ≤ 0.5 s for check-config (best of the rounds).
4. ``--against DIR``: the same commands run from the checkout at DIR as well (its packages first
   on ``PYTHONPATH``, this environment's dependencies), interleaved with this checkout's, and the
   ratio this / that. A worktree of main: ``git worktree add --detach /tmp/cj-main main``.
5. Where check-config's time goes: three ``python -X importtime`` runs of it per checkout, the
   import time of each top-level package summed over its modules (each module's least self
   time), largest first.

6. ``--instructions``: the instructions each of check-config, ``--help`` and the baselines
   executes, counted by valgrind (``cachegrind``, no cache simulation; a minute each): a figure
   the machine's load does not change, for a shared machine where wall times swing.

7. Bytecode. The image compiles every module when it is built (the Dockerfile's
   ``UV_COMPILE_BYTECODE=1``; ``pip install`` does the same by default), so an operator's process
   reads ``.pyc`` files; a development checkout synced by ``uv sync`` has none (uv compiles only
   when asked) and this workspace sets ``PYTHONDONTWRITEBYTECODE=1``, so there every process
   compiles every module it imports from source again — 0.25-0.3 s of check-config's time. (The
   official Python image ships its standard library without bytecode too; the Dockerfile compiles
   it in the runtime stage.) The commands are therefore timed both ways, in the same rounds: **as
   installed** (the default ``--bytecode both``): bytecode compiled first into a scratch
   ``PYTHONPYCACHEPREFIX`` — the standard library, the environment's packages and the checkout, as
   the image has them — which the runs then read;
   and **from source**, the caller's environment unchanged. The targets are judged as installed.

check-config gets settings from the environment: every ``CORE_JOBS_*`` variable of the caller is
dropped and ``CORE_JOBS_DATABASE_URL`` points at port 9 of localhost, where nothing listens — a
check-config that connected would fail (exit 1); each run's exit status is checked, and its
output is checked not to show the URL's password.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from maintenance.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

PASSWORD = "bench-not-a-secret"
DATABASE_URL = f"postgresql://bench:{PASSWORD}@127.0.0.1:9/never_connected"  # port 9: nothing listens
FOREIGN = ("CORE_JOBS_TEST_DATABASE_URL", "CORE_JOBS_BENCH_DATABASE_URL")
TARGET_S = 0.3
TARGET_CHECK_CONFIG_S = 0.5
PACKAGES = ("maintenance", "harness", "demo")  # the checkout's trees an install compiles
BYTECODE = {"installed": "as installed (bytecode compiled)", "source": "from source (no bytecode, as this dev venv)"}
BASELINES = {
    "python -c pass": ["-c", "pass"],
    "python -c 'import pydantic'": ["-c", "import pydantic"],
    "python -c 'import pydantic_settings'": ["-c", "import pydantic_settings"],
}


def help_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """``--help`` of the parser and of every subcommand under it, depth first, in the parser's order."""
    found = [(*prefix, "--help")]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += help_commands(sub, (*prefix, name))
    return found


def environment(checkout: Path | None, pycache: Path | None = None) -> dict[str, str]:
    """The runs' environment: no CORE_JOBS_* of the caller's; with ``pycache``, bytecode read from there."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CORE_JOBS_") or k.upper() in FOREIGN}
    env["CORE_JOBS_DATABASE_URL"] = DATABASE_URL
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), *filter(None, [os.environ.get("PYTHONPATH")])])
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def compile_bytecode(pycache: Path, checkouts: list[Path]) -> None:
    """Compile the standard library, this environment's packages and each checkout's into ``pycache``, as an install does."""
    paths = sysconfig.get_paths()
    trees = [paths["stdlib"], paths["purelib"], *(str(c / p) for c in checkouts for p in PACKAGES)]
    env = environment(None, pycache)
    argv = [sys.executable, "-m", "compileall", "-q", "-j", "0", *filter(os.path.isdir, trees)]
    # compileall exits 1 when some file of the trees does not compile (the standard library's tests hold a few on purpose)
    subprocess.run(argv, env=env, capture_output=True, check=False)


def cli_prefix() -> list[str]:
    script = Path(sys.executable).with_name("core-jobs")
    return [str(script)] if script.exists() else [sys.executable, "-m", "maintenance"]


def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, done


def check(label: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{label}: exit {done.returncode}\n{done.stderr[-2000:]}")
    if PASSWORD in done.stdout + done.stderr:
        raise SystemExit(f"{label}: the database URL's password is in the output")


def import_profile(env: dict[str, str], cwd: Path, top: int, runs: int = 3) -> list[tuple[str, float, int]]:
    """check-config under ``-X importtime``, ``runs`` times: (top-level package, seconds of self time, modules), largest first.

    Each module's self time is its least over the runs (the machine's noise only adds), then summed per package.
    """
    argv = [sys.executable, "-X", "importtime", "-m", "maintenance", "check-config"]
    least: dict[str, int] = {}
    for _ in range(runs):
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
        for line in done.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| \s*(\S+)", line)
            if m:
                least[m.group(3)] = min(least.get(m.group(3), int(m.group(1))), int(m.group(1)))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for module, us in least.items():
        entry = totals[module.split(".")[0]]
        entry[0] += us
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    print(f"  (all {len(least)} modules: {sum(least.values()) / 1e6:.3f} s)")
    return [(name, us / 1e6, n) for name, (us, n) in ranked[:top]]


def instructions(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    """The instructions the process ``argv`` executes, counted by valgrind's cachegrind."""
    tool = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    done = subprocess.run([*tool, *argv], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    m = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if m is None:
        raise SystemExit(f"valgrind counted nothing for {argv}:\n{done.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout to measure beside this one (e.g. main)")
    parser.add_argument("--top", type=int, default=12, help="packages shown in check-config's import profile")
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--instructions", action="store_true", help="also count instructions with valgrind")
    parser.add_argument(
        "--bytecode", choices=("both", *BYTECODE), default="both", help="as installed, from source, or both (default)"
    )
    args = parser.parse_args()

    commands: list[tuple[str, ...]] = help_commands(build_parser())
    commands += [("check-config",), ("check-config", "--json")]
    checkouts: dict[str, Path | None] = {"this": None}
    if args.against is not None:
        checkouts["against"] = args.against.resolve()
    cli = cli_prefix()
    modes = list(BYTECODE) if args.bytecode == "both" else [args.bytecode]
    scratch = tempfile.TemporaryDirectory(prefix="core-jobs-bench-pycache-")  # removed on exit, even on an error
    pycache = Path(scratch.name)
    if "installed" in modes:
        compile_bytecode(pycache, [c or ROOT for c in checkouts.values()])

    def env_for(mode: str, checkout: Path | None) -> dict[str, str]:
        return environment(checkout, pycache if mode == "installed" else None)

    # (mode, checkout, label) -> argv, env, cwd
    jobs: dict[tuple[str, str, str], tuple[list[str], dict[str, str], Path]] = {}
    for mode in modes:
        for label, argv in BASELINES.items():
            jobs[(mode, "", label)] = ([sys.executable, *argv], env_for(mode, None), ROOT)
        for which, checkout in checkouts.items():
            for command in commands:
                jobs[(mode, which, "core-jobs " + " ".join(command))] = (
                    [*cli, *command],
                    env_for(mode, checkout),
                    checkout or ROOT,
                )

    print(f"python {sys.version.split()[0]}; {len(commands)} commands; {args.rounds} rounds; CLI: {' '.join(cli)}")
    if args.against is not None:
        print(f"this: {ROOT}; against: {checkouts['against']}")
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    order = list(jobs)
    rng = random.Random(args.seed)
    for key in order:  # a run of each first, untimed: its exit status and output checked, the caches warm
        argv, env, cwd = jobs[key]
        check(" ".join(k for k in key if k), run(argv, env, cwd)[1])
    for round_ in range(args.rounds):
        rng.shuffle(order)
        for key in order:
            argv, env, cwd = jobs[key]
            seconds, _ = run(argv, env, cwd)
            times[key].append(seconds)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)

    def best(key: tuple[str, str, str]) -> float:
        return min(times[key])

    width = max(len(label) for _, _, label in jobs) + 2
    for mode in modes:
        floor = best((mode, "", "python -c pass"))
        pydantic = best((mode, "", "python -c 'import pydantic'"))
        print(f"\n{BYTECODE[mode]}:")
        print(f"{'process':<{width}} {'best s':>7} {'median s':>9} {'/pass':>6} {'/pydantic':>9}  target")
        for label in BASELINES:
            key = (mode, "", label)
            print(
                f"{label:<{width}} {best(key):7.3f} {statistics.median(times[key]):9.3f}"
                f" {best(key) / floor:6.2f} {best(key) / pydantic:9.2f}"
            )
        for which in checkouts:
            if len(checkouts) > 1:
                print(f"-- {which}: {checkouts[which] or ROOT}")
            missed = 0
            for command in commands:
                key = (mode, which, "core-jobs " + " ".join(command))
                target = TARGET_CHECK_CONFIG_S if command[0] == "check-config" else TARGET_S
                met = best(key) <= target
                missed += not met
                print(
                    f"{key[2]:<{width}} {best(key):7.3f} {statistics.median(times[key]):9.3f}"
                    f" {best(key) / floor:6.2f} {best(key) / pydantic:9.2f}  ≤ {target} s {'met' if met else 'MISSED'}"
                )
            print(f"targets met ({mode}): {len(commands) - missed}/{len(commands)}")
        if args.against is not None:
            print("\nthis / against (best of each):")
            for command in commands:
                label = "core-jobs " + " ".join(command)
                this, that = best((mode, "this", label)), best((mode, "against", label))
                print(f"  {label:<{width}} {that:7.3f} -> {this:7.3f} s  x{this / that:5.2f}")
    if "installed" in modes and "source" in modes:
        print("\nsource / installed (best of each), what compiling from source adds:")
        for label in ["python -c 'import pydantic_settings'", "core-jobs --help", "core-jobs check-config"]:
            which = "" if label.startswith("python") else "this"
            source, installed = best(("source", which, label)), best(("installed", which, label))
            print(f"  {label:<{width}} {installed:7.3f} -> {source:7.3f} s  x{source / installed:5.2f}")

    if args.instructions:
        print("\ninstructions executed (valgrind; load does not change them), and over python -c 'import pydantic':")
        mode = modes[0]  # as installed, unless only --bytecode source
        print(f"({BYTECODE[mode]})")
        counted = {
            label: instructions([sys.executable, *argv], env_for(mode, None), ROOT) for label, argv in BASELINES.items()
        }
        for which, checkout in checkouts.items():
            for command in [("--help",), ("check-config",)]:
                label = f"{which}: core-jobs {' '.join(command)}"
                counted[label] = instructions([*cli, *command], env_for(mode, checkout), checkout or ROOT)
        reference = counted["python -c 'import pydantic'"]
        for label, count in counted.items():
            print(f"  {label:<{width + 8}} {count / 1e9:7.3f} G  x{count / reference:6.2f}")

    for which, checkout in checkouts.items():
        print(
            f"\nwhere check-config's imports go ({which}, {BYTECODE[modes[0]]};"
            " -X importtime, self time summed per top-level package):"
        )
        for name, seconds, modules in import_profile(env_for(modes[0], checkout), checkout or ROOT, args.top):
            print(f"  {name:<24} {seconds:7.3f} s  {modules:4d} modules")
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
