"""`iac proto`: code generation for other languages, and schema hygiene with buf.

CI installs protoc (Debian protobuf-compiler), protoc-gen-go (Debian protoc-gen-go)
and the npm tools of tests/interop/js (buf, protoc-gen-es), so nothing here skips:
a missing tool fails the test with the line that says what to install.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iac.cli import proto as _protoc
from iac.errors import ConfigError, IacError

ROOT = Path(__file__).resolve().parent.parent
JS_DIR = ROOT / "tests" / "interop" / "js"
TYPES = ("TaskState", "Message", "Hello", "Forward", "Dict", "GoAway", "MessageType", "Intent")

BUILTIN_FILES = {
    "python": ["iac_pb2.py", "iac_pb2.pyi"],
    "cpp": ["iac.pb.h", "iac.pb.cc"],
    "java": ["iac/Iac.java"],
    "kotlin": ["iac/Iac.java", "iac/MessageKt.kt", "iac/HelloKt.kt", "iac/TaskStateKt.kt"],
    "csharp": ["Iac.cs"],
    "objc": ["Iac.pbobjc.h", "Iac.pbobjc.m"],
    "php": ["Iac/Message.php", "Iac/Hello.php", "Iac/TaskState.php", "GPBMetadata/Iac.php"],
    "ruby": ["iac_pb.rb"],
}


def _require_ready(lang: str) -> None:
    p = _protoc.plan(lang)
    if p.problem is not None:
        pytest.fail(f"{lang}: {p.problem} (CI installs it in .ci/run)")


def _text(files: list[Path]) -> str:
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def test_every_spec_language_is_known():
    assert set(_protoc.LANGUAGES) == {*BUILTIN_FILES, "go", "typescript"}


@pytest.mark.parametrize("lang", sorted(BUILTIN_FILES))
def test_builtin_language_compiles(lang, tmp_path):
    _require_ready(lang)
    files = _protoc.compile_schema(lang, tmp_path / "out")
    rel = {f.relative_to(tmp_path / "out").as_posix() for f in files}
    assert set(BUILTIN_FILES[lang]) <= rel
    text = _text(files)
    for name in TYPES:
        assert name in text, f"{lang} output does not name {name}"


def test_python_output_is_the_committed_code(tmp_path):
    p = _protoc.plan("python")
    assert p.protoc is not None and "grpcio-tools" in p.protoc.description  # the pinned dev extra
    _protoc.compile_schema("python", tmp_path)
    for name in ("iac_pb2.py", "iac_pb2.pyi"):
        assert (tmp_path / name).read_bytes() == (ROOT / "iac" / "wire" / "_pb" / name).read_bytes()


def test_go_output_or_the_install_hint(tmp_path):
    p = _protoc.plan("go")
    if p.problem is not None:
        assert p.problem == _protoc.LANGUAGES["go"].hint
        with pytest.raises(ConfigError, match="install Debian package protoc-gen-go"):
            _protoc.compile_schema("go", tmp_path)
        return
    files = _protoc.compile_schema("go", tmp_path, go_import_path="example.com/agents/iacpb;iacpb")
    assert [f.name for f in files] == ["iac.pb.go"]
    text = _text(files)
    assert "package iacpb" in text
    for name in (
        "type Message struct",
        "type Hello struct",
        "type TaskState struct",
        "MessageType_DELEGATE_TASK",
    ):
        assert name in text


def test_typescript_output_or_the_install_hint(tmp_path):
    p = _protoc.plan("typescript")
    if p.problem is not None:
        assert p.problem == _protoc.LANGUAGES["typescript"].hint
        with pytest.raises(ConfigError, match="@bufbuild/protoc-gen-es"):
            _protoc.compile_schema("typescript", tmp_path)
        return
    files = _protoc.compile_schema("typescript", tmp_path)
    assert [f.name for f in files] == ["iac_pb.ts"]
    text = _text(files)
    for name in ("MessageSchema", "HelloSchema", "TaskStateSchema", "export type Message ", "DELEGATE_TASK"):
        assert name in text


def test_missing_tools_give_one_line_naming_the_package(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(_protoc, "_node_bins", lambda start: [])
    hints = {
        "go": "protoc-gen-go: not found; install Debian package protoc-gen-go",
        "typescript": "protoc-gen-es: not found; install npm package @bufbuild/protoc-gen-es",
        "cpp": "protoc: not found; install Debian package protobuf-compiler",
        "ruby": "protoc: not found; install Debian package protobuf-compiler",
    }
    for lang, start in hints.items():
        with pytest.raises(ConfigError) as info:
            _protoc.compile_schema(lang, tmp_path / lang, cwd=tmp_path)
        message = str(info.value)
        assert message.startswith(start) and "\n" not in message
    # Python still works with the protoc bundled in grpcio-tools
    assert _protoc.plan("python", cwd=tmp_path).problem is None


def test_unknown_language_and_protoc_failure(tmp_path):
    with pytest.raises(ConfigError, match="unknown language 'cobol'"):
        _protoc.plan("cobol")
    bogus = tmp_path / "protoc"
    bogus.write_text(
        "#!/bin/sh\necho 'bogus protoc'; [ \"$1\" = --version ] && exit 0; echo 'it broke' >&2; exit 3\n"
    )
    bogus.chmod(0o755)
    with pytest.raises(ConfigError, match="protoc failed for cpp: it broke"):
        _protoc.compile_schema("cpp", tmp_path / "out", protoc=str(bogus))


def test_compiles_from_the_embedded_descriptor_when_no_proto_file_is_shipped(tmp_path, monkeypatch):
    _require_ready("cpp")
    monkeypatch.setattr(_protoc, "find_proto", lambda: None)
    files = _protoc.compile_schema("cpp", tmp_path)
    assert {f.name for f in files} == {"iac.pb.h", "iac.pb.cc"}
    assert "class Message final" in _text(files)


def test_proto_file_is_found_in_the_checkout():
    found = _protoc.find_proto()
    assert found is not None
    assert found.read_bytes() == (ROOT / "proto" / "iac.proto").read_bytes()


def _cli(argv: list[str]) -> int:
    """The verb as `iac` runs it: errors are one line on stderr, exit 1."""
    parser = argparse.ArgumentParser(prog="iac")
    sub = parser.add_subparsers(dest="verb", required=True)
    _protoc.register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except IacError as exc:
        print(f"iac {args.verb}: error: {exc}", file=sys.stderr)
        return 1


def test_cli_list_and_compile(tmp_path, capsys):
    assert _cli(["proto", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("schema: ")
    rows = {line.split()[0]: line.split()[1] for line in out[1:]}
    assert set(rows) == set(_protoc.LANGUAGES)
    assert set(rows.values()) <= {"available", "missing"}
    assert rows["python"] == "available"
    for lang in _protoc.LANGUAGES:
        assert (rows[lang] == "available") == (_protoc.plan(lang).problem is None)
    _require_ready("ruby")
    assert _cli(["proto", "compile", "--lang", "ruby", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "iac_pb.rb")


def test_cli_missing_tool_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_protoc, "_node_bins", lambda start: [])
    assert _cli(["proto", "compile", "--lang", "go", "--out", str(tmp_path / "go")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("iac proto: error: protoc-gen-go: not found; install Debian package protoc-gen-go")


# --- buf: lint and breaking-change check ----------------------------------------------------


def _buf() -> str:
    buf = JS_DIR / "node_modules" / ".bin" / "buf"
    if not buf.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is required to install buf (tests/interop/js: npm ci)")
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, check=True, timeout=600)
    return str(buf)


def _run_buf(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_buf(), *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_buf_lint_passes():
    run = _run_buf("lint")
    assert run.returncode == 0, run.stdout + run.stderr


def test_buf_lint_exceptions_are_exactly_the_documented_ones(tmp_path):
    """Without the `except` list, STANDARD fails on those four rules and nothing else."""
    shutil.copytree(
        ROOT / "proto", tmp_path / "proto", ignore=shutil.ignore_patterns("testvectors", "baseline")
    )
    (tmp_path / "buf.yaml").write_text(
        "version: v2\nmodules:\n  - path: proto\nlint:\n  use:\n    - STANDARD\n"
    )
    run = _run_buf("lint", "--error-format=json", cwd=tmp_path)
    assert run.returncode != 0
    rules = {json.loads(line)["type"] for line in run.stdout.splitlines() if line.strip()}
    assert rules == {
        "PACKAGE_VERSION_SUFFIX",
        "PACKAGE_DIRECTORY_MATCH",
        "ENUM_VALUE_PREFIX",
        "ENUM_ZERO_VALUE_SUFFIX",
    }
    config = (ROOT / "buf.yaml").read_text(encoding="utf-8")
    for rule in rules:
        assert f"- {rule}" in config


def test_buf_breaking_against_the_released_baseline():
    run = _run_buf("breaking", "--against", "proto/baseline/iac.binpb")
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("uint64 deadline = 15;", "uint32 deadline = 15;", 'changed type from "uint64" to "uint32"'),
        ("bytes signature = 8;", "bytes signature = 20;", "deleted"),
        ("string state_ref = 5;", "", "deleted"),
        ("REPLY = 10;", "REPLY = 15;", "deleted"),
    ],
)
def test_buf_breaking_catches_a_changed_schema(tmp_path, old, new, expect):
    shutil.copytree(ROOT / "proto", tmp_path / "proto", ignore=shutil.ignore_patterns("testvectors"))
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    proto = tmp_path / "proto" / "iac.proto"
    text = proto.read_text(encoding="utf-8")
    assert old in text
    proto.write_text(text.replace(old, new), encoding="utf-8")
    run = _run_buf("breaking", "--against", "proto/baseline/iac.binpb", cwd=tmp_path)
    assert run.returncode != 0
    assert expect in run.stdout, run.stdout
