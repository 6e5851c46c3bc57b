"""tensorpool: shared-memory tensor pools over Aeron."""
