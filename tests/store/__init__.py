"""Tests of proxy/store, a file per module."""
