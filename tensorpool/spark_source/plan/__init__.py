"""The Spark source's planning: what each trigger may read, decided from ring states alone.

Pure: no pyspark, pyarrow, pyaeron or transport import, transitively (tests/unit/test_layering.py).
Layer order inside ``spark_source``: options < plan < rings < spark.
"""
