"""The documentation's relative links and anchors lead somewhere.

Checks README.md, ARCHITECTURE.md, edge/README.md and docs/*.md: every relative
link names a file or folder that exists, every #anchor names a heading of its
page (GitHub's anchor rules), every docs page is reachable from the README, and
the README stays a ten-minute read. Standard library only, no network.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "edge" / "README.md",
                *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 400

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HTML_ID = re.compile(r"""<a\s[^>]*(?:name|id)=["']([^"']+)["']""")


def prose_lines(text):
    """The lines outside fenced code blocks."""
    fence = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            yield line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link in a heading anchors on its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page):
    seen, found = {}, set()
    for line in prose_lines(page.read_text(encoding="utf-8")):
        found.update(_HTML_ID.findall(line))
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page):
    for line in prose_lines(page.read_text(encoding="utf-8")):
        line = _CODE_SPAN.sub("", line)   # `[a](b)` in code is not a link
        yield from _LINK.findall(line)
        yield from _REF_DEF.findall(line)


def resolve(page, target):
    """(file, anchor) a relative link points at; None for external links."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
        return None
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_slug_follows_github():
    assert slug("The pure-Python backend (`device=\"python\"`)") == "the-pure-python-backend-devicepython"
    assert slug("What has run where — plainly") == "what-has-run-where--plainly"
    assert slug("Set-up: two commands") == "set-up-two-commands"


def test_the_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n[ok](#title) [bad](#nowhere) [gone](missing.md)\n"
                    "```\n[in code](also-missing.md)\n```\n`[span](x.md)`\n")
    broken = [t for t in links(page) if not _target_ok(page, t)]
    assert broken == ["#nowhere", "missing.md"]


def _target_ok(page, target):
    resolved = resolve(page, target)
    if resolved is None:
        return True
    path, anchor = resolved
    if not path.exists():
        return False
    if anchor:
        return path.suffix == ".md" and anchor in anchors(path)
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page):
    broken = [t for t in links(page) if not _target_ok(page, t)]
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached or page.suffix != ".md" or not page.is_file():
            continue
        reached.add(page)
        for target in links(page):
            resolved = resolve(page, target)
            if resolved is not None:
                todo.append(resolved[0])
    orphans = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in reached]
    assert not orphans, f"docs pages no link reaches from README.md: {orphans}"


def test_readme_is_a_ten_minute_read():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"
