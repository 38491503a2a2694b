"""The docs cannot go stale: what they name exists, what they link resolves, what they run plans.

Each check is a function over a list of files that returns its problems as ``file:line: message``
strings, so ``test_checks_catch_a_broken_doc`` can feed each one a scratch page that must fail. The
pages read (``DOC_FILES``) are README.md, every page under docs/ and config/README.md; the config
comments are the ``#`` comments of config/**/*.yaml. CHANGELOG.md is history and may name keys,
flags and pages that are gone: only its links are checked.

How a page names things:

- Code is what sits in a code span (`` `...` ``, also wrapped over lines) or a fenced code block;
  in a config comment, a comment line indented by two spaces or more after its ``#``. A command is
  a code line split at ``&&``, ``||``, ``;`` and ``|``, with backslash continuations joined and
  ``#`` comments and ``$ `` prompts removed; its command word is its first word after ``VAR=value``
  assignments and wrappers (``time``, ``srun``, ``exec``, ``env``, ...).
- A placeholder is a word in capitals (``C``, ``DIR``, ``STAGE``) or one holding ``<``, ``>``,
  ``...``, ``*`` or braces: it stands for something, so nothing about it is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "config" / "README.md"]


def _config_yamls() -> list[Path]:
    return sorted((ROOT / "config").rglob("*.yaml"))


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def test_docs_carry_no_placeholder_for_a_number_still_to_measure() -> None:
    """A doc that waits for a measurement says so in words; a token such as ``X_PLACEHOLDER`` would
    reach users as it is."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "config").glob("*"))]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in docs
        if path.is_file()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"[A-Z]+_PLACEHOLDER|\bTODO\b|\bTBD\b", line)
    ]
    assert not found, found


# ------------------------------------------------------------------------------------ reading pages
@dataclass(frozen=True)
class Text:
    """A piece of a page: ``code`` (a code span or a code block's line) or prose; ``lang`` is the
    code block's language ('' for spans and unmarked blocks)."""

    path: Path
    line: int
    text: str
    code: bool
    lang: str = ""

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"


FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")


def _spans(path: Path, first: int, lines: list[str]) -> Iterator[Text]:
    """The code spans and the prose of one paragraph (CommonMark: a run of n backticks opens a span,
    the next run of exactly n closes it); prose keeps the span's place as spaces."""
    text = "\n".join(lines)
    prose: list[str] = []
    pos = 0
    for run in re.finditer(r"`+", text):
        if run.start() < pos:
            continue
        close = re.compile(rf"(?<!`){run.group()}(?!`)")
        end = close.search(text, run.end())
        if not end:
            continue
        line = first + text.count("\n", 0, run.start())
        yield Text(path, line, " ".join(text[run.end() : end.start()].split()), True)
        prose.append(text[pos : run.start()])
        prose.append(re.sub(r"[^\n]", " ", text[run.start() : end.end()]))
        pos = end.end()
    prose.append(text[pos:])
    for n, line in enumerate("".join(prose).split("\n")):
        yield Text(path, first + n, line, False)


def markdown(path: Path) -> list[Text]:
    """A Markdown page as prose lines, code spans and code-block lines, each with its line number."""
    out: list[Text] = []
    fence: tuple[str, str] | None = None
    para: list[str] = []
    start = 0

    def flush() -> None:
        if para:
            out.extend(_spans(path, start, para))
            para.clear()

    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if fence:
            if re.match(rf"^ {{0,3}}{fence[0][0]}{{{len(fence[0])},}}\s*$", line):
                fence = None
            else:
                out.append(Text(path, n, line, True, fence[1]))
            continue
        opened = FENCE.match(line)
        if opened:
            flush()
            fence = (opened.group(1), opened.group(2).lower())
            continue
        if not line.strip():
            flush()
            continue
        if not para:
            start = n
        para.append(line)
    flush()
    return out


def yaml_comments(path: Path) -> list[Text]:
    """The ``#`` comments of a YAML file: prose and code spans, and (as code) lines indented by two
    spaces or more after the ``#``, which show commands."""
    out: list[Text] = []
    para: list[str] = []
    start = 0
    for n, line in enumerate([*path.read_text().splitlines(), ""], 1):
        found = re.search(r"(?:^|\s)#(.*)$", line)
        body = found.group(1) if found else None
        if body is not None and re.match(r"^ {2,}\S", body):
            out.append(Text(path, n, body.strip(), True, "sh"))
            body = ""
        if body is None or not body.strip():
            if para:
                out.extend(_spans(path, start, para))
                para = []
            continue
        if not para:
            start = n
        para.append(body.strip())
    return out


def texts(files: Iterable[Path]) -> list[Text]:
    out: list[Text] = []
    for path in files:
        out.extend(yaml_comments(path) if path.suffix in (".yaml", ".yml") else markdown(path))
    return out


SHELL = ("", "sh", "bash", "shell", "console", "zsh", "text", "sbatch")
WRAPPERS = {"time", "srun", "exec", "env", "nohup", "sudo", "command", "uv", "run"}


def _is_placeholder(word: str) -> bool:
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_-]*", word)) or any(
        c in word for c in ("<", ">", "...", "*", "{", "}", "…")
    )


def commands(items: Iterable[Text]) -> Iterator[tuple[Text, list[str]]]:
    """Every command in code: (where, its words from the command word on)."""
    items = [t for t in items if t.code and t.lang in SHELL]
    i = 0
    while i < len(items):
        item, line = items[i], items[i].text
        # a code block's backslash continuations (spans are one piece already)
        while line.rstrip().endswith("\\") and i + 1 < len(items) and items[i + 1].path == item.path:
            i += 1
            line = line.rstrip()[:-1] + " " + items[i].text
        i += 1
        line = re.sub(r"^\s*[$>] ", "", line)
        line = re.sub(r"(^|\s)#.*$", "", line)
        for segment in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(segment)
            except ValueError:
                words = segment.split()
            while words and (re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]) or words[0] in WRAPPERS):
                words.pop(0)
            if words:
                yield item, words


# ------------------------------------------------------------------------------- 1. config keys
@cache
def _schema() -> dict[str, Any]:
    from rredcot.settings.config import schema

    return schema()


FILE_SUFFIXES = {
    "md", "yaml", "yml", "json", "jsonl", "csv", "py", "png", "pdf", "html", "txt", "log", "db",
    "pt", "bin", "safetensors", "toml", "sh", "svg", "parquet", "smk", "rst", "tmp", "lock", "ckpt",
}  # fmt: skip
DOTTED = re.compile(r"(?<![\w./$@-])([A-Za-z_]\w*)((?:\.(?:[A-Za-z_]\w*(?:-\w+)*|<[^<>\s]+>|\*))+)(?![\w(/])")


def setting_problem(parts: list[str], node: dict[str, Any] | None = None) -> str | None:
    """Why ``parts`` (a dotted name split at its dots) is not in the settings tree, or None. Below a
    dict-typed setting (``arms``, ``credit_options``, ...) any key is free; ``*`` and ``<name>``
    stand for any key."""
    node = _schema() if node is None else node
    for i, part in enumerate(parts):
        options = [o for o in node.get("anyOf", [node]) if o.get("type") != "null"]
        objects = [o for o in options if "properties" in o or isinstance(o.get("additionalProperties"), dict)]
        if not objects:
            if any(o == {} for o in options):  # typed Any: free below
                return None
            return f"{'.'.join(parts[:i])} has no keys below it"
        if part == "*" or part.startswith("<"):
            if len(objects) == 1 and "properties" in objects[0] and i + 1 < len(parts):
                return None  # any of its keys: what follows is not checked
            node = next((o["additionalProperties"] for o in objects if "additionalProperties" in o), {})
            if not isinstance(node, dict):
                return None
            continue
        found = next((o["properties"][part] for o in objects if part in o.get("properties", {})), None)
        if found is None:
            free = next(
                (
                    o["additionalProperties"]
                    for o in objects
                    if isinstance(o.get("additionalProperties"), dict)
                ),
                None,
            )
            if free is None:
                keys = sorted(next(o for o in objects if "properties" in o)["properties"])
                prefix = ".".join(parts[:i]) or "the top level"
                return f"{prefix} has no key {part!r} (its keys: {', '.join(keys)})"
            found = free
        node = found
    return None


def _is_module(parts: list[str]) -> bool:
    """``a.b.c`` names a module of the package (``rredcot.a.b``, maybe with an attribute after it)."""
    for n in range(len(parts), 0, -1):
        base = ROOT / "src" / "rredcot" / Path(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def key_problems(files: Iterable[Path]) -> list[str]:
    """Every config key a page or a config comment names is in the settings tree.

    A key is a dotted name (``a.b.c``, also ``a.b=value``, ``a.b: value``, ``credit.segmentation.*``,
    ``arms.<name>.credit``) in prose or code, not preceded by a word character, ``.``, ``/`` or ``-``
    (so ``rredcot.stages.data`` and ``results/eval.json`` are not read as keys) and not followed by
    ``(`` or ``/``, whose first part is a top-level key of the settings tree
    (``rredcot.settings.config.schema()``). It is not a key when it is a file name (it ends in a
    file suffix: ``report.md``, ``eval.json``) or a module of the package (``studies.traces`` for
    ``rredcot.studies.traces``). Python code blocks are left out (``model.config`` there is code).
    """
    top = set(_schema()["properties"])
    problems = []
    for item in texts(files):
        if item.lang in ("python", "py", "pycon"):
            continue
        for found in DOTTED.finditer(item.text):
            if found.group(1) not in top:
                continue
            parts = [found.group(1), *found.group(2)[1:].split(".")]
            why = setting_problem(parts)
            if why is None or parts[-1].lower() in FILE_SUFFIXES or _is_module(parts):
                continue
            problems.append(f"{item.where}: config key `{'.'.join(parts)}` is not a setting: {why}")
    return problems


def test_every_config_key_named_exists() -> None:
    files = [*_docs(), *_config_yamls()]
    problems = key_problems(files)
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------- 2. rredcot commands
@dataclass
class Parsed:
    """What ``rredcot COMMAND --help`` builds: its parsers' option strings, positional choices and
    subcommands."""

    options: set[str]
    positionals: int
    choices: list[str]
    subcommands: dict[str, set[str]]
    help_exit: int | str | None
    output: str


@cache
def parsed(command: str) -> Parsed:
    """Run ``rredcot COMMAND --help`` in this process and collect every argparse parser it builds."""
    from rredcot import cli

    made: list[argparse.ArgumentParser] = []
    init = argparse.ArgumentParser.__init__

    def record(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    out = io.StringIO()
    code: int | str | None = None
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
    ):
        mp.setattr(argparse.ArgumentParser, "__init__", record)
        try:
            cli.main([command, "--help"])
        except SystemExit as exc:
            code = exc.code
    subs: dict[str, set[str]] = {}
    children: set[int] = set()
    for parser in made:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    subs[name] = {o for a in sub._actions for o in a.option_strings}
                    children.add(id(sub))
    tops = [p for p in made if id(p) not in children]
    positional = [
        a
        for p in tops
        for a in p._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    return Parsed(
        options={o for p in tops for a in p._actions for o in a.option_strings},
        positionals=len(positional),
        choices=[str(c) for a in positional if a.choices for c in a.choices],
        subcommands=subs,
        help_exit=code,
        output=out.getvalue(),
    )


def _flags(words: list[str]) -> list[str]:
    flags = []
    for word in words:
        word = word.strip("[]()")
        if re.fullmatch(r"--?[A-Za-z][\w-]*(=.*)?", word) and not _is_placeholder(
            word.split("=")[0].lstrip("-")
        ):
            flags.append(word.split("=")[0])
    return flags


def rredcot_problem(words: list[str]) -> str | None:
    """Why ``rredcot WORDS...`` (words after ``rredcot``) names a command or flag that does not exist."""
    from rredcot import cli

    if not words or words[0].startswith("-") or _is_placeholder(words[0]):
        return None
    command = words[0]
    if command not in cli.STAGES:
        return f"`rredcot {command}`: no such command (rredcot --help lists {', '.join(cli.STAGES)})"
    info = parsed(command)
    rest = words[1:]
    options = set(info.options)
    first = rest[0].strip("[]") if rest else ""
    bare = bool(first) and not first.startswith("-") and not _is_placeholder(first)
    if info.subcommands:
        if bare:
            if first not in info.subcommands:
                return (
                    f"`rredcot {command} {first}`: no such subcommand (it has {', '.join(info.subcommands)})"
                )
            options |= info.subcommands[first]
        else:
            options |= {o for sub in info.subcommands.values() for o in sub}
    elif info.choices and bare:
        if first not in info.choices:
            return f"`rredcot {command} {first}`: not one of {', '.join(info.choices)}"
        if first in cli.STAGES:  # rredcot launch train ...: the stage's own options follow
            options |= parsed(first).options
    elif bare and not info.positionals:
        return f"`rredcot {command} {first}`: {command} takes options only, no word {first!r}"
    unknown = [f for f in _flags(rest) if f not in options]
    if unknown:
        named = " ".join(words[: 2 if info.subcommands and bare else 1])
        return f"`rredcot {named}` has no option {', '.join(unknown)}"
    return None


def module_problem(module: str) -> str | None:
    """Why ``python -m MODULE`` (a module of the package) would not run."""
    spec = importlib.util.find_spec(module) if module.split(".")[0] == "rredcot" else None
    if spec is None or spec.origin is None:
        return f"`python -m {module}`: no such module"
    if spec.submodule_search_locations is not None:
        return (
            None
            if importlib.util.find_spec(f"{module}.__main__")
            else f"`python -m {module}`: a package with no __main__"
        )
    if not re.search(r"""__name__\s*==\s*["']__main__["']""", Path(spec.origin).read_text()):
        return f'`python -m {module}`: the module has no `if __name__ == "__main__"` and would do nothing'
    return None


def command_problems(files: Iterable[Path]) -> list[str]:
    """Every ``rredcot COMMAND [SUBCOMMAND] --flag`` in code names a command, subcommand and flags
    that exist: checked against the argparse parsers the command builds (``rredcot COMMAND --help``
    run in this process). ``rredcot launch train ...`` takes launch's options and train's. A command
    that takes options only must not be followed by a bare word. ``python -m rredcot.<module>``
    names a module that runs as a script (``python -m rredcot.cli ...`` is checked as ``rredcot``)."""
    problems = []
    for item, words in commands(texts(files)):
        head = words[0]
        if head in ("python", "python3") or head.endswith(("/python", "/python3")):
            if len(words) < 3 or words[1] != "-m" or not words[2].startswith("rredcot"):
                continue
            if _is_placeholder(words[2]):
                continue
            if words[2] == "rredcot.cli":
                why = rredcot_problem(words[3:])
            else:
                why = module_problem(words[2])
        elif head == "rredcot" or head.endswith("/rredcot"):
            why = rredcot_problem(words[1:])
        else:
            continue
        if why:
            problems.append(f"{item.where}: {why}")
    return problems


def test_every_rredcot_command_and_flag_named_exists() -> None:
    problems = command_problems([*_docs(), *_config_yamls()])
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------ 3. make targets
def make_targets(makefile: Path) -> set[str]:
    """The targets of a Makefile: the names before a rule's ``:`` (not ``:=``; special targets such as
    ``.PHONY`` and names built from variables left out) and .PHONY's list."""
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_./$()-][^:=#\t]*?)\s*::?(?!=)", line)
        if rule and not line.startswith("\t"):
            targets.update(w for w in rule.group(1).split() if "$" not in w and not w.startswith("."))
        phony = re.match(r"^\.PHONY\s*:(.*)", line)
        if phony:
            targets.update(phony.group(1).split())
    return targets


def make_problems(files: Iterable[Path], makefile: Path = ROOT / "Makefile") -> list[str]:
    """Every ``make TARGET`` in code names a target of the Makefile (``VAR=value`` words and options
    such as ``-j 2`` are not targets)."""
    targets = make_targets(makefile)
    problems = []
    for item, words in commands(texts(files)):
        if words[0] != "make":
            continue
        rest = iter(words[1:])
        for word in rest:
            if word in ("-C", "-f", "-j", "-l", "-o", "-W"):
                next(rest, None)
            elif (
                not word.startswith("-")
                and "=" not in word
                and not _is_placeholder(word)
                and word not in targets
            ):
                problems.append(
                    f"{item.where}: `make {word}`: no such target in Makefile ({', '.join(sorted(targets))})"
                )
    return problems


def test_every_make_target_named_exists() -> None:
    problems = make_problems([*_docs(), *_config_yamls()])
    assert not problems, "\n".join(problems)


# -------------------------------------------------------------------------- 4. snakemake targets
@dataclass(frozen=True)
class Plan:
    """One distinct snakemake command line, as the dry run needs it."""

    targets: tuple[str, ...]
    configfiles: tuple[str, ...]
    config: tuple[str, ...]
    profile: str | None


def snakemake_plans(files: Iterable[Path]) -> dict[Plan, list[str]]:
    """Every ``snakemake ...`` command in code, parsed by snakemake's own argument parser (so a target
    that ``--configfile``'s list swallows is read as snakemake reads it) -> where it appears. Left
    out: ``--report``, ``--lint`` and ``--unlock`` runs, commands with a placeholder (``<site>``,
    ``DIR``), and ``--workflow-profile``/``--profile`` folders that are not in the repository (a site's
    copy)."""
    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    plans: dict[Plan, list[str]] = {}
    for item, words in commands(texts(files)):
        if words[0] == "snakemake" or words[0].endswith("/snakemake"):
            args = words[1:]
        elif words[0].startswith("python") and words[1:3] == ["-m", "snakemake"]:
            args = words[3:]
        else:
            continue
        if any(_is_placeholder(w) for w in args if not w.startswith("-")) or any(
            w in ("--report", "--lint", "--unlock") or w.startswith("--report=") for w in args
        ):
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                ns = parser.parse_args(args)
        except SystemExit:
            plans.setdefault(Plan(("<unparsable>", *args), (), (), None), []).append(item.where)
            continue
        profile = ns.workflow_profile or getattr(ns, "profile", None)
        if profile and not (ROOT / str(profile)).is_dir():
            continue
        plan = Plan(
            tuple(sorted(str(t) for t in ns.targets or ())),
            tuple(str(c) for c in ns.configfile or ()),
            tuple(ns.config or ()),
            str(profile) if profile else None,
        )
        plans.setdefault(plan, []).append(item.where)
    return plans


def _results_dir(plan: Plan) -> str:
    from rredcot.settings.config import load_config

    overrides = {}
    for entry in plan.config:
        key, _, value = entry.partition("=")
        overrides[key] = yaml.safe_load(value)
    try:
        return load_config(
            [ROOT / "config" / "config.yaml", *(ROOT / c for c in plan.configfiles)], overrides
        )["results_dir"]
    except Exception:
        return "results"


def dry_run(plan: Plan, results: Path) -> str | None:
    """``snakemake -n`` of the plan in the repository, its results folder moved to ``results`` (its
    targets under the configured results_dir follow); the error's tail, or None."""
    if plan.targets[:1] == ("<unparsable>",):
        return f"snakemake cannot parse: {shlex.join(plan.targets[1:])}"
    prefix = _results_dir(plan).rstrip("/")
    targets = [str(results / t[len(prefix) + 1 :]) if t.startswith(prefix + "/") else t for t in plan.targets]
    cmd = [sys.executable, "-m", "snakemake", "-n", "--nolock", *targets]
    cmd += [*(["--configfile", *plan.configfiles] if plan.configfiles else [])]
    cmd += ["--config", *plan.config, f"results_dir={results}"]
    cmd += ["--workflow-profile", plan.profile] if plan.profile else []
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("MLFLOW_TRACKING_URI", "RREDCOT_INVOCATION"):
        env.pop(name, None)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    lines = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if "profile" not in line]
    tail = "\n    ".join(lines[-8:])
    return f"`snakemake -n` fails (exit {proc.returncode}):\n    {tail}"


def _shown(plan: Plan) -> str:
    shown = ["snakemake", *plan.targets]
    shown += ["--configfile", *plan.configfiles] if plan.configfiles else []
    shown += ["--config", *plan.config] if plan.config else []
    shown += ["--workflow-profile", plan.profile] if plan.profile else []
    return shlex.join(shown)


def plan_problems(plans: dict[Plan, list[str]], results: Path, workers: int = 2) -> list[str]:
    """Dry runs of the plans, two at a time. Plans that differ in their targets only are planned in
    one dry run with all their targets; only when it fails is each planned alone, so that the
    failure names the page and line of the command that fails."""
    groups: dict[tuple[Any, ...], list[Plan]] = {}
    for plan in plans:
        groups.setdefault((plan.configfiles, plan.config, plan.profile, bool(plan.targets)), []).append(plan)

    def one(item: tuple[int, list[Plan]]) -> list[str]:
        n, group = item
        first = group[0]
        merged = Plan(
            tuple(t for p in group for t in p.targets), first.configfiles, first.config, first.profile
        )
        if len(group) > 1 and dry_run(merged, results / f"plan{n}") is None:
            return []
        failed = [(plan, dry_run(plan, results / f"plan{n}-{k}")) for k, plan in enumerate(group)]
        return [f"{', '.join(plans[plan])}: {_shown(plan)}: {why}" for plan, why in failed if why]

    with ThreadPoolExecutor(workers) as pool:
        return [p for found in pool.map(one, enumerate(groups.values())) for p in found]


@pytest.mark.slow
def test_every_snakemake_command_named_plans(tmp_path: Path) -> None:
    """One dry run per distinct command line (targets, config files, --config, profile), two at a
    time, each into its own results folder under tmp_path: nothing under results/ is touched."""
    plans = snakemake_plans([*_docs(), *_config_yamls()])
    started = time.perf_counter()
    problems = plan_problems(plans, tmp_path)
    print(f"{len(plans)} snakemake command lines planned in {time.perf_counter() - started:.1f} s")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- 5. links and anchors
def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, everything but letters, marks, digits,
    ``_``, ``-`` and spaces removed (``σ`` stays, ``·`` and ``|`` go), spaces turned into ``-``."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown page: each heading's slug (the n-th repeat of one gets ``-n``) and
    every explicit ``id``/``name`` of an HTML tag."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fence = None
    for line in path.read_text(errors="replace").splitlines():
        opened = FENCE.match(line)
        if opened and not fence:
            fence = opened.group(1)
            continue
        if fence:
            if re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line):
                fence = None
            continue
        heading = re.match(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
        out.update(re.findall(r"""<[a-zA-Z][^>]*\s(?:id|name)=["']([^"']+)["']""", line))
    return frozenset(out)


@cache
def headings(path: Path) -> frozenset[str]:
    """The slugs of a page's headings without a closing tag in parentheses or brackets: a citation
    ``"Paired methods"`` finds the heading "Paired methods [measured]"."""
    text = path.read_text(errors="replace")
    return frozenset(
        slug(re.sub(r"\s*(\([^()]*\)|\[[^\[\]]*\])\s*$", "", found))
        for found in re.findall(r"^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", text, re.M)
    )


def _target_problem(target: Path, anchor: str | None, shown: str, heading: bool = False) -> str | None:
    if not target.exists():
        return f"{shown}: {_rel(target)} does not exist"
    known = anchors(target) | (headings(target) if heading else frozenset())
    if anchor and target.suffix == ".md" and anchor not in known:
        near = sorted(a for a in anchors(target) if a[:4] == anchor[:4]) or sorted(anchors(target))[:8]
        return (
            f"{shown}: {_rel(target)} has no heading with anchor #{anchor} (some it has: {', '.join(near)})"
        )
    return None


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HREF = re.compile(r"""<(?:a|img)\s[^>]*(?:href|src)=["']([^"']+)["']""")


def link_problems(files: Iterable[Path]) -> list[str]:
    """Every relative Markdown link (inline, reference definition, ``<a href>``, ``<img src>``) outside
    code resolves from the page's folder, and its ``#anchor`` is a heading of the page it points to."""
    problems = []
    for item in texts(files):
        if item.code:
            continue
        targets = [*LINK.findall(item.text), *REFDEF.findall(item.text), *HREF.findall(item.text)]
        for raw in targets:
            if not raw or re.match(r"^[a-z][a-z0-9+.-]*:", raw) or raw.startswith("//"):
                continue  # external (https:, mailto:)
            path, _, anchor = raw.partition("#")
            target = (item.path.parent / path).resolve() if path else item.path
            why = _target_problem(target, anchor or None, f"{item.where}: link ({raw})")
            if why:
                problems.append(why)
    return problems


REFERENCE = re.compile(
    r"(?<![\w./-])(docs/[\w./-]*?\.md)(?:#([\w-]*\w))?(?:,\s*(?:#\s*)?\"([^\"]{1,200})\")?"
)


def reference_problems(files: Iterable[Path]) -> list[str]:
    """Every page cited from the repository's root as ``docs/PAGE.md`` exists, ``docs/PAGE.md#anchor``
    names one of its headings' anchors and ``docs/PAGE.md, "Heading"`` one of its headings (compared
    by anchor, so case and punctuation may differ; a heading may wrap over comment lines)."""
    problems = []
    for path in files:
        text = path.read_text(errors="replace")
        for found in REFERENCE.finditer(text):
            page, anchor, heading = found.groups()
            line = text.count("\n", 0, found.start()) + 1
            shown = f"{_rel(path)}:{line}: {' '.join(found.group(0).split())}"
            if heading:
                heading = " ".join(re.sub(r"\n\s*(#|//)?", " ", heading).split())
                anchor = slug(heading)
            why = _target_problem(ROOT / page, anchor, shown, heading=bool(heading))
            if why:
                problems.append(why)
    return problems


def _reference_files() -> list[Path]:
    """The repository's files (tracked, or new and not ignored) under src/, config/, workflow/,
    examples/ and envs/, with the pages, the Makefile and pyproject.toml."""
    roots = ["src", "config", "workflow", "examples", "envs"]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *roots],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    suffixes = (".py", ".yaml", ".yml", ".md", ".smk", ".rst", ".toml", ".txt", "")
    found = sorted({ROOT / p for p in listed if p and (ROOT / p).is_file() and Path(p).suffix in suffixes})
    return [*_docs(), *found, ROOT / "Makefile", ROOT / "pyproject.toml"]


def test_every_link_and_anchor_resolves() -> None:
    changelog = [ROOT / "CHANGELOG.md"] if (ROOT / "CHANGELOG.md").exists() else []
    problems = link_problems([*_docs(), *changelog]) + reference_problems(_reference_files())
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------ 6. rredcot --help
def help_problems(text: str, dispatched: Iterable[str]) -> list[str]:
    """``rredcot --help`` names exactly the commands ``rredcot`` dispatches: each ``rredcot NAME``
    at the start of a line of the help is one command listed."""
    listed = re.findall(r"^\s*rredcot ([a-z][\w-]*)", text, flags=re.M)
    dispatched = list(dispatched)
    problems = [
        f"rredcot --help lists {name!r}, which rredcot does not dispatch"
        for name in listed
        if name not in dispatched
    ]
    problems += [
        f"rredcot --help leaves out {name!r}, which rredcot dispatches"
        for name in dispatched
        if name not in listed
    ]
    problems += [
        f"rredcot --help lists {name!r} twice" for name in sorted(set(listed)) if listed.count(name) > 1
    ]
    return problems


def test_rredcot_help_lists_exactly_the_commands_it_dispatches() -> None:
    from rredcot import cli

    script = Path(sys.executable).parent / "rredcot"
    proc = subprocess.run(
        [str(script) if script.exists() else "rredcot", "--help"], capture_output=True, text=True, check=True
    )
    assert not help_problems(proc.stdout, cli.STAGES), help_problems(proc.stdout, cli.STAGES)
    failed = {name: parsed(name) for name in cli.STAGES if parsed(name).help_exit not in (0, None)}
    assert not failed, {name: (p.help_exit, p.output[-500:]) for name, p in failed.items()}
    empty = [name for name in cli.STAGES if "usage:" not in parsed(name).output]
    assert not empty, f"`rredcot NAME --help` printed no usage for {empty}"
    synopses = [
        rredcot_problem([name, *command.usage.replace("|", " ").split()])
        for name, command in cli.COMMANDS.items()
    ]
    assert not any(synopses), [p for p in synopses if p]


# --------------------------------------------------------- 7. counts and lists of credit methods
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
NUMBERS = {w: n for n, w in enumerate(WORDS.split())}
COUNT = re.compile(
    r"\b(\d+|" + "|".join(NUMBERS) + r")\s+(registered\s+|built-in\s+)?(credit\s+)?methods\b", re.I
)
CONFIG_FILE = re.compile(r"(?<![\w/.-])config/[\w/.-]+\.yaml\b")


@cache
def credit_methods() -> tuple[str, ...]:
    """The registered credit methods (``rredcot.method.registry.CREDIT_METHODS``), in order."""
    import rredcot.method.sources  # noqa: F401  (registers the built-in methods)
    from rredcot.method.registry import CREDIT_METHODS

    return tuple(CREDIT_METHODS)


@cache
def trained_methods(config: str) -> tuple[str, ...]:
    """The methods a config file trains, layered on the default config: its ``run_arms``, or every
    method under ``arms`` where ``run_arms`` is null."""
    from rredcot.settings.config import load_config

    files = [ROOT / "config" / "config.yaml"]
    files += [ROOT / config] if config != "config/config.yaml" else []
    cfg = load_config(files)
    return tuple(cfg["run_arms"] or cfg["arms"])


@cache
def default_arms() -> tuple[str, ...]:
    """The methods the default config defines under ``arms``."""
    from rredcot.settings.config import load_config

    return tuple(load_config([ROOT / "config" / "config.yaml"])["arms"])


def paragraphs(path: Path) -> Iterator[tuple[int, str]]:
    """The prose paragraphs of a page, code spans kept in their backticks: (first line, text with
    its line breaks). Fenced code blocks and headings are left out; a table row is a paragraph of its
    own. In a YAML file, the paragraphs of its ``#`` comments (a comment line indented by two spaces
    or more after its ``#`` is code)."""
    para: list[str] = []
    start, fence = 0, ""
    yaml_file = path.suffix in (".yaml", ".yml")
    for n, line in enumerate([*path.read_text(errors="replace").splitlines(), ""], 1):
        if yaml_file:
            found = re.search(r"(?:^|\s)#(.*)$", line)
            body = found.group(1) if found and not re.match(r"^ {2,}\S", found.group(1)) else ""
        else:
            opened = FENCE.match(line)
            if fence:
                fence = "" if re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$", line) else fence
                continue
            if opened:
                fence, body = opened.group(1), ""
            else:
                body = "" if re.match(r"^ {0,3}#{1,6}\s", line) else line
        row = body.lstrip().startswith("|")
        if (not body.strip() or row) and para:
            yield start, "\n".join(para)
            para = []
        if row:
            yield n, body
        elif body.strip():
            start = n if not para else start
            para.append(body.strip())


def _sentences(files: Iterable[Path]) -> Iterator[tuple[Text, str, list[str]]]:
    """Every sentence of the pages' paragraphs (:func:`paragraphs`; a table row is one): (where it
    starts, its text with the code spans in their backticks, the spans' texts)."""
    for path in files:
        for first, text in paragraphs(path):
            pos = 0
            for part in re.split(r"(?<=\.)\s+(?=[A-Z(`*\[])", text) if not text.startswith("|") else [text]:
                at = text.index(part, pos)
                pos = at + len(part)
                sentence = " ".join(part.split())
                where = Text(path, first + text.count("\n", 0, at), sentence, False)
                yield where, sentence, re.findall(r"`([^`]+)`", sentence)


def count_problems(files: Iterable[Path]) -> list[str]:
    """Every count of methods a page or config comment states is the code's.

    - "N credit methods", "N registered methods", "N built-in methods": the registry's number.
    - "N methods" in a sentence (or table row) that names exactly one config file
      (``config/testbed.yaml``), or in a config file's own comments where its sentence names no
      other: the number of methods that config trains (its ``run_arms``, layered on the default).
    - "N methods:" followed by a list of method names in code spans: as many names as N.
    - "The built-in (registered) credit methods are `a`, `b`, ...": exactly the registry's names.
    A count in a sentence that names a commit (a hex word of 7 or more characters) or an "earlier"
    recipe is history and left alone."""
    registry = credit_methods()
    problems = []
    for path in files:
        for item, sentence, spans in _sentences([path]):
            named = {c for c in CONFIG_FILE.findall(sentence) if (ROOT / c).is_file()}
            if path.suffix == ".yaml" and not named and path.is_relative_to(ROOT / "config"):
                named = {_rel(path)}
            history = re.search(r"\b[0-9a-f]{7,40}\b|\bearlier\b|\bbefore\b", sentence)
            for found in COUNT.finditer(sentence):
                word = found.group(1).lower()
                n = int(word) if word.isdigit() else NUMBERS[word]
                if history:
                    continue
                if found.group(2) or found.group(3):
                    if n != len(registry):
                        problems.append(
                            f"{item.where}: '{found.group(0)}': the registry has {len(registry)} credit "
                            f"methods ({', '.join(registry)})"
                        )
                    continue
                rest = sentence[found.end() :]
                if rest.startswith(":"):
                    names = re.findall(r"`([^`]+)`", rest)
                    arms = set(default_arms())
                    listed = [name for name in names if name in arms or name in registry]
                    if listed and len(listed) != n:
                        problems.append(
                            f"{item.where}: '{found.group(0)}:' lists {len(listed)}: {', '.join(listed)}"
                        )
                        continue
                if len(named) == 1:
                    (config,) = named
                    trains = trained_methods(config)
                    if n != len(trains):
                        problems.append(
                            f"{item.where}: '{found.group(0)}': {config} trains {len(trains)} "
                            f"({', '.join(trains)})"
                        )
            if re.search(r"\b(built-in|registered) credit methods (are|is)\b", sentence):
                names = [s for s in spans if re.fullmatch(r"[a-z][a-z0-9_+]*", s)]
                missing = [m for m in registry if m not in names]
                unknown = [m for m in names if m not in registry]
                if missing or unknown:
                    problems.append(
                        f"{item.where}: the list of credit methods leaves out {', '.join(missing) or '-'}"
                        f" and names unregistered {', '.join(unknown) or '-'} (the registry: "
                        f"{', '.join(registry)})"
                    )
    return problems


def method_table_problems(files: Iterable[Path]) -> list[str]:
    """A Markdown table whose first column is headed `` `credit` `` or "credit method" lists every
    registered credit method once and nothing else in that column."""
    registry = credit_methods()
    problems = []
    for path in files:
        if path.suffix != ".md":
            continue
        rows: list[tuple[int, list[str]]] = []
        lines = [*path.read_text(errors="replace").splitlines(), ""]
        for n, line in enumerate(lines, 1):
            if line.lstrip().startswith("|"):
                rows.append((n, [c.strip() for c in line.strip().strip("|").split("|")]))
                continue
            if rows and rows[0][1][0].strip("`").lower() in ("credit", "credit method"):
                names = [m.group(1) for _, cells in rows[2:] if (m := re.fullmatch(r"`([^`]+)`", cells[0]))]
                missing = [m for m in registry if m not in names]
                unknown = [m for m in names if m not in registry]
                if missing or unknown:
                    problems.append(
                        f"{_rel(path)}:{rows[0][0]}: the table of credit methods leaves out "
                        f"{', '.join(missing) or '-'} and lists unregistered {', '.join(unknown) or '-'}"
                    )
            rows = []
    return problems


def test_every_count_and_list_of_methods_is_the_codes() -> None:
    files = [*_docs(), *_config_yamls()]
    problems = count_problems(files) + method_table_problems(files)
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------- 8. rules and the DAG
def rules(folder: Path = ROOT / "workflow") -> set[str]:
    """The workflow's rules: every ``rule NAME:`` of the Snakefile and workflow/rules/*.smk (also
    one indented under an ``if``)."""
    found: set[str] = set()
    for smk in [folder / "Snakefile", *sorted((folder / "rules").glob("*.smk"))]:
        found.update(re.findall(r"^\s*rule\s+(\w+)\s*:", smk.read_text(), flags=re.M))
    return found


ARROW = re.compile(r"─+►")


def dag_edges(path: Path) -> list[tuple[int, str, str]]:
    """The edges a page draws between rules in its diagrams (code blocks with ``─►``): on each line,
    each node and the next one that is a rule, skipping files between them (``clean ─► rl.clean.jsonl
    ─► train`` draws clean → train). A node is a name, ``name[wildcards]``, or a comma-separated
    list of names (``report, tables ─► claims``: both draw an edge)."""
    known = rules()
    edges = []
    for item in markdown(path):
        if not (item.code and ARROW.search(item.text)):
            continue
        text = re.sub(r"\[[^\]]*\]", "", item.text)
        nodes = [
            re.split(r",\s*", re.sub(r"^[\s─┬┴├└┐┘┤│]+|[\s─┬┴├└┐┘┤│]+$", "", n)) for n in ARROW.split(text)
        ]
        previous: list[str] = []
        for node in nodes:
            names = [n for n in node if n in known]
            if names:
                edges += [(item.line, a, b) for a in previous for b in names]
                previous = names
            elif not any(n.strip() for n in node):
                previous = []
    return edges


@cache
def rule_graph() -> frozenset[tuple[str, str]]:
    """The edges (producer, consumer) of ``snakemake --rulegraph all`` under the default config."""
    with_results = f"results_dir={ROOT / '.snakemake' / 'rulegraph-results'}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--rulegraph", "--nolock", "--config", with_results, "--", "all"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    label = dict(re.findall(r'^\s*(\d+)\[label = "(\w+)"', proc.stdout, flags=re.M))
    return frozenset((label[a], label[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", proc.stdout, re.M))


def rule_problems(files: Iterable[Path], graph: frozenset[tuple[str, str]] | None = None) -> list[str]:
    """What the pages say of the workflow's rules is what workflow/ defines.

    - A name in the first column of a table headed "rule" (each of a comma-separated list), and a
      code span right before the word "rule" or after "rule"/"rules" (the `` `train` `` rule,
      rules `` `sft` ``, `` `train` ``), is a rule.
    - docs/pipeline.md's table of rules (its "Rules" section) lists every rule but ``all``.
    - Every edge a diagram draws between two rules is an edge of the default config's rule graph
      (``snakemake --rulegraph``): the second rule reads a file the first writes."""
    known = rules()
    problems = []
    for path in files:
        table: list[str] | None = None
        tabled: set[str] = set()
        section, start = "", 0
        for n, line in enumerate([*path.read_text(errors="replace").splitlines(), ""], 1):
            if line.startswith("#"):
                section = line.lstrip("#").strip()
            if not line.lstrip().startswith("|"):
                if table and table[0].lower() == "rule" and section == "Rules":
                    missing = sorted(known - tabled - {"all"})
                    if missing:
                        problems.append(
                            f"{_rel(path)}:{start}: the table of rules leaves out {', '.join(missing)}"
                        )
                table, tabled = None, set()
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if table is None:
                table, start = cells, n
                continue
            if table[0].lower() != "rule" or set(cells[0]) <= set("-: "):
                continue
            for name in re.findall(r"`([^`]+)`", cells[0]):
                tabled.add(name)
                if name not in known and name != "default-resources":  # the profile's defaults
                    problems.append(f"{_rel(path)}:{n}: `{name}` in a table of rules is no rule of workflow/")
    for path in files:
        text = path.read_text(errors="replace")
        for found in re.finditer(r"`(\w+)` rule\b|\brules? `(\w+)`((?:,? (?:and )?`\w+`)*)", text):
            names = (
                [found.group(1)]
                if found.group(1)
                else [found.group(2), *re.findall(r"`(\w+)`", found.group(3))]
            )
            line = text.count("\n", 0, found.start()) + 1
            problems += [
                f"{_rel(path)}:{line}: `{name}` is called a rule, and workflow/ has no rule {name}"
                for name in names
                if name not in known
            ]
        if path.suffix == ".md" and ARROW.search(text):
            edges = dag_edges(path)
            if edges:
                graph = rule_graph() if graph is None else graph
                problems += [
                    f"{_rel(path)}:{line}: the diagram draws {a} ─► {b}; the rule graph has no such edge "
                    f"({b} reads nothing {a} writes)"
                    for line, a, b in edges
                    if (a, b) not in graph
                ]
    return problems


def test_every_rule_named_and_edge_drawn_exists() -> None:
    problems = rule_problems(_docs())
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------- 9. what changing a setting reruns
def _computes(stage: str, key: str) -> bool:
    """Whether ``stage`` computes with the setting ``key`` (``rredcot.settings.reads.READS``): a key
    it declares is ``key`` or a section above or below it, and no ``runs`` key takes it out. The
    train stage's credit settings count as the ``credit`` section."""
    from rredcot.settings.reads import CREDIT_OF_ARM, READS

    reads = READS[stage]
    declared = [*reads.computes, *(k for keys in reads.variants.values() for k in keys)]
    declared = ["credit" if k == CREDIT_OF_ARM else k.replace(".{arm}", "") for k in declared]

    def covers(a: str, b: str) -> bool:
        return a == b or b.startswith(a + ".")

    if any(covers(r, key) for r in reads.runs):
        return False
    return any(covers(k, key) or covers(key, k) for k in declared)


RERUNS = re.compile(r"[Cc]hanging ((?:`[\w.]+`(?:,? (?:or |and )?)?)+) reruns? ((?:(?!\bchanging\b)[^.;])*)")


def reruns_problems(files: Iterable[Path]) -> list[str]:
    """A sentence "Changing `KEY` reruns `stage`, `stage` ..." names stages that compute with the key, and
    "changing `KEY` reruns nothing" a key no stage computes with (``rredcot.settings.reads``)."""
    from rredcot.settings.reads import READS

    problems = []
    for item, sentence, _ in _sentences(files):
        for found in RERUNS.finditer(sentence):
            keys = re.findall(r"`([\w.]+)`", found.group(1))
            if found.group(2).startswith("nothing"):
                problems += [
                    f"{item.where}: changing `{key}` reruns nothing, but {stage} computes with it"
                    for key in keys
                    for stage in READS
                    if _computes(stage, key)
                ]
                continue
            stages = [s for s in re.findall(r"`(\w+)`", found.group(2)) if s in READS]
            problems += [
                f"{item.where}: changing `{key}` reruns `{stage}`, which does not compute with it"
                for key in keys
                for stage in stages
                if not _computes(stage, key)
            ]
    return problems


def test_what_a_changed_setting_reruns_is_what_the_stages_read() -> None:
    problems = reruns_problems(_docs())
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------- 10. claims of what is tested
TEST_FILE = re.compile(r"(?<![\w/.-])(tests/[\w/]+\.py)(?:::(\w+))?")
TEST_NAME = re.compile(r"(?<![\w/.-])(?:::)?(test_\w+)\b(?!\.py)")
BARE_TEST_FILE = re.compile(r"(?<![\w/.-])(test_\w+\.py)\b")
TESTED = re.compile(
    r"\b(is|are|gets|get|was|were) tested\b|\btests? cover|\bthe tests? (runs?|checks?|shows?)\b|"
    r"\bchecked by\b|\btested (in|by|on)\b|\bthe tests check\b",
    re.I,
)
# "what is tested where", "how the tests run ...": a pointer, not a claim.
ASKED = re.compile(r"\b(what|how)\b(\W+\w+){0,3}\W*$", re.I)
UNTESTED = re.compile(r"\bnot (tested|covered|checked)|\buntested\b|\bnever\b|\bno test\b", re.I)
# What runs the tests besides pytest: CI and its scripts.
TEST_RUNNERS = (".ci/run", "scripts/check-library", "scripts/test-other-arch", "make test", "snakemake -n")


@cache
def functions_of_tests() -> dict[str, frozenset[str]]:
    """Every test module under tests/ -> the names of its functions (tests and helpers)."""
    return {
        _rel(path): frozenset(re.findall(r"^\s*(?:async\s+)?def\s+(\w+)", path.read_text(), flags=re.M))
        for path in sorted((ROOT / "tests").rglob("*.py"))
    }


def claimed_test_problems(files: Iterable[Path]) -> list[str]:
    """Every test a page names exists, and every claim that something is tested names the test.

    - ``tests/test_x.py`` is a file; ``tests/test_x.py::test_name`` a function of it, and a bare
      ``::test_name`` or ``test_name`` after it on the same line a function of the same file; a
      ``test_name`` alone a function of some test module.
    - A sentence that says something "is tested", "tests cover", "the tests run", "checked by" ...
      (and not "not tested", "untested", "never") names a test module or function, CI or one of
      its scripts (``.ci/run``, ``scripts/check-library``, ...), or links to a section whose
      anchor says what is tested (``#what-is-tested-where``, ``#what-the-tests-cover``)."""
    functions = functions_of_tests()
    every = frozenset().union(*functions.values())
    problems = []
    for item, sentence, _ in _sentences(files):
        last = None
        for found in re.finditer(rf"{TEST_FILE.pattern}|{TEST_NAME.pattern}", sentence):
            module, function, name = found.group(1), found.group(2), found.group(3)
            if module:
                last = module
                if module not in functions and not (ROOT / module).is_file():
                    problems.append(f"{item.where}: {module} does not exist")
                elif function and function not in functions.get(module, ()):
                    problems.append(f"{item.where}: {module} has no {function}")
                continue
            if _is_placeholder(name) or name.endswith("_"):
                continue
            scope = functions.get(last, every) if found.group(0).startswith("::") or last else every
            if name not in scope and name not in every:
                problems.append(f"{item.where}: no test function {name} in tests/")
            elif name not in scope:
                problems.append(f"{item.where}: {last} has no {name}")
        for found in BARE_TEST_FILE.finditer(sentence):
            if not any(module.endswith(f"/{found.group(1)}") for module in functions):
                problems.append(f"{item.where}: no test module {found.group(1)} in tests/")
        claim = next((c for c in TESTED.finditer(sentence) if not ASKED.search(sentence[: c.start()])), None)
        if claim and not UNTESTED.search(sentence):
            names_a_test = (
                TEST_FILE.search(sentence)
                or BARE_TEST_FILE.search(sentence)
                or TEST_NAME.search(sentence)
                or any(runner in sentence for runner in TEST_RUNNERS)
                or re.search(r"\bCI\b", sentence)
                or re.search(r"#what-(is-tested|the-tests)", sentence)
            )
            if not names_a_test:
                problems.append(
                    f"{item.where}: a claim that something is tested names no test: {sentence.strip()[:160]}"
                )
    return problems


def test_every_test_named_exists_and_every_tested_claim_names_one() -> None:
    problems = claimed_test_problems([*_docs(), *_config_yamls()])
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------- each check fails once
BROKEN = """# A page

## Running it

Set `credit.keywordz` or `rl.gpu.use_vllmm=true`; `arms.mine.credit` and `credit.segmentation.*` exist.

```bash
rredcot train --config config/config.yaml --armz grpo
rredcot report table --config C
rredcot frobnicate --out x
python -m rredcot.stages.nope
make setup VLLM=gpu && make deploy
snakemake --cores all results/no-such-output.csv
```

See [the method](missing.md), [this page](#no-such-heading) and [running](#running-it).
The default is in docs/nope.md, and docs/results.md, "No such heading".
"""


def test_checks_catch_a_broken_doc(tmp_path: Path) -> None:
    """Each check, fed a page that breaks it, fails naming the page and line of what it broke."""
    page = tmp_path / "broken.md"
    page.write_text(BROKEN)
    files = [page]

    keys = key_problems(files)
    assert [p.split(": config key ")[0] for p in keys] == [f"{page}:5", f"{page}:5"], keys
    assert "credit has no key 'keywordz'" in keys[0] and "rl.gpu has no key 'use_vllmm'" in keys[1], keys

    cmds = command_problems(files)
    assert len(cmds) == 4, cmds
    assert cmds[0].startswith(f"{page}:8: `rredcot train` has no option --armz"), cmds
    assert cmds[1].startswith(f"{page}:9: `rredcot report table`: report takes options only"), cmds
    assert cmds[2].startswith(f"{page}:10: `rredcot frobnicate`: no such command"), cmds
    assert cmds[3].startswith(f"{page}:11: `python -m rredcot.stages.nope`: no such module"), cmds

    make = make_problems(files)
    assert len(make) == 1 and make[0].startswith(f"{page}:12: `make deploy`: no such target"), make

    plans = snakemake_plans(files)
    assert list(plans.values()) == [[f"{page}:13"]], plans
    planned = plan_problems(plans, tmp_path / "results")
    assert len(planned) == 1 and planned[0].startswith(f"{page}:13: snakemake results/no-such-output.csv"), (
        planned
    )
    assert "MissingRuleException" in planned[0] or "No rule to produce" in planned[0], planned

    links = link_problems(files) + reference_problems(files)
    assert len(links) == 4, links
    assert links[0].startswith(f"{page}:16: link (missing.md):") and "does not exist" in links[0], links
    assert links[1].startswith(f"{page}:16: link (#no-such-heading):") and "no heading" in links[1], links
    assert links[2].startswith(f"{page}:17: docs/nope.md") and "does not exist" in links[2], links
    assert links[3].startswith(f'{page}:17: docs/results.md, "No such heading"'), links

    helped = help_problems("  rredcot data --config C\n  rredcot ghost --x\n", ["data", "train"])
    assert helped == [
        "rredcot --help lists 'ghost', which rredcot does not dispatch",
        "rredcot --help leaves out 'train', which rredcot dispatches",
    ], helped


BROKEN_COUNTS = """# A page

The recipe (`config/testbed.yaml`) trains five methods. The registry holds four credit methods.
The default trains three methods: `grpo` and `rredcot`.

The built-in credit methods are `uniform`, `rredcot` and `frobnicate`.

| `credit` | what |
|---|---|
| `uniform` | GRPO |

## Rules

| rule | command |
|---|---|
| `data` | `rredcot data` |
| `nope` | `rredcot nope` |

```
data ─► sft ─► models/sft
report, figures ─► tables ─► table2.csv
```

The `ghost` rule runs last. So changing `rl.max_steps` reruns nothing, and changing
`prompt.exit_string` reruns `report`.

The cleaner is tested on every kind of label noise. It is checked by `tests/test_nope.py` and
`tests/test_credit.py::test_no_such_test`.
"""


def test_count_rule_reads_and_test_checks_catch_a_broken_doc(tmp_path: Path) -> None:
    """Each of checks 7-10, fed a page that breaks it, fails naming the page and line."""
    page = tmp_path / "broken.md"
    page.write_text(BROKEN_COUNTS)
    files = [page]

    counts = count_problems(files) + method_table_problems(files)
    assert [p.split(": ")[0] for p in counts] == [f"{page}:{n}" for n in (3, 3, 4, 6, 8)], counts
    assert "config/testbed.yaml trains 7" in counts[0] and "the registry has 9" in counts[1], counts
    assert "'three methods:' lists 2" in counts[2], counts
    assert "leaves out entropy" in counts[3] and "unregistered frobnicate" in counts[3], counts
    assert "the table of credit methods leaves out entropy" in counts[4], counts

    graph = frozenset({("data", "sft"), ("train", "tables")})
    found = rule_problems(files, graph)
    assert [p.split(": ")[0] for p in found] == [f"{page}:17", f"{page}:14", f"{page}:24", f"{page}:21"], (
        found
    )
    assert "`nope` in a table of rules" in found[0] and "leaves out" in found[1] and "clean" in found[1], (
        found
    )
    assert "no rule ghost" in found[2] and "draws report ─► tables" in found[3], found

    reruns = reruns_problems(files)
    assert len(reruns) == 3 and all(p.startswith(f"{page}:24") for p in reruns), reruns
    assert "`rl.max_steps` reruns nothing, but train computes with it" in reruns[0], reruns
    assert reruns[-1].endswith(
        "changing `prompt.exit_string` reruns `report`, which does not compute with it"
    )

    tested = claimed_test_problems(files)
    assert [p.split(": ")[0] for p in tested] == [f"{page}:27", f"{page}:27", f"{page}:27"], tested
    assert "names no test" in tested[0] and "tests/test_nope.py does not exist" in tested[1], tested
    assert "tests/test_credit.py has no test_no_such_test" in tested[2], tested


def test_slug_follows_github() -> None:
    assert slug("From a trace to σ") == "from-a-trace-to-σ"
    assert slug("σ·|o| per token: `credit.budget`") == "σo-per-token-creditbudget"
    assert slug("The default's time budget (2-core)") == "the-defaults-time-budget-2-core"
    assert slug("[Linked](x.md) heading_with_underscore") == "linked-heading_with_underscore"
