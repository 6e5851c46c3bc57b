"""Seeing what the system does (#19): Prometheus metrics, ``tensorpool top``, the frame viewer.

Everything here is a *reader* of the layers below: the metrics collectors read the agents'
existing counters when Prometheus scrapes (nothing is counted twice, nothing is added to a hot
path), ``top`` reads the driver's status file, the superblocks and QoS traffic, and the viewer
is an ordinary rate-limited consumer. Nothing below imports this package.
"""
