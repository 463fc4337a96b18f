"""What a person sees of a pipeline run in the Prefect UI, read through the API the UI reads."""

from __future__ import annotations

import asyncio


def from_prefect(flow_run_id: str, what: str) -> list:
    """The task runs (`what="tasks"`), log lines ("logs"), artifacts ("artifacts") or stage flow runs
    ("stages") of a pipeline flow run and its stage subflows."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
    )

    async def read() -> list:
        async with get_client() as client:
            children = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
            ids = [flow_run_id, *(str(f.id) for f in children)]
            if what == "stages":
                return children
            if what == "tasks":
                return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            if what == "artifacts":
                return await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
            return await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))

    return asyncio.run(read())


def stage_edges(flow_run_id: str) -> dict[str, set[str]]:
    """Each stage -> the stages its edges in the flow-run graph come from: the earlier stage runs whose
    results it was given. Prefect records them as the `upstream` input of the stage's parent task run
    (named `<stage>-<n>`), each as the run that returned the object: the stage's flow run, or a task
    run inside it."""
    stages = from_prefect(flow_run_id, "stages")
    tasks = {t.id: t for t in from_prefect(flow_run_id, "tasks")}
    stage_of_flow = {f.id: tasks[f.parent_task_run_id].name.rsplit("-", 1)[0] for f in stages}
    stage_of_flow |= {f.parent_task_run_id: name for f in stages for name in [stage_of_flow[f.id]]}

    def stage_of(run_id) -> str:
        if run_id in stage_of_flow:  # a stage's flow run, or the task run that stands for it in the pipeline
            return stage_of_flow[run_id]
        return stage_of_flow[tasks[run_id].flow_run_id]  # a task run inside a stage's flow run

    return {stage_of_flow[f.id]: {stage_of(i.id) for i in tasks[f.parent_task_run_id].task_inputs["upstream"]}
            for f in stages}
