import dataclasses

import pytest

from spotlight.config import (
    PROJECT_ROOT,
    ConfigError,
    ConfigWarning,
    GRPOConfig,
    PlannerConfig,
    RunConfig,
    from_stored,
    load_config,
    parse_override,
)
from spotlight.exploration.planner import ExplorationPlanner


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_configs_load():
    ocr = load_config("configs/digits.yaml")
    geneval = load_config("configs/digits-geneval.yaml")
    assert ocr.world.task == "ocr" and geneval.world.task == "geneval"
    assert ocr.source == "configs/digits.yaml"


def test_unknown_key_names_key_file_and_nearest(tmp_path):
    path = write(tmp_path, "grpo:\n  learning_rat: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "grpo.learning_rat" in message and str(path) in message
    path = write(tmp_path, "grpo:\n  clip_rang: 0.1\n")
    with pytest.raises(ConfigError, match="did you mean 'clip_range'"):
        load_config(path)


def test_a_retired_key_is_refused_in_a_file_and_dropped_from_a_recorded_run(tmp_path):
    with pytest.raises(ConfigError, match=r"'preemption.dispatch' was retired: spot requests "
                                          r"are always pulled .*; delete it"):
        load_config(write(tmp_path, "preemption:\n  dispatch: pull\n"))
    recorded = load_config("configs/digits.yaml").to_dict()
    recorded["preemption"]["dispatch"] = "pull"   # what runs recorded before it was retired
    assert from_stored(recorded, "run").preemption == load_config("configs/digits.yaml").preemption


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'sampeler'.*did you mean 'sampler'"):
        load_config(write(tmp_path, "sampeler:\n  num_steps: 3\n"))


def test_bad_value_names_field_and_range(tmp_path):
    with pytest.raises(ConfigError,
                       match=r"GRPOConfig.clip_range = -1.0 is out of range.*\[0.0001, 10.0\]"):
        load_config(write(tmp_path, "grpo:\n  clip_range: -1\n"))
    with pytest.raises(ConfigError, match="SamplerConfig.sde_type = 'ddim'.*'flow', 'cps'"):
        load_config(write(tmp_path, "sampler:\n  sde_type: ddim\n"))
    with pytest.raises(ConfigError, match="'grpo.group_size' = 'eight' must be of type int"):
        load_config(write(tmp_path, "grpo:\n  group_size: eight\n"))


def test_cross_field_and_section_shape_errors(tmp_path):
    with pytest.raises(ConfigError, match="even sides"):
        load_config(write(tmp_path, "world:\n  canvas_height: 13\n"))
    with pytest.raises(ConfigError, match="'grpo' must be a mapping"):
        load_config(write(tmp_path, "grpo: 3\n"))
    with pytest.raises(ConfigError, match="sde_window_start"):
        load_config(write(tmp_path, "sampler:\n  num_steps: 4\n  sde_window_start: 4\n"))


def test_missing_file_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    path = write(tmp_path, "seed: 0\ngrpo:\n  lr: [unclosed\n  group_size: 8\n")
    with pytest.raises(ConfigError, match=rf"{path}:4:\d+: YAML syntax error"):
        load_config(path)
    with pytest.raises(ConfigError, match="top level must be a mapping.*got a list"):
        load_config(write(tmp_path, "- grpo\n- sampler\n"))
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(write(tmp_path, "# nothing but a comment\n"))


def test_lists_are_typed_item_by_item():
    with pytest.raises(ConfigError, match=r"'planner.candidates' = 16 must be a list of int"):
        load_config("configs/digits.yaml", {"planner.candidates": 16})
    with pytest.raises(ConfigError, match=r"'planner.steps\[1\]' = 'six' must be of type int"):
        load_config("configs/digits.yaml", {"planner.steps": [0, "six"]})
    with pytest.raises(ConfigError, match=r"PreemptionConfig.notice_sources.*ibm.*choose from"):
        load_config("configs/digits.yaml", {"preemption.notice_sources": ["sigterm", "ibm"]})
    with pytest.raises(ConfigError, match="PlannerConfig.candidates = \\[16, 2.5\\] must be of "
                                          "type list\\[int\\]"):
        PlannerConfig(candidates=[16, 2.5])


def test_overriding_into_a_value_or_an_unknown_section_names_it():
    with pytest.raises(ConfigError, match="'seed' is a value, not a section"):
        load_config("configs/digits.yaml", {"seed.x": 1})
    with pytest.raises(ConfigError, match="'grpo.lr' = 'abc' must be of type float"):
        load_config("configs/digits.yaml", {"grpo.lr": "abc"})
    with pytest.raises(ConfigError, match="unknown key 'grpoo'; did you mean 'grpo'"):
        load_config("configs/digits.yaml", {"grpoo.lr": 1e-4})


def test_cross_section_checks():
    with pytest.raises(ConfigError, match="reward.name = 'geneval' scores the 'geneval' task"):
        load_config("configs/digits.yaml", {"reward.name": "geneval"})
    with pytest.raises(ConfigError, match=r"planner.candidates \[8\] must each exceed "
                                          "grpo.group_size = 8"):
        load_config("configs/digits.yaml", {"planner.candidates": [8, 16]})
    with pytest.raises(ConfigError, match="exploration.steps = 3 does not replay"):
        load_config("configs/digits.yaml", {"exploration.steps": 3})
    with pytest.raises(ConfigError, match="cluster.spot_workers = 0 on an embedded cluster"):
        load_config("configs/digits.yaml", {"cluster.spot_workers": 0})
    # fine in the modes that do not explore on spot workers
    assert load_config("configs/digits.yaml", {"cluster.spot_workers": 0,
                                               "mode": "vanilla"}).cluster.spot_workers == 0


def test_files_resolve_against_the_config_file_and_must_parse(tmp_path, monkeypatch):
    prompts = tmp_path / "data" / "train.txt"
    prompts.parent.mkdir()
    prompts.write_text('a sign that says "12"\n')
    path = write(tmp_path, "world:\n  train_prompts: data/train.txt\n", "good.yaml")
    monkeypatch.chdir(tmp_path.parent)   # the working folder does not matter
    config = load_config(path)
    assert config.world.train_prompts == str(prompts)
    assert config.world.val_prompts == str(PROJECT_ROOT / "configs/prompts/ocr_val.txt")
    assert config.cost.prices == str(PROJECT_ROOT / "configs/prices.yaml")
    with pytest.raises(ConfigError, match=r"world.train_prompts = '.*missing.txt' does not exist"):
        load_config(write(tmp_path, "world:\n  train_prompts: missing.txt\n"))
    bad = tmp_path / "bad.txt"
    bad.write_text("no quotes here\n")
    with pytest.raises(ConfigError, match="world.train_prompts"):
        load_config(write(tmp_path, f"world:\n  train_prompts: {bad}\n"))
    trace = tmp_path / "trace.csv"
    trace.write_text("0,add,n1\nsoon,remove,n1\n")
    with pytest.raises(ConfigError, match=r"injector.trace: .*trace.csv:2"):
        load_config(path, {"injector.trace": str(trace)})


def test_configs_are_frozen_and_replaced_with_validation():
    config = load_config("configs/digits.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.grpo.lr = 1.0
    changed = config.with_values({"grpo.lr": 1e-4, "mode": "sync"})
    assert (changed.grpo.lr, changed.mode, config.grpo.lr) == (1e-4, "sync", 2e-4)
    with pytest.raises(ConfigError, match="GRPOConfig.lr"):
        config.with_values({"grpo.lr": 5.0})


def test_all_sde_sampler_drops_the_replay_arms_that_rank_another_process():
    with pytest.warns(ConfigWarning, match=r"planner.steps \[7, 6\] dropped"):
        config = load_config("configs/digits.yaml", {"sampler.sde_window_size": 0})
    planner = ExplorationPlanner(config.planner, config.sampler)
    assert {m for _, m in planner.arms} == {0}
    kept = load_config("configs/digits.yaml")   # SDE window 0+4 of 10: 7 and 6 keep it whole
    assert {m for _, m in ExplorationPlanner(kept.planner, kept.sampler).arms} == {0, 6, 7}
    with pytest.raises(ConfigError, match="none replays the rollout's random process"):
        load_config("configs/digits.yaml", {"sampler.sde_window_size": 0, "planner.steps": [6]})


def test_overrides_are_validated_like_the_file():
    config = load_config("configs/digits.yaml", dict([parse_override("grpo.lr=3e-4")]))
    assert config.grpo.lr == pytest.approx(3e-4)
    with pytest.raises(ConfigError, match="GRPOConfig.lr"):
        load_config("configs/digits.yaml", {"grpo.lr": 5.0})
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("grpo.lr")


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="group_size"):
        GRPOConfig(group_size=1)
    assert RunConfig().grpo.group_size == 8


def test_every_field_is_documented_and_the_reference_is_current():
    from spotlight.config import reference

    assert reference.undocumented() == []
    rows = list(reference.field_rows(RunConfig))
    assert len(rows) > 90 and all(kind for _, kind, _, _, _ in rows)
    written = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
    assert written == reference.markdown(), (
        "docs/configuration.md is stale: python -m spotlight.config.reference > "
        "docs/configuration.md")


def test_an_undocumented_field_is_caught(monkeypatch):
    from spotlight.config import reference

    fields = list(reference.field_rows(RunConfig))
    key, kind, default, allowed, _ = fields[0]
    monkeypatch.setattr(reference, "field_rows",
                        lambda cls, prefix="": iter([(key, kind, default, allowed, "  ")]))
    assert reference.undocumented() == [key]


def test_placement_defaults_follow_the_mode_and_single_task_stages_name_one_class():
    by_mode = {mode: load_config("configs/digits.yaml", {"mode": mode})
               for mode in ("spotlight", "rlboost", "vanilla", "sync")}
    assert by_mode["spotlight"].placed("rollout") == ("gpu", "spot")
    assert by_mode["rlboost"].placed("rollout") == ("gpu", "spot")
    assert by_mode["vanilla"].placed("rollout") == by_mode["sync"].placed("rollout") == ("gpu",)
    assert by_mode["spotlight"].placed("explore") == ("spot",)
    assert by_mode["sync"].placed("explore") == ("gpu",)
    assert by_mode["spotlight"].placed("explore", "sync") == ("gpu",)   # a sync fallback
    assert by_mode["spotlight"].placed("train") == ("gpu",)
    chosen = load_config("configs/digits.yaml", {"placement.rollout": ["spot"],
                                                 "placement.explore": ["gpu", "spot"]})
    assert chosen.placed("rollout", "vanilla") == ("spot",)
    assert chosen.placed("explore", "sync") == ("gpu", "spot")
    with pytest.raises(ConfigError, match=r"placement.train = \['gpu', 'spot'\]: name one"):
        load_config("configs/digits.yaml", {"placement.train": ["gpu", "spot"]})
    with pytest.raises(ConfigError, match=r"placement.reward = \[\]: name one"):
        load_config("configs/digits.yaml", {"placement.reward": []})
    with pytest.raises(ConfigError, match=r"placement.explore = \['tpu'\]: list each of"):
        load_config("configs/digits.yaml", {"placement.explore": ["tpu"]})
    with pytest.raises(ConfigError, match="mode 'rlboost' rolls out on spot workers too"):
        load_config("configs/digits.yaml", {"mode": "rlboost", "placement.rollout": ["gpu"]})


@pytest.mark.parametrize("values, message", [
    ({"parallel.size_classes": ["12x32"]}, r"'12x32' is not 'HEIGHTxWIDTH:DEGREE'"),
    ({"parallel.size_classes": ["12x32:2", "12X32:1"]}, "names 12x32 twice"),
    ({"parallel.size_classes": ["12x32:0"]}, "must be >= 1"),
    ({"parallel.size_classes": ["12x32:3"], "cluster.gpu_workers": 3},
     r"sp_degree 3 does not divide the model's 2 attention heads.*\(1, 2\)"),
    ({"parallel.size_classes": ["10x30:2"], "model.num_attention_heads": 4,
      "world.canvas_height": 10, "world.canvas_width": 30, "cluster.gpu_workers": 2},
     "does not divide the request's 75 image tokens"),
    ({"parallel.size_classes": ["12x32:2"]}, r"embedded cluster has \{'gpu': 1, 'spot': 1\}"),
    ({"parallel.size_classes": ["12x32:2"], "cluster.gpu_workers": 2, "stream_latents": False},
     "stream_latents is false"),
])
def test_an_impossible_sp_degree_is_refused_when_the_config_is_read(values, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig().with_values(values)


def test_the_rollout_degree_is_its_image_size_class():
    from spotlight.config import rollout_sp_degree

    config = RunConfig().with_values({"parallel.size_classes": ["12x32:2", "64x64:1"],
                                      "cluster.gpu_workers": 2})
    assert rollout_sp_degree(config) == 2
    assert rollout_sp_degree(config.with_values({"world.canvas_height": 16})) == 1   # not listed
    assert config.parallel.degree(64, 64) == 1
