"""Metrics: per-update JSONL records, the live progress line and the experience accounting."""
