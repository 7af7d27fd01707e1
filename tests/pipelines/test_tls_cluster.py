"""A cluster spanning machines talks TLS: a TLS-only `dask scheduler` and workers on loopback,
certificates made here; an iteration completes over TLS, a client without the right
certificates is refused with a message that says what to set."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.bench.testbed import kill
from pipelines.cluster import ClusterError
from pipelines.deploy.certificates import make_pki
from pipelines.front.session import Session
from tests.ports import free_port

pytestmark = pytest.mark.timeout(420)


@pytest.fixture
def tls_cluster(tmp_path):
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"])
    tls = pki.dask_args()
    port = free_port()
    address = f"tls://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", str(port), "--protocol", "tls",
                               "--no-dashboard", *tls], cwd=tmp_path, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    for cls in ("gpu", "spot"):
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                       address, "--resources", f"{cls}=1", *tls],
                                      cwd=tmp_path, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    yield (address, {"ca_file": pki.ca_file, "cert": pki.client_cert, "key": pki.client_key},
           tmp_path)
    for proc in procs:
        kill(proc)


def test_an_iteration_runs_over_tls_and_a_client_without_certificates_is_refused(
        tls_cluster, tiny_run_config, tmp_path):
    address, client_tls, folder = tls_cluster
    base = {"cluster.scheduler": address, "cluster.connect_timeout_s": 60}
    config = tiny_run_config.with_values({**base, **{f"cluster.tls.{k}": v
                                                     for k, v in client_tls.items()}})
    with Session.from_config(config, store=str(tmp_path / "run")) as session:
        assert session.cluster.client.scheduler.address.startswith("tls://")
        history = session.run(1)
    assert list(history.index) == [0]

    # No certificates at all: refused before any connection, saying what to set.
    bare = tiny_run_config.with_values({**base, "cluster.connect_timeout_s": 10})
    with pytest.raises(ClusterError, match="TLS address but no client certificate.*cluster.tls"):
        Session.from_config(bare, store=str(tmp_path / "a"))
    # Plain TCP to the TLS-only scheduler: no answer as a scheduler, within the deadline.
    plain = bare.with_values({"cluster.scheduler": address.replace("tls://", "tcp://")})
    with pytest.raises(ClusterError, match="tls:// address and set cluster.tls"):
        Session.from_config(plain, store=str(tmp_path / "b"))
    # A certificate the cluster's CA did not sign: the TLS handshake fails, and says so.
    rogue = make_pki(folder / "rogue", ["127.0.0.1"])
    forged = tiny_run_config.with_values({**base, "cluster.connect_timeout_s": 10,
                                          **rogue.run_settings()})
    with pytest.raises(ClusterError, match="TLS handshake with .* failed"):
        Session.from_config(forged, store=str(tmp_path / "c"))
    assert not any((tmp_path / d).exists() for d in "abc")
