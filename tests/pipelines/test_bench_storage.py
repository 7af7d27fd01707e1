"""``spotlight bench storage --quick``: the contract keys, through the real entry point.

Benchmarks measure and tests assert behaviour: no timing thresholds here, only that the
figures exist and are sane, and that a cut-and-resumed request is bit-identical.
"""
from __future__ import annotations

import json
import math

from spotlight import main

CONTRACT = ("step_compute_s", "overhead_ratio_file", "overhead_ratio_s3", "resume_identical",
            "bytes_per_step", "s3_server_cpu_share", "machine", "wall_s")


def test_bench_storage_quick_writes_the_contract(tmp_path, capsys):
    out = tmp_path / "storage.json"
    assert main(["bench", "storage", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    for key in CONTRACT:
        assert key in result, key
    assert result["resume_identical"] is True
    for backend, resume in result["resume"].items():
        assert resume["resumed_at"] == resume["cut_step"] and resume["recorded_resumes"], backend
    for key in ("step_compute_s", "overhead_ratio_file", "overhead_ratio_s3", "wall_s"):
        assert math.isfinite(result[key]) and result[key] > 0, key
    assert 0 <= result["s3_server_cpu_share"] < 2
    b, tokens, channels = result["batch"], *result["latent_shape"]
    assert result["bytes_per_step"] == b * tokens * channels * 4
    assert result["stored_chunk_bytes"] == result["bytes_per_step"] + 4  # + crc32c
    assert result["machine"]["cores"] >= 1
