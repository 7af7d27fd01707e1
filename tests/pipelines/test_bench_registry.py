"""The bench table the CLI reads before importing any bench (``pipelines.bench.registry``) says
what the benches are: every registered bench is in it, and the options it lists for each are
exactly the bench function's parameters that an option sets."""
from __future__ import annotations

import inspect

import pytest

from pipelines.bench import BENCHES, load_benches
from pipelines.bench.registry import OPTIONS, SPECS


def test_the_table_names_every_registered_bench_and_nothing_else():
    load_benches()
    assert sorted(SPECS) == sorted(BENCHES)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_bench_takes_exactly_the_options_the_table_lists(name):
    load_benches()
    parameters = set(inspect.signature(BENCHES[name]).parameters)
    settable = {flag for flag, parameter in OPTIONS.items() if parameter in parameters}
    assert settable == set(SPECS[name].options), name


def test_an_option_a_bench_does_not_take_is_refused_before_the_bench_loads():
    import subprocess
    import sys

    code = ("import sys; from spotlight import main; rc = main(['bench', 'storage', '--set', "
            "'grpo.lr=1e-4']); assert 'torch' not in sys.modules, 'torch loaded'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--set applies to 'bench convergence', 'arms', 'overhead', 'preemption', 'faults' " \
        "and 'simulate' only; 'bench storage' takes --config" in done.stderr


def test_an_unknown_bench_is_refused_naming_every_bench(capsys):
    from spotlight import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert all(f"'{name}'" in err for name in SPECS), err
