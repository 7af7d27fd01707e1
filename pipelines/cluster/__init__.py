"""The Dask cluster side: connecting (embedded or remote, TLS), the project's worker plugin,
pull dispatch of spot requests, preemption notices and the preemption injector."""
from pipelines.cluster.classes import GPU, SPOT, class_of, worker_classes, workers_by_class
from pipelines.cluster.connect import (
    LOOPBACK,
    Absence,
    ClusterError,
    ClusterHandle,
    ClusterLostError,
    RunInterrupted,
    TaskFailedError,
    check_shape,
    connect,
    open_cluster,
    probe_scheduler,
    register_worker_setup,
    security,
    start_embedded,
    task_error,
)

__all__ = ["GPU", "LOOPBACK", "SPOT", "Absence", "ClusterError", "ClusterHandle",
           "ClusterLostError", "RunInterrupted", "TaskFailedError", "check_shape", "class_of",
           "connect", "open_cluster", "probe_scheduler", "register_worker_setup", "security",
           "start_embedded", "task_error", "worker_classes", "workers_by_class"]
