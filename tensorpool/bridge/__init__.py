"""The SHM Tensor Pool Aeron-UDP bridge (Bridge Spec v1.0): streams between hosts.

Modules, one job each:

- ``config``    the TOML surface (§10) into a validated :class:`BridgeConfig`.
- ``chunker``   pure: a frame → ``BridgeFrameChunk`` messages (§5.1, §5.2).
- ``assembler`` the receiver's sans-IO core: chunk validation, assembly, §6 checks,
                epochs (§8), progress remapping (§9).
- ``sender``    the sender agent: a local consumer whose frames leave as chunks.
- ``receiver``  the receiver agent: chunks in, a local producer's frames out.
- ``app``       one bridge process (sender and/or receiver) and its status.
- ``reasons``   stable drop-reason names.

``tensorpool bridge --config FILE`` runs it (``tensorpool.commands.bridge``).
"""
