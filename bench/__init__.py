"""Benchmarks: ``python -m bench [NAME ...]`` (see ``bench/__main__.py``)."""

#: Exit status of a benchmark that cannot run on this host (``bench_gpu`` without a GPU or the
#: ``tensorpool[gpu]`` extra): ``python -m bench`` lists it as skipped, not failed.
SKIPPED = 77
