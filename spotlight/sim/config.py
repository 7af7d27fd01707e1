"""Typed configuration of the simulator: one config per part, loaded from ``configs/sim/*.yaml``.

Every figure that comes from a publication says where in the YAML file that sets it; the
defaults here are the 512² Qwen-Image scenario on AWS (``configs/sim/qwen-image-512.yaml``).
An unknown key is an error naming the nearest valid one, as for run configs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotlight.config.base import ConfigError, Validated, build, replaced, spec

CLOUDS = ("aws", "gcp", "azure")
SYSTEMS = ("ondemand", "sync", "offpolicy", "rlboost", "spotlight")
# A spot instance's warning before it is taken (the clouds' documentation).
CLOUD_NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
# The 8x H100 instance of each cloud in the paper's price table (configs/prices.yaml).
CLOUD_INSTANCES = {"aws": "p5.48xlarge", "gcp": "a3-highgpu-8g", "azure": "ND96isr_H100_v5"}


@dataclass(kw_only=True, frozen=True)
class WorkloadConfig(Validated):
    """What one RL iteration computes (Flow-GRPO on Qwen-Image)."""

    resolution: int = spec(512, "Image side in pixels; image tokens are (side/16)².",
                           range=(16, 8192))
    prompts_per_iteration: int = spec(32, "Prompts per iteration.", range=(1, 100000))
    group_size: int = spec(16, "Samples (seeds) per prompt.", range=(2, 4096))
    rollout_steps: int = spec(20, "Denoising steps of a rollout.", range=(1, 1000))
    rollout_request_images: int = spec(4, "Images per rollout request (one batch on one SP "
                                          "group); requests are what the dispatcher hands out.",
                                       range=(1, 4096))
    candidates: int = spec(32, "Exploration's reference N: candidate seeds per prompt of sync "
                               "exploration and of the convergence ratios' measurement.",
                           range=(1, 100000))
    explore_request_images: int = spec(8, "Candidates per exploration request.",
                                       range=(1, 4096))
    reward_s_per_image: float = spec(0.05, "Reward (OCR / detector) seconds per image, on the "
                                           "GPU that rolled it out.", range=(0.0, 3600.0))

    @property
    def image_tokens(self) -> int:
        return (self.resolution // 16) ** 2

    @property
    def images(self) -> int:
        return self.prompts_per_iteration * self.group_size

    def validate(self) -> None:
        if self.candidates <= self.group_size:
            raise ConfigError(f"WorkloadConfig.candidates = {self.candidates} must exceed "
                              f"group_size = {self.group_size}: exploring no more seeds than a "
                              "group keeps selects nothing")


@dataclass(kw_only=True, frozen=True)
class TimingConfig(Validated):
    """Seconds of the work and of the cluster's housekeeping, per GPU (an H100 or H200: the
    same bf16 compute). The work's defaults are Qwen-Image at 512² as ``spotlight check-gpu``
    measured it (``configs/sim/qwen-image-512.yaml`` names each source)."""

    step_s: float = spec(0.118, "Seconds of one denoising step (both CFG passes) of one image "
                                "on one GPU at the workload's resolution.", range=(1e-6, 3600.0))
    batch_exponent: float = spec(1.0, "A batch of b images costs b^x times one image.",
                                 range=(0.0, 1.0))
    sp_degree: int = spec(1, "GPUs of one sequence-parallel group (a request runs on a group).",
                          range=(1, 64))
    sp_speedup: float = spec(1.0, "How much faster a group runs a step than one GPU.",
                             range=(0.01, 64.0))
    train_s_per_image: float = spec(1.01, "GPU-seconds of training per rollout image.",
                                    range=(0.0, 3600.0))
    weight_sync_s: float = spec(1.0, "Broadcast of new weights to the spot GPUs after training.",
                                range=(0.0, 3600.0))
    weight_load_s: float = spec(27.0, "Loading the weights from storage (a cold start).",
                                range=(0.0, 36000.0))
    peer_copy_s: float = spec(4.0, "Copying the weights from a live peer over the network.",
                              range=(0.0, 36000.0))
    process_start_s: float = spec(60.0, "A new spot instance: boot, container and imports.",
                                  range=(0.0, 36000.0))
    comm_init_s_per_rank: float = spec(2.0, "Communicator (NCCL) initialisation per rank of a "
                                            "group built from scratch.", range=(0.0, 3600.0))
    elastic_regroup_s: float = spec(0.5, "Spotlight's regroup of live executors that keep their "
                                         "weights (communicator rebuilt from the survivors).",
                                    range=(0.0, 3600.0))
    resume_s: float = spec(0.2, "Reading a preempted request's committed latent back.",
                           range=(0.0, 3600.0))
    dispatch_s: float = spec(0.0, "Seconds a worker waits between finishing a request and "
                                  "starting its next: the pool's decision, the scheduler's hop "
                                  "and the task's start (`spotlight bench scale` measures it).",
                             range=(0.0, 3600.0))
    driver_s_per_stage: float = spec(0.0, "The driver's seconds at each boundary of the critical "
                                          "path (before, between and after its stages): task "
                                          "round trips, seed selection, manifest writes -- every "
                                          "GPU waits.", range=(0.0, 3600.0))

    def validate(self) -> None:
        if self.sp_speedup > self.sp_degree:
            raise ConfigError(f"TimingConfig.sp_speedup = {self.sp_speedup} exceeds sp_degree = "
                              f"{self.sp_degree}: a group of d GPUs is at most d times faster")


@dataclass(kw_only=True, frozen=True)
class ClusterConfig(Validated):
    """The GPUs: on-demand ones always up, spot ones as a trace says."""

    ondemand_gpus: int = spec(8, "On-demand GPUs (they train, and roll out).", range=(1, 100000))
    spot_ratio: float = spec(1.0, "Spot GPUs per on-demand GPU when the trace has every node up.",
                             range=(0.0, 1000.0))
    gpus_per_spot_instance: int = spec(1, "GPUs of one spot instance (a trace node).",
                                       range=(1, 64))
    trace: str = spec("", "Spot availability trace (count JSON or event CSV), relative to the "
                          "config file; empty: the spot GPUs never leave.")
    trace_speedup: float = spec(1.0, "Play the trace this many times faster: more preemptions "
                                     "per hour (1 = as measured).", range=(1e-3, 1e4))
    trace_offset_s: float = spec(0.0, "Start the run this far into the trace.",
                                 range=(0.0, 1e9))
    cloud: str = spec("aws", "Prices and notice length of this cloud.", choices=CLOUDS)
    notice_s: float = spec(-1.0, "Warning before a preemption; -1 = the cloud's (AWS 120 s, GCP "
                                 "30 s, Azure 30 s), 0 = none.", range=(-1.0, 3600.0))
    prices: str = spec("../prices.yaml", "Price table (USD per instance-hour), relative to the "
                                         "config file.")
    victim_seed: int = spec(0, "Which spot instances a drop in a count trace takes.",
                            range=(0, 2**31 - 1))

    @property
    def notice(self) -> float:
        return CLOUD_NOTICE_S[self.cloud] if self.notice_s < 0 else self.notice_s

    @property
    def spot_instances(self) -> int:
        return int(round(self.ondemand_gpus * self.spot_ratio / self.gpus_per_spot_instance))


@dataclass(kw_only=True, frozen=True)
class ConvergenceConfig(Validated):
    """Iterations to the target: on-demand Flow-GRPO's count and each system's ratio to it.

    A ratio r means the system reaches the target in 1/r of on-demand's iterations when every
    iteration explores as the ratio's measurement did (``workload.candidates``, full replays,
    every prompt); an iteration that explored less counts proportionally less.
    """

    scenario: str = spec("bench", "'bench' = the ratios bench convergence measured here; "
                                  "'paper' = the ratios implied by the paper's headline.",
                         choices=("bench", "paper"))
    ondemand_iterations: int = spec(300, "Iterations on-demand Flow-GRPO needs to the target.",
                                    range=(1, 10**7))
    bench_sync_ratio: float = spec(2.0, "Bench: sync's iteration ratio.", range=(0.1, 100.0))
    bench_spotlight_ratio: float = spec(2.0, "Bench: spotlight's iteration ratio.",
                                        range=(0.1, 100.0))
    paper_sync_ratio: float = spec(2.0, "Paper: sync's iteration ratio.", range=(0.1, 100.0))
    paper_spotlight_ratio: float = spec(2.0, "Paper: spotlight's iteration ratio.",
                                        range=(0.1, 100.0))
    offpolicy_ratio: float = spec(1.0, "One-step off-policy pipelining's iteration ratio.",
                                  range=(0.1, 100.0))
    spread_per_log_candidates: float = spec(0.3, "Selected groups' reward spread over random "
                                                 "ones is 1 + x ln(N / group size): the "
                                                 "planner's payoff.", range=(0.0, 10.0))

    def ratio(self, system: str) -> float:
        """Iteration ratio at the reference exploration (1 for systems that do not explore)."""
        if system == "offpolicy":
            return self.offpolicy_ratio
        if system not in ("sync", "spotlight"):
            return 1.0
        return getattr(self, f"{self.scenario}_{system}_ratio")


@dataclass(kw_only=True, frozen=True)
class SimPlannerConfig(Validated):
    """Spotlight's exploration planner as the simulated run configures it."""

    candidates: list[int] = spec([24, 32, 48, 64], "N arms: candidates per prompt.")
    steps: list[int] = spec([0], "M arms: replay steps (0 = the rollout's).")
    gamma: float = spec(0.3, "UCB bonus weight.", range=(0.0, 10.0))
    budget_fraction: float = spec(0.9, "Share of the predicted training time a plan may fill.",
                                  range=(0.05, 1.0))


@dataclass(kw_only=True, frozen=True)
class SimConfig(Validated):
    """A simulated scenario: workload, timings, cluster, convergence and the planner."""

    name: str = spec("qwen-image-512", "The scenario's name (reports and plots).")
    systems: list[str] = spec(list(SYSTEMS), "Systems to compare.")
    max_iterations: int = spec(5000, "Stop a system that has not reached the target.",
                               range=(1, 10**7))
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    convergence: ConvergenceConfig = field(default_factory=ConvergenceConfig)
    planner: SimPlannerConfig = field(default_factory=SimPlannerConfig)
    source: str = ""   # the file it came from (paths resolve against its folder)

    def validate(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if unknown or not self.systems:
            raise ConfigError(f"SimConfig.systems = {self.systems!r}: name systems from "
                              f"{list(SYSTEMS)}")
        tokens, degree = self.workload.image_tokens, self.timing.sp_degree
        if tokens % degree:
            raise ConfigError(f"timing.sp_degree = {degree} does not divide the "
                              f"{tokens} image tokens of {self.workload.resolution}²; pick a "
                              "degree that divides them")
        if self.cluster.ondemand_gpus < degree:
            raise ConfigError(f"cluster.ondemand_gpus = {self.cluster.ondemand_gpus} is fewer "
                              f"than one SP group of timing.sp_degree = {degree}")

    def with_values(self, values: dict[str, Any]) -> "SimConfig":
        return replaced(self, values)

    def path(self, value: str) -> Path | None:
        """A file the config names, resolved against the config file's folder."""
        if not value:
            return None
        path = Path(value)
        if not path.is_absolute() and self.source:
            path = Path(self.source).parent / path
        return path.resolve()

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data


def load_sim_config(path: str | Path, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Read, check and return a scenario; ``overrides`` are dotted keys (``cluster.cloud``)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"simulator config '{path}' cannot be read ({err}); pass a file such "
                          "as configs/sim/qwen-image-512.yaml") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML syntax error ({err}); fix the file") from None
    config = build(SimConfig, data or {}, "", str(path))
    config = dataclasses.replace(config, source=str(path))
    if overrides:
        config = dataclasses.replace(replaced(config, overrides), source=str(path))
    for name, value in (("cluster.trace", config.cluster.trace),
                        ("cluster.prices", config.cluster.prices)):
        resolved = config.path(value)
        if resolved is not None and not resolved.is_file():
            raise ConfigError(f"{path}: {name} = '{value}' names no file ({resolved}); give a "
                              "path relative to the config file")
    return config
