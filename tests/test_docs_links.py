"""The front page and docs/ hold together: every relative link resolves (file and heading anchor), every
command in README.md's command table is a real CLI command, and README.md stays a front page."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _text(path: Path) -> str:
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"[`*]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", _text(path), re.M)}


def links(path: Path) -> list[tuple[str, str]]:
    out = []
    for target in LINK.findall(_text(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        out.append((file, anchor))
    return out


def broken_links(path: Path) -> list[str]:
    bad = []
    for file, anchor in links(path):
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.relative_to(ROOT)}: {file} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.relative_to(ROOT)}: #{anchor} is no heading of {dest.relative_to(ROOT)}")
    return bad


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Top\n\n[ok](a.md#top) [gone](missing.md) [bad](a.md#nowhere)\n")
    bad = broken_links_in(tmp_path / "a.md")
    assert len(bad) == 2 and "missing.md" in bad[0] and "#nowhere" in bad[1]


def broken_links_in(path: Path) -> list[str]:
    global ROOT
    saved, ROOT = ROOT, path.parent
    try:
        return broken_links(path)
    finally:
        ROOT = saved


def table_commands(readme: str) -> list[list[str]]:
    """The commands of README.md's CLI table: rows whose first cell is `autoresearch WORDS ...`."""
    out = []
    for m in re.finditer(r'^\|\s*`autoresearch ([a-z][a-z\- ]*?)(?:\s+[-A-Z\[<."].*?)?`', readme, re.M):
        out.append(m.group(1).split())
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_text_names_an_issue_number(path: Path) -> None:
    assert not [l for l in path.read_text(encoding="utf-8").splitlines()
                if re.search(r"\bissues?\s*#?\d+|\(#\d+\)", l, re.I)]


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    first = [l.strip() for l in lines if l.strip().startswith("make ")][:2]
    assert [f.split()[1] for f in first] == ["run", "test"]


def test_every_command_in_the_readme_table_exists() -> None:
    from autoresearch_dagster.cli import build_parser

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = table_commands(readme)
    rows = [l for l in readme.splitlines() if l.startswith("| `autoresearch")]
    assert len(commands) == len(rows) >= 10  # every command row was read
    parser = build_parser()
    top = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(top.choices) <= {w[0] for w in commands}, "a CLI command is missing from README's table"
    for words in commands:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([*words, "--help"])
        assert done.value.code == 0, words


def test_an_unknown_command_fails_the_check() -> None:
    from autoresearch_dagster.cli import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["no-such-command", "--help"])
    assert done.value.code != 0
