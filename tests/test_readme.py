"""Every README block marked ``<!-- example: NAME -->`` runs as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)


#: What each example prints (a part of it).
EXPECTED = {
    "node": "{'summary': 'Q3 revenue g', 'has_deadline': True}",
    "codec": 'payload_json: "{\\"name\\": \\"summarize\\", \\"args\\": [\\"q3 report\\"]}"',
    "call": "42",
    "delegate": "'accepted': 't-7'",
    "mesh": "True\nHI\nTrue\nHI!",
    "relay": "True 2",
    "broadcast": "True",
    "files": "report.pdf 1080000 True",
    "metrics": 'iac_handled_total 3.0\niac_connections_by_transport{transport="tls"} 1.0',
    "tracing": "['iac handle RUN', 'iac request RUN', 'plan'] 1",
    "a2a": "hello <alice>: hi",
    "nat": "relayed True direct\nHI direct",
}


def examples() -> dict[str, str]:
    return dict(_BLOCK.findall(README.read_text()))


def test_readme_has_examples():
    assert {"codec", "node", "call", "delegate", "mesh"} <= set(examples())


def test_every_example_has_its_expected_output():
    assert set(examples()) == set(EXPECTED)


@pytest.mark.parametrize("name", ["node", "call", "delegate", "relay", "broadcast", "files"])
def test_node_examples_are_under_20_lines(name):
    lines = [line for line in examples()[name].splitlines() if line.strip()]
    assert len(lines) < 20, len(lines)


@pytest.mark.parametrize("name", sorted(examples()))
def test_readme_example_runs(name, tmp_path):
    code = examples()[name]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert EXPECTED[name] in out.stdout, out.stdout
