"""Tests of proxy/dialects, a file per module."""
