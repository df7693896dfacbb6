"""A griffe extension for the API reference: Sphinx roles as Markdown code; protobuf comments.

The docstrings are written for ``help()`` and read as plain text there, with Sphinx roles
(``:class:`Node```, ``:meth:`~iac.Node.send```) marking names. Markdown has no roles, so the
reference would show the role text; this extension keeps the name in code spans instead
(``Node``, ``send``; the ``~`` form keeps the last part, as Sphinx would show it).

The protobuf classes in ``iac.wire._pb`` are generated, without docstrings; their documentation
is the comment above each ``message`` in proto/iac.proto, which becomes the class's docstring.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import griffe

PROTO = Path(__file__).resolve().parents[2] / "proto" / "iac.proto"
GENERATED = "iac.wire._pb.iac_pb2"
_DEFINITION = re.compile(r"^(?:message|enum) (\w+)")
_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|ref):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def strip_roles(text: str) -> str:
    """``text`` with every Sphinx role written as a Markdown code span."""
    return _ROLE.sub(_code, text)


@functools.cache
def proto_comments(path: Path = PROTO) -> dict[str, str]:
    """The comment lines right above each top-level ``message`` or ``enum`` of the schema, by name."""
    found: dict[str, str] = {}
    comment: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("//"):
            comment.append(line[2:].strip())
            continue
        definition = _DEFINITION.match(line)
        if definition and comment:
            found[definition.group(1)] = " ".join(comment)
        comment = []
    return found


class SphinxRolesAsCode(griffe.Extension):
    """Rewrites each loaded object's docstring (:func:`strip_roles`)."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.is_class and obj.module.path == GENERATED and obj.docstring is None:
            text = proto_comments().get(obj.name)
            if text:
                obj.docstring = griffe.Docstring(
                    f"The protobuf ``iac.{obj.name}`` (proto/iac.proto): {text}", parent=obj
                )
        if obj.docstring is not None:
            obj.docstring.value = strip_roles(obj.docstring.value)
