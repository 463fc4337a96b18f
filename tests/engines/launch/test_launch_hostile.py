"""Hostile strings in every launch field: refused naming the field, or rendered into a launch that runs
exactly the intended commands and nothing else.

Each admitted value is rendered for the local, Slurm and Kubernetes launches and checked as the target
reads it: argv lists compared whole; the sbatch script `bash -n`-parsed, its #SBATCH header parsed as
sbatch splits it, then run under stand-in `scontrol` / `srun` with nothing else on PATH (an injected
command fails "not found" and is seen in stderr), srun's argv compared whole; the Kubernetes manifest
loaded as YAML and its launch script run under a stand-in `kubectl`, each call's argv compared whole.
The stand-ins are for the cluster tools, which need a cluster; bash and the YAML parser are real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from stagewise.engines.config import LaunchConfig
from stagewise.engines.launch.plans import job_name, plan_launch
from stagewise.recipe import RecipeError, load_recipe

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"
IMAGE = "nvcr.io/nvidia/nemo:26.08"
ENTRY = ["python", "scripts/training/run_recipe.py", "--recipe", "r", "logger.wandb_exp_name=$(touch pwned)\n;x"]
HOSTILE = ["batch\ntouch pwned", "x; touch pwned", "$(touch pwned)", "`touch pwned`", "a b", "--privileged",
           "a,/:/host", "/a:/b,/:/host", "it's \"quoted\"", "tab\there", "nul\x00", "back\\slash", "", "-",
           "trailing\r", "ok/../x", "/opt/My Venv/$HOME", "/opt/venv;rm", "UNLIMITED", "1-00:00:00", "gpu,gpu-long"]
FIELDS = {
    "env.image": lambda v: {"env": {"image": v}},
    "env.venv": lambda v: {"env": {"venv": v}},
    "env.workdir": lambda v: {"env": {"image": IMAGE, "workdir": v}},
    "slurm.partition": lambda v: {"slurm": {"partition": v}},
    "slurm.account": lambda v: {"slurm": {"account": v}},
    "slurm.time": lambda v: {"slurm": {"time": v}},
    "slurm.container_mounts[0]": lambda v: {"slurm": {"container_mounts": [v]}},
    "kubernetes.namespace": lambda v: {"kubernetes": {"namespace": v}},
    "kubernetes.volume_claim": lambda v: {"kubernetes": {"volume_claim": v}},
}
CASES = [(f, v) for f in FIELDS for v in HOSTILE]


def _config(field: str, value: str) -> LaunchConfig:
    raw = {"env": {"image": IMAGE}, "gpus_per_node": 1, **FIELDS[field](value)}
    return LaunchConfig.model_validate(raw)


def _loc(error: ValidationError) -> set[str]:
    return {".".join(str(p) for p in e["loc"]).replace(".0", "[0]") for e in error.errors()}


def _tools(tmp_path: Path, names: dict[str, str]) -> dict[str, str]:
    """A PATH of only these stand-ins (python scripts recording their argv to <name>.jsonl)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, reply in names.items():
        (bin_dir / name).write_text(textwrap.dedent(f"""\
            #!{sys.executable}
            import json, sys
            with open({str(tmp_path / (name + ".jsonl"))!r}, "a") as f:
                f.write(json.dumps(sys.argv[1:]) + "\\n")
            sys.stdout.write({reply!r})
            """))
        (bin_dir / name).chmod(0o755)
    return {"PATH": str(bin_dir), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "HOME": str(tmp_path)}


def _calls(tmp_path: Path, name: str) -> list[list[str]]:
    log = tmp_path / f"{name}.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _run(script: list[str], tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stderr == "" and not list(tmp_path.rglob("pwned")), proc.stderr  # nothing else ran
    return proc


SBATCH_LINE = re.compile(r"#SBATCH (--[a-z-]+)(?:=(\S+))?")


def _header(text: str) -> dict[str, str]:
    """The #SBATCH options as sbatch reads them: each line one option, its value one word."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            m = SBATCH_LINE.fullmatch(line)
            assert m, f"an #SBATCH line sbatch would split or misread: {line!r}"
            out[m.group(1)] = m.group(2) or ""
    return out


@pytest.mark.parametrize("field,value", CASES, ids=[f"{f}={v!r}" for f, v in CASES])
def test_a_hostile_launch_string_is_refused_or_runs_only_the_intended_commands(field, value, tmp_path):
    try:
        launch = _config(field, value)
    except ValidationError as e:
        assert _loc(e) == {field}, e  # refused, naming the field (the loader adds the file and line)
        return
    run = str(tmp_path / "run")
    image, venv = launch.env.image, launch.env.venv
    workdir = launch.env.workdir or run
    sb, k8s = launch.slurm, launch.kubernetes

    # local: one argv, compared whole
    local = plan_launch(launch, ENTRY, run, style="torchrun", env={"MLFLOW_RUN_ID": value or "x"})
    torchrun = [f"{os.path.abspath(venv)}/bin/torchrun" if venv else "torchrun",
                "--standalone", "--nnodes=1", "--nproc-per-node=1", *ENTRY[1:]]
    if venv:
        assert local.argv == torchrun and local.cwd == workdir
    else:
        assert local.argv == ["docker", "run", "--rm", "--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1",
                              "--ulimit", "stack=67108864", "-v", f"{run}:{run}", "-w", workdir,
                              "-e", "MLFLOW_RUN_ID", image, *torchrun]
        assert not image.startswith("-")  # docker reads its first word that is no option as the IMAGE

    # slurm: the header as sbatch reads it, then the script under stand-in srun / scontrol
    slurm = launch.model_copy(update={"scheduler": "slurm"})
    plan = plan_launch(slurm, ENTRY, run, style="torchrun", name="mb-train", env={"MLFLOW_RUN_ID": value},
                       job="mb-train-0123456789")
    (script_path, text), = plan.files.items()
    assert plan.argv == ["sbatch", "--parsable", f"--output={run}/launch/mb-train.slurm.log", script_path]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    want = {"--job-name": "mb-train-0123456789", "--nodes": "1", "--ntasks-per-node": "1", "--gpus-per-node": "1",
            "--time": sb.time, "--exclusive": "",
            **({"--partition": sb.partition} if sb.partition else {}), **({"--account": sb.account} if sb.account else {})}
    assert _header(text) == want
    Path(script_path).parent.mkdir(parents=True)
    Path(script_path).write_text(text)
    env = _tools(tmp_path, {"scontrol": "n1\n", "srun": ""})
    _run(["/bin/bash", script_path], tmp_path, env)
    srun_env = ([f"--chdir={workdir}"] if venv else
                [f"--container-image={image}", f"--container-mounts={','.join([f'{run}:{run}', *sb.container_mounts])}",
                 f"--container-workdir={workdir}", "--no-container-mount-home"])
    rdzv = ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=n1:29500", "--rdzv-id=7"]
    assert _calls(tmp_path, "srun") == [["--nodes=1", "--ntasks-per-node=1", *srun_env, torchrun[0], *rdzv,
                                         "--nproc-per-node=1", *ENTRY[1:]]]
    assert _calls(tmp_path, "scontrol") == [["show", "hostnames", "n1"]]
    assert Path(plan.job.marker).read_text() == "0\n"  # the EXIT trap wrote the script's status, nothing else ran
    if venv:
        return  # Kubernetes runs images only

    # kubernetes: the manifest as YAML, then its launch script under a stand-in kubectl
    kube = launch.model_copy(update={"scheduler": "kubernetes"})
    job = job_name("megatron-train", run, "run-1")
    plan = plan_launch(kube, ENTRY, run, style="torchrun", name="megatron-train", env={"MLFLOW_RUN_ID": value}, job=job)
    (manifest_path, text), = plan.files.items()
    (item,) = yaml.safe_load(text)["items"]
    assert item["metadata"]["name"] == job and item["metadata"]["namespace"] == k8s.namespace
    pod = item["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["image"], container["workingDir"], container["command"]) == (image, workdir, torchrun)
    assert container["env"][0] == {"name": "MLFLOW_RUN_ID", "value": value}
    assert [v.get("persistentVolumeClaim") for v in pod["volumes"]][1:] == (
        [{"claimName": k8s.volume_claim}] if k8s.volume_claim else [])
    assert plan.argv[:2] == ["bash", "-c"]
    env = _tools(tmp_path, {"kubectl": "Complete"})
    _run(["/bin/bash", "-c", plan.argv[2]], tmp_path, env)
    ns = ["-n", k8s.namespace]
    assert _calls(tmp_path, "kubectl") == [
        [*ns, "delete", "job", job, "--ignore-not-found", "--wait=true"], [*ns, "apply", "-f", manifest_path],
        [*ns, "logs", "-f", f"job/{job}", "--pod-running-timeout=24h"],
        [*ns, "get", "job", job, "-o", 'jsonpath={.status.conditions[?(@.status=="True")].type}']]


def test_the_issues_partition_is_refused_at_load_naming_the_field_and_line(tmp_path):
    recipe = tmp_path / "cluster.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        base: {TINY}
        stages:
          pretrain:
            engine: megatron
            launch:
              env: {{image: {IMAGE}}}
              scheduler: slurm
              slurm:
                partition: "batch\\ntouch pwned"
        """))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    text = str(err.value)
    assert "stages.pretrain.launch.slurm.partition" in text and "breaks it at '\\n'" in text
    assert "cluster.yaml:9" in text


@pytest.mark.parametrize("override,field", [
    ("name=..", "name"), ("name=a/b", "name"), ('workdir="runs/a\\nb"', "workdir")])
def test_recipe_names_are_slugs_and_a_workdir_has_no_control_characters(override, field):
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, [override])
    assert f"{field}:" in str(err.value)


def test_a_workdir_inside_another_runs_step_directory_is_refused(tmp_path):
    step = tmp_path / "runs" / "tiny" / "stages" / "pretrain-0123456789abcdef"
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, [f"workdir={step / 'nested'}"])
    assert "workdir:" in str(err.value) and "inside the step directory" in str(err.value)
    load_recipe(TINY, [f"workdir={tmp_path / 'runs' / 'stages-not-a-step'}"])  # a plain directory is fine


def test_a_container_launch_refuses_a_workdir_that_would_split_its_mount(tmp_path):
    launch = f"stages.pretrain.launch={{env: {{image: {IMAGE}}}, gpus_per_node: 1}}"
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, ["stages.pretrain.engine=megatron", launch, f"workdir={tmp_path / 'a,b'}"])
    assert "workdir:" in str(err.value) and "without ':', ','" in str(err.value)


def test_job_names_are_unique_per_run_and_step_and_fit_kubernetes():
    names = {job_name(step, run_dir, run_id) for step in ("megatron-train-diversity", "megatron-import")
             for run_dir in ("/runs/a/stages/pretrain-1", "/runs/b/stages/pretrain-1") for run_id in ("r1", "r2")}
    assert len(names) == 8
    long = job_name("Megatron_Train-" + "x" * 80, "/runs/a", "r1")
    assert len(long) <= 52 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", long)
    assert long.startswith("megatron-train-xx") and long[-10:] == job_name("other", "/runs/a", "r1")[-10:]
    assert job_name("megatron-import", "/runs/a", "r1") == job_name("megatron-import", "/runs/a", "r1")
