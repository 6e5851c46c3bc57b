"""Frames straight to the GPU (issue #20): pinned payload pools and device batches.

Optional: needs ``pip install 'tensorpool[gpu]'`` (CuPy). Nothing here is imported by the host
paths; :meth:`tensorpool.client.consumer.Consumer.poll_batch` imports it only when asked for a
device. ``registry`` is the sans-IO bookkeeping, ``cuda`` the thin CuPy layer, ``delivery`` the
device batch path. See docs/gpu.md.
"""
