"""End to end: a real `prefect server`, `stagewise serve`, and runs triggered as the UI's Run button does.

The test starts `prefect server start` on 127.0.0.1 (a free port, its own PREFECT_HOME) and
`stagewise serve` against it, both as subprocesses stopped when the module ends, then talks to
the server through the Prefect client (`run_deployment` is what the Run button calls):

- serve registers the pipeline, the weekly and the per-stage deployments, with the stages form;
- the weekly deployment has its next runs scheduled by the server;
- a value outside the form (an unknown stage) is refused by the server, naming the field;
- bad parameters that pass the form (a bad override, a stage the recipe lacks) fail the flow
  run with the located message `stagewise run` prints, and nothing is written to the workdir;
- a form past the operator's boundary (`serve --recipe-root/--allow-set`: a launch, an outside
  MLflow store, a data path, a recipe elsewhere) fails the flow run naming it, before any work;
- a two-stage run (pretrain,merge on a tiny budget) completes, its closing table is an artifact
  of the flow run, and its MLflow runs exist, tagged with the pipeline's Prefect flow run.
- that run in the Prefect UI, rendered by headless Chromium: the pipeline flow run's Artifacts tab
  lists the closing table and the MLflow link, the closing table's page shows each stage's row (its
  metric, its MLflow run) and the link to the pipeline's MLflow run; the screenshots are kept.
- the deployment's Run page in the Prefect UI, rendered by headless Chromium (Debian's package),
  shows the parameter form with its recipe and stages fields; the screenshot is kept.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.servers import chromium_page, prefect_server, stop, tail

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "recipes" / "tiny.yaml"
BIN = Path(sys.executable).parent
STAGES = ["pretrain", "merge", "long_context", "sft", "rl", "distill", "quantize"]
NAMES = {"pipeline", "weekly", *STAGES, "promote", "nightly-eval", "ablate", "data-build"}
SMALL = [  # 16 steps of 2048 tokens, two checkpoints, one 2-checkpoint merge window
    "stages.pretrain.tokens=32768", "stages.pretrain.global_batch=8", "stages.pretrain.micro_batch=8",
    "stages.pretrain.checkpoint_every_tokens=16384", "stages.pretrain.schedule.warmup_tokens=4096",
    "stages.pretrain.val_tokens=8192", "stages.merge.windows_tokens=[16384]", "stages.merge.val_tokens=8192",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Prefect server on a free port, the UI served (the run form test opens it): (api url, client env)."""
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as started:
        yield started


@pytest.fixture(scope="module")
def client_settings(server):
    """This process's Prefect client pointed at the test server (settings are read once at import)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server[0]}):
        yield


def _deployments() -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags

    async def read() -> dict:
        async with get_client() as client:
            found = await client.read_deployments(deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=["stagewise"])))
            return {d.name: d for d in found}

    return asyncio.run(read())


ALLOWED = ["workdir", "stages.pretrain.**", "stages.merge.**"]
"""What the served forms may set beyond the default knobs: the tests' own workdirs and small budgets."""


@pytest.fixture(scope="module")
def team_recipes(tmp_path_factory) -> Path:
    """A --recipe-root: the directory of recipes the team's forms may name besides the shipped ones."""
    return tmp_path_factory.mktemp("team-recipes")


@pytest.fixture(scope="module")
def served(server, client_settings, tmp_path_factory, team_recipes):
    """`stagewise serve --recipe recipes/tiny.yaml` with the team's recipe root and the ALLOWED keys open,
    run from another directory, until the module ends."""
    cwd = tmp_path_factory.mktemp("serve")
    log = cwd / "serve.log"
    env = dict(server[1], PREFECT_RUNNER_POLL_FREQUENCY="1")
    boundary = ["--recipe-root", str(team_recipes), *(a for key in ALLOWED for a in ("--allow-set", key))]
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "stagewise"), "serve", "--recipe", str(TINY), *boundary], env=env, cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while set(_deployments()) != NAMES:
            assert proc.poll() is None and time.monotonic() < deadline, "stagewise serve did not register:\n" + tail(log)
            time.sleep(1)
        yield log
    finally:
        stop(proc)


def _trigger(served: Path, deployment: str, parameters: dict, timeout: float = 600):
    """A flow run of `stagewise-recipe/<deployment>` as the UI's Run button makes it, followed to its end."""
    from prefect.deployments import run_deployment

    run = run_deployment(f"stagewise-recipe/{deployment}", parameters=parameters, poll_interval=1, timeout=timeout)
    assert run.state.is_final(), f"{run.state!r} after {timeout} s\n" + tail(served)
    return run


@pytest.mark.slow
def test_serve_registers_the_deployments_with_the_stages_form(served):
    found = _deployments()
    assert set(found) == NAMES
    stages = found["pipeline"].parameter_openapi_schema["properties"]["stages"]
    items = [s for s in stages["anyOf"] if s.get("type") == "array"][0]["items"]
    assert items["enum"] == STAGES
    assert found["merge"].parameters["stages"] == ["pretrain", "merge"]
    assert all(d.parameters["recipe"] == str(TINY) for name, d in found.items() if name != "promote")
    assert found["promote"].parameters["stage"] == "pretrain"  # the cutoff-promotion job, run from the UI


@pytest.mark.slow
def test_the_weekly_deployment_has_its_next_run_scheduled(served):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateName,
    )

    weekly = _deployments()["weekly"]
    assert [s.schedule.cron for s in weekly.schedules] == ["0 3 * * 0"]

    async def scheduled() -> list:
        async with get_client() as client:
            return await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[weekly.id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(name=FlowRunFilterStateName(any_=["Scheduled"]))))

    deadline = time.monotonic() + 60  # the server's scheduler looks at new deployments every few seconds
    while not (runs := asyncio.run(scheduled())):
        assert time.monotonic() < deadline, "no scheduled run of the weekly deployment"
        time.sleep(2)
    first = min(r.expected_start_time for r in runs)
    from datetime import datetime, timedelta, timezone

    now = datetime.now(timezone.utc)
    assert now < first <= now + timedelta(days=7) and first.weekday() == 6 and (first.hour, first.minute) == (3, 0)


@pytest.mark.slow
def test_a_stage_outside_the_form_is_refused_by_the_server(served):
    from prefect.deployments import run_deployment

    with pytest.raises(Exception, match=r"stages\[0\].*'pretrian' is not one of"):
        run_deployment("stagewise-recipe/pipeline", parameters={"stages": ["pretrian"]}, timeout=0)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["bad override", "stage the recipe lacks"])
def test_bad_parameters_fail_the_flow_run_with_the_located_message_and_train_nothing(served, tmp_path, case,
                                                                                     team_recipes):
    workdir = tmp_path / "w"
    if case == "bad override":
        params = {"stages": ["pretrain"], "overrides": [f"workdir={workdir}", "stages.pretrain.tokenz=5"]}
        where = "stages.pretrain.tokenz: unknown key; did you mean tokens? (--set stages.pretrain.tokenz=5)"
    else:
        recipe = team_recipes / "no_sft.yaml"
        recipe.write_text(f"base: {TINY}\nstages:\n  sft: null\n  distill: null\n")  # distill starts from sft
        params = {"recipe": str(recipe), "stages": ["pretrain", "sft"], "overrides": [f"workdir={workdir}"]}
        where = "--stages: the recipe has no stages.sft block"
    run = _trigger(served, "pipeline", params, timeout=180)
    assert run.state.is_failed(), run.state
    assert "BadInput" in run.state.message and where in run.state.message, run.state.message
    assert not workdir.exists()  # no stage directory, no MLflow store: nothing started


@pytest.mark.slow
@pytest.mark.parametrize("case", ["launch image", "outside MLflow", "data path", "recipe elsewhere"])
def test_a_form_asking_past_the_operators_boundary_fails_before_any_work_naming_it(served, tmp_path, case):
    workdir = tmp_path / "w"
    params = {"stages": ["sft"], "overrides": [f"workdir={workdir}"]}
    if case == "launch image":
        params["overrides"] += ["stages.sft.engine=megatron", "stages.sft.launch={env: {image: evil/image}}"]
        where = "overrides: stages.sft.engine may not be set from a form"
    elif case == "outside MLflow":
        params["overrides"].append("tracking.uri=http://outside.example:5000")
        where = "overrides: tracking.uri may not be set from a form"
    elif case == "data path":
        params["overrides"].append("stages.sft.data.sources[0].path=/etc/shadow")
        where = "overrides: stages.sft.data.sources[0].path may not be set from a form"
    else:
        elsewhere = tmp_path / "mine.yaml"  # not under a --recipe-root
        elsewhere.write_text(f"base: {TINY}\n")
        params["recipe"] = str(elsewhere)
        where = f"recipe: {elsewhere.resolve()} is outside the directories this server serves recipes from"
    run = _trigger(served, "pipeline", params, timeout=180)
    assert run.state.is_failed() and where in run.state.message, run.state.message
    assert not workdir.exists()  # refused in the flow run, before the recipe was even read


@pytest.fixture(scope="module")
def two_stage(served, tmp_path_factory):
    """One two-stage run (pretrain,merge on a tiny budget) triggered as the Run button does, shared by the
    tests that read it (its MLflow runs, its page in the UI): (flow run, workdir)."""
    workdir = tmp_path_factory.mktemp("two-stage") / "w"
    started = time.monotonic()
    run = _trigger(served, "pipeline", {"stages": ["merge", "pretrain"], "overrides": [f"workdir={workdir}", *SMALL]})
    print(f"two-stage run: {time.monotonic() - started:.0f} s")
    return run, workdir


def _pipeline_runs(run) -> list:
    """The completed pipeline subflow runs under the deployment's flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    async def subflows() -> list:
        async with get_client() as client:
            return await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))

    return [f for f in asyncio.run(subflows()) if f.state.is_completed()]


def _artifacts(ids: list) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def read() -> list:
        async with get_client() as client:
            return await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))

    return asyncio.run(read())


@pytest.mark.slow
def test_a_two_stage_run_from_the_api_completes_and_its_mlflow_runs_exist(served, two_stage):
    from mlflow import MlflowClient

    run, workdir = two_stage
    assert run.state.is_completed(), f"{run.state!r}\n" + tail(served)
    pipeline = _pipeline_runs(run)
    assert pipeline, "no completed pipeline subflow under the deployment's flow run"
    table = [a for a in _artifacts([run.id, *(f.id for f in pipeline)]) if a.key == "stagewise-closing-table"]
    # on the pipeline run's page, and on the page the Run button opens (the deployment's own flow run)
    assert sorted(str(a.flow_run_id) for a in table) == sorted([str(run.id), str(pipeline[0].id)]), table
    assert all("pretrain" in a.data and "merge" in a.data for a in table)
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("prefect.flow_run_id") in {str(f.id) for f in pipeline}]
    assert len(parents) == 1, [r.data.tags for r in runs]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert {r.data.tags.get("stagewise.stage") for r in children} >= {"pretrain", "merge"}
    assert all(r.info.status == "FINISHED" for r in [*parents, *children])
    assert {p.name.rsplit("-", 1)[0] for p in (workdir / "stages").iterdir() if p.is_dir()} == {"pretrain", "merge"}


@pytest.mark.slow
def test_the_pipeline_runs_closing_table_and_mlflow_link_render_in_the_prefect_ui(server, served, two_stage, tmp_path,
                                                                                 tmp_path_factory):
    """A person opening the two-stage run in the Prefect UI, rendered by headless Chromium: the page the
    Run button opens (the deployment's flow run) lists the closing table and the MLflow link in its
    Artifacts tab, as the pipeline's flow run does; the closing table's page shows the table (a row per
    stage with its metric and MLflow run id, linked to the run's page) and links the pipeline's MLflow
    run, as does the link's page. What is looked for comes from the MLflow store and the stages' code,
    not from the artifacts."""
    from html import unescape

    from mlflow import MlflowClient

    from stagewise.flows import merge, pretrain
    from tests.eval.test_pipeline_report_browser import _chromium

    browser = _chromium()
    run, workdir = two_stage
    assert run.state.is_completed(), f"{run.state!r}\n" + tail(served)
    pipeline = {f.id: f for f in _pipeline_runs(run)}
    arts = _artifacts([run.id, *pipeline])
    for owner in (*pipeline, run.id):  # the pipeline's flow run, and the deployment's (the Run button's page)
        assert {a.key for a in arts if a.flow_run_id == owner} >= {"stagewise-closing-table", "stagewise-mlflow-run"}
    found = {a.key: a for a in arts if a.flow_run_id in pipeline}
    table, link = found["stagewise-closing-table"], found["stagewise-mlflow-run"]
    owner = table.flow_run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny")
    runs = client.search_runs([experiment.experiment_id])
    parent = [r.info.run_id for r in runs if r.data.tags.get("prefect.flow_run_id") == str(owner)]
    assert len(parent) == 1, [r.data.tags for r in runs]
    stage_runs = {r.data.tags.get("stagewise.stage"): r.info.run_id for r in runs
                  if r.data.tags.get("mlflow.parentRunId") == parent[0]}
    mlflow_page = f"/#/experiments/{experiment.experiment_id}/runs/{parent[0]}"
    ui = server[0].removesuffix("/api")

    # the page the Run button opens (the deployment's flow run), its Artifacts tab; the default UI resets ?tab=
    # to Logs while the run loads, the V2 UI keeps it
    html = chromium_page(browser, f"{ui}/v2/runs/flow-run/{run.id}?tab=Artifacts", tmp_path,
                          tmp_path / "prefect_ui_flow_run_artifacts.png")
    (tmp_path / "flow_run_artifacts.html").write_text(html)
    assert f"<title>Flow Run: {run.name} " in html, "no flow run page in the DOM"
    for artifact in arts:
        if artifact.flow_run_id == run.id and artifact.key.startswith("stagewise-"):
            assert f'href="/v2/artifacts/artifact/{artifact.id}"' in html and f">{artifact.key}<" in html, artifact.key

    # the pipeline's closing table's page (the default UI), as the tab's card opens it
    shot = tmp_path / "prefect_ui_closing_table.png"
    html = chromium_page(browser, f"{ui}/artifacts/artifact/{table.id}", tmp_path, shot)
    (tmp_path / "closing_table.html").write_text(html)
    assert "<title>Artifact: stagewise-closing-table " in html, "no artifact page in the DOM"
    assert f'href="/runs/flow-run/{owner}"' in html  # it names the pipeline's flow run, a link back to its page
    text = lambda cell: " ".join(unescape(re.sub(r"<[^>]+>", " ", cell)).split())  # noqa: E731
    tables = re.findall(r"<table[^>]*>(.*?)</table>", html, re.S)
    assert len(tables) == 1, "no rendered table on the artifact's page"
    lines = [[text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, re.S)]
             for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", tables[0], re.S)]
    assert lines[0] == ["stage", "metric", "before -> after", "tokens", "time", "MLflow run"], lines
    rows = {line[0]: line for line in lines[1:]}
    assert set(rows) == {"pretrain", "merge"}, lines
    assert rows["pretrain"][1] == pretrain.TARGET and rows["merge"][1] == merge.TARGET, lines
    assert all(rows[stage][-1] == stage_runs[stage] for stage in rows), (lines, stage_runs)
    for stage, run_id in stage_runs.items():  # each stage's MLflow run id links to its run's page
        if stage in rows:
            page = f"/#/experiments/{experiment.experiment_id}/runs/{run_id}"
            assert re.search(rf'<a href="[^"]*{re.escape(page)}\?workflowType=machine_learning"[^>]*>{run_id}</a>',
                             html), page
    assert re.search(rf'<a href="[^"]*{re.escape(mlflow_page)}\?workflowType=machine_learning"[^>]*>the pipeline\'s run</a>',
                     html), mlflow_page

    # the MLflow link's own page
    html = chromium_page(browser, f"{ui}/artifacts/artifact/{link.id}", tmp_path)
    assert re.search(rf'<a href="[^"]*{re.escape(mlflow_page)}\?workflowType=machine_learning"[^>]*>MLflow run {parent[0]}</a>',
                     html), mlflow_page
    for png in (shot, tmp_path / "prefect_ui_flow_run_artifacts.png"):
        kept = tmp_path_factory.getbasetemp() / png.name
        shutil.copyfile(png, kept)
        print(f"prefect UI screenshot: {kept}")


@pytest.mark.slow
def test_the_ui_run_page_renders_the_parameter_form_in_chromium(server, served, tmp_path, tmp_path_factory):
    from tests.eval.test_pipeline_report_browser import _chromium

    browser = _chromium()
    # the page the deployment's Run button opens; the UI is served next to the API, at the server's root
    url = f"{server[0].removesuffix('/api')}/deployments/deployment/{_deployments()['pipeline'].id}/run"
    # 60 s of the page's virtual time (seconds of wall time): its requests answer and the form fades fully in
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,1600",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=60000"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=90)
    html = dom.stdout
    (tmp_path / "run_form.html").write_text(html)
    assert "<title>Create Flow Run for Deployment: pipeline" in html, f"no run page in the DOM\n{dom.stderr[-2000:]}"
    labels = re.findall(r'class="schema-form-property__label">([^<]*)<', html)  # the form's fields, as rendered
    assert labels[:2] == ["recipe", "stages (Optional)"], labels
    shot = tmp_path / "prefect_ui_form.png"
    proc = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=90)
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    kept = tmp_path_factory.getbasetemp() / "prefect_ui_form.png"
    shutil.copyfile(shot, kept)
    print(f"prefect UI run form screenshot: {kept}")



@pytest.mark.slow
def test_serve_with_a_pool_registers_the_deployments_on_a_process_work_pool(server, client_settings, tmp_path):
    """The work-pool form: `stagewise serve --pool NAME` makes a process pool when missing, puts every
    deployment on it and exits, naming the worker command (last in this module: it moves the
    deployments that the served runner registered onto the pool)."""
    from prefect import get_client

    proc = subprocess.run([str(BIN / "stagewise"), "serve", "--recipe", str(TINY), "--pool", "stagewise-test"],
                          env=server[1], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "prefect worker start --pool stagewise-test" in proc.stdout
    found = _deployments()
    assert set(found) == NAMES and {d.work_pool_name for d in found.values()} == {"stagewise-test"}
    from stagewise.recipe.form_policy import DEFAULT_ALLOWED, POLICY_ENV, FormPolicy

    for d in found.values():  # the pool's workers read the boundary from each job's environment
        policy = FormPolicy.model_validate_json(d.job_variables["env"][POLICY_ENV])
        assert str(TINY.parent.resolve()) in policy.recipe_roots and policy.allowed == list(DEFAULT_ALLOWED)
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("stagewise-test").type == "process"
