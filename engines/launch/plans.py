"""How a launched engine is started: the command (and script or manifest) for one stage's launch.

Megatron-Bridge and NeMo RL run in their own environment (a container image or a venv named in
the recipe's `launch.env`), never in our process: they pin their own transformers, Transformer
Engine and mamba-ssm. The translations (megatron_bridge.py, nemo_rl.py) give an *entry* argv —
what one process of the engine runs, e.g. `python scripts/training/run_recipe.py --recipe X k=v`
— and this module says how that entry is started for `launch.scheduler`:

- `local`: one node, run here. An argv for engines/launch/task.py to stream: `torchrun` from the venv, or
  `docker run ... IMAGE torchrun ...` for an image.
- `slurm`: the text of an sbatch script plus `sbatch --parsable --output=LOG SCRIPT`, whose job
  engines/launch/scheduler_job.py follows to its end (the log streamed, the scheduler's state read:
  `sbatch --wait` exits 0 for a job cancelled while pending, and outlives nothing it could cancel);
  the script writes its exit status to a marker file as it ends.
- `kubernetes`: an Indexed Job (one pod per node) as a YAML manifest plus a `bash -c` that applies
  it, streams pod 0's log and exits 0 only when the Job completes.

Two launcher styles, because the engines spread over GPUs differently:
- `torchrun` (Megatron-Bridge): one process per GPU. torchrun starts them, one torchrun per node;
  on several nodes they meet at a rendezvous on the first node. Upstream's Slurm example starts one
  srun task per GPU instead (`--ntasks-per-node=8 --mpi=pmix`); one torchrun per node is used here
  so that the same entry runs unchanged on one node, on Slurm and on Kubernetes.
- `single` (NeMo RL): one driver process for the whole job; it places its workers on the GPUs
  itself through Ray. On one node the driver starts its own Ray. On several nodes a Ray cluster is
  brought up first, as upstream's ray.sub does: `ray start --head` on the first node, `ray start
  --address=HEAD --block` on the others, a wait until Ray sees every GPU, then the driver on the
  head, whose exit status is the job's.

Everything is plain text and lists, built deterministically from the config (tests compare text),
quoted with shlex. No Prefect, no MLflow, and nothing of the engines is imported.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Literal

import yaml

from stagewise.engines.config import LaunchConfig

LauncherStyle = Literal["torchrun", "single"]
"""torchrun: one process per GPU (Megatron-Bridge). single: one driver that uses Ray (NeMo RL)."""

MASTER_PORT = 29500
"""torchrun's rendezvous port on the first node (torch's default)."""
RAY_PORT = 6379
"""The Ray head's GCS port (Ray's default)."""
RAY_WAIT_S = 1800
"""How long the head waits for every node's GPUs to join the Ray cluster (ray.sub waits 30 min too)."""

# Run by the head, after `ray start --head`: block until the cluster has all GPUs, so the driver
# never plans its placement on a half-joined cluster. argv: [address, gpus, timeout_s]. It travels
# in the RAY_WAIT environment variable (`python -c "$RAY_WAIT"`) to keep the srun / pod command
# readable; it has no single quotes, so shlex quotes it as one plain '...' block.
RAY_WAIT = """\
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
want, wait_s = int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + wait_s
while (have := ray.cluster_resources().get("GPU", 0)) < want:
    if time.time() > deadline:
        sys.exit("Ray cluster has %g of %d GPUs after %g s" % (have, want, wait_s))
    time.sleep(5)
"""

_PYTHON = re.compile(r"(^|/)python(3(\.\d+)?)?$")


class LaunchUnsupported(ValueError):
    """The launch config asks for something this scheduler cannot do (e.g. several nodes `local`).

    `field` is the recipe key path to change (e.g. `stages.pretrain.launch.nodes`)."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class ScheduledJob:
    """A launch that is a scheduler's job, followed and cancelled by id (engines/launch/scheduler_job.py)."""

    scheduler: Literal["slurm", "kubernetes"]
    name: str
    """The scheduler's job name."""
    id: str | None = None
    """Known before submission (Kubernetes: `<namespace>/<name>`); Slurm's comes from sbatch."""
    script: str | None = None
    """Slurm: the sbatch script."""
    log: str | None = None
    """Slurm: the job's output file (on the shared filesystem)."""
    marker: str | None = None
    """Slurm: the file the script writes its exit status to as it ends."""


@dataclass(frozen=True)
class LaunchPlan:
    """What to run for one launch: write `files`, then run `argv` in `cwd` with `env` over os.environ.

    `argv`'s exit status is the launch's (torchrun's, the Kubernetes Job's); a Slurm job's end is
    read from the scheduler (`job`). `job_log` is where the job's own output lands when it is not argv's output
    (Slurm writes it on the shared filesystem); None when argv's output is the job's."""

    argv: list[str]
    cwd: str
    env: dict[str, str] = dc_field(default_factory=dict)
    files: dict[str, str] = dc_field(default_factory=dict)
    job_log: str | None = None
    job: ScheduledJob | None = None
    """Set when argv submits a scheduler's job (Slurm: argv is the submission, the job is followed by
    id; Kubernetes: argv applies and streams the Job, which is deleted on an interruption)."""

    def write_files(self) -> None:
        """Write the script / manifest files (their directories made) before argv runs."""
        for path, text in self.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)

    def shell(self) -> str:
        """argv as one shell line (for logs and for a user to paste)."""
        return shlex.join(self.argv)


JOB_SUFFIX = 10
"""Hex digits of a job name's unique suffix (job_name)."""


def job_name(step: str, run_dir: str | os.PathLike, run_id: str) -> str:
    """The scheduler's name for `step` of the run `run_id` writing `run_dir`: `<step>-<10 hex>`, the
    suffix a hash of both, so no two runs' launches share a name (the Kubernetes launch deletes an
    earlier Job of its own name before applying: a shared name would kill another run's job).
    Within Kubernetes' rules (an RFC 1123 label of at most 52 characters, so `<job>-<index>` pod
    hostnames fit 63) and Slurm's; the step's name is cut, never the suffix."""
    digest = hashlib.sha256(f"{run_id}\0{os.path.abspath(os.fspath(run_dir))}".encode()).hexdigest()[:JOB_SUFFIX]
    return f"{_k8s_name(step)[:K8S_NAME_CHARS - JOB_SUFFIX - 1].strip('-')}-{digest}"


def plan_launch(launch: LaunchConfig, entry: Sequence[str], run_dir: str | os.PathLike, *,
                style: LauncherStyle, name: str = "engine", env: Mapping[str, str] | None = None,
                field: str = "launch", container_tool: str = "docker",
                mounts: Sequence[str] = (), job: str | None = None) -> LaunchPlan:
    """The LaunchPlan that starts `entry` as `launch` says (see the module docstring).

    entry: one engine process's argv (a leading `python` is the environment's interpreter).
    run_dir: the stage's directory; it is mounted into containers at the same path, and the
        script / manifest files go under `<run_dir>/launch/`.
    style: "torchrun" (one process per GPU) or "single" (one Ray driver).
    name: names the launch's files (e.g. `megatron-train`), and its job unless `job` is given.
    job: the scheduler's job name (Slurm's --job-name, the Kubernetes Job and Service): job_name()'s,
        unique per run and step, when several runs share a cluster.
    env: variables the engine needs (MLFLOW_TRACKING_URI, MLFLOW_RUN_ID, ...). Locally they go
        in the plan's env (docker gets `-e NAME` so values stay out of argv); in an sbatch script
        they are exported; in a Job they are the container's env.
    field: the recipe key path of `launch`, for errors (e.g. `stages.pretrain.launch`).
    container_tool: `docker` or `podman` for a local image (availability.container_tool finds one).
    mounts: extra `src:dst` mounts for containers (local and Slurm), beside the run directory.
    Raises LaunchUnsupported for a combination the scheduler cannot run.
    """
    if style not in ("torchrun", "single"):
        raise ValueError(f"launcher style must be 'torchrun' or 'single', not {style!r}")
    if not entry:
        raise ValueError("the entry argv is empty")
    run = os.path.abspath(os.fspath(run_dir))
    env = dict(env or {})
    for key in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"not an environment variable name: {key!r}")
    if launch.scheduler == "local":
        return _local(launch, list(entry), run, style, env, field, container_tool, list(mounts))
    if launch.scheduler == "slurm":
        return _slurm(launch, list(entry), run, style, name, job or name, env, list(mounts))
    return _kubernetes(launch, list(entry), run, style, name, job or name, env, field)


# ---------------------------------------------------------------------------------------------
# entry -> the command one node runs


def _venv_bin(launch: LaunchConfig, tool: str) -> str:
    """`tool` from the venv (an absolute path: the launch may run in another directory), or bare
    `tool` inside an image (found on the image's PATH)."""
    if launch.env.venv is not None:
        return os.path.join(os.path.abspath(launch.env.venv), "bin", tool)
    return tool


def _driver_argv(launch: LaunchConfig, entry: list[str]) -> list[str]:
    """entry with a leading `python` made the environment's interpreter."""
    if _PYTHON.search(entry[0]) and "/" not in entry[0]:
        return [_venv_bin(launch, "python"), *entry[1:]]
    return entry


def _torchrun_target(entry: list[str]) -> list[str]:
    """What torchrun is given after its own flags: a script (torchrun runs it with its own
    python), `-m module`, or `--no-python CMD` for an entry that is not a python invocation."""
    if _PYTHON.search(entry[0]):
        rest = entry[1:]
        if not rest:
            raise ValueError("the entry is `python` with no script")
        if rest[0] == "-m":
            return rest
        if rest[0].startswith("-"):
            raise ValueError(f"torchrun runs a script or `-m module`, not python option {rest[0]!r}")
        return rest
    return ["--no-python", *entry]


def _torchrun(launch: LaunchConfig, entry: list[str], rendezvous: list[str]) -> list[str]:
    return [_venv_bin(launch, "torchrun"), *rendezvous, f"--nproc-per-node={launch.gpus_per_node}",
            *_torchrun_target(entry)]


# ---------------------------------------------------------------------------------------------
# local


def _local(launch: LaunchConfig, entry: list[str], run: str, style: LauncherStyle, env: dict[str, str],
           field: str, container_tool: str, mounts: list[str]) -> LaunchPlan:
    """One node, here: torchrun --standalone (a rendezvous on a free local port) or the driver."""
    if launch.nodes != 1:
        raise LaunchUnsupported(f"{field}.nodes", f"scheduler local runs on this one node, not {launch.nodes}: "
                                "use scheduler slurm or kubernetes for several nodes")
    if style == "torchrun":
        cmd = _torchrun(launch, entry, ["--standalone", "--nnodes=1"])
    else:
        cmd = _driver_argv(launch, entry)
    workdir = launch.env.workdir or run
    if launch.env.venv is not None:
        return LaunchPlan(argv=cmd, cwd=workdir, env=env)
    if container_tool not in ("docker", "podman"):
        raise ValueError(f"container tool must be docker or podman, not {container_tool!r}")
    # podman reaches GPUs through CDI (nvidia-ctk cdi generate); docker through --gpus; a CPU job asks for none.
    gpus = ([] if not launch.gpus_per_node else ["--gpus", "all"] if container_tool == "docker"
            else ["--device", "nvidia.com/gpu=all"])
    argv = [container_tool, "run", "--rm", *gpus,
            # PyTorch's DataLoader workers and NCCL use shared memory; NVIDIA's containers ask for these.
            "--ipc=host", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "-v", f"{run}:{run}"]
    for m in mounts:
        argv += ["-v", m]
    argv += ["-w", workdir]
    for key in sorted(env):
        argv += ["-e", key]  # the value comes from the plan's env: not in argv, not in `ps`
    argv += [launch.env.image, *cmd]
    return LaunchPlan(argv=argv, cwd=run, env=env)


# ---------------------------------------------------------------------------------------------
# slurm


def _slurm(launch: LaunchConfig, entry: list[str], run: str, style: LauncherStyle, name: str, job: str,
           env: dict[str, str], mounts: list[str]) -> LaunchPlan:
    base = os.path.join(run, "launch", _file_stem(name))
    script_path, log_path, marker = base + ".sbatch", base + ".slurm.log", base + ".exit"
    text = slurm_script(launch, entry, run, style=style, name=job, env=env, mounts=mounts, marker=marker)
    # the log path is the run directory's (any characters but control ones): on sbatch's argv, where
    # it is one word, not in an #SBATCH line, which sbatch splits at whitespace itself
    return LaunchPlan(argv=["sbatch", "--parsable", f"--output={log_path}", script_path], cwd=run,
                      files={script_path: text}, job_log=log_path,
                      job=ScheduledJob("slurm", _file_stem(job), script=script_path, log=log_path, marker=marker))


def _srun_env_flags(launch: LaunchConfig, run: str, mounts: list[str]) -> list[str]:
    """srun flags for the environment: pyxis container flags for an image, --chdir for a venv
    (it must lie on a filesystem the compute nodes share)."""
    workdir = launch.env.workdir or run
    if launch.env.venv is not None:
        return [f"--chdir={workdir}"]
    all_mounts = [f"{run}:{run}", *launch.slurm.container_mounts, *mounts]
    return [f"--container-image={launch.env.image}", f"--container-mounts={','.join(all_mounts)}",
            f"--container-workdir={workdir}", "--no-container-mount-home"]


def slurm_script(launch: LaunchConfig, entry: Sequence[str], run_dir: str | os.PathLike, *,
                 style: LauncherStyle, name: str = "engine", env: Mapping[str, str] | None = None,
                 mounts: Sequence[str] = (), marker: str | None = None) -> str:
    """The sbatch script that runs `entry` on `launch.nodes` nodes (see the module docstring).

    torchrun: one srun task per node, each a torchrun with `gpus_per_node` processes meeting at a
    c10d rendezvous on the first node (MASTER_ADDR: the first of `scontrol show hostnames`).
    single: a Ray head on the first node and Ray workers on the others, then the driver on the
    head; the script exits with the driver's status. Images run through pyxis (`--container-*`).
    The job's output file is given on sbatch's command line (the plan's argv), not here; `marker`,
    when given, is a file the script writes its exit status to as it ends (an EXIT trap), so the
    job's end is known after Slurm has forgotten it.

    Every recipe string in the #SBATCH lines (partition, account, time) was admitted by its type
    (engines/launch_text.py: the scheduler's grammar, no whitespace or control characters);
    every other one is shlex-quoted."""
    run = os.path.abspath(os.fspath(run_dir))
    entry = list(entry)
    q = shlex.quote
    sb = launch.slurm
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={_file_stem(name)}",
             f"#SBATCH --nodes={launch.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if launch.gpus_per_node:  # 0: a CPU job asks for no GRES
        lines.append(f"#SBATCH --gpus-per-node={launch.gpus_per_node}")
    if sb.partition:
        lines.append(f"#SBATCH --partition={sb.partition}")
    if sb.account:
        lines.append(f"#SBATCH --account={sb.account}")
    lines.append(f"#SBATCH --time={sb.time}")
    lines += ["#SBATCH --exclusive",
              "# written by stagewise (engines/launch/plans.py); followed by job id (engines/launch/scheduler_job.py)",
              "set -euo pipefail"]
    if marker is not None:
        on_exit = 'echo "$?" > ' + q(marker)  # the trap's text is shell code run later: the path quoted in it
        lines.append(f"trap {q(on_exit)} EXIT")
    for key in sorted(env or {}):
        lines.append(f"export {key}={q((env or {})[key])}")
    lines.append('NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))')
    srun_env = " ".join(q(f) for f in _srun_env_flags(launch, run, list(mounts)))
    if style == "torchrun":
        lines += ['export MASTER_ADDR="${NODES[0]}"', f"export MASTER_PORT={MASTER_PORT}"]
        rdzv = [f"--nnodes={launch.nodes}", "--rdzv-backend=c10d"]
        cmd = _torchrun(launch, entry, rdzv)
        # the rendezvous flags refer to shell variables: they stay unquoted-expandable
        torchrun = " ".join([q(cmd[0]), *(q(a) for a in rdzv),
                             '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"',
                             *(q(a) for a in cmd[1 + len(rdzv):])])
        lines.append(f"srun --nodes={launch.nodes} --ntasks-per-node=1 {srun_env} {torchrun}")
        return "\n".join(lines) + "\n"
    if launch.nodes == 1:  # the driver starts its own Ray on its node, as locally
        lines.append(f"srun --nodes=1 --ntasks=1 {srun_env} {shlex.join(_driver_argv(launch, entry))}")
        return "\n".join(lines) + "\n"
    # several nodes: the Ray pattern of NeMo RL's ray.sub, without its retries and port juggling
    ray, python = q(_venv_bin(launch, "ray")), q(_venv_bin(launch, "python"))
    gpus = launch.gpus_per_node
    lines += ['HEAD_NODE="${NODES[0]}"',
              'HEAD_IP=$(srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" hostname --ip-address | awk \'{print $1}\')',
              f"RAY_PORT={RAY_PORT}"]
    # `ray start --address` fails until the head's GCS listens: the workers retry; they live as long
    # as the head's step (killed after it), like ray.sub's.
    worker = (f'until {ray} start --address="$HEAD_IP:$RAY_PORT" --num-gpus={gpus} --disable-usage-stats --block; '
              "do sleep 5; done")
    lines += [f"srun --nodes={launch.nodes - 1} --ntasks={launch.nodes - 1} --ntasks-per-node=1 "
              f'--exclude="$HEAD_NODE" {srun_env} bash -c {q(worker)} &',
              "WORKERS=$!"]
    head = (f'{ray} start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --num-gpus={gpus} '
            f'--disable-usage-stats && {python} -c "$RAY_WAIT" auto {launch.gpus} {RAY_WAIT_S} && '

            f"exec {shlex.join(_driver_argv(launch, entry))}")
    lines += ["export HEAD_IP RAY_PORT", f"export RAY_WAIT={q(RAY_WAIT)}",
              f'srun --nodes=1 --ntasks=1 -w "$HEAD_NODE" {srun_env} bash -c {q(head)} && rc=0 || rc=$?']
    lines += ['kill "$WORKERS" 2>/dev/null || true', 'exit "$rc"']
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# kubernetes


K8S_NAME_CHARS = 52
"""The longest Job name whose `<name>-<index>` pod hostnames stay within 63 characters."""


def _k8s_name(name: str) -> str:
    """A DNS-1123 label short enough for `<name>-<index>` pod hostnames (63 characters)."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:K8S_NAME_CHARS].strip("-")
    return s or "engine"


def kubernetes_manifest(launch: LaunchConfig, entry: Sequence[str], run_dir: str | os.PathLike, *,
                        style: LauncherStyle, name: str = "engine", env: Mapping[str, str] | None = None,
                        field: str = "launch") -> dict[str, Any]:
    """A `kind: List` of a headless Service (several nodes: pods find pod 0 by name) and an Indexed
    Job: one pod per node (completions = parallelism = nodes), `gpus_per_node` GPUs each, the run
    directory's volume claim mounted at the run directory's path, no retries (backoffLimit 0: a
    rerun is `stagewise run --resume`).

    torchrun: each pod runs torchrun with `--node-rank` = its completion index and pod 0 as the
    master (a static rendezvous: pod names are stable, so no c10d host election is needed).
    single: pod 0 starts the Ray head, waits for every GPU and runs the driver; the other pods are
    Ray workers. The Job's successPolicy (Kubernetes >= 1.31) makes pod 0's success the Job's."""
    if launch.env.image is None:
        raise LaunchUnsupported(f"{field}.env.venv", "scheduler kubernetes runs containers: give env.image, not a venv")
    run = os.path.abspath(os.fspath(run_dir))
    entry = list(entry)
    job = _k8s_name(name)
    n, gpus = launch.nodes, launch.gpus_per_node
    head = f"{job}-0.{job}"  # pod 0's hostname within the headless Service's subdomain
    if style == "torchrun":
        rdzv = (["--standalone", "--nnodes=1"] if n == 1 else
                [f"--nnodes={n}", "--node-rank=$(NODE_RANK)", f"--master-addr={head}", f"--master-port={MASTER_PORT}"])
        command = _torchrun(launch, entry, rdzv)
    elif n == 1:
        command = _driver_argv(launch, entry)  # the driver starts its own Ray on the pod
    else:
        script = (f'if [ "$NODE_RANK" = 0 ]; then '
                  f"ray start --head --port={RAY_PORT} --num-gpus={gpus} --disable-usage-stats && "
                  f'python -c "$RAY_WAIT" auto {launch.gpus} {RAY_WAIT_S} && '
                  f"exec {shlex.join(entry)}; "
                  f"else until ray start --address={head}:{RAY_PORT} --num-gpus={gpus} --disable-usage-stats --block; "
                  "do sleep 5; done; fi")
        command = ["bash", "-c", script]
    container_env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted((env or {}).items())]
    if style == "single" and n > 1:
        container_env.append({"name": "RAY_WAIT", "value": RAY_WAIT})
    container_env.append({"name": "NODE_RANK", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if launch.kubernetes.volume_claim:
        volumes.append({"name": "run", "persistentVolumeClaim": {"claimName": launch.kubernetes.volume_claim}})
        mounts.append({"name": "run", "mountPath": run})
    ns = launch.kubernetes.namespace
    labels = {"app.kubernetes.io/managed-by": "stagewise", "app.kubernetes.io/name": job}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{
            "name": "engine",
            "image": launch.env.image,
            "workingDir": launch.env.workdir or run,
            "command": command,
            "env": container_env,
            "resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {},
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    }
    job_spec: dict[str, Any] = {"completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 0}
    items: list[dict[str, Any]] = []
    if n > 1:
        pod_spec["subdomain"] = job
        items.append({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"name": job, "namespace": ns, "labels": dict(labels)},
                      "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                               "selector": {"job-name": job}}})
        if style == "single":
            job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    job_spec["template"] = {"metadata": {"labels": dict(labels)}, "spec": pod_spec}
    items.append({"apiVersion": "batch/v1", "kind": "Job",
                  "metadata": {"name": job, "namespace": ns, "labels": dict(labels)}, "spec": job_spec})
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _kubernetes(launch: LaunchConfig, entry: list[str], run: str, style: LauncherStyle, name: str, job: str,
                env: dict[str, str], field: str) -> LaunchPlan:
    """Apply the manifest (an earlier Job of the same name, this run's own when `job` is job_name()'s,
    is deleted first: Jobs are immutable), stream pod 0's log, then poll the Job's conditions: Failed
    exits 1, Complete exits 0."""
    manifest = kubernetes_manifest(launch, entry, run, style=style, name=job, env=env, field=field)
    path = os.path.join(run, "launch", _file_stem(name) + ".k8s.yaml")
    job, ns = _k8s_name(job), launch.kubernetes.namespace
    k = f"kubectl -n {shlex.quote(ns)}"
    script = "\n".join([
        "set -euo pipefail",
        f"{k} delete job {job} --ignore-not-found --wait=true",
        f"{k} apply -f {shlex.quote(path)}",
        f"{k} logs -f job/{job} --pod-running-timeout=24h || true",
        "while true; do",
        f"  state=$({k} get job {job} -o 'jsonpath={{.status.conditions[?(@.status==\"True\")].type}}')",
        f'  case "$state" in *Failed*) echo "job {job} failed" >&2; exit 1;; *Complete*) exit 0;; esac',
        "  sleep 10",
        "done",
    ])
    text = yaml.safe_dump(manifest, sort_keys=False, width=1000)
    return LaunchPlan(argv=["bash", "-c", script], cwd=run, files={path: text},
                      job=ScheduledJob("kubernetes", job, id=f"{ns}/{job}"))


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "engine"
