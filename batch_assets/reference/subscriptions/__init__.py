"""The nightly subscription expiry (CONTRACT §6)."""
