"""Launch plans (local torchrun / docker, an sbatch script, a Kubernetes Job), the engine-availability
check and the GPU-free import of engines/ (benchmarks/gpu_check.sh: tests/benchmarks/test_gpu_check.py)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from stagewise.engines.availability import EngineMissing, check_engine, container_tool
from stagewise.engines.config import LaunchConfig
from stagewise.engines.launch.plans import RAY_WAIT, LaunchUnsupported, kubernetes_manifest, plan_launch, slurm_script

ROOT = Path(__file__).resolve().parents[3]
RUN = "/runs/tiny/stages/pretrain-abc"
IMAGE = "nvcr.io/nvidia/nemo:26.08"
MB_ENTRY = ["python", "scripts/training/run_recipe.py", "--recipe", "nemotron_3_nano_pretrain_config",
            "train.train_iters=10", "logger.wandb_exp_name=a b"]
RL_ENTRY = ["python", "examples/run_grpo.py", "--config", "/runs/tiny/stages/rl/grpo.yaml"]
ENV = {"MLFLOW_TRACKING_URI": "sqlite:////runs/tiny/mlflow.db", "MLFLOW_RUN_ID": "0123abcd"}
FIELD = "stages.pretrain.launch"


def cfg(**kw) -> LaunchConfig:
    kw.setdefault("env", {"image": IMAGE})
    return LaunchConfig.model_validate(kw)


# ------------------------------------------------------------------------------------ local


def test_local_venv_runs_the_venvs_torchrun_one_process_per_gpu(tmp_path):
    venv = tmp_path / "mb-venv"
    plan = plan_launch(cfg(env={"venv": str(venv)}), MB_ENTRY, RUN, style="torchrun", env=ENV)
    assert plan.argv == [f"{venv}/bin/torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=8",
                         "scripts/training/run_recipe.py", "--recipe", "nemotron_3_nano_pretrain_config",
                         "train.train_iters=10", "logger.wandb_exp_name=a b"]
    assert plan.cwd == RUN and plan.env == ENV and plan.files == {} and plan.job_log is None
    assert "'logger.wandb_exp_name=a b'" in plan.shell()
    # the venv's workdir wins over the run directory; a relative venv is made absolute
    rel = plan_launch(cfg(env={"venv": "rel/venv", "workdir": "/opt/Megatron-Bridge"}), MB_ENTRY, RUN, style="torchrun")
    assert rel.argv[0] == os.path.abspath("rel/venv") + "/bin/torchrun" and rel.cwd == "/opt/Megatron-Bridge"


def test_local_image_runs_torchrun_inside_docker_with_the_run_dir_mounted():
    launch = cfg(env={"image": IMAGE, "workdir": "/opt/Megatron-Bridge"}, gpus_per_node=8)
    plan = plan_launch(launch, MB_ENTRY, RUN, style="torchrun", env=ENV, mounts=["/data:/data:ro"])
    assert plan.argv == [
        "docker", "run", "--rm", "--gpus", "all", "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-v", f"{RUN}:{RUN}", "-v", "/data:/data:ro", "-w", "/opt/Megatron-Bridge",
        "-e", "MLFLOW_RUN_ID", "-e", "MLFLOW_TRACKING_URI", IMAGE,
        "torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=8", *MB_ENTRY[1:]]
    # values travel in the process environment, never in argv
    assert plan.env == ENV and not any("0123abcd" in a for a in plan.argv)
    podman = plan_launch(launch, MB_ENTRY, RUN, style="torchrun", container_tool="podman")
    assert podman.argv[:5] == ["podman", "run", "--rm", "--device", "nvidia.com/gpu=all"]


def test_local_single_runs_one_driver_and_entry_forms_map_onto_torchrun(tmp_path):
    venv = tmp_path / "nrl"
    single = plan_launch(cfg(env={"venv": str(venv)}), RL_ENTRY, RUN, style="single")
    assert single.argv == [f"{venv}/bin/python", *RL_ENTRY[1:]]
    assert plan_launch(cfg(), RL_ENTRY, RUN, style="single").argv[-4:] == ["python", *RL_ENTRY[1:]]
    as_module = plan_launch(cfg(env={"venv": str(venv)}, gpus_per_node=2), ["python3", "-m", "pkg.train", "x=1"],
                            RUN, style="torchrun")
    assert as_module.argv[-4:] == ["--nproc-per-node=2", "-m", "pkg.train", "x=1"]
    other = plan_launch(cfg(env={"venv": str(venv)}), ["uv", "run", "train.py"], RUN, style="torchrun")
    assert other.argv[-4:] == ["--no-python", "uv", "run", "train.py"]


def test_local_refuses_several_nodes_naming_the_key():
    with pytest.raises(LaunchUnsupported) as err:
        plan_launch(cfg(nodes=2), MB_ENTRY, RUN, style="torchrun", field=FIELD)
    assert err.value.field == "stages.pretrain.launch.nodes" and "slurm or kubernetes" in str(err.value)


# ------------------------------------------------------------------------------------ slurm


def _sbatch(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            out[key] = value
    return out


def _slurm_cfg(**kw) -> LaunchConfig:
    return cfg(scheduler="slurm", nodes=2, gpus_per_node=8,
               slurm={"partition": "batch", "account": "llm", "time": "02:00:00",
                      "container_mounts": ["/lustre:/lustre"]},
               **kw)


def test_slurm_script_for_two_nodes_line_by_line():
    launch = _slurm_cfg(env={"image": IMAGE, "workdir": "/opt/Megatron-Bridge"})
    plan = plan_launch(launch, MB_ENTRY, RUN, style="torchrun", name="megatron-train", env=ENV)
    script_path = f"{RUN}/launch/megatron-train.sbatch"
    assert plan.job_log == f"{RUN}/launch/megatron-train.slurm.log" and plan.env == {}
    assert plan.argv == ["sbatch", "--parsable", f"--output={plan.job_log}", script_path]
    text = plan.files[script_path]
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert _sbatch(text) == {"--job-name": "megatron-train", "--nodes": "2", "--ntasks-per-node": "1",
                             "--gpus-per-node": "8", "--partition": "batch", "--account": "llm", "--time": "02:00:00",
                             "--exclusive": ""}
    body = [ln for ln in lines if not ln.startswith("#")]
    assert plan.job.marker == f"{RUN}/launch/megatron-train.exit"
    assert body[:7] == ["set -euo pipefail",
                        f"trap 'echo \"$?\" > {RUN}/launch/megatron-train.exit' EXIT",  # the job's end, after Slurm forgets it
                        "export MLFLOW_RUN_ID=0123abcd",
                        "export MLFLOW_TRACKING_URI=sqlite:////runs/tiny/mlflow.db",
                        'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
                        'export MASTER_ADDR="${NODES[0]}"',
                        "export MASTER_PORT=29500"]
    assert len(body) == 8
    srun = shlex.split(body[7])
    assert srun[:3] == ["srun", "--nodes=2", "--ntasks-per-node=1"]
    assert srun[3:7] == [f"--container-image={IMAGE}", f"--container-mounts={RUN}:{RUN},/lustre:/lustre",
                         "--container-workdir=/opt/Megatron-Bridge", "--no-container-mount-home"]
    # one torchrun per node; the ranks meet at a c10d rendezvous on the first node
    assert srun[7:] == ["torchrun", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT",
                        "--rdzv-id=$SLURM_JOB_ID", "--nproc-per-node=8", *MB_ENTRY[1:]]
    assert text == slurm_script(launch, MB_ENTRY, RUN, style="torchrun", name="megatron-train", env=ENV,
                                marker=plan.job.marker)  # deterministic


def test_slurm_venv_uses_chdir_and_the_venvs_tools(tmp_path):
    launch = cfg(scheduler="slurm", nodes=1, gpus_per_node=4, env={"venv": str(tmp_path / "v")})
    text = slurm_script(launch, MB_ENTRY, RUN, style="torchrun")
    sb = _sbatch(text)
    assert "--partition" not in sb and "--account" not in sb and sb["--time"] == "04:00:00"
    srun = shlex.split(text.splitlines()[-1])
    assert srun[3] == f"--chdir={RUN}" and srun[4] == f"{tmp_path}/v/bin/torchrun"
    assert not any(a.startswith("--container") for a in srun)
    single = slurm_script(launch, RL_ENTRY, RUN, style="single")
    assert shlex.split(single.splitlines()[-1]) == ["srun", "--nodes=1", "--ntasks=1", f"--chdir={RUN}",
                                                    f"{tmp_path}/v/bin/python", *RL_ENTRY[1:]]


def _fake_slurm(tmp_path: Path, rc: int) -> tuple[dict[str, str], Path]:
    """scontrol and srun stand-ins on PATH: srun records its argv (one JSON line) and exits `rc`."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "srun.jsonl"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'gpu-node-1\\ngpu-node-2\\n'\n")
    (bin_dir / "srun").write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        with open({str(calls)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "HEAD_IP": os.environ.get("HEAD_IP"),
                                "RAY_WAIT": os.environ.get("RAY_WAIT")}}) + "\\n")
        if "hostname" in sys.argv:
            print("10.0.0.1 fe80::1")
            sys.exit(0)
        if "ray start --head" in sys.argv[-1]:  # the script kills the background workers when the head ends:
            import time                          # give their srun the time to record itself first
            time.sleep(2)
        sys.exit({rc})
        """))
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "gpu-node-[1-2]"}
    return env, calls


def test_slurm_script_runs_expands_the_rendezvous_and_exits_with_the_jobs_status(tmp_path):
    text = slurm_script(_slurm_cfg(), MB_ENTRY, RUN, style="torchrun", env=ENV)
    (tmp_path / "job.sh").write_text(text)
    env, calls = _fake_slurm(tmp_path, rc=3)
    proc = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    (call,) = [json.loads(ln) for ln in calls.read_text().splitlines()]
    assert "--rdzv-endpoint=gpu-node-1:29500" in call["argv"] and "--rdzv-id=4242" in call["argv"]
    assert call["argv"][-1] == "logger.wandb_exp_name=a b"


def test_slurm_nemo_rl_brings_up_ray_then_runs_the_driver_on_the_head(tmp_path):
    text = slurm_script(_slurm_cfg(), RL_ENTRY, RUN, style="single", env=ENV)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    (tmp_path / "job.sh").write_text(text)
    env, calls = _fake_slurm(tmp_path, rc=0)
    proc = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    hostname, *steps = [json.loads(ln) for ln in calls.read_text().splitlines()]
    # the workers' srun runs in the background: it may record before or after the head's
    (workers,) = [c for c in steps if "--exclude=gpu-node-1" in c["argv"]]
    (head,) = [c for c in steps if c is not workers]
    assert hostname["argv"] == ["--nodes=1", "--ntasks=1", "-w", "gpu-node-1", "hostname", "--ip-address"]
    assert workers["argv"][:4] == ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--exclude=gpu-node-1"]
    assert workers["argv"][-3:-1] == ["bash", "-c"]
    assert 'ray start --address="$HEAD_IP:$RAY_PORT"' in workers["argv"][-1]
    assert head["argv"][:4] == ["--nodes=1", "--ntasks=1", "-w", "gpu-node-1"]
    assert f"--container-image={IMAGE}" in head["argv"]
    inner = head["argv"][-1]
    assert inner.startswith('ray start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --num-gpus=8')
    assert f'python -c "$RAY_WAIT" auto 16 1800 && exec {shlex.join(RL_ENTRY)}' in inner
    assert head["HEAD_IP"] == "10.0.0.1" and head["RAY_WAIT"] == RAY_WAIT
    compile(RAY_WAIT, "ray_wait", "exec")
    # the driver's status is the job's
    (tmp_path / "failing").mkdir()
    env, _ = _fake_slurm(tmp_path / "failing", rc=5)
    assert subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True).returncode == 5


# ------------------------------------------------------------------------------------ kubernetes


def test_kubernetes_job_manifest_for_two_nodes():
    launch = cfg(scheduler="kubernetes", nodes=2, gpus_per_node=8,
                 kubernetes={"namespace": "training", "volume_claim": "runs-pvc"})
    plan = plan_launch(launch, MB_ENTRY, RUN, style="torchrun", name="Megatron_Train", env=ENV)
    path = f"{RUN}/launch/Megatron_Train.k8s.yaml"
    doc = yaml.safe_load(plan.files[path])
    assert doc["kind"] == "List" and [i["kind"] for i in doc["items"]] == ["Service", "Job"]
    service, job = doc["items"]
    assert service["metadata"]["name"] == "megatron-train" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": "megatron-train"}
    assert job["metadata"] == {"name": "megatron-train", "namespace": "training",
                               "labels": {"app.kubernetes.io/managed-by": "stagewise",
                                          "app.kubernetes.io/name": "megatron-train"}}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == "megatron-train"
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["workingDir"] == RUN and c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert c["command"] == ["torchrun", "--nnodes=2", "--node-rank=$(NODE_RANK)",
                            "--master-addr=megatron-train-0.megatron-train", "--master-port=29500",
                            "--nproc-per-node=8", *MB_ENTRY[1:]]
    env = {e["name"]: e for e in c["env"]}
    assert env["MLFLOW_RUN_ID"]["value"] == "0123abcd"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert {"name": "run", "mountPath": RUN} in c["volumeMounts"]
    assert {"name": "run", "persistentVolumeClaim": {"claimName": "runs-pvc"}} in pod["volumes"]
    # applied, then waited on: a Failed Job exits 1, a Complete one 0
    assert plan.argv[:2] == ["bash", "-c"]
    script = plan.argv[2]
    assert f"kubectl -n training apply -f {path}" in script and "logs -f job/megatron-train" in script
    assert "*Failed*) echo" in script and "exit 1" in script and "*Complete*) exit 0" in script


def test_kubernetes_single_node_and_nemo_rl_ray_and_venv_refused(tmp_path):
    one = kubernetes_manifest(cfg(scheduler="kubernetes", nodes=1), MB_ENTRY, RUN, style="torchrun")
    (job,) = one["items"]
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:4] == ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=8"]
    assert [v["name"] for v in job["spec"]["template"]["spec"]["volumes"]] == ["dshm"]  # no claim: yours to mount
    rl = kubernetes_manifest(cfg(scheduler="kubernetes", nodes=2), RL_ENTRY, RUN, style="single", name="grpo")
    job = rl["items"][1]
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:2] == ["bash", "-c"]
    assert 'if [ "$NODE_RANK" = 0 ]; then ray start --head' in c["command"][2]
    assert "ray start --address=grpo-0.grpo:6379" in c["command"][2]
    assert {"name": "RAY_WAIT", "value": RAY_WAIT} in c["env"]
    with pytest.raises(LaunchUnsupported) as err:
        plan_launch(cfg(scheduler="kubernetes", env={"venv": str(tmp_path)}), MB_ENTRY, RUN, style="torchrun",
                    field=FIELD)
    assert err.value.field == f"{FIELD}.env.venv"


def test_plan_files_are_written_under_the_run_dir(tmp_path):
    plan = plan_launch(_slurm_cfg(), MB_ENTRY, tmp_path, style="torchrun", name="mb")
    plan.write_files()
    assert (tmp_path / "launch" / "mb.sbatch").read_text() == plan.files[str(tmp_path / "launch" / "mb.sbatch")]


# ------------------------------------------------------------------------------------ availability


def _fake_venv(root: Path, pythonpath: Path | None = None, tools: tuple[str, ...] = ()) -> Path:
    """A venv dir whose bin/python execs this interpreter (which has no megatron.bridge / nemo_rl),
    with `pythonpath` (fake engine modules) on its PYTHONPATH."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    pp = f'PYTHONPATH={shlex.quote(str(pythonpath))} ' if pythonpath else ""
    (bin_dir / "python").write_text(f'#!/bin/sh\n{pp}exec {shlex.quote(sys.executable)} "$@"\n')
    for tool in ("python", *tools):
        (bin_dir / tool).touch()
        (bin_dir / tool).chmod((bin_dir / tool).stat().st_mode | stat.S_IXUSR)
    return root


def _fake_modules(root: Path) -> Path:
    for pkg in ("megatron/bridge", "nemo_rl"):
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "megatron" / "__init__.py").write_text("")
    return root


def test_a_venv_without_python_or_without_the_engine_is_missing(tmp_path):
    (tmp_path / "empty" / "bin").mkdir(parents=True)
    with pytest.raises(EngineMissing) as err:
        check_engine("megatron", cfg(env={"venv": str(tmp_path / "empty")}), field=FIELD)
    assert err.value.field == "stages.pretrain.launch.env.venv" and isinstance(err.value, ValueError)
    assert "no bin/python" in err.value.message and "pip install" in err.value.message
    assert "nvcr.io/nvidia/nemo" in err.value.message
    with pytest.raises(EngineMissing, match="does not exist"):
        check_engine("megatron", cfg(env={"venv": str(tmp_path / "nowhere")}), field=FIELD)
    bare = _fake_venv(tmp_path / "bare", tools=("torchrun",))
    with pytest.raises(EngineMissing) as err:
        check_engine("megatron", cfg(env={"venv": str(bare)}), field=FIELD)
    assert "Megatron-Bridge is not installed" in err.value.message and "megatron.bridge" in err.value.message
    with pytest.raises(EngineMissing) as err:
        check_engine("nemo_rl", cfg(env={"venv": str(bare)}), field="stages.rl.launch")
    assert err.value.field == "stages.rl.launch.env.venv" and "uv sync" in err.value.message


def test_a_venv_with_the_engine_passes_and_needs_its_launcher(tmp_path):
    mods = _fake_modules(tmp_path / "site")
    good = _fake_venv(tmp_path / "good", pythonpath=mods, tools=("torchrun",))
    check_engine("megatron", cfg(env={"venv": str(good)}), field=FIELD)
    check_engine("nemo_rl", cfg(env={"venv": str(good)}), field=FIELD)
    check_engine("torch", cfg(env={"venv": str(tmp_path / "ignored")}))  # in-process: nothing to check
    no_torchrun = _fake_venv(tmp_path / "no-torchrun", pythonpath=mods)
    with pytest.raises(EngineMissing, match="no bin/torchrun"):
        check_engine("megatron", cfg(env={"venv": str(no_torchrun)}), field=FIELD)
    slurm = cfg(env={"venv": str(no_torchrun)}, scheduler="slurm", nodes=2)
    with pytest.raises(EngineMissing, match="no bin/ray"):
        check_engine("nemo_rl", slurm, field=FIELD, which=lambda t: f"/usr/bin/{t}")


def test_the_check_asks_the_venvs_python_and_reports_a_broken_one(tmp_path):
    venv = _fake_venv(tmp_path / "v", tools=("torchrun",))
    seen = []

    def run(argv, **kw):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 3, "", "Traceback\nImportError: libcuda.so.1\n")

    with pytest.raises(EngineMissing, match=r"failed \(exit 3\).*libcuda"):
        check_engine("megatron", cfg(env={"venv": str(venv)}), field=FIELD, run=run)
    assert seen[0][0] == f"{venv}/bin/python" and seen[0][1] == "-c" and seen[0][-1] == "megatron.bridge"


def _installed(site: Path, version: str) -> Path:
    """`site` as an install of megatron-bridge `version`: the package plus its distribution metadata,
    what `pip install megatron-bridge==VERSION` leaves for importlib.metadata to read."""
    _fake_modules(site)
    info = site / f"megatron_bridge-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: megatron-bridge\nVersion: {version}\n")
    return site


def test_a_venv_with_another_megatron_bridge_release_is_refused_naming_both(tmp_path):
    other = _fake_venv(tmp_path / "other", pythonpath=_installed(tmp_path / "site-061", "0.6.1"), tools=("torchrun",))
    with pytest.raises(EngineMissing) as err:
        check_engine("megatron", cfg(env={"venv": str(other)}), field=FIELD)
    assert err.value.field == "stages.pretrain.launch.env.venv"
    assert "megatron-bridge 0.6.1" in err.value.message and "megatron-bridge 0.6.2" in err.value.message
    assert "megatron-bridge==0.6.2" in err.value.message  # how to get the pinned one
    pinned = _fake_venv(tmp_path / "pinned", pythonpath=_installed(tmp_path / "site-062", "0.6.2"), tools=("torchrun",))
    check_engine("megatron", cfg(env={"venv": str(pinned)}), field=FIELD)
    check_engine("nemo_rl", cfg(env={"venv": str(other)}), field=FIELD)  # NeMo RL's release is not pinned


def test_the_release_is_what_the_venvs_python_prints(tmp_path):
    """The venv's python is asked (a script standing in for it prints a release), never this process."""
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text('#!/bin/sh\necho \'{"version": "0.7.0rc1", "dirs": []}\'\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "torchrun").touch()
    with pytest.raises(EngineMissing, match=r"has megatron-bridge 0\.7\.0rc1, but .* megatron-bridge 0\.6\.2"):
        check_engine("megatron", cfg(env={"venv": str(venv)}), field=FIELD)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'Traceback' >&2; exit 0\n")
    with pytest.raises(EngineMissing, match=r"could not say which megatron-bridge release .* Traceback"):
        check_engine("megatron", cfg(env={"venv": str(venv)}), field=FIELD)


def test_a_source_checkout_is_read_from_its_package_info(tmp_path):
    """Without distribution metadata (a checkout on PYTHONPATH), the package's own package_info.py,
    read as text; a bare package recording no release at all is let through."""
    site = _fake_modules(tmp_path / "site")
    (site / "megatron" / "bridge" / "package_info.py").write_text(
        'MAJOR = 0\nMINOR = 5\nPATCH = 1\nPRE_RELEASE = ""\n# Use the following formatting\n')
    venv = _fake_venv(tmp_path / "v", pythonpath=site, tools=("torchrun",))
    with pytest.raises(EngineMissing, match=r"has megatron-bridge 0\.5\.1, but"):
        check_engine("megatron", cfg(env={"venv": str(venv)}), field=FIELD)
    (site / "megatron" / "bridge" / "package_info.py").write_text("MAJOR = 0\nMINOR = 6\nPATCH = 2\nPRE_RELEASE = ''\n")
    check_engine("megatron", cfg(env={"venv": str(venv)}), field=FIELD)


def test_a_release_mismatch_is_bad_input_at_the_stages_launch_env(tmp_path):
    from stagewise.data.errors import BadInput
    from stagewise.flows.pipeline import check_engines
    from stagewise.recipe import load_recipe

    venv = _fake_venv(tmp_path / "v", pythonpath=_installed(tmp_path / "site", "0.6.0"), tools=("torchrun",))
    launch = f"stages.pretrain.launch={{env: {{venv: {venv}, workdir: /opt/Megatron-Bridge}}, gpus_per_node: 2}}"
    loaded = load_recipe(ROOT / "recipes" / "tiny.yaml", ["stages.pretrain.engine=megatron", launch])
    with pytest.raises(BadInput) as err:
        check_engines(loaded, ["pretrain"])
    text = str(err.value)
    assert text.startswith("stages.pretrain.launch.env.venv: ") and "0.6.0" in text and "0.6.2" in text


def test_an_image_needs_the_schedulers_tool_on_path():
    none = lambda tool: None  # noqa: E731
    with pytest.raises(EngineMissing) as err:
        check_engine("megatron", cfg(), field=FIELD, which=none)
    assert err.value.field == f"{FIELD}.env.image" and "docker or podman" in err.value.message
    only_podman = lambda tool: "/usr/bin/podman" if tool == "podman" else None  # noqa: E731
    check_engine("megatron", cfg(), field=FIELD, which=only_podman)
    assert container_tool(only_podman) == "podman" and container_tool(none) is None
    with pytest.raises(EngineMissing) as err:
        check_engine("nemo_rl", cfg(scheduler="slurm"), field=FIELD, which=none)
    assert err.value.field == f"{FIELD}.scheduler" and "sbatch" in err.value.message and "pyxis" in err.value.message
    with pytest.raises(EngineMissing, match="kubectl"):
        check_engine("megatron", cfg(scheduler="kubernetes"), field=FIELD, which=none)
    check_engine("megatron", cfg(scheduler="kubernetes"), field=FIELD, which=lambda t: "/usr/bin/kubectl")
    with pytest.raises(ValueError, match="unknown engine"):
        check_engine("deepspeed", cfg())


def test_importing_every_engines_module_imports_nothing_gpu_only():
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import stagewise.engines
        names = [m.name for m in pkgutil.walk_packages(stagewise.engines.__path__, "stagewise.engines.")]
        for name in names:
            importlib.import_module(name)
        bad = ("megatron", "megatron.bridge", "nemo_rl", "transformer_engine", "mamba_ssm", "causal_conv1d", "vllm")
        print(sorted(m for m in sys.modules if m.split(".")[0] in {b.split(".")[0] for b in bad}))
        print(sorted(names))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded, modules = proc.stdout.splitlines()
    assert loaded == "[]"
    assert {"stagewise.engines.availability", "stagewise.engines.launch.plans", "stagewise.engines.megatron.translate",
            "stagewise.engines.nemo_rl.translate"} <= set(eval(modules))


def test_a_cpu_job_asks_slurm_and_kubernetes_for_no_gpus(tmp_path):
    """gpus_per_node 0 (a stage on our engine as a job): no --gpus-per-node GRES, no GPU limit, no --gpus."""
    cpu = LaunchConfig.model_validate({"env": {"venv": "/v"}, "scheduler": "slurm", "gpus_per_node": 0})
    text = plan_launch(cpu, ["python", "-m", "x"], RUN, style="single", name="sft-job").files[f"{RUN}/launch/sft-job.sbatch"]
    assert "--gpus-per-node" not in text and "#SBATCH --nodes=1" in text
    kube = LaunchConfig.model_validate({"env": {"image": IMAGE}, "scheduler": "kubernetes", "gpus_per_node": 0})
    manifest = kubernetes_manifest(kube, ["python", "-m", "x"], RUN, style="single", name="sft-job")
    (job,) = [i for i in manifest["items"] if i["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {}
    local = LaunchConfig.model_validate({"env": {"image": IMAGE}, "gpus_per_node": 0})
    assert "--gpus" not in plan_launch(local, ["python", "-m", "x"], RUN, style="single").argv
