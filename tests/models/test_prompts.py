import json

import pytest

from spotlight.models.prompts import (
    PromptFileError,
    geneval_prompt,
    geneval_record,
    load_prompts,
    ocr_prompt,
)


def test_shipped_prompt_files_load_and_are_disjoint():
    for task, ext in (("ocr", "txt"), ("geneval", "jsonl")):
        train = load_prompts(f"configs/prompts/{task}_train.{ext}", task)
        val = load_prompts(f"configs/prompts/{task}_val.{ext}", task)
        assert len(train) > 100 and len(val) >= 32
        assert not {p.text for p in train} & {p.text for p in val}
    targets_train = {p.target for p in load_prompts("configs/prompts/ocr_train.txt", "ocr")}
    targets_val = {p.target for p in load_prompts("configs/prompts/ocr_val.txt", "ocr")}
    assert not targets_train & targets_val, "OCR validation targets must be held out"


def test_ocr_line_parsing():
    assert ocr_prompt('a sign that says "407"').target == "407"
    with pytest.raises(PromptFileError, match="no target between double quotes"):
        ocr_prompt("a sign that says 407")
    with pytest.raises(PromptFileError, match="must be 1-3 digits"):
        ocr_prompt('a sign that says "4a7"')
    with pytest.raises(PromptFileError, match="must be 1-3 digits"):
        ocr_prompt('a sign that says "4071"')


def test_bad_ocr_file_names_the_line_and_changes_nothing(tmp_path):
    path = tmp_path / "p.txt"
    text = 'a sign that says "12"\n\na wall that says hello\n'
    path.write_text(text)
    with pytest.raises(PromptFileError, match=r"p.txt:3: no target"):
        load_prompts(path, "ocr")
    assert path.read_text() == text


def test_geneval_lines(tmp_path):
    good = {"tag": "position", "include": [{"class": "3", "count": 1},
                                           {"class": "5", "count": 1, "position": ["left of", 0]}],
            "prompt": "a 5 left of a 3"}
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(good) + "\n" + '{"tag": "counting", "include": [\n')
    with pytest.raises(PromptFileError, match=r"g.jsonl:2: malformed JSON"):
        load_prompts(path, "geneval")
    path.write_text(json.dumps(good) + "\n")
    (prompt,) = load_prompts(path, "geneval")
    assert prompt.include[1].position == ("left of", 0)
    assert geneval_record(prompt) == good


@pytest.mark.parametrize("include, message", [
    ([{"class": "x"}], "must be one digit"),
    ([{"class": "3", "count": 4}], "count = 4"),
    ([{"class": "3", "color": "purple"}], "color = 'purple'"),
    ([{"class": "3"}, {"class": "4", "position": ["beside", 0]}], "position"),
    ([{"class": "3", "size": 2}], "unknown keys"),
])
def test_geneval_clause_errors(tmp_path, include, message):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"tag": "t", "include": include, "prompt": "p"}) + "\n")
    with pytest.raises(PromptFileError, match=message):
        load_prompts(path, "geneval")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(tmp_path / "none.txt", "ocr")
    (tmp_path / "empty.txt").write_text("\n# only a comment\n")
    with pytest.raises(PromptFileError, match="holds no prompts"):
        load_prompts(tmp_path / "empty.txt", "ocr")


def test_open_vocabulary_prompts_take_geneval_as_published():
    line = ('{"tag": "counting", "include": [{"class": "computer keyboard", "count": 4}], '
            '"exclude": [{"class": "computer keyboard", "count": 5}], '
            '"prompt": "a photo of four computer keyboards"}')
    prompt = geneval_prompt(line, open_vocabulary=True)
    assert prompt.include[0].cls == "computer keyboard" and prompt.exclude[0].count == 5
    assert geneval_record(prompt) == json.loads(line)
    with pytest.raises(PromptFileError, match="must be one digit"):
        geneval_prompt(line)   # the digits world refuses it
    purple = '{"tag": "colors", "include": [{"class": "cup", "color": "purple"}], "prompt": "p"}'
    assert geneval_prompt(purple, open_vocabulary=True).include[0].color == "purple"
    with pytest.raises(PromptFileError, match="'exclude' must list"):
        geneval_prompt('{"tag": "t", "include": [{"class": "cup"}], "exclude": [{"class": "cup"}],'
                       ' "prompt": "p"}', open_vocabulary=True)
    assert ocr_prompt('a sign that says "HELLO 42"', open_vocabulary=True).target == "HELLO 42"
    with pytest.raises(PromptFileError, match="1-3 digits"):
        ocr_prompt('a sign that says "HELLO 42"')
