"""The `engine:` and `launch:` keys of a trainable stage: which engine trains it, where, how parallel.

`engine: torch` (the default) is our own engine in this process. `megatron` (pretrain, long_context,
sft) and `nemo_rl` (rl, distill) are launched processes: `launch` says in which environment
(a container image or a venv), on how many nodes and GPUs, through which scheduler, and with
which model-parallel sizes. The translations (engines/megatron/translate.py,
engines/nemo_rl/translate.py) read these; the data-parallel size is what the GPUs leave.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from stagewise.config_base import StrictConfig
from stagewise.engines.launch_text import (
    ContainerMount,
    EnvironmentPath,
    ImageRef,
    KubernetesLabel,
    KubernetesSubdomain,
    PlainPath,
    SlurmName,
    SlurmPartitions,
    SlurmTime,
)

Engine = Literal["torch", "megatron", "nemo_rl"]
"""torch: ours, in process. megatron: Megatron-Bridge. nemo_rl: NeMo RL (GRPO, on-policy distillation)."""


class Parallelism(StrictConfig):
    """Model-parallel sizes; data parallelism is what the GPUs leave (gpus / (tp * pp * cp))."""

    tp: int = Field(1, ge=1)
    """Tensor parallel size."""
    pp: int = Field(1, ge=1)
    """Pipeline parallel size."""
    cp: int = Field(1, ge=1)
    """Context parallel size (long sequences split across GPUs)."""
    ep: int = Field(1, ge=1)
    """Expert parallel size (MoE presets)."""
    etp: int | None = Field(None, ge=1)
    """Expert tensor parallel size (None: the engine's default)."""
    sequence_parallel: bool = False
    """Shard norms and dropout activations along the sequence over the TP group (needs tp > 1)."""
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] | None = None
    """How context-parallel ranks exchange keys and values (None: the engine's default)."""

    @model_validator(mode="after")
    def _sp_needs_tp(self) -> "Parallelism":
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        return self

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica spans (experts ride on the data-parallel ranks)."""
        return self.tp * self.pp * self.cp


class EngineEnv(StrictConfig):
    """The environment the engine runs in: a container image or a venv (exactly one)."""

    image: ImageRef | None = None
    """Container image with the engine installed (e.g. nvcr.io/nvidia/nemo:26.08)."""
    venv: PlainPath | None = None
    """A virtual environment directory with the engine installed (its bin/python runs the launch)."""
    workdir: EnvironmentPath | None = None
    """Working directory inside the environment (e.g. /opt/Megatron-Bridge); None: the run directory."""

    @model_validator(mode="after")
    def _exactly_one(self) -> "EngineEnv":
        if (self.image is None) == (self.venv is None):
            raise ValueError("give exactly one of `image` (a container) or `venv` (a directory)")
        return self


def slurm_seconds(text: str) -> float | None:
    """A Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; UNLIMITED, INFINITE: None) in seconds."""
    if text in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if len(parts) == 3:  # HH:MM:SS
        hours, minutes, seconds = parts
    else:  # MM or MM:SS
        hours, minutes, seconds = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    return float((hours * 60 + minutes) * 60 + seconds)


class SlurmOptions(StrictConfig):
    """sbatch settings for `scheduler: slurm`."""

    partition: SlurmPartitions | None = None
    """Partition (None: the cluster's default)."""
    account: SlurmName | None = None
    """Account to charge."""
    time: SlurmTime = "04:00:00"
    """Wall-clock limit (HH:MM:SS)."""
    container_mounts: list[ContainerMount] = Field(default_factory=list)
    """`src:dst` mounts for pyxis/enroot (the run directory is always mounted)."""
    max_pending: SlurmTime | None = None
    """Cancel the job and fail the stage, naming Slurm's pending reason, when it has pended this long
    (a Slurm time: MM, HH:MM:SS, D-HH:MM, ...); None: wait as long as the queue takes. A request the
    partition can never meet is refused without waiting either way."""

    @property
    def max_pending_s(self) -> float | None:
        """max_pending in seconds (None: no limit)."""
        return None if self.max_pending is None else slurm_seconds(self.max_pending)


class KubernetesOptions(StrictConfig):
    """Job settings for `scheduler: kubernetes`."""

    namespace: KubernetesLabel = "default"
    """Namespace of the Job."""
    volume_claim: KubernetesSubdomain | None = None
    """A PersistentVolumeClaim mounted at the run directory's path (None: you mount it yourself)."""


class LaunchConfig(StrictConfig):
    """Where and how a launched engine runs."""

    env: EngineEnv
    """The engine's environment."""
    scheduler: Literal["local", "slurm", "kubernetes"] = "local"
    """local: torchrun on this node. slurm: an sbatch script with srun. kubernetes: a Job manifest."""
    nodes: int = Field(1, ge=1)
    """Nodes."""
    gpus_per_node: int = Field(8, ge=0)
    """GPUs per node; 0: a CPU job (our engine only: Megatron-Bridge and NeMo RL need GPUs)."""
    parallel: Parallelism = Field(default_factory=Parallelism)
    """Model-parallel sizes."""
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    """Used when scheduler is slurm."""
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions)
    """Used when scheduler is kubernetes."""

    @model_validator(mode="after")
    def _fits(self) -> "LaunchConfig":
        gpus = self.nodes * self.gpus_per_node
        if gpus % self.parallel.model_parallel:
            raise ValueError(f"{gpus} GPUs ({self.nodes} x {self.gpus_per_node}) are not a multiple of "
                             f"tp * pp * cp = {self.parallel.model_parallel}")
        return self

    @property
    def gpus(self) -> int:
        """All GPUs of the launch."""
        return self.nodes * self.gpus_per_node

    @property
    def data_parallel(self) -> int:
        """Data-parallel size: the GPUs one model replica leaves."""
        return self.gpus // self.parallel.model_parallel


class NemoGym(StrictConfig):
    """NeMo Gym's side of `engine: nemo_rl` (rl, distill): NeMo RL scores rows with NeMo Gym
    servers, not with our verifiers (eval/environments), so the recipe says which Gym agent
    verifies the rows of each of our environments and which Gym configs start those agents."""

    agents: dict[str, str] = Field(default_factory=dict)
    """Our environment (exact_answer, json_answer, ...) -> the NeMo Gym agent that verifies its rows
    there (written as each row's `agent_ref.name` unless the row names one). An agent named after one
    of NeMo Gym's typed resources servers (math_with_judge_simple_agent, string_match_simple_agent,
    lc_equivalence_rule_simple_agent, structured_outputs_simple_agent: engines/nemo_rl/translate.py
    GYM_SERVERS) gets its rows in that server's verify request's form (e.g. math_with_judge:
    `expected_answer` "42" for 42, `question` the last user message), and an environment that server
    cannot verify (e.g. sorting under math_with_judge) is refused here, exit 2."""
    config_paths: list[str] = Field(default_factory=list)
    """NeMo Gym server configs that serve those agents, as NeMo RL's `env.nemo_gym.config_paths`
    (e.g. resources_servers/math_with_judge/configs/math_with_judge.yaml); the policy's own model
    server is added first."""


class LaunchChoice(StrictConfig):
    """The `launch` key every stage block has: where the stage runs. None: in the run's own process.
    Given to a stage on our engine (merge and quantize included), the stage runs as one job where
    its compute is (flows/stage_job.py: local, Slurm or Kubernetes; `gpus_per_node: 0` for a CPU
    job) and hands back the same result as in process."""

    launch: LaunchConfig | None = None
    """Where the stage runs: None in this process; else a job (env, scheduler, nodes, GPUs). For a
    launched engine (megatron, nemo_rl), where that engine runs (its environment, nodes, GPUs,
    scheduler, parallel sizes)."""


def where_free(block: LaunchChoice) -> LaunchChoice:
    """The block as a step's spec hashes it: a stage on our engine computes the same weights in process or
    as a job (flows/stage_job.py), so its `launch` is hashed as unset and the step is the same either way;
    a launched engine's launch stays (other nodes and parallel sizes, other numerics)."""
    if getattr(block, "engine", "torch") == "torch" and block.launch is not None:
        return block.model_copy(update={"launch": None})
    return block


class EngineChoice(LaunchChoice):
    """The `engine` and `launch` keys every trainable stage block has (engines/checks.py checks
    the engine against the block's ENGINES, and that a launched engine has a `launch`)."""

    ENGINES: ClassVar[tuple[str, ...]] = ("torch",)
    """The engines this stage's block can be given (each trainable block names its own)."""

    engine: Engine = "torch"
    """Which engine trains the stage: torch (ours: in this process, or as a job with `launch`),
    megatron (Megatron-Bridge: pretrain, long_context, sft) or nemo_rl (NeMo RL: rl, distill), the
    last two launched."""
