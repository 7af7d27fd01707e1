"""Model folders staged in object storage (a real S3 API: moto's server on loopback, through
s3fs): copied once into the cache, checked, refused when incomplete or damaged."""
from __future__ import annotations

import pytest

from spotlight.staging import StagingError, staged_folder


def _require(folder, named):
    if not (folder / "config.json").is_file():
        raise StagingError(f"{named!r} lacks config.json")


def test_a_folder_in_s3_is_copied_once_and_a_damaged_copy_is_refused(moto_s3, tmp_path,
                                                                      monkeypatch):
    import s3fs

    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    # How a user points fsspec at a non-AWS endpoint for weights: the standard AWS variables.
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3.endpoint)
    options = moto_s3.storage_options()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    fs = s3fs.S3FileSystem(**options)
    bucket = moto_s3.config().url.split("/")[2]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    fs.pipe({f"{bucket}/models/det/config.json": b'{"a": 1}',
             f"{bucket}/models/det/weights.bin": b"0123456789",
             f"{bucket}/models/bad/weights.bin": b"x"})
    fs.invalidate_cache()

    folder = staged_folder(f"s3://{bucket}/models/det", "reward.detector", _require)
    assert (folder / "weights.bin").read_bytes() == b"0123456789"
    fs.rm(f"{bucket}/models/det", recursive=True)   # a second start reads the cache only
    assert staged_folder(f"s3://{bucket}/models/det", "reward.detector", _require) == folder

    with pytest.raises(StagingError, match="lacks config.json"):
        staged_folder(f"s3://{bucket}/models/bad", "reward.detector", _require)
    assert [p.name for p in (tmp_path / "cache" / "weights").iterdir()] == [folder.name]
    with pytest.raises(StagingError, match="no such folder"):
        staged_folder(f"s3://{bucket}/models/none", "reward.detector", _require)
    (folder / "weights.bin").write_bytes(b"012")   # truncated
    with pytest.raises(StagingError, match="damaged"):
        staged_folder(f"s3://{bucket}/models/det", "reward.detector", _require)
