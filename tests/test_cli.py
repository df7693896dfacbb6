import argparse
import dataclasses
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import iac
from iac.cli.main import build_parser, main
from iac.demo.codec import DEFAULT_COUNT
from iac.protocol.files import DEFAULT_WINDOW

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "iac", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_keygen_and_id(tmp_path):
    key = tmp_path / "a.key"
    out = run("keygen", "--out", str(key))
    assert out.returncode == 0, out.stderr
    agent_id = out.stdout.strip()
    assert iac.wire.is_agent_id(agent_id)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    out = run("id", "--key", str(key))
    assert out.stdout.strip() == agent_id
    # Refuses to overwrite; a readable key is refused with one line naming the fix.
    assert run("keygen", "--out", str(key)).returncode != 0
    os.chmod(key, 0o644)
    out = run("id", "--key", str(key))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1 and "chmod 600" in out.stderr


def test_dict_train(tmp_path):
    out_file = tmp_path / "d.zdict"
    samples = ROOT / "iac" / "bench" / "corpus" / "train.jsonl"
    out = run("dict", "train", str(samples), "--out", str(out_file), "--size", "8192", "--dict-id", "41000")
    assert out.returncode == 0, out.stderr
    d = iac.wire.Dictionary.load(out_file)
    assert d.dict_id == 41000
    assert d.sha256.hex() in out.stdout


def test_dict_train_too_few_samples_is_one_line(tmp_path):
    sample = tmp_path / "one.jsonl"
    sample.write_text('{"a":1}\n')
    out = run("dict", "train", str(sample), "--out", str(tmp_path / "x"))
    assert out.returncode == 1
    assert "at least 8" in out.stderr and out.stderr.count("\n") == 1


def _verbs(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every verb path of the CLI (``("dict",)``, ``("dict", "train")``, ...) with its parser,
    read from the parser itself so that a new verb is covered without touching this test."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _verbs(sub, (*path, name))


VERBS = dict(_verbs(build_parser()))


def test_the_cli_has_its_verbs():
    top = {p[0] for p in VERBS}
    assert {"keygen", "id", "dict", "demo", "node", "ping", "send", "request", "call"} <= top
    assert len(VERBS) >= 15


@pytest.mark.parametrize("path", sorted(VERBS), ids=" ".join)
def test_help_on_each_verb(path, capsys):
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: iac {' '.join(path)}")
    parser = VERBS[path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names = list(action.choices)  # a verb group names its verbs
        elif action.option_strings:
            names = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
        else:
            names = [action.metavar or action.dest]  # a positional argument
        for name in names:
            assert name in out, f"`iac {' '.join(path)} --help` does not mention {name}"


def test_help_of_the_installed_entry_point_lists_every_verb():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    for verb in {p[0] for p in VERBS}:
        assert verb in out.stdout


_DEFAULT_IN_HELP = re.compile(r"\(default:? ([0-9][0-9.]*)\)")


def _node_default(name):
    return {f.name: f.default for f in dataclasses.fields(iac.NodeConfig)}[name]


def test_send_file_help_shows_the_window_the_node_uses(capsys):
    with pytest.raises(SystemExit):
        main(["send-file", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"chunks in flight (default {_node_default('file_window')})" in out
    assert _node_default("file_window") == DEFAULT_WINDOW


@pytest.mark.parametrize("path", sorted(VERBS), ids=" ".join)
def test_defaults_in_help_are_the_defaults_in_the_code(path):
    """A number shown as "(default N)" is the option's own default, or, for an option left unset
    (None), the default of the node setting it stands for."""
    unset = {  # option dest -> what applies when it is not given
        "window": _node_default("file_window"),
        "max_file_size": _node_default("max_file_size"),
        "count": DEFAULT_COUNT if path == ("demo",) else None,
    }
    for action in VERBS[path]._actions:
        match = _DEFAULT_IN_HELP.search(action.help or "")
        if match is None or action.help is None:
            continue
        shown = float(match.group(1))
        expected = action.default if action.default is not None else unset.get(action.dest)
        assert expected is not None, f"iac {' '.join(path)} {action.dest}: help names a default it lacks"
        assert shown == float(expected), f"iac {' '.join(path)} {action.dest}: help says {shown}"
