"""The payment task queue (CONTRACT §7): claim, process outside a transaction, retry, DLQ."""
