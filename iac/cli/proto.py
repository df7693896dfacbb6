"""``iac proto``: compile the IAC wire schema for other languages with the tools on this machine.

    iac proto list
    iac proto compile --lang go --out gen/go

Built-in generators (cpp, csharp, java, kotlin, objc, php, python, ruby) come
from a ``protoc`` binary (Debian ``protobuf-compiler``); Python can also use the
protoc bundled with ``grpcio-tools`` (dev extras), which generates only Python.
Go and TypeScript need a plugin (``protoc-gen-go``, ``protoc-gen-es`` or
``ts-proto``) on PATH or in a ``node_modules/.bin`` folder.

The schema is ``proto/iac.proto`` of a source checkout, or ``iac/data/iac.proto``
when the package ships it. An installation that has neither still compiles: the
generated Python module embeds the schema as a descriptor, which protoc accepts
with ``--descriptor_set_in`` (the output then lacks the schema's comments).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.errors import ConfigError

PROTO_NAME = "iac.proto"
#: Go import path used when the caller gives none (iac.proto sets no go_package).
DEFAULT_GO_IMPORT_PATH = "iac/iacpb;iacpb"

_PROTOC_HINT = (
    "protoc: not found; install Debian package protobuf-compiler "
    "(the protoc bundled with grpcio-tools generates only Python)"
)
#: Python needs no protoc binary: grpcio-tools bundles one (the dev extra pins the version that
#: made iac/wire/_pb).
_PYTHON_HINT = (
    "neither grpcio-tools nor protoc found; pip install grpcio-tools (it bundles a protoc for "
    "Python), or install Debian package protobuf-compiler"
)


@dataclass(frozen=True, slots=True)
class Language:
    """How to generate code for one language."""

    name: str
    #: protoc ``--X_out`` flags to pass (built-ins) or the plugin's out flag
    out_flags: tuple[str, ...]
    #: plugin executables tried in order (empty: built into protoc)
    plugins: tuple[str, ...] = ()
    #: one line naming what provides a missing plugin
    hint: str = ""


LANGUAGES: dict[str, Language] = {
    "python": Language("python", ("python_out", "pyi_out")),
    "cpp": Language("cpp", ("cpp_out",)),
    "java": Language("java", ("java_out",)),
    "kotlin": Language("kotlin", ("java_out", "kotlin_out")),  # Kotlin DSL on top of the Java classes
    "csharp": Language("csharp", ("csharp_out",)),
    "objc": Language("objc", ("objc_out",)),
    "php": Language("php", ("php_out",)),
    "ruby": Language("ruby", ("ruby_out",)),
    "go": Language(
        "go",
        ("go_out",),
        ("protoc-gen-go",),
        "protoc-gen-go: not found; install Debian package protoc-gen-go "
        "(or `go install google.golang.org/protobuf/cmd/protoc-gen-go@latest`)",
    ),
    "typescript": Language(
        "typescript",
        ("es_out",),
        ("protoc-gen-es", "protoc-gen-ts_proto"),
        "protoc-gen-es: not found; install npm package @bufbuild/protoc-gen-es "
        "(`npm install --save-dev @bufbuild/protoc-gen-es`) or ts-proto",
    ),
}


@dataclass(frozen=True, slots=True)
class Protoc:
    """A protoc to run: its argv prefix and a description for ``iac proto list``."""

    argv: tuple[str, ...]
    description: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What compiling one language needs; ``problem`` is set when something is missing."""

    language: Language
    protoc: Protoc | None
    plugin: tuple[str, str] | None  # (plugin name, path)
    problem: str | None


# --- finding the schema and the tools -------------------------------------------------------


def find_proto() -> Path | None:
    """The schema source: the packaged copy, else the source checkout's ``proto/iac.proto``."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "data" / PROTO_NAME, package.parent / "proto" / PROTO_NAME):
        if candidate.is_file():
            return candidate
    return None


def schema_descriptor_set() -> bytes:
    """A FileDescriptorSet of iac.proto, from the descriptor embedded in the generated module."""
    from google.protobuf.descriptor_pb2 import FileDescriptorProto, FileDescriptorSet

    from iac.wire._pb import iac_pb2

    fdp = FileDescriptorProto.FromString(iac_pb2.DESCRIPTOR.serialized_pb)
    return FileDescriptorSet(file=[fdp]).SerializeToString(deterministic=True)


def _system_protoc(explicit: str | None) -> Protoc | None:
    path = explicit or shutil.which("protoc")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        raise ConfigError(
            f"--protoc {path}: cannot run it ({exc.strerror}); give the path of a protoc binary"
            if explicit
            else f"{path}: cannot run protoc ({exc.strerror}); reinstall protobuf-compiler"
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{path} --version did not answer within 30 s; give a working protoc with --protoc"
        ) from None
    first = (out.stdout.strip().splitlines() or [""])[0].strip()
    if out.returncode != 0 or not first:
        raise ConfigError(
            f"--protoc {path}: not a protoc (`{Path(path).name} --version` failed); "
            "give the path of protoc (Debian package protobuf-compiler)"
        )
    return Protoc((path,), f"{first} ({path})")


def _bundled_protoc() -> Protoc | None:
    if importlib.util.find_spec("grpc_tools") is None:
        return None
    return Protoc((sys.executable, "-m", "grpc_tools.protoc"), "grpcio-tools' bundled protoc")


def _node_bins(start: Path) -> list[Path]:
    """``node_modules/.bin`` folders: from ``start`` upwards, then the repo's interop project."""
    out: list[Path] = []
    for d in (start, *start.parents):
        out.append(d / "node_modules" / ".bin")
    repo = Path(__file__).resolve().parents[2]
    out.append(repo / "tests" / "interop" / "js" / "node_modules" / ".bin")
    return out


def find_plugin(names: Sequence[str], cwd: Path | None = None) -> tuple[str, str] | None:
    """The first plugin of ``names`` on PATH or in a ``node_modules/.bin``: ``(name, path)``."""
    for name in names:
        found = shutil.which(name)
        if found:
            return name, found
        for d in _node_bins((cwd or Path.cwd()).resolve()):
            p = d / name
            if p.is_file() and os.access(p, os.X_OK):
                return name, str(p)
    return None


def plan(lang: str, *, protoc: str | None = None, cwd: Path | None = None) -> Plan:
    """Work out how ``lang`` would be compiled here, without running anything."""
    language = LANGUAGES.get(lang)
    if language is None:
        raise ConfigError(f"unknown language {lang!r}; choose one of: {', '.join(sorted(LANGUAGES))}")
    system = _system_protoc(protoc)
    bundled = None if protoc else _bundled_protoc()
    plugin = None
    if language.plugins:
        plugin = find_plugin(language.plugins, cwd)
        chosen = system or bundled  # any protoc runs a plugin
        if plugin is None:
            return Plan(language, chosen, None, language.hint)
        if chosen is None:
            return Plan(language, None, plugin, _PROTOC_HINT)
        return Plan(language, chosen, plugin, None)
    # for Python, the pinned grpcio-tools makes exactly the code committed in iac/wire/_pb
    chosen = (bundled or system) if lang == "python" else system
    if chosen is None:
        return Plan(language, None, None, _PYTHON_HINT if lang == "python" and not protoc else _PROTOC_HINT)
    return Plan(language, chosen, None, None)


# --- compiling ------------------------------------------------------------------------------


def compile_schema(
    lang: str,
    out: str | os.PathLike[str],
    *,
    protoc: str | None = None,
    go_import_path: str = DEFAULT_GO_IMPORT_PATH,
    cwd: Path | None = None,
) -> list[Path]:
    """Generate code for ``lang`` into ``out``; return the files written.

    Raises :class:`ConfigError` with one line naming the missing tool and the
    package that provides it, or protoc's own message when it fails.
    """
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            f"--out {out}: is a file; give a folder for the generated code (created if missing)"
        )
    p = plan(lang, protoc=protoc, cwd=cwd)
    if p.problem is not None or p.protoc is None:
        raise ConfigError(p.problem or _PROTOC_HINT)
    with tempfile.TemporaryDirectory(prefix="iac-proto-") as tmp:
        gen = Path(tmp) / "out"
        gen.mkdir()
        proto = find_proto()
        if proto is not None:
            source = [f"--proto_path={proto.parent}", str(proto)]
        else:
            desc = Path(tmp) / "iac.binpb"
            desc.write_bytes(schema_descriptor_set())
            source = [f"--descriptor_set_in={desc}", PROTO_NAME]
        args = list(p.protoc.argv)
        if p.plugin is not None:
            name, path = p.plugin
            args.append(f"--plugin={name}={path}")
            if name == "protoc-gen-go":
                args += [
                    f"--go_out={gen}",
                    "--go_opt=paths=source_relative",
                    f"--go_opt=M{PROTO_NAME}={go_import_path}",
                ]
            elif name == "protoc-gen-es":
                args += [f"--es_out={gen}", "--es_opt=target=ts"]
            else:
                args += [f"--ts_proto_out={gen}"]
        else:
            args += [f"--{flag}={gen}" for flag in p.language.out_flags]
        try:
            run = subprocess.run([*args, *source], capture_output=True, text=True, timeout=300, check=False)
        except OSError as exc:
            raise ConfigError(f"{args[0]}: cannot run: {exc.strerror}") from None
        if run.returncode != 0:
            lines = (run.stderr or run.stdout).strip().splitlines()
            detail = lines[-1] if lines else f"exit {run.returncode}"
            raise ConfigError(f"protoc failed for {lang}: {detail}")
        written: list[Path] = []
        for f in sorted(gen.rglob("*")):
            if f.is_file():
                dest = out_dir / f.relative_to(gen)
                try:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(f, dest)
                except OSError as exc:
                    raise ConfigError(
                        f"--out {out}: cannot write {dest} ({exc.strerror}); give a writable folder"
                    ) from None
                written.append(dest)
    return written


# --- the CLI verb ---------------------------------------------------------------------------


def _cmd_list(args: argparse.Namespace) -> int:
    proto = find_proto()
    print(f"schema: {proto if proto is not None else 'embedded descriptor (iac.wire._pb.iac_pb2)'}")
    for name in LANGUAGES:
        p = plan(name, protoc=args.protoc)
        if p.problem is None and p.protoc is not None:
            via = p.protoc.description
            if p.plugin is not None:
                via = f"{p.plugin[1]} via {via}"
            print(f"{name:<11} available  {via}")
        else:
            print(f"{name:<11} missing    {p.problem}")
    return 0


def _cmd_compile(args: argparse.Namespace) -> int:
    files = compile_schema(args.lang, args.out, protoc=args.protoc, go_import_path=args.go_import_path)
    for f in files:
        print(f)
    return 0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``proto`` verb to the ``iac`` parser."""
    p = sub.add_parser("proto", help="compile the wire schema (proto/iac.proto) for other languages")
    psub = p.add_subparsers(dest="proto_verb", metavar="ACTION", required=True)

    ls = psub.add_parser("list", help="show which languages can be compiled on this machine")
    ls.add_argument("--protoc", default=None, help="protoc binary to use (default: protoc on PATH)")
    ls.set_defaults(func=_cmd_list)

    c = psub.add_parser("compile", help="generate code for one language")
    c.add_argument("--lang", required=True, choices=sorted(LANGUAGES), help="target language")
    c.add_argument("--out", required=True, help="output folder (created if missing)")
    c.add_argument("--protoc", default=None, help="protoc binary to use (default: protoc on PATH)")
    c.add_argument(
        "--go-import-path",
        default=DEFAULT_GO_IMPORT_PATH,
        help=f"Go import path for iac.proto, 'path;package' (default {DEFAULT_GO_IMPORT_PATH})",
    )
    c.set_defaults(func=_cmd_compile)
