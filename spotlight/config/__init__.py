"""Typed run configuration: one frozen dataclass per component, loaded from YAML, checked up front.

Every field carries its type, allowed range or choices and documentation; validation runs at
construction, so a bad value is refused before any worker starts or anything is written. An
unknown YAML key is an error naming the key, its file and the nearest valid key. Files a config
names (prompts, traces, prices, certificates) are resolved against the folder of the config
file that names them and must exist and parse before a run store is created
(:func:`check_files`). The reference of every field is ``docs/configuration.md``
(:mod:`spotlight.config.reference`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spotlight.config.base import ConfigError, Validated, build, replaced, spec, without_retired
from spotlight.config.model import ModelConfig
from spotlight.config.objective import ObjectiveConfig
from spotlight.config.sections import (
    MARKETS,
    NOTICE_SOURCES,
    ClusterConfig,
    CostConfig,
    ExplorationConfig,
    FidelityConfig,
    GRPOConfig,
    InjectorConfig,
    ParallelConfig,
    PlacementConfig,
    PlannerConfig,
    PreemptionConfig,
    PretrainConfig,
    RewardConfig,
    SamplerConfig,
    TLSConfig,
    ValidationConfig,
    WorldConfig,
)
from spotlight.config.tracking import TrackingConfig, check_trackers
from spotlight.modes import MODE_NAMES, MODES, Mode, mode_of

__all__ = ["ConfigError", "RunConfig", "load_config", "parse_override", "config_hash",
           "check_files", "faithful_replay", "rollout_sp_degree", "MARKETS", "NOTICE_SOURCES",
           "ClusterConfig", "CostConfig", "ExplorationConfig", "FidelityConfig", "GRPOConfig",
           "InjectorConfig", "ModelConfig", "ObjectiveConfig", "ParallelConfig", "PlannerConfig",
           "PreemptionConfig", "PretrainConfig", "RewardConfig",
           "SamplerConfig", "TLSConfig", "TrackingConfig", "ValidationConfig", "WorldConfig"]

DISTRIBUTION = "spotlight-dit"   # pyproject.toml's name


def shipped_root(package_file: str = __file__, prefix: str = sys.prefix) -> Path:
    """The folder holding the shipped ``configs/`` (prompt files, traces, prices): the checkout
    the package runs from (an editable install), else where ``pip install`` put them (data files
    under the environment's prefix, ``share/spotlight-dit/``)."""
    checkout = Path(package_file).resolve().parents[2]
    if (checkout / "configs").is_dir():
        return checkout
    return Path(prefix) / "share" / DISTRIBUTION


# Defaults name shipped files; they resolve against this root, not the working folder.
PROJECT_ROOT = shipped_root()


def shipped_config(name: str) -> str:
    """A config shipped in ``configs/``: the working directory's copy if it has one, else the
    project's (so benchmarks and defaults work from any folder)."""
    relative = Path("configs") / name
    return str(relative) if relative.is_file() else str(PROJECT_ROOT / relative)
# Rewards built into the digits world, by the task they score.
REWARD_TASKS = {"ocr": "ocr", "geneval": "geneval"}


@dataclass(kw_only=True, frozen=True)
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
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    mode: str = spec("spotlight", "; ".join(f"'{m.name}' ({m.summary})" for m in MODES.values())
                     + ".", choices=MODE_NAMES)
    store: str = spec("", "Run store URL (file path, file://, s3://); empty = runs/<time>-<hash>.")
    stream_latents: bool = spec(True, "Stream every denoising step's latent to the run store.")
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    fidelity: FidelityConfig = field(default_factory=FidelityConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    injector: InjectorConfig = field(default_factory=InjectorConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    source: str = field(default="<defaults>", metadata={"help": "File this config came from."})

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data.pop("source")
        return data

    def with_values(self, values: dict[str, Any]) -> "RunConfig":
        """A validated copy with dotted keys replaced: ``config.with_values({"mode": "sync"})``."""
        return replaced(self, values)

    def validate(self) -> None:
        check_run(self)

    def placed(self, stage: str, mode: "str | Mode | None" = None) -> tuple[str, ...]:
        """The worker classes that run ``stage`` (rollout, explore, reward, train) in ``mode``
        (default: this config's): ``placement.<stage>``, or the mode's default when empty."""
        chosen = getattr(self.placement, stage)
        if chosen:
            return tuple(chosen)
        mode = mode_of(mode or self.mode)
        return mode.rollout_on if stage == "rollout" else mode.explore_on



def faithful_replay(sampler: SamplerConfig, steps: int) -> bool:
    """Whether an exploration replay of ``steps`` model evaluations ranks the rollout's own
    random process: the full grid (0 or the rollout's steps), or a replay that keeps the SDE
    window's sigmas and noise and compresses only the ODE tail after it. Anything else coarsens
    the whole grid, moving the SDE noise to other sigmas: a different process (ranked at τ 0.49
    on the digits world). With an all-SDE sampler (``sde_window_size: 0``) no shorter replay
    is faithful."""
    if steps == 0 or steps >= sampler.num_steps:   # the planner clamps longer arms to the rollout's
        return True
    return sampler.sde_window_end < steps < sampler.num_steps


def check_run(config: "RunConfig") -> None:
    """Cross-section checks of a whole run."""
    grpo, explore, sampler = config.grpo, config.exploration, config.sampler
    mode = mode_of(config.mode)
    if config.model.policy == "digits":
        config.world.check_drawable()
    if mode.explores and explore.candidates < grpo.group_size:
        raise ConfigError(
            f"exploration.candidates = {explore.candidates} cannot fill a group of "
            f"grpo.group_size = {grpo.group_size}; explore at least {grpo.group_size} "
            "candidates per prompt, or set mode: vanilla")
    task = REWARD_TASKS.get(config.reward.name)
    if task is not None and task != config.world.task:
        raise ConfigError(f"reward.name = {config.reward.name!r} scores the {task!r} task, but "
                          f"world.task = {config.world.task!r}; use reward.name: "
                          f"{config.world.task!r}")
    if explore.steps > sampler.num_steps or not faithful_replay(sampler, explore.steps):
        raise ConfigError(
            f"exploration.steps = {explore.steps} does not replay the rollout's random process "
            f"(sampler: {sampler.num_steps} steps, SDE window {sampler.sde_window_start}+"
            f"{sampler.sde_window_size}); use 0 (the rollout's steps) or a count between the "
            f"window's end and num_steps")
    _check_planner_arms(config)
    _check_sequence_parallel(config)
    _check_shard_training(config)
    if mode.hybrid_rollout and "spot" not in config.placed("rollout"):
        raise ConfigError(f"mode '{mode}' rolls out on spot workers too, but placement.rollout "
                          f"= {config.placement.rollout}; set placement.rollout: [gpu, spot] "
                          f"(or leave it empty)")
    cluster = config.cluster
    if not cluster.scheduler and cluster.spot_workers == 0 and mode.needs_spot and \
            cluster.missing_spot == "error":
        raise ConfigError("cluster.spot_workers = 0 on an embedded cluster, but mode "
                          "'spotlight' explores on spot workers; start at least one "
                          "(cluster.spot_workers: 1), or run mode sync / vanilla, or set "
                          "cluster.missing_spot: sync")


def rollout_sp_degree(config: "RunConfig") -> int:
    """The SP degree of this run's rollout requests (its image size's class)."""
    height = config.model.height or config.world.canvas_height
    width = config.model.width or config.world.canvas_width
    return config.parallel.degree(height, width)


def _check_shard_training(config: "RunConfig") -> None:
    """Sharded training runs the model's own collectives in each forward and backward, so every
    member must compute the same passes: the Flow-GRPO step does (a member without rows takes
    a zero-weighted one); the NFT objective's pass over the old weights goes by each member's
    rows, and a trainable text encoder would stay whole."""
    if not config.parallel.shard_training:
        return
    if config.objective.kind != "flow-grpo":
        raise ConfigError(f"parallel.shard_training trains the flow-grpo objective only; "
                          f"objective.kind is {config.objective.kind!r}. Set objective.kind: "
                          "flow-grpo, or parallel.shard_training: false (data_parallel: true "
                          "trains any objective over the gpu workers)")
    if config.grpo.trainable != "transformer":
        raise ConfigError(f"parallel.shard_training shards the transformer; grpo.trainable is "
                          f"{config.grpo.trainable!r}. Set grpo.trainable: transformer")


def _check_sequence_parallel(config: "RunConfig") -> None:
    """A rollout SP degree the run cannot have: more workers than a class has, no streamed
    latents to resume from, or (the embedded policy) heads or tokens it does not divide. The
    Qwen-Image policy checks heads and tokens against its weights (its start-up check)."""
    degree = rollout_sp_degree(config)
    if degree == 1:
        return
    where = f"parallel.size_classes gives this run's rollout requests sp_degree {degree}"
    if not config.stream_latents:
        raise ConfigError(f"{where}, but stream_latents is false: a request cut by a lost "
                          "group member resumes from its streamed steps; set stream_latents: true")
    if not config.cluster.scheduler:
        sizes = {"gpu": config.cluster.gpu_workers, "spot": config.cluster.spot_workers}
        if all(sizes[c] < degree for c in config.placed("rollout")):
            raise ConfigError(f"{where}: a group of {degree} workers of one class, but the "
                              f"embedded cluster has {sizes} workers of the rollout's classes "
                              f"{list(config.placed('rollout'))}; start more "
                              f"(cluster.gpu_workers) or lower the degree")
    if config.model.policy == "digits":
        # config is the bottom layer: the SP rules are the parallel layer's, asked only here
        from spotlight.parallel.ulysses import SequenceParallelError, check_degree

        height, width = config.world.canvas_height, config.world.canvas_width
        try:
            check_degree(degree, heads=config.model.num_attention_heads,
                         image_tokens=(height // 2) * (width // 2))
        except SequenceParallelError as err:
            raise ConfigError(f"{where}: {err}") from None


def _check_planner_arms(config: "RunConfig") -> None:
    planner, sampler, group = config.planner, config.sampler, config.grpo.group_size
    if not mode_of(config.mode).explores or not planner.enabled:
        return
    small = [n for n in planner.candidates if n <= group]
    if small:
        raise ConfigError(f"planner.candidates {small} must each exceed grpo.group_size = "
                          f"{group}: N <= G keeps every candidate and selects nothing; use e.g. "
                          f"{[2 * group, 3 * group, 4 * group]}")
    cover = planner.cover_candidates
    if cover and not group < cover < min(planner.candidates):
        raise ConfigError(f"planner.cover_candidates = {cover} must exceed grpo.group_size = "
                          f"{group} (N <= G selects nothing) and stay under the smallest of "
                          f"planner.candidates {planner.candidates} (it is the fallback when "
                          f"none of them fits); use e.g. {(group + min(planner.candidates)) // 2}, "
                          "or 0 for none")
    unfaithful = [m for m in planner.steps if not faithful_replay(sampler, m)]
    if unfaithful and len(unfaithful) == len(planner.steps):
        raise ConfigError(f"planner.steps {planner.steps}: none replays the rollout's random "
                          f"process with this sampler; include 0 (the rollout's steps)")
    if unfaithful:
        warnings.warn(f"planner.steps {unfaithful} dropped: with the SDE window "
                      f"{sampler.sde_window_start}+{sampler.sde_window_size} of "
                      f"{sampler.num_steps} steps they would coarsen the whole grid and rank a "
                      "different random process than the rollout samples", ConfigWarning,
                      stacklevel=2)


class ConfigWarning(UserWarning):
    """A setting was adjusted at validation; the message says which and why."""


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file '{path}' cannot be read ({err}); pass a readable YAML "
                          "file such as configs/digits.yaml") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}; fix the file at that line "
                          "and column") from None
    if data is None:
        raise ConfigError(f"{path}: the file is empty; a config is a mapping of sections "
                          "such as 'grpo:' and 'sampler:' (see configs/digits.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections to settings, "
                          f"got a {type(data).__name__}; see configs/digits.yaml")
    return data


def _path_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every field that names a file."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints.get(f.name)):
            out += _path_fields(hints[f.name], f"{prefix}{f.name}.")
        elif f.metadata.get("path"):
            out.append(prefix + f.name)
    return out


def _resolve(value: Any, base: Path) -> Any:
    if not isinstance(value, str) or not value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else Path(os.path.abspath(base / path)))


def _get(data: dict, dotted: str) -> tuple[dict | None, str]:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, leaf
    return (node if isinstance(node, dict) else None), leaf


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> "RunConfig":
    """Load, resolve and validate a YAML run config; ``overrides`` maps dotted keys to values.

    File paths in the YAML resolve against the YAML's folder, paths given as overrides against
    the working folder, defaults against the project root; every named file must exist and
    parse (:func:`check_files`).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file "
                          "such as configs/digits.yaml")
    data = _read_yaml(path)
    base = path.resolve().parent
    paths = _path_fields(RunConfig)
    for dotted in paths:
        node, leaf = _get(data, dotted)
        if node is not None and leaf in node:
            node[leaf] = _resolve(node[leaf], base)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override '{dotted}': '{part}' is a value, not a section")
            node = child
        node[leaf] = _resolve(value, Path.cwd()) if dotted in paths else value
    for dotted in paths:   # defaults name files of this repository
        node, leaf = _get(data, dotted)
        if node is None or leaf not in node:
            section = data
            for part in dotted.split(".")[:-1]:
                section = section.setdefault(part, {})
            if isinstance(section, dict):
                default = _default_of(dotted)
                section[leaf] = _resolve(default, PROJECT_ROOT)
    config = build(RunConfig, data, "", str(path))
    config = dataclasses.replace(config, source=str(path))
    check_files(config)
    return config


def _default_of(dotted: str) -> Any:
    node: Any = RunConfig()
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def check_files(config: "RunConfig") -> None:
    """Every file the run names exists and parses; a ConfigError naming the key otherwise."""
    # The parsers of the files a config names live above the config layer that they import.
    from spotlight.cost import run_prices
    from spotlight.models.prompts import PromptFileError, load_prompts
    from spotlight.scheduling.traces import TraceError, load_trace

    def must_exist(key: str, value: str) -> None:
        if value and not Path(value).is_file():
            raise ConfigError(f"{config.source}: {key} = '{value}' does not exist; paths in a "
                              "config file are relative to that file, paths given with --set "
                              "or on the command line to the working folder")

    for key in ("train_prompts", "val_prompts"):
        value = getattr(config.world, key)
        must_exist(f"world.{key}", value)
        try:
            load_prompts(value, config.world.task,
                         open_vocabulary=config.model.policy != "digits")
        except (PromptFileError, ValueError) as err:
            raise ConfigError(f"{config.source}: world.{key}: {err} (task "
                              f"{config.world.task!r})") from None
    if config.injector.trace:
        must_exist("injector.trace", config.injector.trace)
        try:
            load_trace(config.injector.trace)
        except (TraceError, ValueError) as err:
            raise ConfigError(f"{config.source}: injector.trace: {err}") from None
    must_exist("cost.prices", config.cost.prices)
    try:
        run_prices(config.cost)
    except ValueError as err:
        raise ConfigError(f"{config.source}: cost: {err}") from None
    for key in ("ca_file", "cert", "key"):
        must_exist(f"cluster.tls.{key}", getattr(config.cluster.tls, key))
    try:
        check_trackers(config.tracking)
    except ConfigError as err:
        raise ConfigError(f"{config.source}: {err}") from None


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set key.path=value`` override; the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value, e.g. grpo.lr=3e-4")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"override '{text}': the value {raw!r} is not valid YAML; quote "
                          "strings that hold ':' or '#'") from None
    return key.strip(), value


def from_stored(data: dict, source: str) -> "RunConfig":
    """A config as a run store recorded it (paths absolute; older runs: relative to here)."""
    config = build(RunConfig, without_retired(data), "", source)
    return dataclasses.replace(config, source=source)


def config_hash(*parts: Any) -> str:
    """Stable short hash of config sections (dataclasses or plain data)."""
    blob = json.dumps([dataclasses.asdict(p) if dataclasses.is_dataclass(p) else p for p in parts],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

