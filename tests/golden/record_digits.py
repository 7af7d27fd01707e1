"""Run the pinned digits scenario and print one JSON line per mode: rewards and weights hashes.

    python tests/golden/record_digits.py spotlight,vanilla,sync [inprocess|cluster]

By default each mode runs in the in-process executor of the iteration program
(``pipelines/run/inprocess.py``), which computes what the Dask driver computes by construction
(both carry out the same program's requests with the same task functions; one test runs both,
``tests/pipelines/test_inprocess.py``). ``cluster`` runs the same scenario through a ``Session`` on
the embedded cluster instead.

``tests/pipelines/test_digits_pin.py`` runs this in a subprocess on the current code and on the
reference commit, checked out in a git work tree on the same machine, and compares the two
(``pin_reference.py``; the reference's results are cached under a key that includes this file's
hash, so any edit here recomputes them). Torch's kernels are held to their portable (non-SIMD)
paths, MKL to its compatible code path and oneDNN to SSE4.1, set before torch loads; the
recogniser and base model are trained afresh in a private cache, on the same paths. Even so some
kernel still sums in another order on another CPU, which is why the pin judges a machine only by
what the reference computes there. To run an older commit by hand, check it out into a work tree
and run this file there with ``PYTHONPATH`` set to the work tree.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

# oneDNN (torch's convolutions) picks its own instruction set: on an AVX-512 CPU it sums in
# another order than on an AVX2 one, and the pin moved; SSE4.1 is on every x86-64 CPU here.
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                "ONEDNN_MAX_CPU_ISA": "SSE41"}
os.environ.update(PORTABLE_ENV)   # before torch loads, here and in the workers it starts


def scenario() -> dict:
    """The pinned run: the pipeline tests' tiny run with a base model that renders something."""
    from tests.pipelines.conftest import TINY_RUN

    run = dict(TINY_RUN, iterations=3)
    # No wall-clock cap: a loaded machine must not stop pretraining early and move the base.
    run["pretrain"] = {"steps": 400, "batch_size": 16, "warmup_steps": 10, "time_budget_s": 86400.0}
    run["model"] = dict(TINY_RUN["model"], num_layers=2, attention_head_dim=32, text_dim=32)
    run["fidelity"] = {"audit_every": 5}   # the audit cadence of the recording (none in 3)
    return run


def weights_sha256(weights: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].numpy().tobytes())
    return digest.hexdigest()


def write_scenario(workdir: str) -> str:
    import yaml

    path = os.path.join(workdir, "pinned.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(scenario(), f)
    return path


def rewards_sha256(arrays: list) -> str:
    import numpy as np

    return hashlib.sha256(np.nan_to_num(np.stack(arrays)).tobytes()).hexdigest()


def record_cluster(mode: str, workdir: str) -> dict:
    from pipelines.front.session import Session
    from pipelines.run.records import stage_name
    from spotlight.config import load_config

    config = load_config(write_scenario(workdir))
    with Session.from_config(config, store=os.path.join(workdir, mode), mode=mode) as session:
        history = session.run(3)
        store = session.store
        weights = store.load_checkpoint(3).weights
        rewards = [store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
                   for k in range(3)]
    return {"weights_sha256": weights_sha256(weights), "rewards_sha256": rewards_sha256(rewards),
            "val_reward": [float(v) for v in history["val_reward"]],
            "rollout_reward": [float(v) for v in history["reward_mean"]]}


def record_inprocess(mode: str, workdir: str) -> dict:
    from pipelines.run.inprocess import InProcessRun
    from pipelines.run.records import stage_name
    from spotlight.config import load_config

    run = InProcessRun(load_config(write_scenario(workdir)), mode)
    try:
        history = run.run_iterations(3)
        weights = run.store.load_checkpoint(3).weights
        rewards = [run.store.get_arrays(stage_name(k, "reward"), "reward")["rewards"]
                   for k in range(3)]
    finally:
        run.close()
    return {"weights_sha256": weights_sha256(weights), "rewards_sha256": rewards_sha256(rewards),
            "val_reward": [it.val_reward for it in history.iterations],
            "rollout_reward": [it.rollout_reward for it in history.iterations]}


RECORDERS = {"inprocess": record_inprocess, "cluster": record_cluster}


def main(argv: list[str]) -> int:
    modes = (argv[0] if argv else "spotlight,vanilla,sync").split(",")
    record = RECORDERS[argv[1] if len(argv) > 1 else "inprocess"]
    with tempfile.TemporaryDirectory() as workdir:
        # A private artefact cache: the recogniser and the base model are trained here, on the
        # portable paths too, never taken from a cache another process filled.
        os.environ["SPOTLIGHT_CACHE"] = os.path.join(workdir, "cache")
        for mode in modes:
            print(json.dumps({mode: record(mode, workdir)}), flush=True)
    return 0


if __name__ == "__main__":   # workers start by spawning: they import this file, not run it
    sys.exit(main(sys.argv[1:]))
