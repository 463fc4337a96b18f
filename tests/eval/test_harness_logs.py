"""An evaluation inside a Prefect flow leaves the flow's log with the flow's own lines only.

lm-eval's progress bars write to stderr (the terminal); the library prints under it (dill's
disassembly while datasets fingerprints a task's table) reached the log through Prefect's
`log_prints` until `eval.harness.terminal_prints` gave `print` back its stream.
"""

from __future__ import annotations

import asyncio
import builtins
import dis
import io
import re
import sys
import time

from stagewise.eval.harness import run_tasks, terminal_prints

# What must never be in a flow run's log: a tqdm frame, a rate, a bytecode listing.
NOISE = re.compile(r"\d+%\||it/s|s/it|Running \w+ requests|LOAD_(GLOBAL|FAST|ATTR)|RETURN_VALUE")


def test_terminal_prints_writes_where_print_was_aimed(monkeypatch, capsys):
    logged = []
    monkeypatch.setattr(builtins, "print", lambda *a, **k: logged.append(a))  # an orchestrator's swap
    buffer = io.StringIO()
    with terminal_prints():
        print("to stdout", 1, sep="-")
        print("to a file", file=buffer, end="!")
        saved, sys.stdout = sys.stdout, io.StringIO()  # what dill's capture('stdout') does
        try:
            dis.dis(compile("x = y", "<t>", "exec"))
            captured = sys.stdout.getvalue()
        finally:
            sys.stdout = saved
    print("after")  # the swap is back
    assert capsys.readouterr().out == "to stdout-1\n"
    assert buffer.getvalue() == "to a file!"
    assert "LOAD_NAME" in captured and "(y)" in captured
    assert logged == [("after",)]


def _flow_logs(flow_run_id) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read():
        async with get_client() as client:
            return await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))

    return [log.message for log in asyncio.run(read())]


def test_a_flow_run_log_holds_no_progress_bars_or_library_chatter(tiny_lm):
    from prefect import flow, get_run_logger
    from prefect.context import get_run_context

    import stagewise  # noqa: F401  (the import root sets the project's Prefect settings)

    model, tokenizer = tiny_lm

    @flow(name="harness-logs", log_prints=True)  # as the stage flows are declared
    def evaluate():
        get_run_logger().info("stage line: evaluating")
        result = run_tasks(model, tokenizer, ["world_arithmetic", "world_compare_mc"], limit=3, batch_size=8)
        get_run_logger().info("stage line: %d metrics", len(result.metrics))
        return get_run_context().flow_run.id

    flow_run_id = evaluate()
    messages = []
    for _ in range(20):  # logs reach the API in batches
        messages = _flow_logs(flow_run_id)
        if any("metrics" in m for m in messages):
            break
        time.sleep(0.5)
    assert "stage line: evaluating" in messages and "stage line: 3 metrics" in messages
    noisy = [m for m in messages if NOISE.search(m)]
    assert not noisy, noisy[:5]
