"""``spotlight bench storage --quick``: the contract keys, through the installed command.

Benchmarks measure and tests assert behaviour: no timing thresholds here, only that the
figures exist and are sane, and that a cut-and-resumed request is bit-identical.
"""
from __future__ import annotations

import math

from tests.pipelines.conftest import run_quick_bench

CONTRACT = ("step_compute_s", "overhead_ratio_file", "overhead_ratio_s3", "resume_identical",
            "bytes_per_step", "s3_server_cpu_share", "machine", "wall_s")


def test_bench_storage_quick_writes_the_contract(tmp_path, outside_repo):
    result, _ = run_quick_bench("storage", [], outside_repo, tmp_path / "storage.json",
                                timeout=400)
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
