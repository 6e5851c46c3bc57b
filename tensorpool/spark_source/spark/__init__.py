"""The pyspark adapters: data source, stream and pulse readers, sink, publisher.
Layer order inside ``spark_source``: options < plan < rings < spark.
"""
