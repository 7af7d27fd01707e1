"""The process side of elastic sequence parallelism: persistent executors on Dask workers
(:mod:`pipelines.parallel.executor`) and the driver that groups them
(:mod:`pipelines.parallel.groups`)."""
