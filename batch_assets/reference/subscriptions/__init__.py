"""The nightly subscription expiry (docs/guide/subscriptions.md)."""
