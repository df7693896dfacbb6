"""What user code relies on to type-check strictly: TaskState, ``ctx.task``, ``stream``, ``expose``.

The guides' examples run under ``mypy --strict`` (tests/test_guides.py); these tests hold the run
time side of the same promises, and one mypy run checks a small agent that uses them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import iac
from iac.wire._pb import iac_pb2

ROOT = Path(__file__).resolve().parent.parent


def test_task_state_is_the_protobuf_class_and_takes_the_python_intent() -> None:
    assert iac.TaskState is iac_pb2.TaskState is iac.wire.TaskState
    task = iac.TaskState(task_id="t", intent=iac.Intent.PROVIDE_INFO, step=1, steps=2)
    assert task.intent == iac.Intent.PROVIDE_INFO == iac_pb2.PROVIDE_INFO


def test_ctx_task_is_the_envelope_and_a_message_without_one_says_how_to_check() -> None:
    async def main() -> None:
        async with iac.Node(listen="tls://127.0.0.1:0") as bob, iac.Node() as alice:
            seen: list[object] = []

            @bob.on("RUN")
            def run(ctx: iac.Context) -> str:
                seen.append(ctx.has_task)
                if ctx.has_task:
                    return ctx.task.task_id
                with pytest.raises(iac.ConfigError, match=r"RUN message carries no task; check ctx.has_task"):
                    ctx.task  # noqa: B018
                return "none"

            alice.add_peer(bob.agent_id, *bob.addresses)
            task = iac.TaskState(task_id="t-1", intent=iac.Intent.ASSIGN_TASK, step=1, steps=1)
            assert (await alice.request(bob.agent_id, "RUN", timeout=5)).payload == "none"
            assert (await alice.request(bob.agent_id, "RUN", timeout=5, task=task)).payload == "t-1"
            assert seen == [False, True]

    asyncio.run(main())


AGENT = """
import asyncio
import contextlib
from collections.abc import AsyncIterator

import iac


async def main(node: iac.Node, peer: str) -> None:
    @node.on(iac.MessageType.DELEGATE_TASK)
    def take(ctx: iac.Context) -> str:
        task: iac.TaskState = ctx.task
        return task.task_id

    @node.on(iac.MessageType.RUN)
    async def parts(ctx: iac.Context) -> AsyncIterator[int]:
        yield 1

    @node.expose
    def add(a: int, b: int = 0) -> int:
        return a + b

    @node.expose("shout")
    async def shout(text: str) -> str:
        return text.upper()

    reveal_type(add)
    reveal_type(shout)
    total: int = add(1, b=2)
    unsubscribe = node.on_file(lambda f: None)
    unsubscribe()
    task = iac.TaskState(task_id="t", intent=iac.Intent.ASSIGN_TASK, step=1, steps=1, state_ref="r")
    await node.delegate(peer, task, {}, timeout=1)
    async with contextlib.aclosing(node.stream(peer, "RUN", timeout=1)) as stream:
        async for part in stream:
            reveal_type(part)
"""


def test_a_small_agent_passes_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
         str(tmp_path / "agent.py")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert 'Revealed type is "iac.node.types.Reply"' in out.stdout, out.stdout
    # expose keeps the function's type (a decorator that returned Any lost it); mypy writes
    # builtins.int or int, by version
    revealed = out.stdout.replace("builtins.", "")
    assert 'Revealed type is "def (a: int, b: int =) -> int"' in revealed, out.stdout
    assert 'Revealed type is "def (text: str) -> typing.Coroutine[Any, Any, str]"' in revealed, out.stdout
    assert "error" not in out.stdout.replace("Revealed", ""), out.stdout
