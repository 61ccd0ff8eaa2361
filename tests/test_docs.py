"""The docs against the code: README's configuration reference and reload table say what
``refresher/_config.py`` and ``refresher/ops/_reload.py`` do, the links, paths, commands and
metric names the docs quote exist, and nothing in the project cites a path outside it."""

from __future__ import annotations

import dataclasses
import re
import shlex
import tomllib
import typing
from pathlib import Path

import pytest

from refresher._config import Config, load_config
from refresher.ops._cli import _parser
from refresher.ops._metrics import METRICS, MetricSpec
from refresher.ops._reload import RELOAD, config_keys
from refresher.store._snapshot import SnapshotStatistics

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: a key the block shows commented out, ``# key = example  # why``: unset by default
_COMMENTED = re.compile(r"^# (\w+ = .*)$")


def _config_block() -> str:
    """The TOML block of README's section "Configuration"."""
    section = README.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```toml\n", 1)[1].split("\n```", 1)[0]


def _commented_keys() -> list[str]:
    """The dotted keys the block shows commented out (optional, unset by default)."""
    section, keys = "", []
    for line in _config_block().splitlines():
        if line.startswith("["):
            section = line[1 : line.index("]")]
        elif m := _COMMENTED.match(line):
            keys.append(f"{section}.{m.group(1).partition(' = ')[0]}")
    return keys


def test_the_readme_config_block_names_every_key_the_config_takes_and_no_other() -> None:
    shown = [f"{s}.{k}" for s, table in tomllib.loads(_config_block()).items() for k in table]
    assert sorted(shown + _commented_keys()) == sorted(config_keys())


def test_the_readme_config_block_loads_as_the_defaults(tmp_path: Path) -> None:
    # every key written out holds its default: a copy of the block changes nothing
    (tmp_path / "refresher.toml").write_text(_config_block(), encoding="utf-8")
    loaded = load_config(tmp_path / "refresher.toml", default_file=tmp_path / "none.toml")
    default = Config()
    for key in config_keys():
        section, _, name = key.partition(".")
        got, want = (
            getattr(getattr(loaded, section), name),
            getattr(getattr(default, section), name),
        )
        if isinstance(want, Path):  # relative paths are taken relative to the file
            want = tmp_path / want
        assert (key, got) == (key, want)


def test_a_key_the_readme_config_block_leaves_commented_out_is_unset_by_default() -> None:
    hints = typing.get_type_hints(Config)
    factories = {
        f"{s.name}.{f.name}"
        for s in dataclasses.fields(Config)
        for f in dataclasses.fields(hints[s.name])
        if f.default_factory is not dataclasses.MISSING  # fleet.node_id: the host name
    }
    commented = _commented_keys()
    assert commented, "the block shows its optional keys commented out"
    for key in commented:
        section, _, name = key.partition(".")
        value = getattr(getattr(Config(), section), name)
        assert (key, value is None or key in factories) == (key, True)


def _reload_table() -> dict[str, str]:
    """README's "What a reload changes" table, as dotted key → live or restart."""
    section = README.split("\n### What a reload changes\n", 1)[1].split("\n## ", 1)[0]
    keys_of = {
        s: {k.partition(".")[2] for k in config_keys() if k.startswith(f"{s}.")}
        for s in {k.partition(".")[0] for k in config_keys()}
    }
    out: dict[str, str] = {}
    for row in section.splitlines():
        if not row.startswith("| `["):
            continue
        names, live, restart = (cell.strip() for cell in row.strip("|").split("|"))
        for name in re.findall(r"`\[(\w+)\]`", names):
            named_live = set(re.findall(r"`(\w+)`", live))
            named_restart = set(re.findall(r"`(\w+)`", restart))
            for key in keys_of[name]:
                if live == "all" or key in named_live:
                    out[f"{name}.{key}"] = "live"
                elif restart in ("all", "the rest") or key in named_restart:
                    out[f"{name}.{key}"] = "restart"
    return out


def test_the_readme_reload_table_says_of_every_key_what_reload_does() -> None:
    assert _reload_table() == dict(RELOAD)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped,
    spaces as '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_link_to_a_heading_of_the_readme_finds_it() -> None:
    outside_code = re.sub(r"```.*?```", "", README, flags=re.DOTALL)
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", outside_code, flags=re.MULTILINE)}
    links = set(re.findall(r"\]\(#([^)]+)\)", outside_code))
    assert sorted(links - anchors) == []


def test_every_file_the_readme_links_to_is_in_the_project() -> None:
    targets = set(re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README))
    assert targets, "the pattern finds the README's file links"
    missing = sorted(t for t in targets if not (ROOT / t).exists())
    assert missing == []


#: a path of the project quoted in the docs, e.g. `refresher/store/_views.py`, `bench/`
_PATH = re.compile(
    r"`((?:refresher|policies|tests|bench|analysis|docs|ops|systemd|fuzz)/[^`\s<*]*)`"
)
_DOCS = (
    "README.md",
    "docs/operations.md",
    "docs/model.md",
    "docs/evaluation.md",
    "systemd/README.md",
    "bench/README.md",
    "bench/history.md",
)


def test_every_path_of_the_project_the_docs_quote_exists() -> None:
    quoted = {(doc, p) for doc in _DOCS for p in _PATH.findall((ROOT / doc).read_text("utf-8"))}
    assert len(quoted) > 20, "the pattern finds the docs' paths"
    assert sorted((doc, p) for doc, p in quoted if not (ROOT / p).exists()) == []


def _command_lines(text: str) -> list[str]:
    """The ``refresher …`` command lines of a document's code blocks (continuations joined,
    a prompt or sudo dropped, a ``$(…)`` substitution as one word)."""
    lines, inside = [], False
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        command = re.sub(r"^(\$ |sudo (-u \w+ )?)", "", line.strip())
        # "refresher run: …" is the CLI's error message, not a command
        if inside and re.match(r"refresher [a-z]+( |$)", command):
            lines.append(re.sub(r"\$\([^)]*\)", "X", command))
    return lines


def test_every_refresher_command_the_docs_show_parses(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    shown = [line for doc in _DOCS for line in _command_lines((ROOT / doc).read_text("utf-8"))]
    assert len(shown) > 20, "the docs' command lines are found"
    refused = []
    for line in shown:
        argv = shlex.split(line, comments=True)[1:]
        try:
            parser.parse_args(argv[: argv.index(">")] if ">" in argv else argv)  # a redirect
        except SystemExit:
            refused.append((line, capsys.readouterr().err.strip().splitlines()[-1]))
    assert refused == []


def _metric_names() -> set[str]:
    """The names /metrics serves for the fields METRICS lists and the snapshot's statistics
    (counters with prometheus_client's ``_total``)."""
    specs = [
        (component, key, spec)
        for component, fields in METRICS.items()
        for key, spec in fields.items()
    ] + [
        ("snapshot", f.name, MetricSpec(kind=f.metadata.get("metric", "gauge")))
        for f in dataclasses.fields(SnapshotStatistics)
    ]
    return {
        "refresher_"
        + (spec.name or f"{component}_{key.replace('.', '_')}")
        + ("_total" if spec.kind == "counter" else "")
        for component, key, spec in specs
    }


def test_every_metric_the_docs_name_is_one_the_daemon_serves() -> None:
    served = _metric_names()
    named = {
        (doc, name)
        for doc in _DOCS
        for name in re.findall(
            r"`(refresher_\w+)(?:\{[^`]*\})?(?: \d)?`",
            re.sub(r"```.*?```", "", (ROOT / doc).read_text("utf-8"), flags=re.DOTALL),
        )
        if not name.endswith("_")  # a prefix, as in `refresher_archive_*`
    }
    assert len(named) > 10, "the docs' metric names are found"
    assert sorted((doc, name) for doc, name in named if name not in served) == []


#: a file of the project named anywhere in its text, e.g. tests/crawl/test_robots.py
_FILE = re.compile(
    r"(?<![\w./-])((?:refresher|policies|tests|bench|analysis|docs|ops|systemd|fuzz)/"
    r"[\w/.-]+\.(?:py|md|sql|json|toml|yaml|png|service))"
)


def _project_texts() -> list[Path]:
    """The project's own text: its code, tests, data, docs, unit files and build files."""
    return [ROOT / n for n in ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")] + [
        p
        for folder in (
            "refresher", "policies", "tests", "bench", "analysis", "docs", "fuzz", "systemd"
        )
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".md", ".sql", ".json", ".toml", ".service")
        and p.name != "urltestdata.json"
    ]  # fmt: skip


def test_every_file_of_the_project_its_code_and_docs_name_exists() -> None:
    named = {
        (str(t.relative_to(ROOT)), f)
        for t in _project_texts()
        for f in _FILE.findall(t.read_text("utf-8"))
        if "<" not in f
    }
    assert len(named) > 50, "the pattern finds the files the project names"
    assert sorted((t, f) for t, f in named if not (ROOT / f).exists()) == []


#: what the project must not cite: the design brief and papers it grew from, and the
#: workspace it was built in (split so that this file does not name them itself)
_OUTSIDE = ("DESIGN" + ".md", "../" + "shared", "/" + "work/")


def test_no_file_of_the_project_cites_a_path_outside_it() -> None:
    offenders = sorted(
        (str(t.relative_to(ROOT)), word)
        for t in _project_texts()
        for word in _OUTSIDE
        if word in t.read_text("utf-8")
    )
    assert offenders == []
