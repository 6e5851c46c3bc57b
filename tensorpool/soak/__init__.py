"""The pure parts of `tensorpool soak`: the seeded fault schedule and the accounting ledger.

Nothing here starts a process, reads a clock or touches a file, so both are unit-tested in
microseconds (tests/unit/soak/); :mod:`tensorpool.commands.soak` does the I/O.
"""
