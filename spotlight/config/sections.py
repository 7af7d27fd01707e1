"""The components' configs: one frozen, validated dataclass per component.

Every field documents itself (``help``) and states its allowed range or choices; the generated
reference (``docs/configuration.md``) is made from exactly these declarations."""
from __future__ import annotations

from dataclasses import dataclass, field

from spotlight.config.base import ConfigError, Validated, spec
from spotlight.config.reward_service import RewardServiceConfig


@dataclass(kw_only=True, frozen=True)
class WorldConfig(Validated):
    """The embedded digits world: which task, canvas size and prompt files."""

    task: str = spec("ocr", "Task family: 'ocr' (render a digit string) or 'geneval' (objects).",
                     choices=("ocr", "geneval"))
    canvas_height: int = spec(12, "Canvas height in pixels (even, for 2x2 packing).", range=(8, 64))
    canvas_width: int = spec(32, "Canvas width in pixels (even, for 2x2 packing).", range=(16, 128))
    glyphs_per_class: int = spec(6, "Handwritten instances per digit the world draws from "
                                 "(0 = all ~180); fewer styles pretrain faster.", range=(0, 200))
    train_prompts: str = spec("configs/prompts/ocr_train.txt", "Training prompt file (relative to "
                               "the config file that names it).", path="exists")
    val_prompts: str = spec("configs/prompts/ocr_val.txt", "Held-out validation prompt file "
                             "(relative to the config file that names it).", path="exists")

    def validate(self) -> None:
        if self.canvas_height % 2 or self.canvas_width % 2:
            raise ConfigError(f"WorldConfig canvas {self.canvas_height}x{self.canvas_width} must "
                              "have even sides: the policy packs 2x2 pixel patches into tokens")

    def check_drawable(self) -> None:
        """The digits world draws its canvases (model.policy: digits): room for the task."""
        if self.task == "ocr" and self.canvas_width < 28:
            raise ConfigError("WorldConfig.canvas_width must be >= 28 for 'ocr' (3 digits)")
        if self.task == "geneval" and (self.canvas_height < 20 or self.canvas_width < 32):
            raise ConfigError("WorldConfig canvas must be at least 20x32 for 'geneval' "
                              "(two rows of three object slots)")


@dataclass(kw_only=True, frozen=True)
class PretrainConfig(Validated):
    """Flow-matching pretraining of the base model on composed canvases."""

    steps: int = spec(2000, "Optimizer steps (the time budget may stop earlier).", range=(1, 10**7))
    time_budget_s: float = spec(280.0, "Wall-clock cap on training.", range=(1.0, 86400.0))
    batch_size: int = spec(32, "Canvases per step.", range=(1, 4096))
    lr: float = spec(2e-3, "Peak AdamW learning rate.", range=(1e-7, 1.0))
    warmup_steps: int = spec(50, "Linear warm-up steps.", range=(0, 10**6))
    seed: int = spec(0, "Seed of data composition and initialisation.", range=(0, 2**31 - 1))


@dataclass(kw_only=True, frozen=True)
class RewardConfig(Validated):
    """Reward by registered name, the models behind it, and where it runs (``service``)."""

    name: str = spec("ocr", "Registered reward name (see spotlight.rewards.REWARDS).")
    recognizer_epochs: int = spec(30, "Recogniser training epochs.", range=(1, 1000))
    recognizer_seed: int = spec(0, "Recogniser split and initialisation seed.",
                                range=(0, 2**31 - 1))
    ocr_engine: str = spec("rapidocr", "OCR engine of reward 'ocr-text' (real images): 'rapidocr' "
                           "runs PP-OCR, offline.", choices=("rapidocr", "transformers"))
    ocr_model: str = spec("", "OCR engine 'transformers': a folder or object-storage URL of a VLM "
                          "OCR model + processor (AutoModelForImageTextToText, e.g. DeepSeek-OCR).")
    detector: str = spec("", "Reward 'geneval-image': a folder or object-storage URL of a "
                         "transformers object-detection model and its image processor.")
    color_classifier: str = spec("", "Reward 'geneval-image': a folder or object-storage URL of a "
                                 "CLIP-style model and processor (colour clauses).")
    service: RewardServiceConfig = field(default_factory=RewardServiceConfig)


@dataclass(kw_only=True, frozen=True)
class SamplerConfig(Validated):
    """The denoising sampler used for rollouts (SDE) and validation (ODE)."""

    num_steps: int = spec(10, "Denoising steps.", range=(1, 1000))
    noise_level: float = spec(0.7, "SDE noise scale (Flow-GRPO's a).", range=(0.0, 2.0))
    sde_type: str = spec("flow", "'flow' = Flow-GRPO's SDE; 'cps' = coefficients-preserving.",
                         choices=("flow", "cps"))
    sde_window_start: int = spec(0, "First step that uses the SDE (and is trained).",
                                 range=(0, 1000))
    sde_window_size: int = spec(4, "Number of SDE steps (cut at num_steps); 0 = every step from "
                                "the start. Early steps decide which digit goes where; late ones "
                                "only render it.", range=(0, 1000))
    shift: float = spec(1.0, "Timestep shift of the sigma schedule (1 = linear).",
                        range=(0.1, 20.0))
    schedule: str = spec("shift", "Sigma schedule: 'shift' = linspace(1, 0) time-shifted by "
                         "sampler.shift; 'model' = the policy's own (qwen-image: its weights' "
                         "FlowMatchEulerDiscreteScheduler with the resolution's dynamic shift, as "
                         "QwenImagePipeline sets it).", choices=("shift", "model"))

    @property
    def sde_window_end(self) -> int:
        """The step after the last SDE step: everything a seed decides happens before it."""
        if self.sde_window_size == 0:
            return self.num_steps
        return min(self.num_steps, self.sde_window_start + self.sde_window_size)

    def validate(self) -> None:
        if self.sde_window_start >= self.num_steps:
            raise ConfigError(f"SamplerConfig.sde_window_start = {self.sde_window_start} must be "
                              f"below num_steps = {self.num_steps}")


@dataclass(kw_only=True, frozen=True)
class GRPOConfig(Validated):
    """Flow-GRPO optimisation."""

    prompts_per_iteration: int = spec(16, "Prompts per iteration.", range=(1, 4096))
    group_size: int = spec(8, "Samples (seeds) per prompt.", range=(2, 1024))
    request_prompts: int = spec(4, "Prompts per rollout request, each with its whole group: the "
                                   "rollout is sampled in these fixed-shape chunks wherever it "
                                   "runs, so its placement never changes its results.",
                                range=(1, 4096))
    lr: float = spec(3e-4, "AdamW learning rate.", range=(1e-8, 1.0))
    weight_decay: float = spec(0.0, "AdamW weight decay.", range=(0.0, 1.0))
    clip_range: float = spec(0.2, "PPO ratio clip.", range=(1e-4, 10.0))
    adv_clip_max: float = spec(5.0, "Advantages are clipped to [-x, x].", range=(0.1, 100.0))
    beta_kl: float = spec(0.004, "Weight of the KL to the frozen reference (0 disables).",
                          range=(0.0, 10.0))
    timestep_fraction: float = spec(1.0, "Fraction of SDE steps trained per sample.",
                                    range=(0.01, 1.0))
    global_std: bool = spec(False, "Normalise advantages by the batch std instead of per prompt.")
    lr_decay_iterations: int = spec(0, "Decay the learning rate linearly to lr x lr_min_fraction "
                                       "over this many iterations, then hold it (0: constant). "
                                       "For time-budgeted runs, whose late steps mostly add noise.",
                                    range=(0, 10**7))
    lr_min_fraction: float = spec(0.1, "Where the decay ends, as a fraction of lr.",
                                  range=(0.0, 1.0))
    inner_epochs: int = spec(1, "Passes over each rollout batch.", range=(1, 100))
    micro_batch: int = spec(64, "Samples per backward pass.", range=(1, 4096))
    max_grad_norm: float = spec(1.0, "Gradient clipping norm.", range=(1e-3, 1e6))
    trainable: str = spec("transformer", "'transformer' or 'all' (also the prompt encoder).",
                          choices=("transformer", "all"))


@dataclass(kw_only=True, frozen=True)
class ValidationConfig(Validated):
    """Held-out prompts x fixed seeds, deterministic ODE sampling."""

    seeds_per_prompt: int = spec(2, "Fixed seeds per validation prompt.", range=(1, 64))
    max_prompts: int = spec(64, "Validation prompts used (first N of the file).", range=(1, 10**6))
    every: int = spec(5, "Validate every N iterations.", range=(1, 10**6))


@dataclass(kw_only=True, frozen=True)
class ExplorationConfig(Validated):
    """Seed exploration: candidate seeds per prompt, scored by replaying the rollout sampler."""

    candidates: int = spec(16, "Candidate seeds explored per prompt (N); G of them are kept "
                           "(exploration.selection).", range=(2, 4096))
    selection: str = spec("max-variance", "Which G of a prompt's N explored seeds an iteration "
                          "keeps: 'max-variance' = the most spread (the lowest and highest "
                          "rewards); 'top' = the G best; 'quantiles' = G at evenly spaced "
                          "ranks, worst and best included (graded advantages).",
                          choices=("max-variance", "top", "quantiles"))
    steps: int = spec(0, "Model evaluations of an exploration replay (M); 0 = the rollout's "
                         "steps. Fewer keep the rollout's SDE window and compress the "
                         "deterministic tail after it.", range=(0, 1000))
    # Measured with one thread: 2.35 ms per sample-step at batch 8, 1.81 at 32 (one prompt's
    # candidates in one request), and a request's dispatch and stream set-up are paid once.
    request_batch: int = spec(32, "Candidates per exploration request (a fixed batch shape).",
                              range=(1, 4096))
    deadline: bool = spec(True, "Stop exploring when training ends (anytime); false waits for "
                                "every candidate (used to compare runs bit for bit).")
    window: str = spec("auto", "When stale exploration of the next iteration runs: 'iteration' "
                               "= from this iteration's start (θ_k is ready then); 'train' = "
                               "while training runs; 'auto' = 'train' where the spot workers "
                               "also pull the rollout (busy with it until then), else 'iteration'.",
                       choices=("auto", "iteration", "train"))


@dataclass(kw_only=True, frozen=True)
class PlannerConfig(Validated):
    """The exploration planner: a bandit over (N candidates, M steps) under the training time."""

    enabled: bool = spec(True, "Plan N and M per iteration; false explores exploration.candidates "
                               "with the rollout's steps every iteration.")
    candidates: list[int] = spec([16, 24, 32], "The N arms: candidate seeds per prompt (only N > "
                                          "grpo.group_size selects anything).")
    # Measured on the digits world (10 steps, SDE window 4): a 7-step replay ranks seeds at
    # Kendall tau 0.89 against the full one, a 6-step replay at 0.78, for 70% / 60% of its cost.
    steps: list[int] = spec([0, 7, 6], "The M arms: model evaluations per replay (0 = the "
                            "rollout's steps; fewer compress the ODE tail after the SDE window).")
    gamma: float = spec(0.3, "UCB bonus weight: larger tries settings more, smaller exploits.",
                        range=(0.0, 10.0))
    budget_fraction: float = spec(0.9, "Share of the predicted exploration window a plan may fill.",
                                  range=(0.05, 1.0))
    train_time_window: int = spec(5, "Iterations averaged to predict the exploration window "
                                     "(training time, or rollout to training end).",
                                  range=(1, 1000))
    # Measured offline on the base OCR model (docs/results.md, "What the exploration settings
    # buy"): the selected groups' spread grows with N at every M and with M at every N. So under
    # billed payoff (every fitting setting costs the window) a dominated arm can only lose, and
    # trying it spends iterations: 9 arms took 18 iterations of a 15-iteration run to try once.
    prune_dominated: bool = spec(True, "With payoff 'billed', leave out a fitting setting when "
                                       "another that fits has at least as many candidates and "
                                       "at least as many replay steps.")
    # Measured on OCR (docs/results.md, "Fewer candidates on every prompt"): 12 candidates on
    # every prompt learned per iteration as 16 did (four paired seeds), and at 1:1 spot they cost
    # about what 16 on 23 of 32 prompts cost, with no rollout left on the gpu path.
    cover_candidates: int = spec(0, "With objective.train_on_explored: where no setting fits "
                                    "every prompt, explore every prompt with this many "
                                    "candidates (fewer than planner.candidates, more than "
                                    "grpo.group_size) if the iteration waits less for it than "
                                    "for the rollout of the prompts a smaller plan leaves; "
                                    "0 = never.", range=(0, 4096))
    payoff: str = spec("billed", "What a setting's spread gain is paid per: 'billed' = the "
                                 "spot-seconds the exploration window held its slots (spot "
                                 "capacity is billed while alive, busy or idle, so the best "
                                 "setting that fits wins), 'busy' = the spot-seconds exploration "
                                 "computed (for clusters that release idle spot capacity).",
                       choices=("billed", "busy"))

    def validate(self) -> None:
        for name, low in (("candidates", 1), ("steps", 0)):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < low
                                 for v in values):
                raise ConfigError(f"PlannerConfig.{name} = {values!r} must be a non-empty list of "
                                  f"integers >= {low}, e.g. [8, 16, 32]")


@dataclass(kw_only=True, frozen=True)
class FidelityConfig(Validated):
    """Rank fidelity of stale exploration: audits drive the fallback, with hysteresis.

    The fallback watches the *audit* τ: random candidates re-scored with fresh weights, an
    unbiased sample of the stale ranking. The τ over the seeds that were selected (reported
    every iteration as ``kendall_tau``) is biased upwards by the selection itself.
    """

    floor: float = spec(0.3, "Rolling audit τ below this falls back.", range=(-1.0, 1.0))
    recover_margin: float = spec(0.05, "Return when the rolling audit τ reaches floor + margin.",
                                 range=(0.0, 1.0))
    window: int = spec(5, "Audits in the rolling τ (one per audited iteration).", range=(1, 1000))
    min_iterations: int = spec(3, "Audited iterations before any decision.", range=(1, 1000))
    fallback: str = spec("sync", "While τ is low: 'sync' (explore with fresh weights on gpu "
                                 "workers) or 'random' seeds.", choices=("sync", "random"))
    audit_every: int = spec(1, "Audit every R iterations (0 = never, and no fallback): "
                               "re-score random candidates with fresh weights on spot workers "
                               "while the gpu workers roll out.", range=(0, 10**6))
    audit_prompts: int = spec(4, "Prompts per audit, drawn at random.", range=(1, 4096))
    audit_candidates: int = spec(8, "Candidates per audited prompt, drawn at random (τ is "
                                    "taken within each prompt).", range=(2, 4096))

    def validate(self) -> None:
        if self.min_iterations > self.window:
            raise ConfigError(f"FidelityConfig.min_iterations = {self.min_iterations} must not "
                              f"exceed FidelityConfig.window = {self.window}")


@dataclass(kw_only=True, frozen=True)
class TLSConfig(Validated):
    """Mutual TLS between this client and a cluster spanning machines (all three files, or none)."""

    ca_file: str = spec("", "CA certificate that signed the scheduler's and workers' "
                            "certificates (PEM), relative to the config file.", path="exists")
    cert: str = spec("", "This client's certificate (PEM), signed by the same CA.", path="exists")
    key: str = spec("", "This client's private key (PEM); may be the certificate file if it "
                        "holds both.", path="exists")

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file or self.cert or self.key)

    def validate(self) -> None:
        missing = [n for n in ("ca_file", "cert") if not getattr(self, n)]
        if self.enabled and missing:
            raise ConfigError(f"TLSConfig: {', '.join(missing)} missing; TLS needs "
                              "cluster.tls.ca_file and cluster.tls.cert (and key, unless the "
                              "certificate file holds the key too)")


@dataclass(kw_only=True, frozen=True)
class ClusterConfig(Validated):
    """Where tasks run: an embedded local cluster, or an existing scheduler."""

    scheduler: str = spec("", "Address of an existing scheduler (tcp://HOST:PORT); empty starts "
                              "an embedded cluster on this machine.")
    gpu_workers: int = spec(1, "Embedded on-demand workers (resources gpu=1).", range=(1, 64))
    spot_workers: int = spec(1, "Embedded spot workers (resources spot=1).", range=(0, 64))
    threads_per_worker: int = spec(1, "Threads per worker; torch intra-op threads match it.",
                                   range=(1, 256))
    connect_timeout_s: float = spec(30.0, "One hard deadline for reaching an existing "
                                          "scheduler: the handshake and the wait for the worker "
                                          "classes the run needs. A peer that is not a Dask "
                                          "scheduler fails within it.", range=(0.1, 3600.0))
    worker_wait_s: float = spec(30.0, "Embedded cluster: how long its workers may take to "
                                      "start. During a run: how long a stage waits for a "
                                      "worker class that has none left before the run stops.",
                                range=(0.0, 3600.0))
    missing_spot: str = spec("error", "A spotlight-mode run on a cluster without spot workers: "
                                      "'error', or fall back to 'sync' exploration on gpu workers.",
                             choices=("error", "sync"))
    dashboard: bool = spec(True, "Serve the Dask dashboard of an embedded cluster (on "
                                 "127.0.0.1); false starts no HTTP server at all.")
    tls: TLSConfig = field(default_factory=TLSConfig, metadata={
        "help": "Mutual TLS to an existing scheduler (see cluster.tls.*)."})
    spot_nice: int = spec(10, "CPU niceness of embedded spot workers: on a shared machine they "
                              "take spare cycles only, as a separate spot VM would.", range=(0, 19))
    devices_per_node: int = spec(0, "GPUs a node's worker processes share out, one each; 0: the "
                                    "CUDA devices a worker sees.", range=(0, 64))
    start_method: str = spec("forkserver", "How the embedded cluster starts its worker "
                                           "processes: 'forkserver' forks them from one "
                                           "process that imported the project once (a worker "
                                           "is up in well under a second); 'spawn' starts each "
                                           "as a fresh interpreter (seconds each).",
                             choices=("forkserver", "spawn"))


NOTICE_SOURCES = ("sigterm", "file", "aws", "gcp", "azure")


@dataclass(kw_only=True, frozen=True)
class PreemptionConfig(Validated):
    """How spot requests are dispatched and how a spot worker learns it is about to go."""

    notice_sources: list[str] = spec(["sigterm"], f"Where a spot worker hears of its preemption: "
                                             f"any of {list(NOTICE_SOURCES)}.")
    notice_file: str = spec("", "Path whose appearance is a notice (source 'file').",
                            path="optional")
    aws_url: str = spec("", "AWS spot instance-action URL (empty: the instance metadata default).")
    gcp_url: str = spec("", "GCP 'preempted' metadata URL (empty: the default).")
    azure_url: str = spec("", "Azure scheduled-events URL (empty: the default).")
    notice_poll_s: float = spec(1.0, "How often the polled sources are asked.", range=(0.05, 600.0))
    no_spot_wait_s: float = spec(60.0, "How long requests wait with no spot worker at all before "
                                       "the stage gives up on them (the seeds they were for "
                                       "are then random, and recorded as filled).",
                                 range=(0.0, 86400.0))
    heartbeat_silence_s: float = spec(20.0, "A worker the scheduler has not heard from for this "
                                            "long (its heartbeats, about one a second) is cut "
                                            "off: its requests resume elsewhere and it gets no "
                                            "more of the stage until it is heard from again -- a "
                                            "partition is found in this time, whatever the step "
                                            "time. 0: off.", range=(0, 86400.0))
    liveness_steps: float = spec(20.0, "A request with no new committed step for this many step "
                                       "times has a cut-off worker: it resumes elsewhere, that "
                                       "worker gets no more of the stage. 0: off.", range=(0, 1e4))
    liveness_floor_s: float = spec(60.0, "The shortest such silence.", range=(1.0, 86400.0))
    liveness_first_s: float = spec(120.0, "The silence allowed before an attempt's first "
                                          "step (it may load weights).", range=(1.0, 86400.0))

    def validate(self) -> None:
        bad = [s for s in self.notice_sources if s not in NOTICE_SOURCES]
        if bad:
            raise ConfigError(f"PreemptionConfig.notice_sources: {bad} unknown; choose from "
                              f"{list(NOTICE_SOURCES)}")
        if "file" in self.notice_sources and not self.notice_file:
            raise ConfigError("PreemptionConfig.notice_sources has 'file' but notice_file is "
                              "empty; set preemption.notice_file to the path to watch")
        if 0 < (steps := self.liveness_steps) <= 1:
            raise ConfigError(f"preemption.liveness_steps = {steps}: use 0 (off) or >1")


WORKER_CLASSES = ("gpu", "spot")


@dataclass(kw_only=True, frozen=True)
class PlacementConfig(Validated):
    """Which worker classes run a stage. An empty list takes the mode's default (see
    :meth:`RunConfig.placed`): spotlight and rlboost roll out on gpu and spot, vanilla and
    sync on gpu; stale exploration runs on spot, synchronous exploration on gpu."""

    rollout: list[str] = spec([], "Worker classes that pull the rollout's requests "
                                  "(grpo.request_prompts prompts each): [gpu] runs them in one "
                                  "task; with spot, every worker of the listed classes pulls "
                                  "requests, the tail goes to the fastest by measured "
                                  "speed and an idle gpu worker re-runs a straggling spot one. "
                                  "Empty: [gpu, spot] in spotlight and rlboost mode, else [gpu].")
    explore: list[str] = spec([], "Worker classes that pull exploration (and audit) requests. "
                                  "Empty: [spot] for stale exploration, [gpu] for sync mode's.")
    reward: list[str] = spec(["gpu"], "The worker class that scores the rollout (one).")
    train: list[str] = spec(["gpu"], "The worker class that trains, checkpoints, validates "
                                     "and embeds prompts (one).")

    def validate(self) -> None:
        for stage in ("rollout", "explore", "reward", "train"):
            classes = getattr(self, stage)
            bad = [c for c in classes if c not in WORKER_CLASSES]
            if bad or len(set(classes)) != len(classes):
                raise ConfigError(f"placement.{stage} = {classes}: list each of "
                                  f"{list(WORKER_CLASSES)} at most once (or none: the mode's "
                                  f"default)")
        for stage in ("reward", "train"):
            if len(getattr(self, stage)) != 1:
                raise ConfigError(f"placement.{stage} = {getattr(self, stage)}: name one worker "
                                  f"class, e.g. [gpu] (the stage runs as one task)")


@dataclass(kw_only=True, frozen=True)
class InjectorConfig(Validated):
    """Preemption injection on the embedded cluster: a spot trace replay or a Poisson rate."""

    trace: str = spec("", "Spot trace to replay (count JSON or event CSV, see shared traces), "
                          "relative to the config file; empty: none.", path="exists")
    time_scale: float = spec(1.0, "Wall seconds per trace second (0.01: a 5 min tick lasts 3 s).",
                             range=(1e-9, 1e6))
    poisson_rate_per_hour: float = spec(0.0, "Without a trace: preemptions per spot worker-hour "
                                             "(0 = none).", range=(0.0, 1e6))
    restart_after_s: float = spec(5.0, "Poisson mode: seconds until a preempted worker's "
                                       "replacement is started.", range=(0.0, 86400.0))
    action: str = spec("kill", "What a drop does: 'kill' (SIGKILL, no warning), 'notice' "
                               "(SIGTERM notice, graceful) or 'mixed' (alternating).",
                       choices=("kill", "notice", "mixed"))
    seed: int = spec(0, "Chooses the victims of each drop.", range=(0, 2**31 - 1))


MARKETS = ("on_demand", "spot")


@dataclass(kw_only=True, frozen=True)
class CostConfig(Validated):
    """What the cost ledger charges: a price table and the instance behind each worker class."""

    prices: str = spec("configs/prices.yaml", "Price table file (USD per instance-hour), "
                                              "relative to the config file.", path="exists")
    provider: str = spec("aws", "Cloud provider in the price table.")
    gpu_instance: str = spec("p5.48xlarge", "Instance type the 'gpu' (on-demand) workers run on.")
    gpu_market: str = spec("on_demand", "Market the 'gpu' workers are bought on.", choices=MARKETS)
    spot_instance: str = spec("p5.48xlarge", "Instance type the 'spot' workers run on.")
    spot_market: str = spec("spot", "Market the 'spot' workers are bought on.", choices=MARKETS)


@dataclass(kw_only=True, frozen=True)
class ParallelConfig(Validated):
    """Parallelism across workers: which request sizes run on sequence-parallel groups, and
    whether training is data-parallel over the gpu workers."""

    size_classes: list[str] = spec(
        [], "Request size classes with their SP degree, 'HEIGHTxWIDTH:DEGREE' (e.g. "
            "['512x512:1', '1280x1280:4']): a rollout request of that image size runs on a group "
            "of DEGREE workers of one class, its attention split Ulysses-style. Sizes not listed "
            "run on one worker.")
    data_parallel: bool = spec(False, "Train on every gpu worker at once: each computes its "
                               "share of every micro-batch and the gradients are summed over "
                               "them (NCCL on CUDA, gloo on CPU): the single-worker step.")
    shard_training: bool = spec(False, "Train sharded over every gpu worker (FSDP2): each holds "
                                "1/N of the trained weights, their gradients and the optimizer "
                                "state, and the optimizer state is checkpointed as shards; the "
                                "step is the data-parallel one. For full fine-tuning "
                                "(lora_rank 0) of a model whose training state does not fit one "
                                "device. Objective flow-grpo, grpo.trainable 'transformer'.")

    def validate(self) -> None:
        seen: set[tuple[int, int]] = set()
        for entry in self.size_classes:
            size, degree = parse_size_class(entry)
            if size in seen:
                raise ConfigError(f"ParallelConfig.size_classes names {size[0]}x{size[1]} twice; "
                                  "give each image size one degree")
            seen.add(size)

    def degree(self, height: int, width: int) -> int:
        """The SP degree of requests of ``height`` x ``width`` images (1 if not listed)."""
        return dict(parse_size_class(e) for e in self.size_classes).get((height, width), 1)


def parse_size_class(entry: str) -> tuple[tuple[int, int], int]:
    """'1280x1280:4' -> ((1280, 1280), 4), or a ConfigError saying the form."""
    try:
        size, degree = entry.replace(" ", "").split(":")
        height, width = (int(v) for v in size.lower().split("x"))
        degree = int(degree)
    except ValueError:
        raise ConfigError(f"parallel.size_classes entry {entry!r} is not 'HEIGHTxWIDTH:DEGREE' "
                          "(e.g. '1280x1280:4')") from None
    if min(height, width) < 1 or degree < 1:
        raise ConfigError(f"parallel.size_classes entry {entry!r}: sizes and degree must be >= 1")
    return (height, width), degree
