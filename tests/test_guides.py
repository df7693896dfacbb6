"""Every example in docs/guides runs as written and passes ``mypy --strict``.

An example is a block marked ``<!-- example: NAME -->`` (as in the README: tests/test_readme.py);
``EXPECTED`` holds a part of what each prints. The type check is one mypy run over all of them,
with the project's configuration.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ROOT / "docs" / "guides"
#: One guide per task a user has; each has at least one example.
TASKS = ("first-agent", "streaming", "mesh", "files", "a2a", "mcp", "operations", "nat")
_BLOCK = re.compile(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)

#: What each example prints (a part of it).
EXPECTED = {
    "first-agent": "{'summary': 'Q3 revenue', 'from_alice': True}",
    "first-agent-call": "42\nno_handler",
    "first-agent-delegate": "{'accepted': 't-7', 'step': 1, 'of': 3}",
    "first-agent-codec": 'payload_json: "{\\"name\\": \\"summarize\\", \\"args\\": [\\"q3 report\\"]}"',
    "streaming": "[0, 1, 2, 3]",
    "streaming-cancel": "stopped True",
    "mesh": "True\nHI\nTrue\nHI!",
    "mesh-relay": "True 2",
    "mesh-broadcast": "True",
    "files": "report.pdf 1080000 True True",
    "a2a": "hello <alice>: hi",
    "mcp": "True",
    "operations-metrics": "['iac_handled_total 3.0']",
    "operations-tracing": "['iac handle RUN', 'iac request RUN', 'plan'] 1",
    "operations-ca": "ok\nrefused",
    "operations-dictionary": "c-7\nTrue",
    "nat": "relayed True direct\nHI direct",
}


def examples() -> dict[str, str]:
    found: dict[str, str] = {}
    for task in TASKS:
        for name, code in _BLOCK.findall((GUIDES / f"{task}.md").read_text(encoding="utf-8")):
            assert name not in found, f"two examples are named {name}"
            found[name] = code
    return found


def test_there_is_a_guide_per_task_with_an_example() -> None:
    assert sorted(p.stem for p in GUIDES.glob("*.md")) == sorted(TASKS)
    for task in TASKS:
        assert _BLOCK.search((GUIDES / f"{task}.md").read_text(encoding="utf-8")), task


def test_every_example_has_its_expected_output() -> None:
    assert set(examples()) == set(EXPECTED)


def test_the_guides_lines_fit_100_characters() -> None:
    long = [
        f"{p.name}:{i}"
        for p in sorted(GUIDES.glob("*.md"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > 100
    ]
    assert not long, long


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_guide_example_runs(name: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", examples()[name]], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert EXPECTED[name] in out.stdout, out.stdout


def test_guide_examples_pass_mypy_strict(tmp_path: Path) -> None:
    files = []
    for name, code in examples().items():
        path = tmp_path / f"guide_{name.replace('-', '_')}.py"
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"), *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
