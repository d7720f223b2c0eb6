"""docs/method.md stays true: its worked example, its tables and its section references.

The worked example (§9) is a sequence of Python blocks, each followed by the
text it prints; they are run here in one namespace and their output must be
exactly what the page shows. The hand-computed ``t_comm(C)`` table, the
paper's SRPM example (§5) and the H/H_rev illustration (§7) are parsed from
the page and recomputed with the planners.
"""

from __future__ import annotations

import contextlib
import io
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from srpm_reference import srpm_table

from dask_rpm.planners import PLANNERS, grid_h, grid_hrev, make_plan, srpm_dp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "method.md"
TEXT = DOC.read_text(encoding="utf-8")


def _section(number: int) -> str:
    """The text of section ``number`` (up to the next ``## `` heading)."""
    m = re.search(rf"^## {number}\. .*?$(.*?)(?=^## |\Z)", TEXT, flags=re.M | re.S)
    assert m, f"docs/method.md has no section {number}"
    return m.group(1)


def _example_pairs() -> list[tuple[str, str]]:
    """(code, printed output) of every python block of §9 with the text block after it."""
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", _section(9), flags=re.M | re.S)
    pairs = []
    for (lang, code), (next_lang, out) in zip(blocks, blocks[1:]):
        if lang == "python":
            assert next_lang == "text", "every python block of §9 is followed by its output"
            pairs.append((code, out))
    return pairs


def test_worked_example_prints_what_the_page_shows():
    pairs = _example_pairs()
    assert len(pairs) >= 4, "§9 lost its example blocks"
    namespace: dict = {"__name__": "method_doc_example"}
    for code, expected in pairs:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, str(DOC), "exec"), namespace)
        assert buf.getvalue() == expected, f"output of\n{code}\nchanged:\n{buf.getvalue()}"


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_t_comm_table_is_the_dp_and_its_arithmetic():
    rows = _table_rows(_section(9), "| C | t(C, 4)")
    n, m, l, s = 203, 80, 26, 1024  # the example's network and samples, stated in §9
    assert "`203-80-26`" in _section(9) and "`s = 1024`" in _section(9)
    res = srpm_dp([1, 2, 3, 4], (n, m, l), s)
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    for row in rows:
        c = int(row[0])
        t, vertical, horizontal, total = (float(v) for v in row[1:])
        assert t == pytest.approx(res.t_vertical[c - 1], abs=5e-3)
        assert vertical == pytest.approx(2 * l * s * res.t_vertical[c - 1], rel=1e-12)
        assert horizontal == 2 * (l + n) * m * (c - 1)
        assert total == pytest.approx(res.t_comm_by_columns[c - 1], rel=1e-12)
        assert total == pytest.approx(vertical + horizontal, rel=1e-12)
    best = min(range(4), key=lambda i: res.t_comm_by_columns[i]) + 1
    assert f"`C = {best}` wins" in _section(9) and res.sizes == (2, 2)


def _backticked_numbers(text: str) -> list[list[float]]:
    return [
        [float(v) for v in re.split(r"\s*,\s*", g)]
        for g in re.findall(r"`(\d+\.\d+(?:,\s*\d+\.\d+)+)`", text)
    ]


def test_paper_example_of_section_5():
    para = _section(5).split("**The paper's example**", 1)[1].split("\n\n", 1)[0]
    abilities, first_row, t_comm = _backticked_numbers(para)
    shape = re.search(r"shape `(\d+-\d+-\d+)`", para).group(1)
    s = int(re.search(r"`s = (\d+)`", para).group(1))
    k = tuple(int(v) for v in re.search(r"`k = \((\d+(?:, \d+)*)\)`", para).group(1).split(", "))
    table = srpm_table(abilities)
    assert np.round(table[1, 1:], 2).tolist() == first_row
    plan = make_plan(abilities, shape, s, "srpm")
    assert list(plan.t_comm_by_columns) == pytest.approx(t_comm, rel=1e-12)
    assert tuple(len(c) for c in plan.columns) == k
    assert f"`C = {len(k)}`" in para


def _ratio(text: str) -> list[Fraction]:
    return [Fraction(v) for v in text.split(" : ")]


def test_baseline_illustration_of_section_7():
    sec = _section(7)
    para = sec[sec.index("The paper's illustration") :].split("\n\n", 1)[0]
    abilities = [float(v) for v in _ratio(re.search(r"`([\d. :]+)` and `N_DP", para).group(1))]
    dp = int(re.search(r"`N_DP = (\d+)`", para).group(1))
    samples_ratio = _ratio(re.search(r"`s1 : s4 = ([\d. :]+)`", para).group(1))
    h_rows = _ratio(re.search(r"hidden units `([\d. :]+)` under H ", para).group(1))
    hrev_rows = _ratio(re.search(r"and `([\d. :]+)`\s+\(P1 : P2 : P3\) under H_rev", para).group(1))
    p = np.asarray(abilities) / sum(abilities)
    for planner, rows in ((grid_h, h_rows), (grid_hrev, hrev_rows)):
        part = planner(p, (10, 60, 3), 700, dp=dp).partition
        assert part.columns == ((0, 1, 2), (3, 4, 5))
        widths = np.asarray(part.widths) / part.widths[0]
        assert widths.tolist() == pytest.approx([float(v) for v in samples_ratio], rel=1e-12)
        for heights in part.heights:
            ratio = np.asarray(heights) / heights[0]
            assert ratio.tolist() == pytest.approx([float(v) for v in rows], rel=1e-12)


def test_every_registered_planner_is_in_the_baselines_table():
    table = _section(7)
    for name in PLANNERS:
        assert f"`{name}`" in table, f"planner {name!r} is registered but not described in §7"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_sections_are_numbered_and_anchored():
    numbers = [int(v) for v in re.findall(r"^## (\d+)\. ", TEXT, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 10
    anchors = re.findall(r'^<a id="([\w-]+)"></a>\n## (\d+)\. ', TEXT, flags=re.M)
    assert [int(n) for _, n in anchors] == numbers, "each numbered section has an anchor above it"
    ids = {a for a, _ in anchors}
    for target in re.findall(r"\]\(#([\w-]+)\)", TEXT):
        assert target in ids, f"link to #{target} has no anchor"
    for ref in re.findall(r"§(\d+)", TEXT):
        assert int(ref) in numbers, f"§{ref} is referenced but does not exist"


def test_links_to_other_pages_resolve():
    for page, anchor in re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", TEXT):
        path = DOC.parent / page
        assert path.is_file(), f"docs/method.md links to missing {page}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page} has no heading #{anchor}"


def test_code_and_docs_cite_existing_sections_of_this_page():
    numbers = {int(v) for v in re.findall(r"^## (\d+)\. ", TEXT, flags=re.M)}
    files = [*(ROOT / "dask_rpm").rglob("*.py"), *(ROOT / "docs").glob("*.md")]
    cited = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"SPEC\s+(section|§)", text), (
            f"{path.relative_to(ROOT)} cites the SPEC, which is not in this repository: "
            f"cite docs/method.md §N instead"
        )
        for ref in re.findall(r"method\.md\s+§(\d+)", text):
            assert int(ref) in numbers, f"{path.relative_to(ROOT)} cites method.md §{ref}"
            cited += 1
    assert cited >= 15, "the code's references to the method description were lost"
