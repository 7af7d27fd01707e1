import pytest

from spotlight.config import ConfigError, GRPOConfig, RunConfig, load_config, parse_override


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
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


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'sampeler'.*did you mean 'sampler'"):
        load_config(write(tmp_path, "sampeler:\n  num_steps: 3\n"))


def test_bad_value_names_field_and_range(tmp_path):
    with pytest.raises(ConfigError, match=r"GRPOConfig.clip_range = -1.0 is out of range.*\[0.0001, 10.0\]"):
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
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "grpo: [unclosed\n"))


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
