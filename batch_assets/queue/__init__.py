"""A PostgreSQL task queue over any table holding the queue columns (docs/guide/payment-queue.md,
docs/reference/declarations.md), in parts.

The parts, as River (producer, executor, completer, notifier) and pgqueuer split theirs:

- `spec.QueueSpec`: which table, key, columns and priority make the queue;
- `store.QueueStore`: every statement of one queue (claims, results, stats, DLQ, install DDL), for the
  worker and for tests alike (`statements` generates their text from the spec);
- `worker`: the claim loop with its adaptive batch (`batch`), around
- `executor` (the lanes that call the handler), `completer` (the result buffer, one fenced
  `UPDATE … unnest` per flush), `notifier` (LISTEN and reconnect), `connection` (the claim/flush
  connection and its reconnects) and `breaker` (the outage breaker).

The payment queue (`batch_assets.reference.payments`) is one instance; `batch_assets.TableQueueComponent`
declares others.
"""
