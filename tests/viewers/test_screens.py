"""Golden screens: what a user's terminal shows, driven in tmux at 80 and 120 columns.

Each case runs the installed ``spectrace`` command in a real tmux pane of the given size
(Rich reads the pane's width, as it does on a user's terminal) and compares everything it
printed, scrollback included, with ``tests/screens/<case>-<width>.txt``. Lines that change
from run to run (times, paths of temporary folders) are normalised first.

Regenerate after an intended change, then read the diff of tests/screens/ before keeping it:

    SPECTRACE_UPDATE_GOLDEN=1 python -m pytest tests/viewers/test_screens.py
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import paths
from tests.helpers.traces import fc_bypass_records, healthy_records, layer_mismatch_records, write_trace

SCREENS = paths.SCREENS
UPDATE = os.environ.get("SPECTRACE_UPDATE_GOLDEN") == "1"
HEIGHT = 40
START, DONE = "__SCREEN_START__", "__SCREEN_DONE__"

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Pane:
    """One tmux server with one pane of ``width`` x ``height``."""

    def __init__(self, name: str, width: int, height: int = HEIGHT) -> None:
        self.name = name
        self.sock = ["tmux", "-L", f"screens-{os.getpid()}-{name}-{width}"]
        self.width, self.height = width, height

    def __enter__(self) -> Pane:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECTRACE")}
        env.update(TERM="xterm-256color", NO_COLOR="1")
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        # A big scrollback: the whole output of a command is compared, not only its last screen.
        subprocess.run(
            self.sock + ["new-session", "-d", "-s", self.name, "-x", str(self.width), "-y", str(self.height)], check=True, env=env
        )
        subprocess.run(self.sock + ["set-option", "-t", self.name, "history-limit", "5000"], check=True)
        # The environment's bin on PATH, as where it is activated: the screens name `spectrace`
        # (a login shell's profile resets PATH, so it is set in the pane's shell itself).
        self.send(f'export PATH={shlex.quote(os.path.dirname(sys.executable))}:"$PATH"', "Enter")
        return self

    def run(self, command: str, timeout: float = 120.0) -> str:
        """Run ``command`` in the pane, wait for it to end, return everything it printed."""
        done = re.compile(rf"^{DONE}=\d+", re.M)
        before = len(done.findall(self.capture()))  # the runs before this one ended too
        self.send(f"echo {START}; {command}; echo {DONE}=$?", "Enter")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(done.findall(self.capture())) > before:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"{command!r} did not finish:\n{self.capture()}")
        lines = self.capture().splitlines()
        # The markers end their lines: the typed command line holds them too, after "echo".
        # A typed line that fills the pane's width exactly is joined (-J) to the next one, so
        # START may end the command line rather than stand alone. The last run's markers:
        # the pane's history holds the earlier runs too.
        starts = [i for i, line in enumerate(lines) if line.rstrip().endswith(START)]
        assert starts, f"no {START} line in the pane:\n" + "\n".join(lines[:40]) + "\n...\n" + "\n".join(lines[-20:])
        start = starts[-1] + 1
        end = next(i for i, line in enumerate(lines) if i >= start and re.match(rf"^{DONE}=\d+", line))
        return "\n".join(line.rstrip() for line in lines[start:end]).strip("\n") + f"\n[exit {lines[end].split('=')[1]}]\n"

    def send(self, *keys: str) -> None:
        subprocess.run(self.sock + ["send-keys", "-t", self.name, *keys], check=True)

    def capture(self, history: bool = True) -> str:
        extra = ["-J", "-S", "-"] if history else []  # the whole scrollback, wrapped lines joined; or the screen as it is
        return subprocess.run(
            self.sock + ["capture-pane", "-p", *extra, "-t", self.name], capture_output=True, text=True, check=True
        ).stdout

    def __exit__(self, *exc: object) -> None:
        subprocess.run(self.sock + ["kill-server"], capture_output=True)


def spectrace_cmd(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", "spectrace", *args))


def normalise(text: str, tmp: Path, times: bool = False) -> str:
    text = text.replace(str(tmp), "<tmp>")
    if not times:  # the fixtures' times are fixed: only the demo's wall times change
        return text
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "<time>", text)
    text = re.sub(r"\b\d+\.\d s\b", "<s> s", text)  # wall times (the demo's title and progress)
    return text


def check(name: str, text: str) -> None:
    path = SCREENS / f"{name}.txt"
    if UPDATE:
        SCREENS.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path} does not exist; run with SPECTRACE_UPDATE_GOLDEN=1 to create it")
    assert text == path.read_text(), f"{name}: the screen changed; SPECTRACE_UPDATE_GOLDEN=1 regenerates tests/screens/"


def _traces(tmp: Path) -> None:
    for name, records in (("healthy", healthy_records()), ("fc_bypass", fc_bypass_records()), ("layer_mismatch", layer_mismatch_records())):
        write_trace(tmp / name / "trace-node1-4242-rank0.jsonl", records)


# Paths relative to the folder the pane starts in, as a user types them.
CASES: dict[str, list[str]] = {
    "view_fc_bypass": ["view", "fc_bypass", "--no-pager"],
    "view_layer_mismatch": ["view", "layer_mismatch", "--no-pager"],
    "view_healthy_modules": ["view", "healthy", "--modules", "--no-pager"],
    "diff_healthy_vs_fc_bypass": ["diff", "healthy", "fc_bypass"],
    "view_nothing_matches": ["view", "healthy", "--module", "nonexistent", "--no-pager"],
}
# A one-line error is plain text on stderr: the terminal may wrap it. Everything else is
# laid out for the terminal's width and never wider.
PLAIN_TEXT = {"view_nothing_matches"}


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("case", sorted(CASES))
def test_screen(case: str, width: int, tmp_path: Path) -> None:
    _traces(tmp_path)
    with Pane(case, width) as pane:
        text = pane.run(f"cd {shlex.quote(str(tmp_path))} && " + spectrace_cmd(*CASES[case]))
    assert "Traceback" not in text
    if case not in PLAIN_TEXT:
        assert all(len(line) <= width for line in text.splitlines()), "a line wider than the terminal"
    check(f"{case}-{width}", normalise(text, tmp_path))


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.slow
def test_demo_screen(width: int, tmp_path: Path) -> None:
    with Pane("demo", width) as pane:
        text = pane.run(
            f"cd {shlex.quote(str(tmp_path))} && " + spectrace_cmd("demo", "--bug", "healthy", "--bug", "fc_bypass", "--out", "d"),
            timeout=900,
        )
    assert all(len(line) <= width for line in text.splitlines()), "a line wider than the terminal"
    text = normalise(text, tmp_path, times=True)
    assert len(text.splitlines()) <= HEIGHT, "the demo's summary no longer fits one screen"
    check(f"demo-{width}", text)


@pytest.mark.parametrize("width", [80, 120])
def test_audit_screen(width: int, tmp_path: Path) -> None:
    # A speculators checkpoint on an SGLang release that reads none of its ids: the audit's
    # stacked blocks, wrapped at spaces, never a line wider than the terminal.
    root = paths.ROOT
    with Pane("audit", width) as pane:
        text = pane.run(
            f"cd {shlex.quote(str(root))} && "
            + spectrace_cmd(
                "audit", "tests/fixtures/speculators_tiny", "--target-config", "tests/fixtures/target_llama_config.json",
                "--engine", "sglang==0.5.17",
            )
        )  # fmt: skip
    assert "Traceback" not in text
    assert all(len(line) <= width for line in text.splitlines()), "a line wider than the terminal"
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in text  # an identifier kept whole
    check(f"audit-{width}", normalise(text, tmp_path))


@pytest.mark.parametrize("width", [80, 120])
def test_follow_frame(width: int, tmp_path: Path) -> None:
    # A trace its writer never closed (it ran on another host): the live screen as it stands,
    # with the times of its "new" lines and its pace made fixed.
    records = [r for r in fc_bypass_records() if type(r).__name__ != "Counters"]
    write_trace(tmp_path / "run" / "trace-node1-4242-rank0.jsonl", records)
    with Pane("follow", width) as pane:
        pane.send(f"clear; cd {shlex.quote(str(tmp_path))} && " + spectrace_cmd("view", "run", "--follow", "--interval", "0.3"), "Enter")
        deadline = time.monotonic() + 60
        frame = ""
        while time.monotonic() < deadline:
            frame = pane.capture(history=False)
            if frame.startswith(" not closed") and "EAGLE-3 data path" in frame:
                break
            time.sleep(0.2)
        pane.send("C-c")
    lines = [line.rstrip() for line in frame.splitlines()]
    assert lines and lines[0].startswith(" not closed"), frame
    assert len(lines) <= HEIGHT and all(len(line) <= width for line in lines)
    text = re.sub(r"\b\d+s ago", "Ns ago", "\n".join(lines).rstrip("\n") + "\n")
    check(f"follow-{width}", re.sub(r"[\d.]+ steps/s", "N steps/s", text))


# ------------------------------------------------------------------ the newcomer's walkthrough
# The seed reports' three bugs, as the demo reproduces them (docs/walkthrough.md).
SEED_BUGS = (
    ("fc_bypass", "the target hands the draft one hidden state where fc expects three"),
    (
        "layers0_names",
        "the trained decoder layer is dropped at load (`layers.0.*` vs `midlayer.*`) by SGLang releases before 0.5.14;"
        " 0.5.14 and later read both names",
    ),
    ("embedding_vs_layer", "the target captures other layers than the draft was trained on"),
)
WALKTHROUGH = paths.ROOT / "docs" / "walkthrough.md"


def _steady(text: str) -> str:
    """The run-dependent parts of a header (host:pid, start time, span) as fixed example
    values of the same width, so the box stays aligned."""

    def same_width(new: str) -> Callable[[re.Match[str]], str]:
        return lambda m: new.ljust(len(m.group(0)))

    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "2026-12-01 12:00:00 UTC", text)
    # With the blanks after them: the box's right edge stays where it was.
    text = re.sub(r"span \d+(\.\d+)? m?s *", same_width("span 1.2 s"), text)
    return re.sub(r"(?<=1 process  )\S+:\d+ *", same_width("host:4242"), text)


@pytest.mark.slow
def test_walkthrough_shows_each_seed_bug_on_one_80x40_screen(tmp_path: Path) -> None:
    screens = []
    with Pane("walk", 80) as pane:
        # One demo run writes the three scenarios' folders, each what `spectrace demo --bug X
        # --out demo` writes alone (a scenario's trace is its own: the golden doc below says
        # so); one run pays the interpreter's and torch's start once rather than three times.
        bugs = [arg for bug, _what in SEED_BUGS for arg in ("--bug", bug)]
        run = pane.run(f"cd {shlex.quote(str(tmp_path))} && " + spectrace_cmd("demo", *bugs, "--out", "demo"), timeout=900)
        assert run.rstrip().endswith("[exit 0]"), run
        for bug, _what in SEED_BUGS:
            text = pane.run(f"cd {shlex.quote(str(tmp_path))} && " + spectrace_cmd("view", f"demo/{bug}", "--no-pager"))
            first = _steady(text).splitlines()[:HEIGHT]
            screen = "\n".join(first)
            # The root cause and its concrete fix are on the first screen.
            assert re.search(r"^ ERROR ", screen, re.M), screen
            assert re.search(r"^\s+fix\s", screen, re.M), screen
            screens.append((bug, screen))
    doc = _walkthrough_doc(screens)
    if UPDATE:
        WALKTHROUGH.write_text(doc)
    assert WALKTHROUGH.read_text() == doc, "docs/walkthrough.md is not what the demo shows; SPECTRACE_UPDATE_GOLDEN=1 rewrites it"


ROPE_MARK = "<!-- rope screen -->"


def _walkthrough_doc(screens: list[tuple[str, str]]) -> str:
    """The seed bugs' screens; the RoPE section after them (its own test writes it) is kept."""
    text = WALKTHROUGH.read_text() if WALKTHROUGH.exists() else "# Walkthrough\n\n"
    intro = text.split("<!-- screens -->")[0]
    rope = ROPE_MARK + text.split(ROPE_MARK, 1)[1] if ROPE_MARK in text else ""
    parts = [intro.rstrip() + "\n\n<!-- screens -->\n"]
    for (bug, what), (_bug, screen) in zip(SEED_BUGS, screens):
        parts.append(
            f"\n## `{bug}`: {what}\n\n```console\n$ spectrace demo --bug {bug} --out demo\n$ spectrace view demo/{bug}\n{screen}\n```\n"
        )
    if rope:
        parts.append("\n" + rope)
    return "".join(parts)


ROPE_INTRO = """## `rope_mismatch`: the draft's config lost its rotary base

A bug real users hit beyond the three above: a converter or a transformers upgrade drops the
draft's `rope_theta` (or moves it where the engine does not read it), so the engine builds
the draft's rotary embedding with its default base 10000 although the draft was trained at
its Llama-3 target's 500000. Nothing fails; every position is rotated with another phase and
acceptance drops. A config without a base is also what a healthy SpecForge draft looks like
(SpecForge trains with the base its own config gives), so the config alone only earns a
warning that names `spectrace probe`; here the draft's run record (`run.yaml`, beside the
SpecForge fixture with its `rope_parameters` removed) says it was trained at 500000, and
`spectrace audit` names the bug before launch. A served draft gets the same verdict at its
load, from the rotary modules the engine really built (`SPECTRACE=1` on SGLang or vLLM).

To reproduce the screen, in a checkout of this repository (with spectrace installed): the
draft is the SpecForge fixture with its `rope_parameters` removed and a one-line run record,
the target the tiny Llama fixture given a Llama-3 base of 500000; `--trained-with specforge`
says which trainer wrote the draft's layer ids.
"""
# Run as written, in order, from the repository's root (the test runs them in the pane).
ROPE_SETUP = (
    "mkdir rope-demo && cd rope-demo",
    "cp -r ../tests/fixtures/specforge_tiny draft",
    """python -c 'import json; d = json.load(open("draft/config.json")); del d["rope_parameters"]; """
    """json.dump(d, open("draft/config.json", "w"), indent=2)'""",
    "echo 'rope_theta: 500000.0' > draft/run.yaml",
    """mkdir target && python -c 'import json; t = json.load(open("../tests/fixtures/target_llama_config.json")); """
    """t["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}; json.dump(t, open("target/config.json", "w"), indent=2)'""",
)


def test_walkthrough_shows_a_rope_bug_the_audit_names(tmp_path: Path) -> None:
    import json

    fixtures = tmp_path / "tests" / "fixtures"  # the checkout's fixtures, as the commands find them
    fixtures.mkdir(parents=True)
    shutil.copytree(paths.FIXTURES / "specforge_tiny", fixtures / "specforge_tiny")
    shutil.copy(paths.FIXTURES / "target_llama_config.json", fixtures / "target_llama_config.json")
    args = ("audit", "draft", "--target-config", "target/config.json", "--trained-with", "specforge")
    with Pane("rope", 80) as pane:
        # `python` is the environment's (its bin is on the pane's PATH); spectrace runs as the other screens run it.
        text = pane.run(f"cd {shlex.quote(str(tmp_path))} && " + " && ".join(ROPE_SETUP) + " && " + spectrace_cmd(*args))
    demo = tmp_path / "rope-demo"
    assert "rope_parameters" not in json.loads((demo / "draft" / "config.json").read_text())
    assert (demo / "draft" / "run.yaml").read_text() == "rope_theta: 500000.0\n"  # the training run's own record
    assert json.loads((demo / "target" / "config.json").read_text())["rope_parameters"]["rope_theta"] == 500000.0
    assert text.rstrip().endswith("[exit 1]"), text
    screen = text.rstrip().removesuffix("[exit 1]").rstrip()
    assert "ERROR  rope_mismatch" in screen and "base 10000" in screen and "run.yaml" in screen, screen
    assert "Traceback" not in screen and all(len(line) <= 80 for line in screen.splitlines())
    setup = "".join(f"$ {command}\n" for command in ROPE_SETUP)
    section = f"{ROPE_MARK}\n{ROPE_INTRO}\n```console\n{setup}$ spectrace {' '.join(args)}\n{screen}\n```\n"
    text = WALKTHROUGH.read_text()
    doc = text.split(ROPE_MARK)[0].rstrip() + "\n\n" + section
    if UPDATE:
        WALKTHROUGH.write_text(doc)
    assert WALKTHROUGH.read_text() == doc, (
        "docs/walkthrough.md's RoPE screen is not what the audit shows; SPECTRACE_UPDATE_GOLDEN=1 rewrites it"
    )
