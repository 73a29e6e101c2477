"""Every command answers --help, and the README's CLI reference matches the real options."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from mathagent.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"


def _commands() -> dict:
    root = typer.main.get_command(app)
    found: dict = {}

    # Typer may vendor its own click, so groups and options are recognised by shape.
    def walk(cmd, path: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())
        else:
            found[path] = cmd

    walk(root, "")
    return found


COMMANDS = _commands()


def _options(cmd) -> set[str]:
    names = set()
    for param in cmd.params:
        if param.param_type_name == "option":
            names.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
    names.discard("--help")
    return names


def _readme_section(command: str) -> str:
    text = README.read_text()
    start = text.find(f"### `mathagent {command}")
    assert start >= 0, f"README has no CLI reference heading for `mathagent {command}`"
    end = text.find("\n### ", start + 1)
    end2 = text.find("\n## ", start + 1)
    ends = [e for e in (end, end2) if e > 0]
    return text[start : min(ends) if ends else len(text)]


def test_expected_commands_exist():
    expected = {
        "solve",
        "api",
        "serve",
        "generate",
        "sandbox build",
        "sandbox serve",
        "eval",
        "bench",
        "report",
        "train-drafter",
        "fetch-model",
    }
    assert expected <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_runs_in_a_real_process(command: str):
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", *command.split(), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_readme_cli_reference_matches_help(command: str):
    section = _readme_section(command)
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", section))
    actual = _options(COMMANDS[command])
    assert actual - documented == set(), f"options missing from README for {command}"
    assert documented - actual == set(), f"README documents options {command} does not have"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["solve", "p", "--recipe", "aimo3"], "recipe"),
        (["solve", "p", "--reasoning-effort", "max"], "reasoning_effort"),
        (["eval", "--dataset", "x", "--out", "/tmp/x", "--recipe", "kaggle"], "recipe"),
    ],
)
def test_bad_agent_flags_are_refused_before_anything_starts(clean_env, args, message):
    from typer.testing import CliRunner

    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2 and message in done.output


@pytest.mark.parametrize(
    ("host", "says"),
    [("127.0.0.1", "loopback only"), ("::1", "loopback only"), ("0.0.0.0", "other machines")],
)
def test_services_say_where_they_listen(capsys, host, says):
    from mathagent.cli.common import announce

    announce("mathagent sandbox", host, 6000)
    err = capsys.readouterr().err
    assert f"listening on http://{host}:6000" in err and says in err
