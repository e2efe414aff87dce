"""Retention (CONTRACT §2 `retention run`, §8): prune what the product itself keeps, in short batches."""
