"""The command line: dask-rpm plan, its errors, and dask rpm forwarding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from dask_rpm import cli
from dask_rpm.cli import build_parser, draw_plan, main, register_parser
from dask_rpm.planners import make_plan

EX = ["--abilities", "0.05,0.10,0.20,0.30,0.35", "--shape", "203-80-26", "--samples", "1024"]


def _run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ output
def test_plan_json_worked_example(capsys):
    code, out, err = _run(["plan", *EX, "--json"], capsys)
    assert code == 0 and err == ""
    d = json.loads(out)
    assert d["method"] == "srpm"
    assert d["columns"] == [[0, 1, 2], [3, 4]]
    assert d["t_comm"] == pytest.approx(73913.6)
    assert d["t_comm_by_columns"] == pytest.approx([212992.0, 73913.6, 99904.0, 117907.2, 146560.0])
    assert d["excluded"] == [] and isinstance(d["notes"], list)
    assert d["imbalance"] >= 1.0
    rects = {r["worker"]: r for r in d["rectangles"]}
    assert rects[0]["samples"] == [0, 358] and rects[0]["hidden"] == [0, 11]
    assert rects[4]["samples"] == [358, 1024] and rects[4]["hidden"] == [34, 80]
    assert (
        sum(
            (r["samples"][1] - r["samples"][0]) * (r["hidden"][1] - r["hidden"][0])
            for r in rects.values()
        )
        == 1024 * 80
    )


def test_plan_json_columns_follow_command_line_order(capsys):
    code, out, _ = _run(
        [
            "plan",
            "--abilities",
            "0.30,0.05,0.35,0.20,0.10",
            "--shape",
            "203-80-26",
            "--samples",
            "1024",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    assert json.loads(out)["columns"] == [[1, 4, 3], [0, 2]]


def test_plan_json_baseline_has_no_t_comm_by_columns(capsys):
    code, out, _ = _run(
        [
            "plan",
            "--abilities",
            "1,1.5,2,2.5,3,3.5",
            "--shape",
            "10-60-3",
            "--samples",
            "700",
            "--method",
            "grid-hrev",
            "--dp",
            "2",
            "--json",
        ],
        capsys,
    )
    d = json.loads(out)
    assert code == 0 and d["method"] == "grid-hrev" and "t_comm_by_columns" not in d
    assert d["columns"] == [[0, 1, 2], [3, 4, 5]]
    assert d["rectangles"][0]["samples"] == [0, 200]


def test_plan_human_report(capsys):
    code, out, err = _run(["plan", *EX], capsys)
    assert code == 0 and err == ""
    assert "column 1: samples [0, 358) (358), workers P1 P2 P3" in out
    assert "column 2: samples [358, 1024) (666), workers P4 P5" in out
    assert "t_comm (model, elements): 73913.6" in out
    assert "C=2: 73913.6 *" in out
    assert "predicted imbalance:" in out
    drawing = [ln for ln in out.splitlines() if ln.startswith(("+", "|"))]
    assert drawing[0].startswith("+---") and drawing[-1].startswith("+---")
    for label in ("P1", "P2", "P3", "P4", "P5"):
        assert any(f" {label} " in ln for ln in drawing), label


def test_drawing_is_to_scale():
    plan = make_plan([1, 3], (4, 10, 2), 400, "srpm", dp=2)  # widths 100 : 300
    text = draw_plan(plan, width=40, height=8)
    rows = text.splitlines()[1:]
    top = rows[0]
    assert top.startswith("+") and top.count("+") == 3
    inner = top.index("+", 1)
    assert inner == 10  # 100/400 of 40 characters
    assert "P1" in text and "P2" in text


def test_drawing_lists_rectangles_too_thin_to_label():
    plan = make_plan([1, 1, 1, 30], (4, 40, 2), 400, "srpm", dp=1, small_group=0)
    text = draw_plan(plan, width=20, height=8)
    assert "too thin to label" in text


def test_drawing_omitted_for_huge_plans():
    plan = make_plan([1.0] * 50, (4, 100, 2), 1000, "uniform", dp=50)
    assert "drawing omitted" in draw_plan(plan, width=64)


def test_abilities_file_lines_and_json(tmp_path, capsys):
    lines = tmp_path / "p.txt"
    lines.write_text("# speeds\n0.05\n0.10\n\n0.20\n0.30\n0.35\n")
    js = tmp_path / "p.json"
    js.write_text("[0.05, 0.10, 0.20, 0.30, 0.35]")
    rest = ["--shape", "203-80-26", "--samples", "1024", "--json"]
    outs = []
    for f in (lines, js):
        code, out, _ = _run(["plan", "--abilities-file", str(f), *rest], capsys)
        assert code == 0
        outs.append(json.loads(out))
    assert outs[0] == outs[1]
    assert outs[0]["columns"] == [[0, 1, 2], [3, 4]]


def test_small_group_option(capsys):
    _, out0, _ = _run(["plan", *EX, "--small-group", "0", "--json"], capsys)
    _, out6, _ = _run(["plan", *EX, "--small-group", "0.06", "--json"], capsys)
    h0 = {r["worker"]: r["hidden"] for r in json.loads(out0)["rectangles"]}
    h6 = {r["worker"]: r["hidden"] for r in json.loads(out6)["rectangles"]}
    assert h0[3] != h0[2][::-1] and h6[3] == [0, 34] and h0[3] == [0, 37]


def test_help_has_examples(capsys):
    code, out, _ = _run(["plan", "--help"], capsys)
    assert code == 0
    assert "examples:" in out and "dask-rpm plan --abilities 0.05,0.10,0.20,0.30,0.35" in out
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "plan" in out


def test_no_command_is_an_error(capsys):
    code, out, err = _run([], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "choose a command: " in err
    listed = err.split("choose a command: ")[1].split(" (")[0].split(", ")
    assert {"plan", "train", "probe"} <= set(listed) and listed == sorted(listed)


# ------------------------------------------------------------- bad input
BAD = [
    (["--abilities", "", "--shape", "203-80-26", "--samples", "1024"], "--abilities is empty"),
    (
        ["--abilities", "1,-2", "--shape", "203-80-26", "--samples", "1024"],
        "ability #2 (P2) is -2.0",
    ),
    (
        ["--abilities", "-1,2", "--shape", "203-80-26", "--samples", "1024"],
        "ability #1 (P1) is -1.0",
    ),
    (["--abilities", "1,0", "--shape", "203-80-26", "--samples", "1024"], "ability #2 (P2) is 0"),
    (
        ["--abilities", "1,nan", "--shape", "203-80-26", "--samples", "1024"],
        "ability #2 (P2) is nan",
    ),
    (
        ["--abilities", "1,inf", "--shape", "203-80-26", "--samples", "1024"],
        "ability #2 (P2) is inf",
    ),
    (["--abilities", "1,fast", "--shape", "203-80-26", "--samples", "1024"], "ability #2 'fast'"),
    (
        ["--abilities", "1,2", "--shape", "203-80", "--samples", "1024"],
        "shape must be positive integers inputs-hidden-...-outputs",
    ),
    (["--abilities", "1,2", "--shape", "203-x-26", "--samples", "1024"], "m='x'"),
    (
        ["--abilities", "1,2", "--shape", "203-80-26", "--samples", "many"],
        "--samples='many' is not a whole number",
    ),
    (
        ["--abilities", "1,2,3,4", "--shape", "203-80-26", "--samples", "1", "--dp", "2"],
        "samples=1 is fewer than the dp=2 columns",
    ),
    (
        [
            "--abilities",
            "1,2,3,4",
            "--shape",
            "203-2-26",
            "--samples",
            "100",
            "--dp",
            "1",
            "--method",
            "uniform",
        ],
        "dp=1 puts 4 workers in a column but the network has only m=2 hidden units",
    ),
    (
        [
            "--abilities",
            "1,2,3",
            "--shape",
            "203-80-26",
            "--samples",
            "100",
            "--dp",
            "2",
            "--method",
            "grid-h",
        ],
        "dp=2 does not divide the 3 workers",
    ),
    (
        [
            "--abilities-file",
            "/nonexistent/speeds.txt",
            "--shape",
            "203-80-26",
            "--samples",
            "1024",
        ],
        "abilities file '/nonexistent/speeds.txt' not found",
    ),
    (
        ["--abilities", "1,2", "--shape", "203-80-26", "--samples", "10", "--method", "best"],
        "invalid choice: 'best'",
    ),
    (
        ["--shape", "203-80-26", "--samples", "10"],
        "one of the arguments --abilities --abilities-file is required",
    ),
    (
        ["--abilities", "1,2", "--shape", "203-80-26", "--samples", "10", "--small-group", "2"],
        "small_group=2.0 must be a fraction",
    ),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_via_main(args, message, capsys):
    code, out, err = _run(["plan", *args], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert message in lines[0]
    assert lines[0].startswith("dask-rpm plan: error:")


def test_bad_abilities_file_contents(tmp_path, capsys):
    cases = {
        '[1, "a"]': "ability #2 'a'",
        "[1, 2": "is not valid JSON",
        '{"a": 1}': "",  # not a list: read as text -> not a number
        "1\nfoo\n": "ability #2 'foo'",
        "# only a comment\n": "is empty",
        "[]": "is empty",
    }
    for i, (text, msg) in enumerate(cases.items()):
        f = tmp_path / f"f{i}.txt"
        f.write_text(text)
        code, out, err = _run(
            ["plan", "--abilities-file", str(f), "--shape", "3-4-5", "--samples", "10"], capsys
        )
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, text
        assert msg in err, (text, err)


@pytest.mark.slow
def test_bad_input_via_subprocess():
    def run(args):
        return subprocess.run(
            [sys.executable, "-m", "dask_rpm.cli", "plan", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    # One of each kind named in the CLI's contract (every BAD case runs through main() above).
    kinds = [BAD[i] for i in (0, 1, 3, 4, 6, 7, 10, 11, 13)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(run, [a for a, _ in kinds]))
    for (args, message), r in zip(kinds, results):
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (args, r.stderr)
        assert message in lines[0], (args, r.stderr)


def test_console_script_and_dask_rpm_forwarding():
    ok = subprocess.run(
        [sys.executable, "-m", "dask", "rpm", "plan", *EX, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["columns"] == [[0, 1, 2], [3, 4]]
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "dask",
            "rpm",
            "plan",
            "--abilities",
            "1,-1",
            "--shape",
            "1-2-3",
            "--samples",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "dask rpm plan: error: ability #2 (P2) is -1.0: abilities must be positive (relative speeds); "
        "give its speed or drop the worker"
    ]


def test_dask_rpm_help_names_the_dask_entry_point():
    r = subprocess.run(
        [sys.executable, "-m", "dask", "rpm", "plan", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: dask rpm plan "), r.stdout[:200]
    r = subprocess.run(
        [sys.executable, "-m", "dask", "rpm", "--help"], capture_output=True, text=True, timeout=120
    )
    assert (
        r.returncode == 0
        and r.stdout.startswith("usage: dask rpm ")
        and "dask rpm train" in r.stdout
    )


def test_dask_cli_is_a_click_command():
    import click

    assert isinstance(cli.dask_cli, click.Command)
    assert cli.dask_cli.name == "rpm"


# ------------------------------------------------------------ extension
def test_registered_subcommand_is_added(capsys):
    def add_hello_parser(subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.add_argument("--name", default="world")
        p.set_defaults(func=lambda a: print(f"hello {a.name}") or 0)

    register_parser(add_hello_parser)
    try:
        code, out, _ = _run(["hello", "--name", "rpm"], capsys)
        assert code == 0 and out == "hello rpm\n"
        assert "hello" in build_parser().format_help()
    finally:
        cli._REGISTERED.remove(add_hello_parser)
    assert "hello" not in build_parser().format_help()


# ------------------------------------------------------------ help for people
_MARKUP = ("``", ":func:", ":mod:", ":class:", ":meth:", ":data:", ":attr:", "SPEC")


def _subcommands() -> list[str]:
    return cli.subcommand_names(build_parser())


def test_every_subcommand_help_is_for_people(capsys):
    names = _subcommands()
    assert {"plan", "train", "probe", "bench", "simulate"} <= set(names)
    for argv in ([], *([name] for name in names)):
        code, out, err = _run([*argv, "--help"], capsys)
        assert code == 0 and err == "", argv
        for mark in _MARKUP:  # Sphinx markup and the method spec are for developers, not in --help
            assert mark not in out, (argv, mark)
        assert "examples:" in out or "first steps:" in out, argv
        # developer notes of module docstrings ("Pure module", "Registered ...") stay out of --help
        assert "Pure module" not in out and "Runner of" not in out, argv


def test_user_facing_errors_do_not_cite_the_spec(capsys):
    code, _, err = _run(["bench", "--n", "0"], capsys)
    assert code == 2 and "SPEC" not in err and "N=0" in err and "from 1 to 8" in err


# ---------------------------------------------- one source for lists of names
def test_mapping_names_come_from_the_planner_registry():
    from dask_rpm.planners import PLANNERS, mapping_names, planner_aliases

    names = mapping_names()
    assert names[0] == "drpm" and names[1:] == list(PLANNERS)
    assert len(set(names)) == len(names)  # nothing listed twice
    assert {"split-1d", "grid", "grid-hrev"} <= set(names)
    assert planner_aliases() == {"grid": "grid-hrev"}


def _listed(text: str) -> list[str]:
    """Names in a comma- or |-separated list, an alias written ``grid (= grid-hrev)``."""
    import re

    text = re.sub(r"\(= [^)]*\)", "", text)
    return [t.strip(" `\"'.\n") for t in re.split(r"[,|]", text) if t.strip(" `\"'.\n")]


def test_readme_help_errors_and_config_list_the_registry(capsys, tmp_path):
    import re
    from pathlib import Path

    import yaml

    from dask_rpm.job import JobError, load_job
    from dask_rpm.planners import PLANNERS, mapping_names

    names, planners = mapping_names(), list(PLANNERS)
    root = Path(__file__).resolve().parents[1]
    # README: "`mapping` is one of `drpm` (default), `srpm`, ..., or a `dask_rpm.Plan`"
    readme = " ".join((root / "README.md").read_text().split())
    m = re.search(r"`mapping` is one of (.*?), or a `dask_rpm.Plan`", readme)
    assert m, "README lost its list of mappings"
    assert _listed(m.group(1).replace(" (default)", "")) == names
    # dask-rpm train --help (option help and epilog)
    code, out, _ = _run(["train", "--help"], capsys)
    flat = " ".join(out.split()).replace("grid- hrev", "grid-hrev")
    m = re.search(r"mappings: (.*?) drpm re-measures", flat)
    assert code == 0 and m and _listed(m.group(1)) == names
    # dask-rpm train --mapping: the error lists the same names
    code, _, err = _run(["train", "--mapping", "nope"], capsys)
    assert code == 2 and _listed(err.split("is not one of ")[1]) == names
    # dask-rpm plan --method choices
    code, out, _ = _run(["plan", "--help"], capsys)
    assert code == 0 and "{" + ",".join(sorted(planners)) + "}" in out
    # job file: the mapping error lists each name once
    import numpy as np

    from dask_rpm.nn.data import write_dataset

    write_dataset(tmp_path / "d.nc", np.ones((4, 2)), np.ones((4, 1)))
    job = {
        "data": "d.nc",
        "hidden": 2,
        "iterations": 1,
        "learning-rate": 0.1,
        "mapping": "nope",
        "output": "r.nc",
        "workers": {"local": {"speeds": [1.0]}},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    try:
        load_job(tmp_path / "job.yaml")
    except JobError as e:
        msg = str(e)
    else:
        raise AssertionError("a bad mapping was accepted")
    assert "mapping='nope'" in msg
    assert _listed(msg.split("valid: ")[1].split(". ")[0]) == names
    # rpm.yaml comments (and so docs/configuration.md)
    text = (root / "dask_rpm" / "rpm.yaml").read_text()
    method = re.search(r"^    method: srpm +# (.*?);", text, re.M)
    mapping = re.search(r"^    mapping: drpm +# (.*?)$", text, re.M)
    assert method and _listed(method.group(1)) == planners
    assert mapping and _listed(mapping.group(1)) == names


def test_the_command_line_starts_without_distributed():
    """``dask-rpm --help`` and ``dask-rpm plan`` do not pay for importing distributed (or torch):
    the commands that need a cluster import it when they run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = (
        "import sys, dask_rpm.cli; "
        "print(sorted(m for m in ('distributed', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_version_prints_the_package_version():
    from dask_rpm import __version__

    p = subprocess.run(
        [sys.executable, "-m", "dask_rpm.cli", "--version"], capture_output=True, text=True
    )
    assert p.returncode == 0 and p.stdout.strip() == f"dask-rpm {__version__}"


def test_a_reader_that_leaves_early_ends_the_output_quietly():
    """``dask-rpm plan --json | head -c 10``: more output than a pipe holds (1000 workers), the
    reader gone after 10 bytes: no BrokenPipeError traceback, the shell's code for SIGPIPE."""
    abilities = ",".join(["1"] * 1000)
    cmd = (
        f"{sys.executable} -m dask_rpm.cli plan --abilities {abilities} --shape 33-4096-8 "
        "--samples 100000 --json | head -c 10 > /dev/null; echo rc=${PIPESTATUS[0]} >&2"
    )
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.stderr.strip().endswith("rc=141")
