"""A worker's class (``gpu``: on-demand, ``spot``) read from its VM's cloud metadata.

Pools that start every worker alike -- Coiled, dask-cloudprovider, plain VMs from one image or
one instance template -- cannot hand each worker its ``--resources "gpu=1"`` or ``"spot=1"``.
A worker started with ``--preload pipelines.cluster.cloud_class`` (or given
:func:`cloud_class_plugin`) asks its instance metadata service how the VM was bought:

- AWS, IMDSv2: ``/latest/meta-data/instance-life-cycle`` is ``spot``, ``on-demand``,
  ``scheduled`` or ``capacity-block``;
- GCP: ``/computeMetadata/v1/instance/scheduling/preemptible`` is ``TRUE`` for preemptible and
  Spot VMs, ``FALSE`` otherwise (header ``Metadata-Flavor: Google``);
- Azure: ``/metadata/instance/compute`` holds ``"priority"``: ``Spot`` (``Low`` on older scale
  sets) or ``Regular`` (header ``Metadata: true``);

and sets its class with ``Worker.set_resources``. A spot worker then watches the same service's
termination notice (``pipelines.cluster.preemption``'s watch, polling the notice endpoint of
``pipelines.cluster.notices``): on a notice it hands its requests back and retires. The
endpoints are found from the notice URLs (``preemption.aws_url`` etc.), so a mock metadata
server serves both; the HTTP client and the IMDSv2 token are the notice sources' own.

A class given on the command line wins: the metadata is still read, and a worker whose
``--resources`` disagree with its VM is logged. A worker that no service answers keeps no class
(it gets no work, and says so) unless a fallback class is set.

Settings of the preload come from the environment: ``SPOTLIGHT_CLOUDS`` (which services to ask,
in order; default ``aws,gcp,azure``; ``none`` asks none), ``SPOTLIGHT_CLASS_FALLBACK`` (``gpu``
or ``spot``), ``SPOTLIGHT_WORKER_SLOTS`` (the class's resource count, default 1),
``SPOTLIGHT_AWS_URL`` / ``SPOTLIGHT_GCP_URL`` / ``SPOTLIGHT_AZURE_URL`` (the notice URLs) and
``SPOTLIGHT_NOTICE_POLL_S``.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
from dataclasses import dataclass
from typing import Mapping

from distributed import WorkerPlugin
from distributed.core import Status

from pipelines.cluster.connect import GPU, SPOT
from pipelines.cluster.notices import aws_get, aws_token_url, metadata_request, same_host
from pipelines.cluster.preemption import preemption_watch
from spotlight.config import PreemptionConfig
from spotlight.scheduling.notice import AWS_URL, AZURE_URL, GCP_URL

log = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp", "azure")
PLUGIN_NAME = "spotlight-cloud-class"
CLASS_PATHS = {"aws": "/latest/meta-data/instance-life-cycle",
               "gcp": "/computeMetadata/v1/instance/scheduling/preemptible",
               "azure": "/metadata/instance/compute?api-version=2021-02-01"}
NOTICE_URLS = {"aws": AWS_URL, "gcp": GCP_URL, "azure": AZURE_URL}
ENV = {"clouds": "SPOTLIGHT_CLOUDS", "fallback": "SPOTLIGHT_CLASS_FALLBACK",
       "slots": "SPOTLIGHT_WORKER_SLOTS", "aws_url": "SPOTLIGHT_AWS_URL",
       "gcp_url": "SPOTLIGHT_GCP_URL", "azure_url": "SPOTLIGHT_AZURE_URL",
       "notice_poll_s": "SPOTLIGHT_NOTICE_POLL_S"}


class Unclassified(Exception):
    """A metadata service did not say how this VM was bought; the message says what it said."""


# --- what each cloud's documented reply means (pure) ---------------------------------------------

def _ok(cloud: str, status: int, body: str, url: str) -> str:
    if status != 200:
        raise Unclassified(f"{cloud}: HTTP {status} from {url}: {body.strip()[:120]!r}")
    return body.strip()


def aws_class(status: int, body: str, url: str) -> str:
    """EC2 ``instance-life-cycle``: ``spot`` is spot; on-demand, scheduled and capacity-block
    instances are not reclaimed for capacity."""
    value = _ok("aws", status, body, url).lower()
    if value == "spot":
        return SPOT
    if value in ("on-demand", "scheduled", "capacity-block"):
        return GPU
    raise Unclassified(f"aws: unknown instance-life-cycle {value[:60]!r} from {url}")


def gcp_class(status: int, body: str, url: str) -> str:
    """GCE ``scheduling/preemptible``: TRUE for preemptible and Spot VMs."""
    value = _ok("gcp", status, body, url).upper()
    if value in ("TRUE", "FALSE"):
        return SPOT if value == "TRUE" else GPU
    raise Unclassified(f"gcp: expected TRUE or FALSE from {url}, got {value[:60]!r}")


def azure_class(status: int, body: str, url: str) -> str:
    """Azure IMDS ``compute.priority``: Spot (Low on older scale sets) or Regular; a VM created
    without a priority reports an empty one, and is a regular VM."""
    try:
        doc = json.loads(_ok("azure", status, body, url))
        priority = str(doc.get("priority", "")).strip().lower()
    except (ValueError, AttributeError):
        raise Unclassified(f"azure: {url} did not answer with a compute document") from None
    if priority in ("spot", "low"):
        return SPOT
    if priority in ("regular", ""):
        return GPU
    raise Unclassified(f"azure: unknown priority {priority[:60]!r} from {url}")


PARSERS = {"aws": aws_class, "gcp": gcp_class, "azure": azure_class}


@dataclass(frozen=True)
class Found:
    """The class one metadata service reported, and which service."""
    cloud: str
    worker_class: str


@dataclass(frozen=True)
class Decision:
    """What a worker does with its metadata's answer."""
    worker_class: str | None   # the class to set; None sets nothing
    message: str
    warn: bool                 # an operator should look at this worker


def decide(explicit: list[str], found: Found | None, fallback: str) -> Decision:
    """The decision for a worker started with the classes ``explicit`` (``--resources``) whose
    metadata said ``found`` (None: no service answered)."""
    if explicit:
        given = "/".join(explicit)
        if found is not None and found.worker_class not in explicit:
            return Decision(None, f"started as {given}, but its {found.cloud} metadata says "
                                  f"{found.worker_class}; keeping {given}", True)
        return Decision(None, f"class {given} from the command line", False)
    if found is not None:
        return Decision(found.worker_class,
                        f"class {found.worker_class} from {found.cloud} metadata", False)
    if fallback:
        return Decision(fallback, f"no metadata service answered; class {fallback} (the "
                                  "fallback)", True)
    return Decision(None, "no metadata service answered and no fallback is set: this worker "
                          "has no class and gets no work; start it with --resources \"gpu=1\" "
                          "or \"spot=1\", or set SPOTLIGHT_CLASS_FALLBACK", True)


# --- settings and the reads (I/O) ----------------------------------------------------------------

@dataclass(frozen=True)
class CloudClassSettings:
    """Which services to ask, and what a worker does with the answer (see the module docstring)."""
    clouds: tuple[str, ...] = CLOUDS
    fallback: str = ""
    slots: float = 1.0
    aws_url: str = ""
    gcp_url: str = ""
    azure_url: str = ""
    notice_poll_s: float = 1.0
    timeout_s: float = 0.5

    def __post_init__(self) -> None:
        unknown = [c for c in self.clouds if c not in CLOUDS]
        if unknown:
            raise ValueError(f"{ENV['clouds']}: unknown cloud(s) {unknown}; use any of "
                             f"{', '.join(CLOUDS)} (comma-separated), or 'none'")
        if self.fallback not in ("", GPU, SPOT):
            raise ValueError(f"{ENV['fallback']}={self.fallback!r}: use '{GPU}', '{SPOT}' or "
                             "leave it empty (no class when no metadata service answers)")
        if self.slots <= 0 or self.notice_poll_s <= 0:
            raise ValueError(f"{ENV['slots']} and {ENV['notice_poll_s']} must be > 0 "
                             f"(got {self.slots:g} and {self.notice_poll_s:g})")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "CloudClassSettings":
        def get(key: str) -> str:
            return environ.get(ENV[key], "").strip()

        raw = get("clouds").lower()
        clouds = CLOUDS if not raw else () if raw == "none" else \
            tuple(c.strip() for c in raw.split(",") if c.strip())
        try:
            slots = float(get("slots") or 1)
            poll = float(get("notice_poll_s") or 1)
        except ValueError:
            raise ValueError(f"{ENV['slots']} and {ENV['notice_poll_s']} must be numbers, got "
                             f"{get('slots')!r} and {get('notice_poll_s')!r}") from None
        return cls(clouds, get("fallback").lower(), slots, get("aws_url"), get("gcp_url"),
                   get("azure_url"), poll)

    def notice_url(self, cloud: str) -> str:
        return getattr(self, f"{cloud}_url") or NOTICE_URLS[cloud]

    def notice_config(self, cloud: str) -> PreemptionConfig:
        """The notice watch of ``cloud``: its endpoint only (SIGTERM is the run's own watch)."""
        return PreemptionConfig(notice_sources=[cloud], aws_url=self.aws_url,
                                gcp_url=self.gcp_url, azure_url=self.azure_url,
                                notice_poll_s=self.notice_poll_s)


def read_class(cloud: str, notice_url: str, timeout_s: float = 0.5) -> Found:
    """Ask ``cloud``'s metadata service (the host of ``notice_url``) how this VM was bought."""
    url = same_host(notice_url, CLASS_PATHS[cloud])
    if cloud == "aws":
        status, body = aws_get(url, aws_token_url(url), timeout_s)
    else:
        headers = {"Metadata-Flavor": "Google"} if cloud == "gcp" else {"Metadata": "true"}
        status, body = metadata_request("GET", url, headers, timeout_s)
    return Found(cloud, PARSERS[cloud](status, body, url))


def classify(settings: CloudClassSettings) -> tuple[Found | None, list[str]]:
    """The first service of ``settings.clouds`` that answers, and why each before it did not."""
    reasons: list[str] = []
    for cloud in settings.clouds:
        try:
            return read_class(cloud, settings.notice_url(cloud), settings.timeout_s), reasons
        except Unclassified as e:
            reasons.append(str(e))
        except (OSError, http.client.HTTPException, ValueError) as e:
            reasons.append(f"{cloud}: {type(e).__name__}: {e}")
    return None, reasons


async def set_class(worker, resources: dict[str, float]) -> None:
    """Give ``worker`` ``resources``. Before it registered (a preload) they go into its state,
    which its registration carries to the scheduler -- ``Worker.set_resources`` would tell a
    scheduler that does not know the worker yet; afterwards ``Worker.set_resources`` tells it."""
    if worker.status == Status.init:
        for name, amount in resources.items():
            worker.state.total_resources[name] = amount
            worker.state.available_resources[name] = amount
    else:
        await worker.set_resources(**resources)


class CloudClassPlugin(WorkerPlugin):
    """Sets the worker's class from its metadata; a spot worker's watch polls the notice."""
    name = PLUGIN_NAME

    def __init__(self, settings: CloudClassSettings) -> None:
        self.settings = settings
        self.found: Found | None = None
        self.watch = None

    async def setup(self, worker) -> None:
        # The reads block for up to a timeout per service (a VM of another cloud): off the loop.
        self.found, reasons = await asyncio.get_running_loop().run_in_executor(
            None, classify, self.settings)
        explicit = [c for c in (GPU, SPOT) if worker.state.total_resources.get(c, 0) > 0]
        decision = decide(explicit, self.found, self.settings.fallback)
        why = f" ({'; '.join(reasons)})" if decision.warn and reasons else ""
        log.log(logging.WARNING if decision.warn else logging.INFO, "spotlight worker %s: %s%s",
                worker.name, decision.message, why)
        if decision.worker_class is not None:
            await set_class(worker, {decision.worker_class: self.settings.slots})
        if self.found is not None and worker.state.total_resources.get(SPOT, 0) > 0:
            self.watch = preemption_watch(self.settings.notice_config(self.found.cloud))
            self.watch.setup(worker)

    def teardown(self, worker) -> None:
        if self.watch is not None:
            self.watch.teardown(worker)


def cloud_class_plugin(settings: CloudClassSettings | None = None) -> CloudClassPlugin:
    """The plugin for ``client.register_plugin`` (a pool that takes no preload): register it
    before the run starts, so that the run's own notice watch sees the class it set."""
    return CloudClassPlugin(settings or CloudClassSettings())


async def dask_setup(worker) -> None:
    """``dask worker ADDR --preload pipelines.cluster.cloud_class``: classify the worker before
    it registers, with the settings of the ``SPOTLIGHT_*`` environment variables."""
    await worker.plugin_add(CloudClassPlugin(CloudClassSettings.from_env(os.environ)),
                            catch_errors=False)
