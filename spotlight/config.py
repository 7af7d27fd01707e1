"""Typed run configuration: one dataclass per component, loaded from YAML and validated up front.

Every field carries its allowed range or choices in its metadata; validation runs in
``__post_init__`` so a bad value is refused before any worker starts or any file is written.
An unknown YAML key is an error naming the key, its file and the nearest valid key.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says what to change."""


def spec(default: Any, help: str, *, range: tuple[float, float] | None = None,
         choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field with its documentation and validation rule."""
    meta = {"help": help, "range": range, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


class Validated:
    """Mixin: checks every field against its range/choices after construction."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            rng, choices = f.metadata.get("range"), f.metadata.get("choices")
            where = f"{type(self).__name__}.{f.name}"
            if choices is not None and value not in choices:
                raise ConfigError(f"{where} = {value!r} is not allowed; choose one of {list(choices)}")
            if rng is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"{where} = {value!r} must be a number in [{rng[0]}, {rng[1]}]")
                if not math.isfinite(value) or not rng[0] <= value <= rng[1]:
                    raise ConfigError(f"{where} = {value!r} is out of range; allowed range is "
                                      f"[{rng[0]}, {rng[1]}]")
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; override where fields constrain each other."""


@dataclass(kw_only=True)
class WorldConfig(Validated):
    """The embedded digits world: which task, canvas size and prompt files."""

    task: str = spec("ocr", "Task family: 'ocr' (render a digit string) or 'geneval' (objects).",
                     choices=("ocr", "geneval"))
    canvas_height: int = spec(12, "Canvas height in pixels (even, for 2x2 packing).", range=(8, 64))
    canvas_width: int = spec(32, "Canvas width in pixels (even, for 2x2 packing).", range=(16, 128))
    glyphs_per_class: int = spec(6, "Handwritten instances per digit the world draws from "
                                 "(0 = all ~180); fewer styles pretrain faster.", range=(0, 200))
    train_prompts: str = spec("configs/prompts/ocr_train.txt", "Training prompt file.")
    val_prompts: str = spec("configs/prompts/ocr_val.txt", "Held-out validation prompt file.")

    def validate(self) -> None:
        if self.canvas_height % 2 or self.canvas_width % 2:
            raise ConfigError(f"WorldConfig canvas {self.canvas_height}x{self.canvas_width} must have "
                              "even sides: the policy packs 2x2 pixel patches into tokens")
        if self.task == "ocr" and self.canvas_width < 28:
            raise ConfigError("WorldConfig.canvas_width must be >= 28 for 'ocr' (three 8-pixel digits)")
        if self.task == "geneval" and (self.canvas_height < 20 or self.canvas_width < 32):
            raise ConfigError("WorldConfig canvas must be at least 20x32 for 'geneval' "
                              "(two rows of three object slots)")


@dataclass(kw_only=True)
class ModelConfig(Validated):
    """The policy: a tiny QwenImageTransformer2DModel plus a word-level prompt encoder."""

    num_layers: int = spec(4, "Transformer blocks.", range=(1, 64))
    num_attention_heads: int = spec(2, "Attention heads.", range=(1, 64))
    attention_head_dim: int = spec(32, "Width of one head; must be divisible by 8 (RoPE axes).",
                                   range=(8, 256))
    text_dim: int = spec(64, "Prompt-encoder width (the transformer's joint_attention_dim).",
                         range=(8, 4096))
    text_layers: int = spec(2, "Prompt-encoder transformer layers.", range=(0, 12))
    prediction: str = spec("sample", "What the transformer outputs: 'sample' (clean canvas, "
                           "converted to velocity) or 'velocity'.", choices=("sample", "velocity"))
    max_prompt_tokens: int = spec(24, "Prompt tokens kept after word/digit tokenisation.",
                                  range=(4, 256))

    def validate(self) -> None:
        if self.attention_head_dim % 8:
            raise ConfigError(f"ModelConfig.attention_head_dim = {self.attention_head_dim} must be "
                              "divisible by 8 (split across three RoPE axes)")


@dataclass(kw_only=True)
class PretrainConfig(Validated):
    """Flow-matching pretraining of the base model on composed canvases."""

    steps: int = spec(2000, "Optimizer steps (the time budget may stop earlier).", range=(1, 10**7))
    time_budget_s: float = spec(280.0, "Wall-clock cap on training.", range=(1.0, 86400.0))
    batch_size: int = spec(32, "Canvases per step.", range=(1, 4096))
    lr: float = spec(2e-3, "Peak AdamW learning rate.", range=(1e-7, 1.0))
    warmup_steps: int = spec(50, "Linear warm-up steps.", range=(0, 10**6))
    seed: int = spec(0, "Seed of data composition and initialisation.", range=(0, 2**31 - 1))


@dataclass(kw_only=True)
class RewardConfig(Validated):
    """Reward by registered name plus the digit recogniser behind it."""

    name: str = spec("ocr", "Registered reward name (see spotlight.rewards.REWARDS).")
    recognizer_epochs: int = spec(30, "Recogniser training epochs.", range=(1, 1000))
    recognizer_seed: int = spec(0, "Recogniser split and initialisation seed.", range=(0, 2**31 - 1))


@dataclass(kw_only=True)
class SamplerConfig(Validated):
    """The denoising sampler used for rollouts (SDE) and validation (ODE)."""

    num_steps: int = spec(10, "Denoising steps.", range=(1, 1000))
    noise_level: float = spec(0.7, "SDE noise scale (Flow-GRPO's a).", range=(0.0, 2.0))
    sde_type: str = spec("flow", "'flow' = Flow-GRPO's SDE; 'cps' = coefficients-preserving.",
                         choices=("flow", "cps"))
    sde_window_start: int = spec(0, "First step that uses the SDE (and is trained).",
                                 range=(0, 1000))
    sde_window_size: int = spec(4, "Number of SDE steps; 0 = every step from the start. Early "
                                "steps decide which digit goes where; late ones only render it.",
                                range=(0, 1000))
    shift: float = spec(1.0, "Timestep shift of the sigma schedule (1 = linear).", range=(0.1, 20.0))

    def validate(self) -> None:
        if self.sde_window_start >= self.num_steps:
            raise ConfigError(f"SamplerConfig.sde_window_start = {self.sde_window_start} must be "
                              f"below num_steps = {self.num_steps}")


@dataclass(kw_only=True)
class GRPOConfig(Validated):
    """Flow-GRPO optimisation."""

    prompts_per_iteration: int = spec(16, "Prompts per iteration.", range=(1, 4096))
    group_size: int = spec(8, "Samples (seeds) per prompt.", range=(2, 1024))
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


@dataclass(kw_only=True)
class ValidationConfig(Validated):
    """Held-out prompts x fixed seeds, deterministic ODE sampling."""

    seeds_per_prompt: int = spec(2, "Fixed seeds per validation prompt.", range=(1, 64))
    max_prompts: int = spec(64, "Validation prompts used (first N of the file).", range=(1, 10**6))
    every: int = spec(5, "Validate every N iterations.", range=(1, 10**6))


@dataclass(kw_only=True)
class ExplorationConfig(Validated):
    """Seed exploration: candidate seeds per prompt, scored by replaying the rollout sampler."""

    candidates: int = spec(16, "Candidate seeds explored per prompt (N); the G most spread are kept.",
                           range=(2, 4096))
    steps: int = spec(0, "Model evaluations of an exploration replay (M); 0 = the rollout's "
                         "steps. Fewer keep the rollout's SDE window and compress the "
                         "deterministic tail after it.", range=(0, 1000))
    # Measured with one thread: 2.35 ms per sample-step at batch 8, 1.81 at 32 (one prompt's
    # candidates in one request), and a request's dispatch and stream set-up are paid once.
    request_batch: int = spec(32, "Candidates per exploration request (a fixed batch shape).",
                              range=(1, 4096))
    deadline: bool = spec(True, "Stop exploring when training ends (anytime); false waits for "
                                "every candidate (used to compare runs bit for bit).")
    window: str = spec("iteration", "When stale exploration of the next iteration runs: "
                                    "'iteration' = from this iteration's start (θ_k is ready "
                                    "then, and the spot workers are otherwise idle during the "
                                    "rollout), 'train' = only while training runs.",
                       choices=("iteration", "train"))


@dataclass(kw_only=True)
class PlannerConfig(Validated):
    """The exploration planner: a bandit over (N candidates, M steps) under the training time."""

    enabled: bool = spec(True, "Plan N and M per iteration; false explores exploration.candidates "
                               "with the rollout's steps every iteration.")
    candidates: list = spec([16, 24, 32], "The N arms: candidate seeds per prompt (only N > "
                                          "grpo.group_size selects anything).")
    # Measured on the digits world (10 steps, SDE window 4): a 7-step replay ranks seeds at
    # Kendall tau 0.89 against the full one, a 6-step replay at 0.78, for 70% / 60% of its cost.
    steps: list = spec([0, 7, 6], "The M arms: model evaluations per replay (0 = the rollout's "
                                  "steps; fewer compress the ODE tail after the SDE window).")
    gamma: float = spec(0.3, "UCB bonus weight: larger tries settings more, smaller exploits.",
                        range=(0.0, 10.0))
    budget_fraction: float = spec(0.9, "Share of the predicted exploration window a plan may fill.",
                                  range=(0.05, 1.0))
    train_time_window: int = spec(5, "Iterations averaged to predict the exploration window "
                                     "(training time, or rollout to training end).",
                                  range=(1, 1000))
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


@dataclass(kw_only=True)
class FidelityConfig(Validated):
    """Rank fidelity of stale exploration: Kendall τ every iteration, audits, fallback."""

    floor: float = spec(0.3, "Rolling τ below this falls back.", range=(-1.0, 1.0))
    recover_margin: float = spec(0.05, "Return when the rolling τ reaches floor + margin.",
                                 range=(0.0, 1.0))
    window: int = spec(5, "Iterations in the rolling τ.", range=(1, 1000))
    min_iterations: int = spec(3, "Measured iterations before any decision.", range=(1, 1000))
    fallback: str = spec("sync", "While τ is low: 'sync' (explore with fresh weights on gpu "
                                 "workers) or 'random' seeds.", choices=("sync", "random"))
    audit_every: int = spec(5, "Re-score a random candidate subset with fresh weights every R "
                               "iterations (0 = never).", range=(0, 10**6))
    audit_candidates: int = spec(16, "Candidates per audit.", range=(2, 4096))

    def validate(self) -> None:
        if self.min_iterations > self.window:
            raise ConfigError(f"FidelityConfig.min_iterations = {self.min_iterations} must not "
                              f"exceed FidelityConfig.window = {self.window}")


@dataclass(kw_only=True)
class ClusterConfig(Validated):
    """Where tasks run: an embedded local cluster, or an existing scheduler."""

    scheduler: str = spec("", "Address of an existing scheduler (tcp://HOST:PORT); empty starts "
                              "an embedded cluster on this machine.")
    gpu_workers: int = spec(1, "Embedded on-demand workers (resources gpu=1).", range=(1, 64))
    spot_workers: int = spec(1, "Embedded spot workers (resources spot=1).", range=(0, 64))
    threads_per_worker: int = spec(1, "Threads per worker; torch intra-op threads match it.",
                                   range=(1, 256))
    connect_timeout_s: float = spec(10.0, "How long to wait for a scheduler to answer.",
                                    range=(0.1, 3600.0))
    worker_wait_s: float = spec(30.0, "How long to wait for the needed workers to join.",
                                range=(0.0, 3600.0))
    missing_spot: str = spec("error", "A spotlight-mode run on a cluster without spot workers: "
                                      "'error', or fall back to 'sync' exploration on gpu workers.",
                             choices=("error", "sync"))
    dashboard: bool = spec(True, "Serve the Dask dashboard of an embedded cluster.")
    spot_nice: int = spec(10, "CPU niceness of embedded spot workers: on a shared machine they "
                              "take spare cycles only, as a separate spot VM would.", range=(0, 19))


NOTICE_SOURCES = ("sigterm", "file", "aws", "gcp", "azure")


@dataclass(kw_only=True)
class PreemptionConfig(Validated):
    """How spot requests are dispatched and how a spot worker learns it is about to go."""

    dispatch: str = spec("pull", "'pull': a worker gets the next request when it has a free "
                                 "slot (balances, requeues on loss); 'push': Dask assigns all at "
                                 "once (for comparison only).", choices=("pull", "push"))
    notice_sources: list = spec(["sigterm"], f"Where a spot worker hears of its preemption: any "
                                             f"of {list(NOTICE_SOURCES)}.")
    notice_file: str = spec("", "Path whose appearance is a notice (source 'file').")
    aws_url: str = spec("", "AWS spot instance-action URL (empty: the instance metadata default).")
    gcp_url: str = spec("", "GCP 'preempted' metadata URL (empty: the default).")
    azure_url: str = spec("", "Azure scheduled-events URL (empty: the default).")
    notice_poll_s: float = spec(1.0, "How often the polled sources are asked.", range=(0.05, 600.0))
    no_spot_wait_s: float = spec(60.0, "How long requests wait with no spot worker at all before "
                                       "the stage gives up on them (the seeds they were for "
                                       "are then random, and recorded as filled).",
                                 range=(0.0, 86400.0))

    def validate(self) -> None:
        bad = [s for s in self.notice_sources if s not in NOTICE_SOURCES]
        if bad:
            raise ConfigError(f"PreemptionConfig.notice_sources: {bad} unknown; choose from "
                              f"{list(NOTICE_SOURCES)}")
        if "file" in self.notice_sources and not self.notice_file:
            raise ConfigError("PreemptionConfig.notice_sources has 'file' but notice_file is "
                              "empty; set preemption.notice_file to the path to watch")


@dataclass(kw_only=True)
class InjectorConfig(Validated):
    """Preemption injection on the embedded cluster: a spot trace replay or a Poisson rate."""

    trace: str = spec("", "Spot trace to replay (count JSON or event CSV, see shared traces).")
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


@dataclass(kw_only=True)
class CostConfig(Validated):
    """What the cost ledger charges: a price table and the instance behind each worker class."""

    prices: str = spec("configs/prices.yaml", "Price table file (USD per instance-hour).")
    provider: str = spec("aws", "Cloud provider in the price table.")
    gpu_instance: str = spec("p5.48xlarge", "Instance type the 'gpu' (on-demand) workers run on.")
    gpu_market: str = spec("on_demand", "Market the 'gpu' workers are bought on.", choices=MARKETS)
    spot_instance: str = spec("p5.48xlarge", "Instance type the 'spot' workers run on.")
    spot_market: str = spec("spot", "Market the 'spot' workers are bought on.", choices=MARKETS)


@dataclass(kw_only=True)
class RunConfig(Validated):
    """A whole run: every component's config plus the run's identity."""

    seed: int = spec(0, "Run seed: with prompt id, sample seed and step it fixes all noise.",
                     range=(0, 2**31 - 1))
    iterations: int = spec(20, "RL iterations.", range=(0, 10**7))
    threads: int = spec(2, "torch intra-op threads.", range=(1, 256))
    world: WorldConfig = field(default_factory=WorldConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    mode: str = spec("spotlight", "'spotlight' (stale-weight exploration on spot workers during "
                                  "training), 'sync' (exploration on gpu workers before the "
                                  "rollout) or 'vanilla' (random seeds).",
                     choices=("spotlight", "sync", "vanilla"))
    store: str = spec("", "Run store URL (file path, file://, s3://); empty = runs/<time>-<hash>.")
    stream_latents: bool = spec(True, "Stream every denoising step's latent to the run store.")
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    fidelity: FidelityConfig = field(default_factory=FidelityConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    injector: InjectorConfig = field(default_factory=InjectorConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    source: str = field(default="<defaults>", metadata={"help": "File this config came from."})

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data

    def validate(self) -> None:
        grpo, explore = self.grpo, self.exploration
        if grpo.micro_batch % grpo.group_size and grpo.micro_batch < grpo.prompts_per_iteration * grpo.group_size:
            raise ConfigError(
                f"grpo.micro_batch = {grpo.micro_batch} does not hold whole groups of "
                f"grpo.group_size = {grpo.group_size}; use a multiple of {grpo.group_size} "
                f"(e.g. {grpo.group_size * max(1, grpo.micro_batch // grpo.group_size)})")
        if self.mode != "vanilla" and explore.candidates < grpo.group_size:
            raise ConfigError(
                f"exploration.candidates = {explore.candidates} cannot fill a group of "
                f"grpo.group_size = {grpo.group_size}; explore at least {grpo.group_size} "
                "candidates per prompt, or set mode: vanilla")


def _build(cls: type, data: Any, path: str, source: str) -> Any:
    """Build dataclass ``cls`` from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{path or '<top level>'}' must be a mapping of keys to values, "
                          f"got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1, cutoff=0.0)
            hint = f"; did you mean '{near[0]}'?" if near else ""
            raise ConfigError(f"{source}: unknown key '{dotted}'{hint} "
                              f"(valid keys here: {', '.join(names)})")
        kwargs[key] = _coerce(hints[key], value, dotted, source)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _coerce(hint: Any, value: Any, dotted: str, source: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, dotted, source)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return value
    expected = {bool: bool, int: int, float: (int, float), str: str}.get(hint)
    if expected is None:
        return value
    if isinstance(value, bool) and hint is not bool:
        expected = ()
    elif hint is float and isinstance(value, str):
        # PyYAML reads "3e-4" (no dot) as a string; accept what a user plainly meant as a number.
        try:
            value = float(value)
        except ValueError:
            pass
    if not isinstance(value, expected):
        raise ConfigError(f"{source}: '{dotted}' = {value!r} must be of type {hint.__name__}")
    return float(value) if hint is float else value


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load and validate a YAML run config; ``overrides`` maps dotted keys to values."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file "
                          "such as configs/digits.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config = _build(RunConfig, data, "", str(path))
    config.source = str(path)
    return config


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set key.path=value`` override; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value, e.g. grpo.lr=3e-4")
    key, raw = text.split("=", 1)
    return key.strip(), yaml.safe_load(raw)


def config_hash(*parts: Any) -> str:
    """Stable short hash of config sections (dataclasses or plain data)."""
    blob = json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
