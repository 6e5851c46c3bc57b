"""A batch read whose Spark executors run in another mount namespace (#16.3 test role).

Usage: ``spark_ns_reader.py AERON_DIR SHM_BASE STREAM FAIL_ON_DATA_LOSS``. Starts its own local
SparkSession whose Python *executor* workers (``pyspark.daemon pyspark.worker``) start through a
wrapper that enters a new user + mount + UTS namespace, mounts an empty tmpfs over
``SHM_BASE`` and renames the host: the view of an executor on a machine (or in a container)
without the producer's shared memory. The planner (``plan_data_source_read``) and the driver stay
in this namespace, as a Spark driver on the producer's host does. Prints one JSON line:
``{"rows": n}`` or ``{"error": type, "message": text}``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile


def _wrapper(shm_base: str) -> str:
    fd, path = tempfile.mkstemp(prefix="tp-ns-python-", suffix=".sh")
    script = f"""#!/bin/sh
case " $* " in
  *" pyspark.worker"*)
    exec unshare --user --map-root-user --mount --uts sh -c \\
      'mount -t tmpfs tp-elsewhere "$0" && hostname executor-elsewhere && exec "$@"' \\
      {shm_base!r} {sys.executable!r} "$@" ;;
esac
exec {sys.executable!r} "$@"
"""
    os.write(fd, script.encode())
    os.close(fd)
    os.chmod(path, stat.S_IRWXU)
    return path


def main() -> None:
    aeron_dir, shm_base, stream, fail = sys.argv[1:5]
    wrapper = _wrapper(shm_base)
    os.environ["PYSPARK_PYTHON"] = wrapper
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import tensorpool.spark_source as tps

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("tensorpool-ns-reader")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tps.register(spark)
    try:
        df = (
            spark.read.format("tensorpool")
            .options(
                streams=stream,
                aeronDir=aeron_dir,
                shmBaseDir=shm_base,
                attachTimeoutMs="20000",
                failOnDataLoss=fail,
            )
            .load()
        )
        print(json.dumps({"rows": df.count()}), flush=True)
    except Exception as exc:
        text = str(exc)
        kind = "TensorPoolWrongHostError" if "TensorPoolWrongHostError" in text else "other"
        print(json.dumps({"error": kind, "message": text}), flush=True)
    finally:
        spark.stop()
        os.unlink(wrapper)


if __name__ == "__main__":
    main()
