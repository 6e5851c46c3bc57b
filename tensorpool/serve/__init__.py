"""``tensorpool serve``: one host's streams, read-only, over Arrow Flight (#18).

* :mod:`.core`   -- what a ``do_get`` ticket reads and reports lost (sans-IO);
* :mod:`.server` -- the Flight server (auth, describe, scan, do_get);
* :mod:`.journal` -- the loss ledger's journal in serve's state directory (kept across restarts).

Layer: above ``spark_source`` (it serves the Spark source's reads: the same mapped rings,
seqlock read into Arrow, schema and protocol module,
:mod:`tensorpool.spark_source.rings.flight_protocol`), below the command line. See docs/operator.md
("Serving streams to other hosts").
"""
