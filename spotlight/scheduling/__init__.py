"""Request scheduling under spot preemption: pure state, no Dask."""
