"""The payment task queue (docs/guide/payment-queue.md): claim, process outside a transaction, retry, DLQ."""
