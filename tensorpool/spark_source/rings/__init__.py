"""The Spark source's view of the rings: attach, scan, read a partition into Arrow, locally or
through ``tensorpool serve`` (Arrow Flight). No pyspark import.
Layer order inside ``spark_source``: options < plan < rings < spark.
"""
